// The scheduling policies the cluster module knows, by name, and their options.
//
//   fifo      first come, first served; a job runs with its requested GPUs once every job
//             before it runs (no backfilling, no preemption), packed onto the fewest nodes
//   tiresias  Tiresias's two-dimensional least-attained-service (NSDI'19) as Pollux's
//             artifact runs it: discretised queues by GPU-seconds attained, gangs of the
//             requested size, preemption, placement from the nodes with most free GPUs
//   optimus   Optimus (EuroSys'18) with an oracle, as Pollux's artifact: one GPU per job, then
//             GPUs one at a time to the job whose remaining time drops most
//   pollux    Pollux (OSDI'21) as its artifact simulates it: a genetic search over replicas per
//             (job, node) for the best power mean of goodput speedups (normalised to the fair
//             share), restarts penalised; batch sizes adapted to the allocation
//   tandem    tandem's own: goodput-driven (adaptive batch sizes; planner-fed throughput for
//             planned jobs), GPU counts chosen exactly (dynamic programming) for a power mean of
//             speedups, node-aware placement, reallocations weighed by what they cost; jobs pay
//             the simulator's uniform restart
//   tandem-elastic  the same on tandem's elastic layer: a shrink and a grow (more GPUs, none
//             given up) are live (2 s each), a start or a move a checkpoint-and-resume (30 s);
//             declared to the simulator
//   gavel     Gavel (OSDI'20): heterogeneity-aware max-min fairness over device types (an LP,
//             GLPK), jobs time-sliced in rounds by Gavel's priorities, gangs on one type
// Other policies register in cluster/policies.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/policy.h"
#include "cluster/pollux_search.h"

namespace tandem::cluster {

struct TiresiasOptions {
  // GPU-seconds of attained service at which a job moves down a queue; Pollux's artifact uses
  // one threshold, 16 GPU-hours (two queues).
  std::vector<double> queue_thresholds_gpu_seconds = {16 * 3600.0};
  // Tiresias's starvation guard: a demoted job that has waited this many times its executed
  // time goes back to the first queue. 0 turns it off (the artifact's setting).
  double starvation_factor = 0;
};

std::unique_ptr<Policy> MakeFifoPolicy();
std::unique_ptr<Policy> MakeTiresiasPolicy(const TiresiasOptions& options = {});
std::unique_ptr<Policy> MakeOptimusPolicy();

struct PolluxOptions {
  // The allocation search: population 100, 100 generations, p = -1, 30 s restart penalty,
  // seeded (the same calls give the same allocations), as the artifact.
  PolluxSearchOptions search;
  // Speedups relative to the goodput at the job's fair share (the artifact's Problem); false:
  // relative to one GPU.
  bool normalise_to_fair_share = true;
};
std::unique_ptr<Policy> MakePolluxPolicy(const PolluxOptions& options = {});

struct TandemOptions {
  // The costs the policy weighs a change against. With declare_costs the policy also declares
  // them to the simulator (Policy::reallocation_costs) and is named tandem-elastic; otherwise
  // its jobs pay the simulator's uniform restart.
  ReallocationCosts costs = ReallocationCosts::Uniform(30);
  bool declare_costs = false;
  // Power mean exponent over jobs' speedups (-1: harmonic, as Pollux; 0: geometric).
  double fairness_power = -1;
  // A job's weight: (1 + attained GPU-seconds / scale)^-exponent (0: all jobs equal). A
  // positive exponent lowers the average JCT and raises the p99 (docs/cluster.md).
  double service_scale_gpu_seconds = 3600;
  double service_exponent = 0;
  // A change's cost is discounted over the job's age, at least this long.
  double min_horizon_seconds = 600;
  // Weigh each job by its speedup at the fair share (cluster GPUs / jobs, packed), as Pollux
  // normalises speedups: jobs that scale well count for more.
  bool normalise_to_fair_share = true;
  // Discount a change by Pollux's penalty instead: max(age - restarts x grow cost, 0) /
  // (age + cost), which holds back jobs that have restarted often.
  bool restart_history = true;
};
// tandem on its elastic layer: shrink 2 s (a live shrink: kill to the first step after about
// 1.3 s, docs/elastic.md), grow 2 s (a live grow: new ranks started and joined in 1.1-1.2 s,
// re-formed in 30 ms), start and move 30 s (checkpoint-and-resume), declared.
TandemOptions TandemElasticOptions();
std::unique_ptr<Policy> MakeTandemPolicy(const TandemOptions& options = {});

struct GavelPolicyOptions {
  // Jobs are reassigned every round (Gavel's default round: 360 s); between rounds running jobs
  // keep their GPUs and free GPUs go to waiting jobs.
  double round_seconds = 360;
  // Gavel's water-filling (lexicographic max-min) rather than the single max-min LP.
  bool water_filling = true;
};
// FailedPrecondition when tandem was built without GLPK (GavelPolicyAvailable() is false).
absl::StatusOr<std::unique_ptr<Policy>> MakeGavelPolicy(const GavelPolicyOptions& options = {});
bool GavelPolicyAvailable();

// Policy names MakePolicy knows (those this build can make).
std::vector<std::string> PolicyNames();

// A policy by name with default options; InvalidArgument listing the known names otherwise.
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(const std::string& name);

}  // namespace tandem::cluster
