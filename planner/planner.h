// The planner's front door: a profile (or Piper problem), a cluster and an algorithm in, a
// plan (pipeline/plan.h) out, plus a readable summary. Used by `tandem plan` and the benches.
//
// Conversions to plan.json:
//  * Ranks are numbered stage by stage (a stage's replicas, and their tensor-parallel groups,
//    are consecutive ranks). When every stage has the same degrees the plan is uniform (a
//    D x p mesh the runtime can run); otherwise it is non-uniform (empty mesh, per-stage
//    ranks), see docs/plan-format.md. AdaPipe plans are always uniform, with ranks numbered
//    pipeline by pipeline (rank = (d * p + q) * t + tensor rank).
//  * Heterogeneous clusters: PipeDream's straight pipelines use each device's speed; every
//    other plan assumes the slowest device's (synchronous replicas wait for it).
//  * Predicted iteration time: (m - 1) * slowest + sum of per-micro-batch stage times (1F1B
//    estimate, m micro-batches per pipeline), or the simulator's makespan when the schedule
//    search ran.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "pipeline/plan.h"
#include "pipeline/profile.h"
#include "planner/cluster.h"
#include "planner/knapsack.h"
#include "planner/pipedream.h"
#include "planner/piper.h"

namespace tandem::planner {

enum class Algorithm { kPipeDream, kPiper, kAdaPipe };
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);
absl::string_view AlgorithmName(Algorithm algorithm);

struct PlanRequest {
  Algorithm algorithm = Algorithm::kPipeDream;
  pipeline::Profile profile;
  // Piper's own problem when the input was Piper's format (keeps its configurations and sync
  // costs); otherwise Piper plans are built from `profile`.
  std::optional<PiperInstance> piper_instance;
  ClusterSpec cluster;
  // Micro-batches per iteration over all pipelines (Piper's mbsInBatch); 0 = a default (the
  // Piper file's, else 4 per pipeline stage for every pipeline; for Piper, 4 per device, at
  // most pipeline::kMaxMicrobatches).
  int microbatches = 0;
  // PipeDream.
  // PipeDream's view of a graph.txt DAG: with it the plan is PipeDream's optimum over its
  // antichain states, its stages written in a topological order of the layers in which each
  // is contiguous (pipeline::Plan::layer_order, absent when that is the profile's order).
  std::optional<PipeDreamGraph> pipedream_graph;
  // Above this many antichain states the search over them is not run and the plan is the best
  // over contiguous ranges of the profile's layer order, which the summary says.
  int pipedream_max_states = PipeDreamOptions{}.max_states;
  bool straight = false;
  bool use_fewer_machines = false;
  double activation_compression_ratio = 0;
  // Piper.
  KnapsackMode knapsack = KnapsackMode::kExact;
  // AdaPipe: 0 = search.
  int stages = 0;
  int tensor_parallel = 0;
  // AdaPipe: how many parts of each tensor-parallel group hold a mixture's experts whole; 0 =
  // the fastest the profile's variants offer (1 where they have none), N = only variants with
  // N (and so only degrees it divides).
  int expert_parallel = 0;
  // Schedule search (planner/schedule_search.h) over the AdaPipe partition: "" = 1f1b only,
  // "auto" = every schedule, or one schedule name.
  std::string schedule;
  // AdaPipe: the plan is the baseline its summary compares with, Megatron-LM's default
  // (uniform partition, every layer recomputed; UniformFullRecompute) for the pipeline shape
  // AdaPipe chose, so that the two can be run side by side. 1F1B only (no schedule search).
  bool adapipe_baseline = false;
  nlohmann::json inputs = nlohmann::json::object();  // provenance, copied into the plan
  // How the error for a plan that fits no memory names the flag that would make it fit, given
  // the smallest memory per device that does: `tandem plan`'s "--memory BYTES" when unset.
  std::function<std::string(double bytes)> memory_flag_hint;
};

struct PlanOutcome {
  pipeline::Plan plan;
  std::string summary;  // readable table (includes `notes`)
  // Lines the user should see whatever the output format (which search ran, when it is not
  // the algorithm's own); `tandem plan` prints them on stderr when stdout carries JSON.
  std::string notes;
  double planning_seconds = 0;
};

// InvalidArgument for bad requests; ResourceExhausted (with the smallest memory per device
// that would fit, where one exists) when no plan fits.
absl::StatusOr<PlanOutcome> MakePlan(const PlanRequest& request);

}  // namespace tandem::planner
