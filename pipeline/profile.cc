#include "pipeline/profile.h"

#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"

namespace tandem::pipeline {
namespace {

constexpr int kProfileFormatVersion = 1;

absl::Status FieldError(absl::string_view where, absl::string_view field,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ".", field, ": ", problem));
}

absl::Status CheckNonNegative(double value, absl::string_view where, absl::string_view field) {
  if (!std::isfinite(value)) return FieldError(where, field, "must be a finite number");
  if (value < 0) {
    return FieldError(where, field, absl::StrCat("must not be negative (got ", value, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateVariant(const TensorParallelVariant& v, absl::string_view where) {
  if (v.degree < 2) {
    return FieldError(where, "degree", absl::StrCat("must be at least 2 (got ", v.degree, ")"));
  }
  if (v.expert_parallel < 1 || v.degree % v.expert_parallel != 0) {
    return FieldError(
        where, "expert_parallel",
        absl::StrCat("must divide the degree ", v.degree, " (got ", v.expert_parallel, ")"));
  }
  TANDEM_RETURN_IF_ERROR(CheckNonNegative(v.forward_seconds, where, "forward_seconds"));
  TANDEM_RETURN_IF_ERROR(CheckNonNegative(v.backward_seconds, where, "backward_seconds"));
  TANDEM_RETURN_IF_ERROR(
      CheckNonNegative(v.stashed_activation_bytes, where, "stashed_activation_bytes"));
  TANDEM_RETURN_IF_ERROR(CheckNonNegative(v.parameter_bytes, where, "parameter_bytes"));
  TANDEM_RETURN_IF_ERROR(
      CheckNonNegative(v.communication_seconds, where, "communication_seconds"));
  return absl::OkStatus();
}

nlohmann::json VariantToJson(const TensorParallelVariant& v) {
  nlohmann::json j = {{"degree", v.degree},
                      {"forward_seconds", v.forward_seconds},
                      {"backward_seconds", v.backward_seconds},
                      {"stashed_activation_bytes", v.stashed_activation_bytes},
                      {"parameter_bytes", v.parameter_bytes},
                      {"communication_seconds", v.communication_seconds}};
  if (v.sequence_parallel) j["sequence_parallel"] = true;
  if (v.expert_parallel != 1) j["expert_parallel"] = v.expert_parallel;
  return j;
}

absl::StatusOr<TensorParallelVariant> VariantFromJson(const nlohmann::json& j,
                                                      absl::string_view where) {
  TensorParallelVariant v;
  TANDEM_ASSIGN_OR_RETURN(int64_t degree, GetInt(j, "degree", where));
  if (degree < 2 || degree > (int64_t{1} << 20)) {
    return FieldError(where, "degree", absl::StrCat("must be in [2, 1048576] (got ", degree, ")"));
  }
  v.degree = static_cast<int>(degree);
  TANDEM_ASSIGN_OR_RETURN(v.forward_seconds, GetNonNegativeNumber(j, "forward_seconds", where));
  TANDEM_ASSIGN_OR_RETURN(v.backward_seconds, GetNonNegativeNumber(j, "backward_seconds", where));
  TANDEM_ASSIGN_OR_RETURN(v.stashed_activation_bytes,
                          GetNonNegativeNumber(j, "stashed_activation_bytes", where));
  TANDEM_ASSIGN_OR_RETURN(v.parameter_bytes, GetNonNegativeNumber(j, "parameter_bytes", where));
  TANDEM_ASSIGN_OR_RETURN(v.communication_seconds,
                          GetNumberOr(j, "communication_seconds", 0, where));
  TANDEM_RETURN_IF_ERROR(CheckNonNegative(v.communication_seconds, where, "communication_seconds"));
  if (j.contains("sequence_parallel")) {
    if (!j["sequence_parallel"].is_boolean()) {
      return FieldError(where, "sequence_parallel", "must be true or false");
    }
    v.sequence_parallel = j["sequence_parallel"].get<bool>();
  }
  if (j.contains("expert_parallel")) {
    TANDEM_ASSIGN_OR_RETURN(int64_t expert_parallel, GetInt(j, "expert_parallel", where));
    if (expert_parallel < 1 || degree % expert_parallel != 0) {
      return FieldError(
          where, "expert_parallel",
          absl::StrCat("must divide the degree ", degree, " (got ", expert_parallel, ")"));
    }
    v.expert_parallel = static_cast<int>(expert_parallel);
  }
  return v;
}

// An optional non-negative number.
absl::StatusOr<double> GetNonNegativeOr(const nlohmann::json& j, absl::string_view field,
                                        double fallback, absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(double value, GetNumberOr(j, field, fallback, where));
  TANDEM_RETURN_IF_ERROR(CheckNonNegative(value, where, field));
  return value;
}

}  // namespace

bool TensorParallelVariant::operator==(const TensorParallelVariant& o) const {
  return degree == o.degree && forward_seconds == o.forward_seconds &&
         backward_seconds == o.backward_seconds &&
         stashed_activation_bytes == o.stashed_activation_bytes &&
         parameter_bytes == o.parameter_bytes && communication_seconds == o.communication_seconds &&
         sequence_parallel == o.sequence_parallel && expert_parallel == o.expert_parallel;
}

bool LayerProfile::operator==(const LayerProfile& o) const {
  return name == o.name && forward_seconds == o.forward_seconds &&
         backward_seconds == o.backward_seconds &&
         backward_input_seconds == o.backward_input_seconds &&
         backward_weight_seconds == o.backward_weight_seconds &&
         output_activation_bytes == o.output_activation_bytes &&
         stashed_activation_bytes == o.stashed_activation_bytes &&
         parameter_bytes == o.parameter_bytes && optimizer_state_bytes == o.optimizer_state_bytes &&
         recompute_seconds == o.recompute_seconds &&
         recompute_stashed_bytes == o.recompute_stashed_bytes &&
         optimizer_seconds == o.optimizer_seconds && inputs == o.inputs &&
         tensor_parallel == o.tensor_parallel;
}

double Profile::TotalForwardSeconds() const {
  double total = 0;
  for (const LayerProfile& layer : layers) total += layer.forward_seconds;
  return total;
}

double Profile::TotalBackwardSeconds() const {
  double total = 0;
  for (const LayerProfile& layer : layers) total += layer.backward_seconds;
  return total;
}

double Profile::TotalParameterBytes() const {
  double total = 0;
  for (const LayerProfile& layer : layers) total += layer.parameter_bytes;
  return total;
}

bool Profile::operator==(const Profile& o) const {
  return model == o.model && microbatch_size == o.microbatch_size && device == o.device &&
         layers == o.layers;
}

absl::Status ValidateProfile(const Profile& profile, absl::string_view source) {
  if (profile.layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": layers: the model has no layers"));
  }
  if (profile.microbatch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": microbatch_size: must be at least 1 (got ", profile.microbatch_size, ")"));
  }
  std::map<std::string, int> first_index_of_name;
  const int num_layers = static_cast<int>(profile.layers.size());
  for (int i = 0; i < num_layers; ++i) {
    const LayerProfile& layer = profile.layers[i];
    const std::string where = absl::StrCat(source, ": layers[", i, "]");
    if (layer.name.empty()) return FieldError(where, "name", "must not be empty");
    auto [it, inserted] = first_index_of_name.emplace(layer.name, i);
    if (!inserted) {
      return FieldError(where, "name",
                        absl::StrCat("'", layer.name, "' repeats layers[", it->second, "]"));
    }
    TANDEM_RETURN_IF_ERROR(CheckNonNegative(layer.forward_seconds, where, "forward_seconds"));
    TANDEM_RETURN_IF_ERROR(CheckNonNegative(layer.backward_seconds, where, "backward_seconds"));
    TANDEM_RETURN_IF_ERROR(
        CheckNonNegative(layer.backward_input_seconds, where, "backward_input_seconds"));
    TANDEM_RETURN_IF_ERROR(
        CheckNonNegative(layer.backward_weight_seconds, where, "backward_weight_seconds"));
    TANDEM_RETURN_IF_ERROR(
        CheckNonNegative(layer.output_activation_bytes, where, "output_activation_bytes"));
    TANDEM_RETURN_IF_ERROR(
        CheckNonNegative(layer.stashed_activation_bytes, where, "stashed_activation_bytes"));
    TANDEM_RETURN_IF_ERROR(CheckNonNegative(layer.parameter_bytes, where, "parameter_bytes"));
    TANDEM_RETURN_IF_ERROR(
        CheckNonNegative(layer.optimizer_state_bytes, where, "optimizer_state_bytes"));
    TANDEM_RETURN_IF_ERROR(CheckNonNegative(layer.recompute_seconds, where, "recompute_seconds"));
    TANDEM_RETURN_IF_ERROR(
        CheckNonNegative(layer.recompute_stashed_bytes, where, "recompute_stashed_bytes"));
    TANDEM_RETURN_IF_ERROR(CheckNonNegative(layer.optimizer_seconds, where, "optimizer_seconds"));
    const double split = layer.backward_input_seconds + layer.backward_weight_seconds;
    if (split > 0) {
      // Profilers time the halves separately; allow rounding but not a different total.
      const double tolerance = 1e-6 + 1e-3 * layer.backward_seconds;
      if (std::fabs(split - layer.backward_seconds) > tolerance) {
        return FieldError(where, "backward_input_seconds",
                          absl::StrCat("backward_input_seconds + backward_weight_seconds = ",
                                       split, " differs from backward_seconds = ",
                                       layer.backward_seconds));
      }
    }
    std::set<int> seen_inputs;
    for (size_t k = 0; k < layer.inputs.size(); ++k) {
      const int input = layer.inputs[k];
      const std::string field = absl::StrCat("inputs[", k, "]");
      if (input < 0 || input >= num_layers) {
        return FieldError(where, field,
                          absl::StrCat("layer index ", input, " is out of range [0, ",
                                       num_layers, ")"));
      }
      if (input >= i) {
        return FieldError(
            where, field,
            absl::StrCat("refers to layers[", input, "] ('", profile.layers[input].name,
                         "'), which is not earlier: layers must be in topological order and "
                         "the graph must have no cycles"));
      }
      if (!seen_inputs.insert(input).second) {
        return FieldError(where, field, absl::StrCat("repeats input layer ", input));
      }
    }
    // A degree may come several times: without sequence parallelism and with it, and with the
    // experts on each number of parts.
    std::set<std::tuple<int, bool, int>> degrees;
    for (size_t k = 0; k < layer.tensor_parallel.size(); ++k) {
      const TensorParallelVariant& variant = layer.tensor_parallel[k];
      const std::string variant_where = absl::StrCat(where, ".tensor_parallel[", k, "]");
      TANDEM_RETURN_IF_ERROR(ValidateVariant(variant, variant_where));
      if (!degrees.insert({variant.degree, variant.sequence_parallel, variant.expert_parallel})
               .second) {
        return FieldError(
            variant_where, "degree",
            absl::StrCat("degree ", variant.degree,
                         variant.sequence_parallel ? " with" : " without", " sequence parallelism",
                         variant.expert_parallel != 1
                             ? absl::StrCat(" and experts on ", variant.expert_parallel, " parts")
                             : "",
                         " repeats"));
      }
    }
  }
  return absl::OkStatus();
}

