// The cluster a plan is made for: nodes of identical devices, the memory of each device, and
// the network as levels, innermost first (level 0 connects the devices of one node, level 1
// the nodes). Devices may differ in speed (heterogeneous clusters): `device_speeds` gives a
// relative speed per device (1 = as profiled; 0.5 = takes twice as long).
//
// JSON form (docs/plan-format.md):
//   {"nodes": 4, "devices_per_node": 8, "device_memory": "80GiB",
//    "levels": [{"bandwidth": "300GB/s", "latency": 5e-6},
//               {"bandwidth": "25GB/s", "latency": 2e-5}],
//    "device_speeds": [1, 1, ...]}
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::planner {

struct NetworkLevel {
  double bandwidth_bytes_per_second = 0;
  double latency_seconds = 0;
  bool operator==(const NetworkLevel& o) const {
    return bandwidth_bytes_per_second == o.bandwidth_bytes_per_second &&
           latency_seconds == o.latency_seconds;
  }
};

struct ClusterSpec {
  int nodes = 1;
  int devices_per_node = 1;
  double device_memory_bytes = 0;     // 0 = unlimited (no memory constraint)
  std::vector<NetworkLevel> levels;   // innermost first; one or two
  std::vector<double> device_speeds;  // empty = all 1; else one per device

  int NumDevices() const { return nodes * devices_per_node; }
  double SpeedOf(int device) const {
    return device_speeds.empty() ? 1.0 : device_speeds[device];
  }
  double SlowestSpeed() const;
  bool IsHomogeneous() const;
  // The level connecting a group of `group_size` devices placed together: intra-node while it
  // fits in one node, else inter-node.
  const NetworkLevel& LevelForGroup(int group_size) const;
  bool operator==(const ClusterSpec& o) const;
};

// Checks ranges and names the field ("cluster.json: levels[1].bandwidth: must be positive").
absl::Status ValidateCluster(const ClusterSpec& cluster, absl::string_view source = "cluster");

// A cluster from the command line: `devices` devices, `bandwidths` innermost first, nodes of
// `devices_per_node` devices (a divisor of `devices`; needed with two bandwidths). With one
// bandwidth and no node size, all devices form one node sharing it.
absl::StatusOr<ClusterSpec> MakeCluster(int devices, int devices_per_node,
                                        double device_memory_bytes,
                                        const std::vector<double>& bandwidths);

nlohmann::json ToJson(const ClusterSpec& cluster);
absl::StatusOr<ClusterSpec> ClusterFromJson(const nlohmann::json& j,
                                            absl::string_view source = "cluster");
absl::StatusOr<ClusterSpec> ReadClusterFile(const std::string& path);

}  // namespace tandem::planner
