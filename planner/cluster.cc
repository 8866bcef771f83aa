#include "planner/cluster.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/status.h"
#include "common/units.h"

namespace tandem::planner {
namespace {

constexpr int kMaxDevices = 1 << 20;

absl::Status Invalid(absl::string_view where, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", problem));
}

// A size or rate given as a number or as a string with a unit ("80GiB", "25GB/s").
absl::StatusOr<double> GetQuantity(const nlohmann::json& j, absl::string_view field, bool rate,
                                   absl::string_view where) {
  const std::string key(field);
  if (!j.contains(key)) return Invalid(absl::StrCat(where, ".", field), "missing field");
  const nlohmann::json& v = j[key];
  if (v.is_number()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < 0) {
      return Invalid(absl::StrCat(where, ".", field), "must be a non-negative number");
    }
    return d;
  }
  if (v.is_string()) {
    auto parsed =
        rate ? ParseBytesPerSecond(v.get<std::string>()) : ParseBytes(v.get<std::string>());
    if (!parsed.ok()) return Annotate(parsed.status(), absl::StrCat(where, ".", field));
    return *parsed;
  }
  return Invalid(absl::StrCat(where, ".", field), "expected a number or a string like \"8GiB\"");
}

}  // namespace

double ClusterSpec::SlowestSpeed() const {
  if (device_speeds.empty()) return 1.0;
  return *std::min_element(device_speeds.begin(), device_speeds.end());
}

bool ClusterSpec::IsHomogeneous() const {
  return std::all_of(device_speeds.begin(), device_speeds.end(),
                     [&](double s) { return s == device_speeds.front(); });
}

const NetworkLevel& ClusterSpec::LevelForGroup(int group_size) const {
  if (group_size <= devices_per_node || levels.size() == 1) return levels.front();
  return levels[1];
}

bool ClusterSpec::operator==(const ClusterSpec& o) const {
  return nodes == o.nodes && devices_per_node == o.devices_per_node &&
         device_memory_bytes == o.device_memory_bytes && levels == o.levels &&
         device_speeds == o.device_speeds;
}

