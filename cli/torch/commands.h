// The commands of the LibTorch front end (train, profile, checkpoint, generate). TrainMain
// (cli/torch/train_main.h) registers them when it starts, after the program registered its
// models, so that the flags and help they list include every model's.
#pragma once

#include "cli/command.h"

namespace tandem::cli {

CommandInfo TrainCommand();
CommandInfo ProfileCommand();
CommandInfo CheckpointCommand();
CommandInfo GenerateCommand();

}  // namespace tandem::cli
