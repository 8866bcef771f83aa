// Text generation on one rank: a decoder model (gpt, gpt2, llama) loaded whole from a tandem
// checkpoint or a Hugging Face folder, then greedy or sampled decoding, with a key/value cache
// (kv_cache.h: the prompt runs once, then each step runs one position) or without one (each
// step runs the whole sequence again: the reference the cache must agree with).
//
// Greedy decoding takes the arg-max of the last position's logits (the first of equal ones, as
// torch.argmax), what transformers' generate(do_sample=False) does. Sampling divides the logits
// by the temperature, keeps the top_k largest (all where 0; the ties of the k-th kept, as
// transformers' TopKLogitsWarper) and draws from their softmax with a CPU torch generator
// seeded with `seed`: the same seed gives the same tokens, on any device.
//
// Not thread-safe (a model's modules are run in place); one generation at a time per model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/torch/model.h"

namespace tandem::runtime::libtorch {

// A model ready to generate: every layer built on one device, tied weights shared, no
// parameter requiring gradients.
struct GenerationModel {
  LayeredModel model;
  std::string description;    // DescribeGpt, DescribeGpt2 or DescribeLlama
  std::string source;         // "checkpoint DIR (step N)", "Hugging Face folder DIR"
  int64_t vocab = 0;          // token ids must be below it
  int64_t max_positions = 0;  // the longest sequence (prompt and new tokens) it takes
  // Its end-of-text tokens, where its files name them: a Hugging Face folder's
  // generation_config.json eos_token_id (an id or a list), else its config.json's; a
  // checkpoint's --hf-config's. transformers' generate stops after any of them.
  std::vector<int64_t> end_tokens;
  std::string end_tokens_source;  // the file they come from; empty without any
};

// The model a tandem checkpoint (a root or a step folder) holds: the manifest's model
// description (gpt, gpt2 or llama) sizes it, its parameters are the checkpoint's, whatever
// partition saved them. `hf_config`, when not empty, is the config.json a llama or gpt2 was
// trained from (it must describe the checkpoint's model), for what a description lacks (the
// norm epsilon, Llama's max_position_embeddings); empty: the config.json `tandem train`
// recorded in the checkpoint where it did (HfConfigOfCheckpoint), else as `tandem checkpoint
// export` reads a description. NotFound for a folder without a checkpoint; InvalidArgument for
// another model, a parameter missing or of another shape, one the model has not; DataLoss for a
// damaged shard.
absl::StatusOr<GenerationModel> ModelFromCheckpoint(const std::string& checkpoint,
                                                    const std::string& hf_config,
                                                    torch::Device device);

// The model of a Hugging Face folder (config.json of model_type llama or gpt2 and its
// safetensors, as `tandem train --init-from` reads them).
absl::StatusOr<GenerationModel> ModelFromHfFolder(const std::string& folder,
                                                  torch::Device device);

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;       // 0: every token
  uint64_t seed = 0;       // the sampling generator's
  std::vector<int64_t> stop_tokens;  // generation ends after any of these tokens
  bool use_cache = true;   // false: each step runs the whole sequence
};

struct Generation {
  std::vector<int64_t> tokens;  // the new tokens (not the prompt)
  double first_token_seconds = 0;  // the prompt's pass and the first choice
  double seconds = 0;              // all steps
};

// Continues `prompt` (ids below model.vocab, at least one) by up to options.max_new_tokens
// tokens. InvalidArgument naming the value for a token outside the vocabulary, an empty
// prompt, a prompt with the new tokens longer than model.max_positions, a negative or
// non-finite temperature, a negative top_k; FailedPrecondition for use_cache with a layer that
// has no incremental form (kv_cache.h); Internal for a LibTorch error.
absl::StatusOr<Generation> Generate(GenerationModel& model, absl::Span<const int64_t> prompt,
                                    const GenerateOptions& options);

}  // namespace tandem::runtime::libtorch
