// `tandem-torch`: the LibTorch commands (train, profile, checkpoint, generate) with the
// built-in models.
// `tandem` runs it for those commands (cli/torch_commands.h).
#include "cli/torch/train_main.h"

int main(int argc, char** argv) { return tandem::cli::TrainMain(argc, argv); }
