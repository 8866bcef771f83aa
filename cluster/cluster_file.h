// A heterogeneous cluster described in a small JSON file: groups of nodes by device type, and
// how fast each device type runs the jobs.
//
//   {
//     "device_types": [
//       {"name": "v100", "nodes": 4, "gpus_per_node": 4, "speed": 1.0},
//       {"name": "k80",  "nodes": 4, "gpus_per_node": 4, "speed": 0.2}
//     ],
//     "application_speeds": {"cifar10": {"k80": 0.10}, "ncf": {"k80": 1.41}}
//   }
//
// `speed` is a type's throughput relative to the device the workload's durations and traces
// were measured on (1.0: as measured); "application_speeds" overrides it for the jobs of one
// application (a Pollux application name, or "" for fixed-duration trace jobs). Nodes are laid
// out in the order of "device_types". Unknown keys are refused, so a misspelt field is not
// silently ignored.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/policy.h"
#include "cluster/workload.h"

namespace tandem::cluster {

struct DeviceTypeSpec {
  std::string name;
  int nodes = 0;
  int gpus_per_node = 0;
  double speed = 1.0;
};

struct ClusterDescription {
  std::string source;  // the file it came from
  std::vector<DeviceTypeSpec> device_types;
  // application -> device type -> speed, overriding DeviceTypeSpec::speed.
  std::map<std::string, std::map<std::string, double>> application_speeds;

  ClusterView View() const;
  // Speed of `application`'s jobs on `device_type` (1.0 for an unknown type).
  double Speed(const std::string& application, const std::string& device_type) const;
};

// Parses a description; `source` names the input in messages. InvalidArgument naming the field
// for malformed JSON, a missing or unknown field, a duplicate type, counts < 1, a speed that is
// not positive and finite, an application speed for an unknown type.
absl::StatusOr<ClusterDescription> ParseClusterDescription(const std::string& text,
                                                           const std::string& source);
absl::StatusOr<ClusterDescription> ReadClusterDescription(const std::string& path);

// Sets every job's WorkloadJob::device_throughput from the description, one entry per device
// type; entries a job already has are kept.
void ApplyDeviceSpeeds(const ClusterDescription& cluster, Workload* workload);

}  // namespace tandem::cluster
