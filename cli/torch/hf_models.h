// The Hugging Face decoder models of `tandem train` and `tandem profile`: --model llama
// (runtime/torch/llama.h) and --model gpt2 (runtime/torch/gpt2.h), sized by a transformers
// config.json (--hf-config) or by the GPT's size flags, on the GPT's data sets; started from a
// Hugging Face folder's weights with --init-from FOLDER (its config.json sizes the model; each
// rank reads the weights of its own layers, runtime/torch/hf_weights.h).
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::cli {

// Registers llama and gpt2 in the model registry (cli/torch/model_registry.h), once; later
// calls do nothing. Called on the main thread before the registry is read.
void RegisterHuggingFaceModels();

// The config.json that sizes this run's llama or gpt2 (--hf-config's file, or the one in
// --init-from's folder), or nothing when neither flag is given. tandem train records it in its
// checkpoints' manifests (the run record's "hf_config"), so that an export or a generation
// from them writes and reads what the model description leaves out (the norms' epsilon, the
// padding row, LongRoPE's factors) without --hf-config.
absl::StatusOr<std::optional<nlohmann::json>> HfConfigOfRun();

}  // namespace tandem::cli