absl::Status ValidateCluster(const ClusterSpec& cluster, absl::string_view source) {
  if (cluster.nodes < 1 || cluster.nodes > kMaxDevices) {
    return Invalid(absl::StrCat(source, ": nodes"),
                   absl::StrCat("must be in [1, ", kMaxDevices, "], got ", cluster.nodes));
  }
  if (cluster.devices_per_node < 1 ||
      int64_t{cluster.devices_per_node} * cluster.nodes > kMaxDevices) {
    return Invalid(absl::StrCat(source, ": devices_per_node"),
                   absl::StrCat("must be at least 1 with at most ", kMaxDevices,
                                " devices in all, got ", cluster.devices_per_node));
  }
  if (!(cluster.device_memory_bytes >= 0) || !std::isfinite(cluster.device_memory_bytes)) {
    return Invalid(absl::StrCat(source, ": device_memory"), "must be a non-negative number");
  }
  if (cluster.levels.empty()) {
    return Invalid(absl::StrCat(source, ": levels"), "needs at least one network level");
  }
  if (cluster.levels.size() > 2) {
    return Invalid(absl::StrCat(source, ": levels"),
                   absl::StrCat("at most two levels (intra-node, inter-node) are supported, got ",
                                cluster.levels.size()));
  }
  for (size_t i = 0; i < cluster.levels.size(); ++i) {
    const NetworkLevel& level = cluster.levels[i];
    const std::string where = absl::StrCat(source, ": levels[", i, "]");
    if (!(level.bandwidth_bytes_per_second > 0) ||
        !std::isfinite(level.bandwidth_bytes_per_second)) {
      return Invalid(absl::StrCat(where, ".bandwidth"),
                     absl::StrCat("must be positive, got ", level.bandwidth_bytes_per_second));
    }
    if (!(level.latency_seconds >= 0) || !std::isfinite(level.latency_seconds)) {
      return Invalid(absl::StrCat(where, ".latency"), "must not be negative");
    }
  }
  if (!cluster.device_speeds.empty()) {
    if (static_cast<int>(cluster.device_speeds.size()) != cluster.NumDevices()) {
      return Invalid(absl::StrCat(source, ": device_speeds"),
                     absl::StrCat("expected one speed per device (", cluster.NumDevices(),
                                  "), got ", cluster.device_speeds.size()));
    }
    for (size_t i = 0; i < cluster.device_speeds.size(); ++i) {
      if (!(cluster.device_speeds[i] > 0) || !std::isfinite(cluster.device_speeds[i])) {
        return Invalid(absl::StrCat(source, ": device_speeds[", i, "]"),
                       absl::StrCat("must be positive, got ", cluster.device_speeds[i]));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> MakeCluster(int devices, int devices_per_node,
                                        double device_memory_bytes,
                                        const std::vector<double>& bandwidths) {
  if (devices < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--devices must be at least 1, got ", devices));
  }
  if (bandwidths.empty()) return absl::InvalidArgumentError("at least one --bandwidth is needed");
  ClusterSpec cluster;
  cluster.device_memory_bytes = device_memory_bytes;
  for (double b : bandwidths) cluster.levels.push_back({b, 0.0});
  if (bandwidths.size() == 1 && devices_per_node <= 0) {
    cluster.nodes = 1;
    cluster.devices_per_node = devices;
  } else {
    if (devices_per_node < 1 || devices % devices_per_node != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "with two bandwidths (intra-node, inter-node), --devices-per-node must divide "
          "--devices ",
          devices, ", got ", devices_per_node));
    }
    cluster.devices_per_node = devices_per_node;
    cluster.nodes = devices / devices_per_node;
  }
  TANDEM_RETURN_IF_ERROR(ValidateCluster(cluster, "cluster"));
  return cluster;
}

nlohmann::json ToJson(const ClusterSpec& cluster) {
  nlohmann::json levels = nlohmann::json::array();
  for (const NetworkLevel& level : cluster.levels) {
    levels.push_back(
        {{"bandwidth", level.bandwidth_bytes_per_second}, {"latency", level.latency_seconds}});
  }
  nlohmann::json j = {{"nodes", cluster.nodes},
                      {"devices_per_node", cluster.devices_per_node},
                      {"device_memory", cluster.device_memory_bytes},
                      {"levels", std::move(levels)}};
  if (!cluster.device_speeds.empty()) j["device_speeds"] = cluster.device_speeds;
  return j;
}

absl::StatusOr<ClusterSpec> ClusterFromJson(const nlohmann::json& j, absl::string_view source) {
  const std::string top = absl::StrCat(source, ": cluster");
  if (!j.is_object()) return Invalid(source, "expected a JSON object");
  ClusterSpec cluster;
  TANDEM_ASSIGN_OR_RETURN(int64_t nodes, GetInt(j, "nodes", top));
  TANDEM_ASSIGN_OR_RETURN(int64_t per_node, GetInt(j, "devices_per_node", top));
  if (nodes < 1 || nodes > kMaxDevices || per_node < 1 || per_node > kMaxDevices) {
    return Invalid(top, absl::StrCat("nodes and devices_per_node must be in [1, ", kMaxDevices,
                                     "], got ", nodes, " and ", per_node));
  }
  cluster.nodes = static_cast<int>(nodes);
  cluster.devices_per_node = static_cast<int>(per_node);
  if (j.contains("device_memory")) {
    TANDEM_ASSIGN_OR_RETURN(cluster.device_memory_bytes,
                            GetQuantity(j, "device_memory", /*rate=*/false, top));
  }
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* levels, GetArray(j, "levels", top));
  for (size_t i = 0; i < levels->size(); ++i) {
    const std::string where = absl::StrCat(top, ".levels[", i, "]");
    NetworkLevel level;
    TANDEM_ASSIGN_OR_RETURN(level.bandwidth_bytes_per_second,
                            GetQuantity((*levels)[i], "bandwidth", /*rate=*/true, where));
    TANDEM_ASSIGN_OR_RETURN(level.latency_seconds,
                            GetNumberOr((*levels)[i], "latency", 0.0, where));
    cluster.levels.push_back(level);
  }
  if (j.contains("device_speeds")) {
    TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* speeds, GetArray(j, "device_speeds", top));
    for (const nlohmann::json& s : *speeds) {
      if (!s.is_number()) return Invalid(absl::StrCat(top, ".device_speeds"), "expected numbers");
      cluster.device_speeds.push_back(s.get<double>());
    }
  }
  TANDEM_RETURN_IF_ERROR(ValidateCluster(cluster, source));
  return cluster;
}

absl::StatusOr<ClusterSpec> ReadClusterFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  return ClusterFromJson(j, path);
}

}  // namespace tandem::planner
