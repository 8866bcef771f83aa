// `tandem`'s entries for the LibTorch commands: listed in `tandem --help` and run by
// `tandem-torch` (see cli/torch_commands.h). Part of `tandem` only, never of `tandem-torch`.
#include "cli/torch_commands.h"

#include "cli/command.h"
#include "common/config.h"

namespace tandem::cli {
namespace {

CommandInfo TorchCommand(const char* name, const char* summary) {
  CommandInfo info{.name = name, .summary = summary};
  if (TANDEM_HAVE_TORCH) {
    info.program = kTorchProgram;
  } else {
    info.unavailable =
        "this build has no LibTorch (reconfigure with LibTorch installed, e.g. Debian's "
        "libtorch-dev, and TANDEM_WITH_TORCH=ON)";
  }
  return info;
}

const CommandRegistrar train_registrar(TorchCommand("train", kTrainSummary));
const CommandRegistrar profile_registrar(TorchCommand("profile", kProfileSummary));
const CommandRegistrar checkpoint_registrar(TorchCommand("checkpoint", kCheckpointSummary));
const CommandRegistrar generate_registrar(TorchCommand("generate", kGenerateSummary));

}  // namespace
}  // namespace tandem::cli
