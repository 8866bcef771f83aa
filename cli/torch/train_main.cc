#include "cli/torch/train_main.h"

#include <cstring>
#include <vector>

#include "cli/command.h"
#include "cli/command_line.h"
#include "cli/torch/commands.h"
#include "cli/torch/elastic_train.h"
#include "cli/torch/model_flags.h"

namespace tandem::cli {
namespace {

// Registers the LibTorch commands once (after the models, whose flags they list).
void RegisterTorchCommands() {
  static const bool registered = [] {
    CommandRegistrar train(TrainCommand());
    CommandRegistrar profile(ProfileCommand());
    CommandRegistrar checkpoint(CheckpointCommand());
    CommandRegistrar generate(GenerateCommand());
    return true;
  }();
  (void)registered;
}

// True for arguments that RunCommandLine takes as they are: a command, help or the version.
bool NamesACommand(const char* argument) {
  if (Commands().count(argument) > 0) return true;
  for (const char* word : {"help", "--help", "-h", "--version"}) {
    if (std::strcmp(argument, word) == 0) return true;
  }
  return false;
}

}  // namespace

int TrainMain(int argc, char** argv) {
  if (ArgumentsAskForElastic(argc, argv)) CatchElasticSignals();
  RegisterBuiltInModels();
  RegisterTorchCommands();
  if (argc >= 2 && !NamesACommand(argv[1])) {
    // `program --model mine ...`: the flags of `train`.
    std::vector<char*> with_command(argv, argv + argc);
    static char train[] = "train";
    with_command.insert(with_command.begin() + 1, train);
    with_command.push_back(nullptr);
    return RunCommandLine(argc + 1, with_command.data());
  }
  return RunCommandLine(argc, argv);
}

}  // namespace tandem::cli
