// Piper (Tarnawski et al., NeurIPS 2021): the two-level dynamic program that splits a model
// into pipeline stages and gives every stage its own data-parallel degree d and
// tensor-parallel degree t, choosing per layer between stored configurations (e.g. with and
// without activation recomputation) under a per-device memory limit.
//
// Cost model (Piper's): a stage S on t*d devices has load ("time per sample", per
// micro-batch)
//     sum over layers v in S with configuration c:
//        time_per_sample(c) / d
//      + [ 2 * (bytes(u,v) + sync_fw(c,u)) for edges u->v entering S
//        + 2 * (bytes(v,w) + sync_bw(c,w)) for edges v->w leaving S ] / (d * bandwidth)
//      + 4 * (d-1) * parameter_bytes(c) / (d * microbatches_per_batch * bandwidth)
// and memory per device  sum_v A(c) * y + B(c)  with y = ceil(s / d) micro-batches in flight,
// where s is the sum of the data-parallel degrees of S and of every later stage (1F1B).
// d must divide the micro-batches per batch; the sum of all d is at most
// min(microbatches_per_batch, devices). The plan minimises the maximum stage load.
//
// Algorithm (ours, same optimum over contiguous stages): layers are taken in one topological
// order (the importer's, which places every source right before its first consumer) and
// stages are contiguous in it. A search on the load T asks "how few devices cover the layers
// with every stage load <= T?", answered by a dynamic program over (first layer, sum of
// data-parallel degrees of the suffix): for a candidate stage and t, the smallest feasible d
// is the best (fewest devices, most of the degree budget left), so one sweep per (stage, t)
// suffices. Per-stage loads as functions of y come from the knapsack (planner/knapsack.h:
// Piper's greedy or the exact solver). The search starts at a lower bound (total device-time
// over devices) and climbs with growing steps, so that only stages near the optimal load need
// their configurations chosen; an infeasible T also rules out every T below the next load at
// which a stage's in-flight bound changes, which ends the search exactly. The dynamic program
// visits each stage's range of degree sums only where the rest's device count drops.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/knapsack.h"

namespace tandem::planner {

// One stored configuration of a layer at one tensor-parallel degree (Piper's "TMPC").
struct PiperConfig {
  std::string id;              // "vanilla", "activation recomp", ...
  double time_per_sample = 0;  // forward + backward of one micro-batch on the t devices
  double parameter_bytes = 0;  // for the data-parallel resynchronisation cost
  double memory_per_microbatch_bytes = 0;  // A: per micro-batch in flight
  double memory_fixed_bytes = 0;           // B: weights, gradients, optimizer state
  // Extra bytes per incoming edge (keyed by the source node's index) and per outgoing edge
  // (keyed by the destination's index), e.g. tensor-parallel re-layout. Missing = 0.
  std::map<int, double> sync_forward_bytes;
  std::map<int, double> sync_backward_bytes;
};

struct PiperNode {
  std::string name;
  std::map<int, std::vector<PiperConfig>> configs;  // tensor-parallel degree -> configurations
};

struct PiperEdge {
  int source = 0;
  int destination = 0;
  double bytes = 0;
};

// A Piper problem. Nodes are in a topological order (edges go from lower to higher index).
struct PiperInstance {
  std::vector<PiperNode> nodes;
  std::vector<PiperEdge> edges;
  int max_devices = 1;
  double memory_per_device_bytes = 0;
  double bandwidth_bytes_per_second = 0;
  int microbatches_per_batch = 1;
};

// Checks that edges go forward, sync keys name real edges, values are in range.
absl::Status ValidatePiperInstance(const PiperInstance& instance,
                                   absl::string_view source = "piper");

struct PiperOptions {
  KnapsackMode knapsack = KnapsackMode::kExact;
  bool allow_data_parallel = true;
  bool allow_tensor_parallel = true;
};

struct PiperStage {
  int first_node = 0;  // [first_node, end_node) in the instance's order
  int end_node = 0;
  int data_parallel = 1;
  int tensor_parallel = 1;
  int in_flight = 1;                    // y = ceil(s / d)
  std::vector<std::string> config_ids;  // per node of the stage
  double load = 0;                      // time per sample
  double memory_bytes = 0;              // per device
};

struct PiperResult {
  double time_per_sample = 0;  // the maximum stage load
  int devices_used = 0;
  int sum_data_parallel = 0;
  std::vector<PiperStage> stages;
  double planning_seconds = 0;
};

// ResourceExhausted when no partition fits the memory.
absl::StatusOr<PiperResult> RunPiper(const PiperInstance& instance,
                                     const PiperOptions& options = {});

// Whether any plan fits the memory per device on the instance's devices (the load aside): the
// check behind RunPiper's ResourceExhausted, without the search.
absl::StatusOr<bool> PiperFits(const PiperInstance& instance, const PiperOptions& options = {});

// The load and memory of stage [first, end) with degrees (t, d), `in_flight` = y and the
// given configuration index per node of the stage (into instance.nodes[v].configs[t]).
// For tests and baselines; InvalidArgument when a node has no configuration for t.
struct PiperStageCost {
  double load = 0;
  double memory_bytes = 0;
};
absl::StatusOr<PiperStageCost> EvaluatePiperStage(const PiperInstance& instance, int first,
                                                  int end, int tensor_parallel,
                                                  int data_parallel, int in_flight,
                                                  const std::vector<int>& config_indices);

}  // namespace tandem::planner
