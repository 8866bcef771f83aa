#include "cli/torch/model_registry.h"

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "cli/torch/model_flags.h"
#include "common/status.h"

namespace tandem::cli {
namespace {

std::map<std::string, ModelDefinition>& Registry() {
  static auto* registry = new std::map<std::string, ModelDefinition>();
  return *registry;
}

bool IsModelName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// A model's flag given on the command line when another model runs would be ignored without
// a word (`--hf-config` of a Llama with the default gpt trained a GPT of the default sizes):
// InvalidArgument naming the flag, the models that read it and the one chosen.
absl::Status CheckFlagsReadByModel(const ModelDefinition& chosen) {
  const std::set<std::string> own(chosen.flags.begin(), chosen.flags.end());
  std::map<std::string, std::vector<std::string>> readers;  // flag -> models that read it
  for (const auto& [name, definition] : Registry()) {
    for (const std::string& flag : definition.flags) {
      if (own.count(flag) == 0 && FlagGivenOnCommandLine(flag)) readers[flag].push_back(name);
    }
  }
  if (readers.empty()) return absl::OkStatus();
  std::vector<std::string> problems;
  for (auto& [flag, models] : readers) {
    problems.push_back(
        absl::StrCat(CommandLineFlag(flag), " (read by ", absl::StrJoin(models, ", "), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model '", chosen.name, "' does not read ", absl::StrJoin(problems, ", "),
                   ": choose the model with --model, or leave the flag out"));
}

}  // namespace

absl::Status RegisterModel(ModelDefinition definition) {
  if (!IsModelName(definition.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model name '", definition.name, "': use letters, digits, '_' and '-' only"));
  }
  if (!definition.make) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", definition.name, "' has no make function"));
  }
  auto [it, inserted] = Registry().emplace(definition.name, std::move(definition));
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("a model named '", it->first, "' is already registered"));
  }
  return absl::OkStatus();
}

const std::map<std::string, ModelDefinition>& RegisteredModels() { return Registry(); }

std::vector<std::string> ModelFlagNames() {
  std::vector<std::string> names = {"model"};
  std::set<std::string> seen(names.begin(), names.end());
  for (const auto& [name, definition] : Registry()) {
    for (const std::string& flag : definition.flags) {
      if (seen.insert(flag).second) names.push_back(flag);
    }
  }
  return names;
}

std::string ModelsHelp() {
  std::string text = "\n\nModels (--model NAME):";
  for (const auto& [name, definition] : Registry()) {
    std::vector<std::string> flags;
    for (const std::string& flag : definition.flags) flags.push_back(CommandLineFlag(flag));
    absl::StrAppend(&text, "\n  ", name, ": ", definition.summary);
    if (!flags.empty()) absl::StrAppend(&text, " (", absl::StrJoin(flags, " "), ")");
  }
  return text;
}

absl::StatusOr<ModelAndData> ModelAndDataFromFlags(uint64_t seed) {
  const std::string name = absl::GetFlag(FLAGS_model);
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    std::vector<std::string> known;
    for (const auto& [known_name, definition] : Registry()) known.push_back(known_name);
    return absl::InvalidArgumentError(absl::StrCat("--model: unknown model '", name,
                                                   "' (known: ", absl::StrJoin(known, ", "),
                                                   ")"));
  }
  TANDEM_RETURN_IF_ERROR(CheckFlagsReadByModel(it->second));
  ModelRequest request;
  request.seed = seed;
  absl::StatusOr<ModelAndData> made = it->second.make(request);
  if (!made.ok()) return made.status();
  if (made->spec.name.empty()) made->spec.name = name;
  if (made->description.empty()) made->description = name;
  if (made->data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model '", name, "' made no data set"));
  }
  if (!made->spec.build && !made->spec.layer_by_layer()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", name, "' made no builder"));
  }
  if (made->tokens_per_sample < 1) {
    return absl::InvalidArgumentError(absl::StrCat("model '", name, "': tokens_per_sample ",
                                                   made->tokens_per_sample, " is not positive"));
  }
  return made;
}

}  // namespace tandem::cli
