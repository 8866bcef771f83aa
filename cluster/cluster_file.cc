#include "cluster/cluster_file.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace tandem::cluster {
namespace {

using nlohmann::json;

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

absl::Status OnlyKeys(const json& object, const std::set<std::string>& allowed,
                      const std::string& source, const std::string& where) {
  for (const auto& [key, value] : object.items()) {
    if (allowed.count(key) == 0) {
      return Invalid(source, absl::StrCat(where, "unknown field '", key, "' (known: ",
                                          absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// Bounds a simulation can run through in reasonable time: counts of nodes and GPUs per node,
// and speeds relative to the reference device (a speed of 1e-320 would make every job run for
// longer than the universe has existed).
constexpr long long kMaxCount = 1000000;
constexpr double kMinSpeed = 1e-3;
constexpr double kMaxSpeed = 1e3;

absl::StatusOr<int> PositiveCount(const json& object, const std::string& key,
                                  const std::string& source, const std::string& where) {
  if (!object.contains(key)) return Invalid(source, absl::StrCat(where, "missing '", key, "'"));
  const json& value = object.at(key);
  if (!value.is_number_integer() || value.get<long long>() < 1 ||
      value.get<long long>() > kMaxCount) {
    return Invalid(source, absl::StrCat(where, "'", key, "' must be a whole number in [1, ",
                                        kMaxCount, "], got ", value.dump()));
  }
  return value.get<int>();
}

absl::StatusOr<double> PositiveSpeed(const json& value, const std::string& source,
                                     const std::string& where) {
  if (!value.is_number() || !(value.get<double>() >= kMinSpeed) ||
      !(value.get<double>() <= kMaxSpeed)) {
    return Invalid(source, absl::StrCat(where, "speed must be a number in [", kMinSpeed, ", ",
                                        kMaxSpeed, "] (relative to the reference device), got ",
                                        value.dump()));
  }
  return value.get<double>();
}

}  // namespace

ClusterView ClusterDescription::View() const {
  ClusterView view;
  for (const DeviceTypeSpec& type : device_types) {
    for (int n = 0; n < type.nodes; ++n) view.nodes.push_back({type.gpus_per_node, type.name});
  }
  return view;
}

double ClusterDescription::Speed(const std::string& application,
                                 const std::string& device_type) const {
  auto app = application_speeds.find(application);
  if (app != application_speeds.end()) {
    auto found = app->second.find(device_type);
    if (found != app->second.end()) return found->second;
  }
  for (const DeviceTypeSpec& type : device_types) {
    if (type.name == device_type) return type.speed;
  }
  return 1.0;
}

absl::StatusOr<ClusterDescription> ParseClusterDescription(const std::string& text,
                                                           const std::string& source) {
  absl::StatusOr<json> parsed = ParseJson(text, source);
  if (!parsed.ok()) {
    return Invalid(source, JsonNestingDepth(text) > kMaxJsonDepth
                               ? absl::StrCat("JSON nested deeper than ", kMaxJsonDepth, " levels")
                               : std::string("not valid JSON"));
  }
  const json root = *std::move(parsed);
  if (!root.is_object()) return Invalid(source, "expected a JSON object");
  TANDEM_RETURN_IF_ERROR(OnlyKeys(root, {"device_types", "application_speeds"}, source, ""));
  if (!root.contains("device_types") || !root["device_types"].is_array() ||
      root["device_types"].empty()) {
    return Invalid(source, "'device_types' must be a non-empty list");
  }
  ClusterDescription cluster;
  cluster.source = source;
  std::set<std::string> names;
  for (size_t i = 0; i < root["device_types"].size(); ++i) {
    const json& entry = root["device_types"][i];
    const std::string where = absl::StrCat("device_types[", i, "]: ");
    if (!entry.is_object()) return Invalid(source, absl::StrCat(where, "expected an object"));
    TANDEM_RETURN_IF_ERROR(
        OnlyKeys(entry, {"name", "nodes", "gpus_per_node", "speed"}, source, where));
    DeviceTypeSpec type;
    if (!entry.contains("name") || !entry["name"].is_string() ||
        entry["name"].get<std::string>().empty()) {
      return Invalid(source, absl::StrCat(where, "'name' must be a non-empty string"));
    }
    type.name = entry["name"].get<std::string>();
    if (!names.insert(type.name).second) {
      return Invalid(source, absl::StrCat(where, "device type '", type.name, "' given twice"));
    }
    TANDEM_ASSIGN_OR_RETURN(type.nodes, PositiveCount(entry, "nodes", source, where));
    TANDEM_ASSIGN_OR_RETURN(type.gpus_per_node,
                            PositiveCount(entry, "gpus_per_node", source, where));
    if (entry.contains("speed")) {
      TANDEM_ASSIGN_OR_RETURN(type.speed, PositiveSpeed(entry["speed"], source, where));
    }
    cluster.device_types.push_back(type);
  }
  long long total_gpus = 0;
  for (const DeviceTypeSpec& type : cluster.device_types) {
    total_gpus += static_cast<long long>(type.nodes) * type.gpus_per_node;
  }
  if (total_gpus > kMaxCount) {
    return Invalid(source, absl::StrCat(total_gpus, " GPUs (nodes x gpus_per_node over every "
                                        "device type); at most ", kMaxCount, " are simulated"));
  }
  if (root.contains("application_speeds")) {
    const json& apps = root["application_speeds"];
    if (!apps.is_object()) return Invalid(source, "'application_speeds' must be an object");
    for (const auto& [app, speeds] : apps.items()) {
      const std::string where = absl::StrCat("application_speeds.", app, ": ");
      if (!speeds.is_object()) {
        return Invalid(source, absl::StrCat(where, "expected {device type: speed}"));
      }
      for (const auto& [type, value] : speeds.items()) {
        if (names.count(type) == 0) {
          return Invalid(source, absl::StrCat(where, "unknown device type '", type, "' (known: ",
                                              absl::StrJoin(names, ", "), ")"));
        }
        TANDEM_ASSIGN_OR_RETURN(cluster.application_speeds[app][type],
                                PositiveSpeed(value, source, absl::StrCat(where, type, ": ")));
      }
    }
  }
  return cluster;
}

absl::StatusOr<ClusterDescription> ReadClusterDescription(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseClusterDescription(text, path);
}

void ApplyDeviceSpeeds(const ClusterDescription& cluster, Workload* workload) {
  for (WorkloadJob& job : workload->jobs) {
    for (const DeviceTypeSpec& type : cluster.device_types) {
      job.device_throughput.emplace(type.name, cluster.Speed(job.application, type.name));
    }
  }
}

}  // namespace tandem::cluster