nlohmann::json ToJson(const Profile& profile) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerProfile& layer : profile.layers) {
    nlohmann::json l = {{"name", layer.name},
                        {"forward_seconds", layer.forward_seconds},
                        {"backward_seconds", layer.backward_seconds},
                        {"output_activation_bytes", layer.output_activation_bytes},
                        {"stashed_activation_bytes", layer.stashed_activation_bytes},
                        {"parameter_bytes", layer.parameter_bytes},
                        {"optimizer_state_bytes", layer.optimizer_state_bytes},
                        {"recompute_seconds", layer.recompute_seconds},
                        {"recompute_stashed_bytes", layer.recompute_stashed_bytes}};
    if (layer.backward_input_seconds > 0 || layer.backward_weight_seconds > 0) {
      l["backward_input_seconds"] = layer.backward_input_seconds;
      l["backward_weight_seconds"] = layer.backward_weight_seconds;
    }
    if (layer.optimizer_seconds > 0) l["optimizer_seconds"] = layer.optimizer_seconds;
    if (!layer.inputs.empty()) l["inputs"] = layer.inputs;
    if (!layer.tensor_parallel.empty()) {
      nlohmann::json variants = nlohmann::json::array();
      for (const TensorParallelVariant& v : layer.tensor_parallel) {
        variants.push_back(VariantToJson(v));
      }
      l["tensor_parallel"] = std::move(variants);
    }
    layers.push_back(std::move(l));
  }
  return {{"format_version", kProfileFormatVersion},
          {"model", profile.model},
          {"microbatch_size", profile.microbatch_size},
          {"device", profile.device},
          {"layers", std::move(layers)}};
}

