// The models `tandem train` and `tandem profile` know by name (--model NAME). `tandem-torch`
// registers its built-in models (gpt); a program that embeds tandem's training front end
// registers its own before it calls TrainMain (cli/torch/train_main.h):
//
//   ABSL_FLAG(int, width, 32, "cnn: channels");
//
//   int main(int argc, char** argv) {
//     tandem::cli::RegisterModel({
//         .name = "cnn",
//         .summary = "a small CNN on synthetic images",
//         .flags = {"width"},                // its own flags, accepted by train and profile
//         .make = [](const tandem::cli::ModelRequest& request)
//             -> absl::StatusOr<tandem::cli::ModelAndData> { ... }});
//     return tandem::cli::TrainMain(argc, argv);
//   }
//
// The model then runs through everything `tandem train` does: profiling and planning, every
// schedule, data and tensor parallelism (where it has a sharded form), checkpoints, resume and
// --elastic. Registration happens on the main thread before TrainMain; the registry is not
// meant to change afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"

namespace tandem::cli {

// A model and its data set, as one registered model's `make` returns them.
struct ModelAndData {
  // How to build the layers and the loss (runtime/torch/model.h). Every rank builds from the
  // same seed, so every rank gets the same initial parameters as a single process.
  runtime::libtorch::ModelSpec spec;
  // The samples of every iteration (runtime/torch/data.h): deterministic in (iteration,
  // sample), so every rank and a single process see the same batches.
  std::shared_ptr<runtime::libtorch::Dataset> data;
  // Held-out samples for the validation loss (`train --eval-every`), read as `data` is; null:
  // none (ValidationDataFromFlags gives the flags' choice).
  std::shared_ptr<runtime::libtorch::Dataset> validation;
  // One line naming the model and its sizes ("gpt layers=4 hidden=64 ..."): printed at the
  // start and stored in checkpoints, which a resume must match. Empty: the model's name.
  std::string description;
  // Tokens in one sample, for tokens/s (1 for a model whose samples are not sequences: the
  // figure is then samples/s).
  int64_t tokens_per_sample = 1;
  // Training FLOPs (forward and backward) per token, for MFU on known GPUs; 0: unknown.
  double training_flops_per_token = 0;
  // The activation bytes `layers` consecutive layers (the last stage's when `last_stage`)
  // keep at the least for one micro-batch of `microbatch_size` samples, for a first check that
  // a plan's micro-batches fit before anything is allocated. Empty: not checked.
  std::function<double(int64_t microbatch_size, int layers, bool last_stage)>
      minimum_activation_bytes;
};

// What a model's `make` is called with, on every rank (the model's own flags it reads itself
// with absl::GetFlag).
struct ModelRequest {
  uint64_t seed = 0;  // --seed: the data set's randomness (the model's is ModelSpec::Build's)
};

struct ModelDefinition {
  std::string name;     // --model NAME: letters, digits, '_' and '-'
  std::string summary;  // one line for --help
  // Names of the absl flags (as ABSL_FLAG names them: "seq_len") this model reads; `train`
  // and `profile` accept them. Flags may be shared between models.
  std::vector<std::string> flags;
  std::function<absl::StatusOr<ModelAndData>(const ModelRequest&)> make;
};

// Adds a model. InvalidArgument for an empty or malformed name or no `make`; AlreadyExists
// for a name taken (gpt included).
absl::Status RegisterModel(ModelDefinition definition);

// Every registered model, by name.
const std::map<std::string, ModelDefinition>& RegisteredModels();

// "model" and every registered model's flags (each once), for a command's flag list.
std::vector<std::string> ModelFlagNames();

// "\n\nModels (--model NAME):\n  gpt: ..." for the end of a command's usage: every registered
// model with its summary and flags.
std::string ModelsHelp();

// The model --model names, made. InvalidArgument naming the known models for an unknown
// name; what `make` returns otherwise (its description defaults to the model's name).
absl::StatusOr<ModelAndData> ModelAndDataFromFlags(uint64_t seed);

}  // namespace tandem::cli
