#include "cli/torch/model_registry.h"

#include <set>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/torch/model_flags.h"

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
    for (const std::string& flag : definition.flags) {
      std::string dashed = flag;
      for (char& c : dashed) {
        if (c == '_') c = '-';
      }
      flags.push_back(absl::StrCat("--", dashed));
    }
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
