// The `tandem` program's subcommands. Each subcommand lives in its own cli/*_command.cc,
// defines its flags with ABSL_FLAG (shared flags live in cli/flags.cc) and registers itself:
//
//   static tandem::cli::CommandRegistrar registrar({
//       .name = "schedule", .summary = "...", .usage = "...",
//       .flags = {"schedule", "stages", ...}, .run = RunSchedule});
//
// The parser accepts only the flags a command lists, so `--help` shows exactly those and a
// flag of another command is an error. Exit codes: 0 success, 1 runtime failure, 2 bad input.
//
// Two programs share this registry and cli/main.cc: `tandem` (cli/*_command.cc; no LibTorch)
// and `tandem-torch` (cli/torch/*_command.cc), which `tandem` runs for train and profile.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

struct CommandInfo {
  std::string name;
  std::string summary;       // one line for `tandem --help`
  std::string usage;         // synopsis and description for `tandem NAME --help`
  std::vector<std::string> flags;  // absl flag names this command accepts
  std::map<std::string, std::string> aliases;  // short name -> flag ("o" -> "output")
  // Runs after flags are parsed; gets the positional arguments.
  std::function<int(const std::vector<std::string>& args)> run;
  // Set for a command that another program beside this one runs (the LibTorch commands run in
  // tandem-torch, see cli/torch_commands.h): the whole argv, unparsed, goes to it through exec.
  std::string program;
  // Set for a command this build lacks (built without LibTorch): why. Running it, `--help`
  // included, prints that and exits kExitBadInput.
  std::string unavailable;
};

class CommandRegistrar {
 public:
  explicit CommandRegistrar(CommandInfo info);
};

const std::map<std::string, CommandInfo>& Commands();

// Parses argv (after the subcommand name) into the absl flags `info` lists. Repeated
// occurrences of a list flag (std::vector<std::string>) accumulate. InvalidArgument on an
// unknown flag, a flag of another command, a missing or malformed value.
absl::Status ParseCommandFlags(const CommandInfo& info, int argc, char** argv,
                               std::vector<std::string>* positional, bool* help);

// Whether the last ParseCommandFlags found flag `name` (absl's name: "microbatch_size") on
// the command line, for flags whose default is also a value one may ask for.
bool FlagGivenOnCommandLine(const std::string& name);

// A flag as the command line spells it: "microbatch_size" -> "--microbatch-size".
std::string CommandLineFlag(absl::string_view name);

std::string CommandHelp(const CommandInfo& info);

// Prints "tandem NAME: error: MESSAGE" to stderr and returns kExitBadInput for
// InvalidArgument/NotFound/OutOfRange/ResourceExhausted/DataLoss (bad input), kExitFailure
// otherwise.
int ReportError(const std::string& command, const absl::Status& status);

}  // namespace tandem::cli
