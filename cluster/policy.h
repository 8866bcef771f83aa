// The scheduling-policy interface shared by the cluster simulator and the live scheduler.
//
// Every round the caller hands a policy the active jobs (submitted, not finished) in submission
// order, the cluster, and the current allocations; the policy returns new allocations. An
// allocation lists one node index per GPU, as Pollux does ({0, 0, 3}: two GPUs on node 0, one
// on node 3). A job absent from the result gets no GPUs. A policy may keep state between rounds
// (Tiresias's queues); it is called from one thread at a time.
//
// What a job shows a policy (JobView) is enough for FIFO, Tiresias, Optimus, Pollux and Gavel:
// requested gang size and batch size, attained service, restarts, a speedup function
// (nodes, replicas) -> goodput relative to one GPU, Optimus's per-iteration time, and per-device
// type throughput for heterogeneous clusters.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::cluster {

inline constexpr char kDefaultDeviceType[] = "gpu";

struct NodeView {
  int gpus = 0;
  std::string device_type = kDefaultDeviceType;
};

struct ClusterView {
  std::vector<NodeView> nodes;

  static ClusterView Homogeneous(int num_nodes, int gpus_per_node,
                                 const std::string& device_type = kDefaultDeviceType);
  int total_gpus() const;
  int max_gpus_per_node() const;
};

using Allocation = std::vector<int>;                  // node index per GPU
using Allocations = std::map<std::string, Allocation>;  // job name -> allocation

// How the simulator sets up jobs' batch sizes for a policy (Pollux's simulator does this per
// policy): Tiresias and FIFO run the workload's replicas and batch size; Optimus keeps the
// batch size and chooses replicas; Pollux adapts the batch size to the allocation.
enum class BatchSizeMode { kFixedReplicasAndBatch, kFixedBatch, kAdaptive };

// What a reallocation costs a job, in seconds during which it holds its new GPUs without
// progressing, by what the change is. Pollux's simulator charges one restart for every change
// (checkpoint and restart, 30 s); a runtime that can shrink and grow a job live (tandem's
// elastic layer) pays less for those.
struct ReallocationCosts {
  double start_seconds = 30;   // from no GPUs: the first start, or a resume after preemption
  double grow_seconds = 30;    // more GPUs, keeping on every node at least the GPUs it had
  double shrink_seconds = 30;  // fewer GPUs, each on a node where the job already had as many
  double move_seconds = 30;    // any other change (GPUs given up on one node, taken on another)

  static ReallocationCosts Uniform(double seconds) {
    return {seconds, seconds, seconds, seconds};
  }
  // True when `after` (non-empty, different) keeps, per node, at most the GPUs `before` had.
  static bool IsShrink(const Allocation& before, const Allocation& after);
  // True when `after` (larger) keeps, per node, at least the GPUs `before` (non-empty) had.
  static bool IsGrow(const Allocation& before, const Allocation& after);
  // The cost of going from `before` to `after` (0 when they are equal or `after` is empty).
  double Seconds(const Allocation& before, const Allocation& after) const;
};

struct JobView {
  std::string name;
  std::string application;  // empty for a fixed-duration trace job
  double submission_seconds = 0;
  double age_seconds = 0;                   // now - submission
  double attained_service_gpu_seconds = 0;  // GPU-seconds held so far
  int restarts = 0;                         // reallocations after the first
  int requested_replicas = 1;               // the workload's gang size
  int requested_batch_size = 0;             // the workload's batch size (0: none)
  int min_replicas = 0;
  int max_replicas = 1;
  bool preemptible = true;
  // Goodput with (nodes, replicas) relative to one GPU on one node (0 for 0 replicas). Pollux's
  // speedup function; linear (= replicas) before a job has been profiled. May be evaluated
  // lazily; valid during the Optimize call only.
  std::function<double(int nodes, int replicas)> speedup;
  // Optimus's oracle: seconds per iteration on `replicas` GPUs packed onto as few nodes as
  // possible, at the requested batch size; with remaining_iterations, the time left.
  std::function<double(int replicas)> iteration_seconds;
  double remaining_iterations = 0;
  // Throughput on each device type relative to the reference type (absent: 1.0).
  std::map<std::string, double> device_throughput;
  // Samples/s on (nodes, replicas) as tandem's planner predicts it
  // (cluster/planned_throughput.h), for jobs planned from a model profile; empty for the
  // others. `speedup` of such a job stays what a policy knows without the plan (linear up to
  // the requested GPUs).
  std::function<double(int nodes, int replicas)> planned_throughput;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  virtual BatchSizeMode batch_size_mode() const = 0;
  // The costs of a reallocation under the mechanism this policy's jobs run on; none: the
  // simulator's uniform restart (SimulationOptions::restart_seconds).
  virtual std::optional<ReallocationCosts> reallocation_costs() const { return std::nullopt; }
  // New allocations for `jobs` at time `now_seconds`. `current` holds the allocations of the
  // jobs in `jobs` that have some. Errors are the policy's own failures (Internal) or bad
  // input (InvalidArgument, e.g. a job wider than the cluster).
  virtual absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                               const ClusterView& cluster,
                                               const Allocations& current,
                                               double now_seconds) = 0;
};

// Free GPUs per node after `allocations`.
std::vector<int> FreeGpus(const ClusterView& cluster, const Allocations& allocations);

// Takes `gpus` GPUs the way Tiresias's and Optimus's simulators place a gang: repeatedly from
// the node with the most free GPUs (the lowest index on ties). FailedPrecondition if fewer are
// free.
absl::StatusOr<Allocation> TakeFromMostFree(int gpus, std::vector<int>* free);

// GPUs per node of an allocation in the order nodes first appear: {3, 3, 1} -> {2, 1}.
std::vector<int> PlacementOf(const Allocation& allocation);

// Checks an allocation result: known jobs only, node indices in range, no node over its GPUs.
absl::Status ValidateAllocations(const Allocations& allocations,
                                 const std::vector<JobView>& jobs, const ClusterView& cluster,
                                 const std::string& policy);

}  // namespace tandem::cluster
