#include "cli/command.h"

#include <algorithm>
#include <iostream>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/printable.h"
#include "common/status.h"

namespace tandem::cli {
namespace {

std::map<std::string, CommandInfo>& Registry() {
  static auto* registry = new std::map<std::string, CommandInfo>;
  return *registry;
}

}  // namespace

CommandRegistrar::CommandRegistrar(CommandInfo info) {
  std::string name = info.name;
  Registry().emplace(name, std::move(info));
}

const std::map<std::string, CommandInfo>& Commands() { return Registry(); }

namespace {
std::set<std::string>& GivenFlags() {
  static auto* given = new std::set<std::string>;
  return *given;
}
}  // namespace

bool FlagGivenOnCommandLine(const std::string& name) { return GivenFlags().count(name) > 0; }

std::string CommandLineFlag(absl::string_view name) {
  std::string flag = absl::StrCat("--", name);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

absl::Status ParseCommandFlags(const CommandInfo& info, int argc, char** argv,
                               std::vector<std::string>* positional, bool* help) {
  *help = false;
  GivenFlags().clear();
  std::set<std::string> allowed(info.flags.begin(), info.flags.end());
  std::map<std::string, std::vector<std::string>> list_values;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help" || arg == "--helpfull") {
      *help = true;
      return absl::OkStatus();
    }
    if (arg == "--") {
      for (++i; i < argc; ++i) positional->push_back(argv[i]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      positional->push_back(arg);
      continue;
    }
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string name = body, value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    if (auto a = info.aliases.find(name); a != info.aliases.end()) name = a->second;
    std::replace(name.begin(), name.end(), '-', '_');
    bool negated = false;
    if (!allowed.count(name) && absl::StartsWith(name, "no") && allowed.count(name.substr(2))) {
      name = name.substr(2);
      negated = true;
    }
    if (!allowed.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag '", arg, "' for 'tandem ", info.name, "' (see tandem ", info.name,
          " --help)"));
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      return absl::InternalError(absl::StrCat("flag --", name, " is listed but not defined"));
    }
    if (flag->IsOfType<bool>()) {
      if (!has_value) value = negated ? "false" : "true";
    } else {
      if (negated) return absl::InvalidArgumentError(absl::StrCat("--", arg, ": not a boolean"));
      if (!has_value) {
        if (i + 1 >= argc) {
          return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
        }
        value = argv[++i];
      }
    }
    if (flag->IsOfType<std::vector<std::string>>()) {
      list_values[name].push_back(value);
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value for --", name, ": '", value, "': ", error));
    }
    GivenFlags().insert(name);
  }
  for (const auto& [name, values] : list_values) {
    std::string error;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (!flag->ParseFrom(absl::StrJoin(values, ","), &error)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value for --", name, ": ", error));
    }
    GivenFlags().insert(name);
  }
  return absl::OkStatus();
}

std::string CommandHelp(const CommandInfo& info) {
  std::string out = absl::StrCat("tandem ", info.name, ": ", info.summary, "\n\n", info.usage,
                                 "\n\nFlags:\n");
  std::map<std::string, std::string> reverse_alias;
  for (const auto& [a, f] : info.aliases) reverse_alias[f] = a;
  for (const std::string& name : info.flags) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::string alias = reverse_alias.count(name) ? absl::StrCat(", -", reverse_alias[name]) : "";
    std::string def = flag->DefaultValue();
    absl::StrAppend(&out, "  ", CommandLineFlag(name), alias, "\n      ", flag->Help());
    if (!def.empty()) absl::StrAppend(&out, " (default: ", def, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

int ReportError(const std::string& command, const absl::Status& status) {
  // One write, so lines of several ranks sharing a terminal do not interleave.
  std::cerr << absl::StrCat("tandem ", command, ": error: ", Printable(status.message()), "\n")
            << std::flush;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDataLoss:  // a corrupt or truncated input file
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

}  // namespace tandem::cli