absl::StatusOr<Profile> ProfileFromJson(const nlohmann::json& j, absl::string_view source) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  }
  // Top-level fields read as "x.json: profile.microbatch_size"; layers as "x.json: layers[3]".
  const std::string top = absl::StrCat(source, ": profile");
  TANDEM_ASSIGN_OR_RETURN(int64_t version,
                          GetIntOr(j, "format_version", kProfileFormatVersion, top));
  if (version != kProfileFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(top, ".format_version: unsupported version ",
                                                   version, " (this build reads ",
                                                   kProfileFormatVersion, ")"));
  }
  Profile profile;
  TANDEM_ASSIGN_OR_RETURN(profile.model, GetStringOr(j, "model", "", top));
  TANDEM_ASSIGN_OR_RETURN(profile.microbatch_size, GetInt(j, "microbatch_size", top));
  TANDEM_ASSIGN_OR_RETURN(profile.device, GetStringOr(j, "device", "", top));
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* layers, GetArray(j, "layers", top));

  // Names first, so that `inputs` may name a layer.
  std::map<std::string, int> index_of_name;
  for (size_t i = 0; i < layers->size(); ++i) {
    const std::string where = absl::StrCat(source, ": layers[", i, "]");
    TANDEM_ASSIGN_OR_RETURN(std::string name, GetString((*layers)[i], "name", where));
    index_of_name.emplace(name, static_cast<int>(i));
  }

  for (size_t i = 0; i < layers->size(); ++i) {
    const nlohmann::json& l = (*layers)[i];
    const std::string where = absl::StrCat(source, ": layers[", i, "]");
    LayerProfile layer;
    TANDEM_ASSIGN_OR_RETURN(layer.name, GetString(l, "name", where));
    TANDEM_ASSIGN_OR_RETURN(layer.forward_seconds,
                            GetNonNegativeNumber(l, "forward_seconds", where));
    TANDEM_ASSIGN_OR_RETURN(layer.backward_seconds,
                            GetNonNegativeNumber(l, "backward_seconds", where));
    TANDEM_ASSIGN_OR_RETURN(layer.backward_input_seconds,
                            GetNonNegativeOr(l, "backward_input_seconds", 0, where));
    TANDEM_ASSIGN_OR_RETURN(layer.backward_weight_seconds,
                            GetNonNegativeOr(l, "backward_weight_seconds", 0, where));
    TANDEM_ASSIGN_OR_RETURN(layer.output_activation_bytes,
                            GetNonNegativeNumber(l, "output_activation_bytes", where));
    TANDEM_ASSIGN_OR_RETURN(layer.stashed_activation_bytes,
                            GetNonNegativeNumber(l, "stashed_activation_bytes", where));
    TANDEM_ASSIGN_OR_RETURN(layer.parameter_bytes,
                            GetNonNegativeNumber(l, "parameter_bytes", where));
    TANDEM_ASSIGN_OR_RETURN(layer.optimizer_state_bytes,
                            GetNonNegativeOr(l, "optimizer_state_bytes", 0, where));
    // Recomputing a layer re-runs its forward; keeping only its input is the usual result.
    TANDEM_ASSIGN_OR_RETURN(
        layer.recompute_seconds,
        GetNonNegativeOr(l, "recompute_seconds", layer.forward_seconds, where));
    TANDEM_ASSIGN_OR_RETURN(layer.recompute_stashed_bytes,
                            GetNonNegativeOr(l, "recompute_stashed_bytes", 0, where));
    TANDEM_ASSIGN_OR_RETURN(layer.optimizer_seconds,
                            GetNonNegativeOr(l, "optimizer_seconds", 0, where));
    if (l.contains("inputs")) {
      const nlohmann::json& inputs = l["inputs"];
      if (!inputs.is_array()) {
        return FieldError(where, "inputs", "expected an array of layer indices or names");
      }
      for (size_t k = 0; k < inputs.size(); ++k) {
        const nlohmann::json& input = inputs[k];
        if (input.is_number_integer()) {
          layer.inputs.push_back(input.get<int>());
        } else if (input.is_string()) {
          auto it = index_of_name.find(input.get<std::string>());
          if (it == index_of_name.end()) {
            return FieldError(where, absl::StrCat("inputs[", k, "]"),
                              absl::StrCat("unknown layer name '", input.get<std::string>(),
                                           "'"));
          }
          layer.inputs.push_back(it->second);
        } else {
          return FieldError(where, absl::StrCat("inputs[", k, "]"),
                            "expected a layer index or name");
        }
      }
    }
    if (l.contains("tensor_parallel")) {
      const nlohmann::json& variants = l["tensor_parallel"];
      if (!variants.is_array()) return FieldError(where, "tensor_parallel", "expected an array");
      for (size_t k = 0; k < variants.size(); ++k) {
        TANDEM_ASSIGN_OR_RETURN(
            TensorParallelVariant v,
            VariantFromJson(variants[k], absl::StrCat(where, ".tensor_parallel[", k, "]")));
        layer.tensor_parallel.push_back(v);
      }
    }
    profile.layers.push_back(std::move(layer));
  }
  TANDEM_RETURN_IF_ERROR(ValidateProfile(profile, source));
  return profile;
}

absl::StatusOr<Profile> ReadProfileFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  return ProfileFromJson(j, path);
}

absl::Status WriteProfileFile(const Profile& profile, const std::string& path) {
  TANDEM_RETURN_IF_ERROR(ValidateProfile(profile, path));
  return WriteFileAtomically(path, ToJson(profile).dump(2) + "\n");
}

}  // namespace tandem::pipeline
