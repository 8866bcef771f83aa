// A discrete-time cluster simulator in the manner of Pollux's (OSDI'21 artifact, simulator/):
// every `interval_seconds` each job advances by its true (measured) goodput on its current
// placement, then the policy reallocates GPUs; a job whose allocation changes pauses for
// `restart_seconds` (checkpoint-restart), or what the policy's mechanism declares a start, a
// grow and a shrink cost (Policy::reallocation_costs). Runs until every job has finished.
//
// Jobs of a Pollux application progress through epochs of statistical progress: per interval,
// goodput = efficiency gain / step time from the application's traces, so a larger batch
// trains faster per step but needs more samples. Batch sizes follow the policy's mode (see
// BatchSizeMode). Fixed-duration jobs (Philly, Tiresias traces) take their duration on their
// requested GPUs and slow down linearly on fewer.
//
// Checked every round: a policy never places more GPUs on a node than it has, nor GPUs for a
// job that is not active; the simulation stops with DeadlineExceeded `max_rounds` rounds after
// the last submission.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/application.h"
#include "cluster/policy.h"
#include "cluster/workload.h"

namespace tandem::cluster {

struct SimulationProgress {
  int round = 0;
  double now_seconds = 0;
  int finished_jobs = 0;
  int total_jobs = 0;
  int running_jobs = 0;  // jobs holding GPUs
  int allocated_gpus = 0;
};

struct SimulationOptions {
  double interval_seconds = 60;  // scheduling round
  // Pause after every reallocation, unless the policy declares its own costs
  // (Policy::reallocation_costs).
  double restart_seconds = 30;
  double interference = 0.0;     // slowdown of jobs sharing a node with another multi-node job
  // Give up (DeadlineExceeded) after this many rounds past the last job's submission.
  int max_rounds = 100000;
  // Adaptive (Pollux) mode keeps these applications at a fixed batch size, as Pollux's
  // simulator does for ncf.
  std::map<std::string, int> adaptive_fixed_batch = {{"ncf", 32768}};
  // Cap on max_replicas of adaptive jobs (Pollux: 64).
  int adaptive_max_replicas = 64;
  bool record_timeline = true;
  // Called after every round (progress output).
  std::function<void(const SimulationProgress&)> on_round;
};

struct JobOutcome {
  std::string name;
  std::string application;
  double submission_seconds = 0;
  double completion_seconds = 0;
  double jct_seconds = 0;            // completion - submission
  int restarts = 0;
  double gpu_seconds = 0;            // GPU-seconds held (attained service)
  int requested_gpus = 0;
  double isolated_seconds = 0;       // run time alone on the requested GPUs, no restarts
};

// GPUs each job held from `start_seconds` for one interval (job index into `jobs`, GPUs).
struct TimelineEntry {
  double start_seconds = 0;
  std::vector<std::pair<int, int>> gpus;
};

struct SimulationResult {
  std::string policy;
  std::string workload;
  int total_gpus = 0;
  double interval_seconds = 0;
  int rounds = 0;
  std::vector<JobOutcome> jobs;  // workload order
  std::vector<TimelineEntry> timeline;
};

// Runs `workload` under `policy` on `cluster`. `applications` must hold every application the
// workload names (ValidateWorkload is checked first: InvalidArgument for bad input).
absl::StatusOr<SimulationResult> Simulate(const Workload& workload,
                                          const ApplicationCatalog& applications,
                                          const ClusterView& cluster, Policy& policy,
                                          const SimulationOptions& options = {});

// Run time of one job alone on `requested` GPUs packed `gpus_per_node` to a node, at its
// requested batch size, with no restarts (the reference of finish-time fairness).
absl::StatusOr<double> IsolatedRunSeconds(const WorkloadJob& job,
                                          const ApplicationCatalog& applications,
                                          int gpus_per_node);

}  // namespace tandem::cluster
