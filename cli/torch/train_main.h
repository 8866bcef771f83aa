// tandem's training front end as a library: a program registers its models
// (cli/torch/model_registry.h) and hands its command line to TrainMain, and gets what
// `tandem train` does (progress lines, JSON log, timeline, checkpoints and resume, profiling
// and planning, every schedule, DP x TP x PP, --elastic) for them:
//
//   #include "cli/torch/train_main.h"
//
//   int main(int argc, char** argv) {
//     if (absl::Status s = tandem::cli::RegisterModel({...}); !s.ok()) return 2;
//     return tandem::cli::TrainMain(argc, argv);
//   }
//
//   mpirun -np 4 ./my_program --model mine --schedule 1f1b --stages 2 --steps 100
//
// The program then runs the commands `tandem-torch` runs: `train` (the default when the first
// argument is a flag), `profile`, `checkpoint` and `generate` (`./my_program profile --model
// mine`, `./my_program help train`). `tandem-torch` itself is this call with the built-in models.
// Link the CMake target tandem::train (find_package(tandem)).
#pragma once

#include "cli/torch/model_registry.h"

namespace tandem::cli {

// Registers the built-in models (gpt) and the LibTorch commands, then runs the command line.
// Returns the exit code: 0 done, 1 runtime failure, 2 bad input. Call once, from main.
int TrainMain(int argc, char** argv);

}  // namespace tandem::cli
