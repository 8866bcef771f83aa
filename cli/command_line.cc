// The command-line dispatcher shared by `tandem`, `tandem-torch` and programs that embed
// tandem's training front end (cli/torch/train_main.h): see cli/command_line.h.
#include "cli/command_line.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/cpu_binding.h"
#include "common/config.h"
#include "nlohmann/json.hpp"

namespace {

void PrintTopLevelHelp() {
  std::cout << "tandem: distributed training runtime with a pipeline scheduler\n\n"
               "Usage: tandem COMMAND [flags]    (tandem COMMAND --help for its flags)\n\n"
               "Commands:\n";
  for (const auto& [name, info] : tandem::cli::Commands()) {
    std::cout << absl::StrFormat("  %-10s %s%s\n", name, info.summary,
                                 info.unavailable.empty() ? "" : " [not in this build]");
  }
  std::cout << absl::StrFormat("\nBuilt with: MPI=%d LibTorch=%d CUDA=%d NCCL=%d\n",
                               TANDEM_HAVE_MPI, TANDEM_HAVE_TORCH, TANDEM_HAVE_CUDA,
                               TANDEM_HAVE_NCCL);
}

// Runs a command this program lists but does not hold: execs `info.program` from this
// program's folder with argv as it came (same process, so `mpirun` and signals see no
// difference), or reports why this build cannot. Returns only on failure.
int RunElsewhere(const tandem::cli::CommandInfo& info, char** argv) {
  using namespace tandem::cli;
  if (!info.unavailable.empty()) {
    return ReportError(info.name, absl::InvalidArgumentError(info.unavailable));
  }
  char self[PATH_MAX];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) {
    return ReportError(info.name, absl::InternalError(absl::StrCat(
                                      "cannot find this program's path (/proc/self/exe): ",
                                      std::strerror(errno))));
  }
  std::string path(self, length);
  path = path.substr(0, path.find_last_of('/') + 1) + info.program;
  // Before LibTorch loads in the program started: its OpenMP and BLAS size their waits by the
  // CPUs they see at start-up (one rank of a 2-core host, widened here: as fast as unbound;
  // widened after start-up: 1.3-1.7x slower).
  if (const int before = WidenDefaultMpiBinding(); before > 0) {
    ::setenv(kWidenedBindingVariable, absl::StrCat(before).c_str(), /*overwrite=*/1);
  }
  // An elastic job takes SIGUSR1 and SIGUSR2 as requests (stop, grow): ignored until the
  // program started catches them (an ignored signal stays ignored across exec; a caught one
  // would not), so that one arriving while LibTorch loads does not end the rank.
  int argc = 0;
  while (argv[argc] != nullptr) ++argc;
  if (ArgumentsAskForElastic(argc, argv)) {
    std::signal(SIGUSR1, SIG_IGN);
    std::signal(SIGUSR2, SIG_IGN);
  }
  std::fflush(nullptr);
  ::execv(path.c_str(), argv);
  const int error = errno;
  if (error == ENOENT) {
    return ReportError(info.name, absl::NotFoundError(absl::StrCat(
                                      path, ", the program that runs 'tandem ", info.name,
                                      "', is missing (build the ", info.program, " target)")));
  }
  return ReportError(info.name, absl::InternalError(absl::StrCat("cannot run ", path, ": ",
                                                                 std::strerror(error))));
}

bool RunsElsewhere(const tandem::cli::CommandInfo& info) {
  return !info.program.empty() || !info.unavailable.empty();
}

}  // namespace

namespace tandem::cli {

bool ArgumentsAskForElastic(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--elastic") == 0 || std::strcmp(argv[i], "--elastic=true") == 0 ||
        std::strcmp(argv[i], "--elastic=1") == 0) {
      return true;
    }
  }
  return false;
}

int RunCommandLine(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    if (argc >= 3 && std::strcmp(argv[1], "help") == 0) {
      auto it = Commands().find(argv[2]);
      if (it != Commands().end()) {
        if (RunsElsewhere(it->second)) return RunElsewhere(it->second, argv);
        std::cout << CommandHelp(it->second);
        return kExitOk;
      }
    }
    PrintTopLevelHelp();
    return argc < 2 ? kExitBadInput : kExitOk;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::cout << "tandem " TANDEM_VERSION "\n";
    return kExitOk;
  }
  auto it = Commands().find(argv[1]);
  if (it == Commands().end()) {
    std::cerr << "tandem: error: unknown command '" << argv[1] << "' (see tandem --help)\n";
    return kExitBadInput;
  }
  const CommandInfo& info = it->second;
  if (RunsElsewhere(info)) return RunElsewhere(info, argv);
  std::vector<std::string> positional;
  bool help = false;
  absl::Status parsed = ParseCommandFlags(info, argc - 2, argv + 2, &positional, &help);
  if (!parsed.ok()) return ReportError(info.name, parsed);
  if (help) {
    std::cout << CommandHelp(info);
    return kExitOk;
  }
  // A last line of defence: an exception escaping a command (a JSON accessor meeting a value
  // of another type, an allocation a size check missed) ends in one line, never an abort.
  try {
    return info.run(positional);
  } catch (const nlohmann::json::exception& e) {
    return ReportError(info.name, absl::InvalidArgumentError(
                                      absl::StrCat("malformed input: ", e.what())));
  } catch (const std::bad_alloc&) {
    return ReportError(info.name, absl::ResourceExhaustedError(
                                      "out of memory (a size in the input is too large?)"));
  } catch (const std::exception& e) {
    return ReportError(info.name, absl::InternalError(e.what()));
  }
}

}  // namespace tandem::cli
