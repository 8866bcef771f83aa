// The Hugging Face decoder models of `tandem train` and `tandem profile`: --model llama
// (runtime/torch/llama.h) and --model gpt2 (runtime/torch/gpt2.h), sized by a transformers
// config.json (--hf-config) or by the GPT's size flags, on the GPT's data sets; started from a
// Hugging Face folder's weights with --init-from FOLDER (its config.json sizes the model; each
// rank reads the weights of its own layers, runtime/torch/hf_weights.h).
#pragma once

namespace tandem::cli {

// Registers llama and gpt2 in the model registry (cli/torch/model_registry.h), once; later
// calls do nothing. Called on the main thread before the registry is read.
void RegisterHuggingFaceModels();

}  // namespace tandem::cli
