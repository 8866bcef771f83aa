// Workloads for the cluster simulator: the jobs, when they arrive and what they ask for.
//
// Three formats, told apart by their header:
//   Pollux   name,time,application,num_replicas,batch_size  (time: submission second)
//   Philly   timestamp,duration,num_gpus,gpu_time,cluster   (Microsoft's trace as Pollux ships it)
//   Tiresias job_id,num_gpu,submit_time,iterations,model_name,duration,interval
// Pollux jobs run one of the measured applications (cluster/application.h). Philly and
// Tiresias jobs have no measured application: they become fixed-duration jobs that take
// `duration_seconds` on their requested GPUs and scale linearly with fewer GPUs (never more
// than requested; see docs/cluster.md).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/application.h"
#include "cluster/planned_throughput.h"
#include "cluster/policy.h"

namespace tandem::cluster {

struct WorkloadJob {
  std::string name;
  double submission_seconds = 0;
  std::string application;  // a Pollux application, or empty for a fixed-duration job
  int num_replicas = 1;     // requested GPUs
  int batch_size = 0;       // requested batch size (Pollux jobs)
  double duration_seconds = 0;  // fixed-duration jobs: run time on num_replicas GPUs
  // Throughput on each device type relative to the reference (absent: 1.0).
  std::map<std::string, double> device_throughput;
  // A job planned by tandem's planner (no application): a fixed-duration job whose rate on a
  // placement is the plan's throughput there relative to its requested GPUs packed.
  std::shared_ptr<const PlannedThroughput> planned;
};

struct Workload {
  std::string source;  // the file it came from
  std::vector<WorkloadJob> jobs;  // ascending submission time
};

struct PhillyOptions {
  double min_duration_seconds = 60;  // Pollux's workload generator drops shorter jobs
  int max_jobs = 0;                  // the first N jobs by submission (0: all)
  std::string cluster;               // only this virtual cluster (empty: all)
};

absl::StatusOr<Workload> ReadPolluxWorkload(const std::string& path);
absl::StatusOr<Workload> ReadPhillyTrace(const std::string& path,
                                         const PhillyOptions& options = {});
absl::StatusOr<Workload> ReadTiresiasTrace(const std::string& path);
// Any of the three, by header. InvalidArgument (file and line) for malformed rows.
absl::StatusOr<Workload> ReadWorkload(const std::string& path,
                                      const PhillyOptions& philly = {});

// Tiresias's cluster spec (num_switch,num_node_p_switch,num_gpu_p_node,...): switches x nodes
// per switch nodes of num_gpu_p_node GPUs.
absl::StatusOr<ClusterView> ReadTiresiasClusterSpec(const std::string& path);

// True when some job runs a Pollux application (the catalog is needed).
bool NeedsApplications(const Workload& workload);

// InvalidArgument for a job the simulator cannot run: unknown application, no GPUs, more GPUs
// than the cluster has, a batch size outside the application's validated range, a
// fixed-duration job without a positive duration, a duplicate name.
absl::Status ValidateWorkload(const Workload& workload, const ApplicationCatalog& applications,
                              const ClusterView& cluster);

}  // namespace tandem::cluster
