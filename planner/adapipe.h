// AdaPipe (Sun et al., ASPLOS 2024): per-stage adaptive recomputation chosen jointly with the
// partition.
//
// Model (1F1B): stage i of p (0-based) holds the stashed activations of up to p - i
// micro-batches, so early stages need more recomputation than late ones. A stage [a, b) at
// position i needs
//     memory = sum (2 * parameter_bytes + optimizer_state_bytes)           (weights, grads,
//              + (p - i) * sum over layers (recomputed ? recompute_stashed : stashed) state)
// and takes  T = sum (forward + backward) + sum over recomputed layers recompute_seconds.
// For every (a, b, p - i) the cheapest set of layers to recompute that fits `memory_bytes`
// is a knapsack (planner/knapsack.h, exact); the partition minimising the slowest stage is a
// dynamic program over (stages, first layers) on top, O(p L^2) knapsacks, each cached by
// (a, b, in-flight count) so that trying several pipeline depths reuses them.
// Layers are whatever the profile lists: a profile that splits a transformer layer into
// attention and MLP parts lets AdaPipe recompute one part without the other.
//
// Predicted iteration time (1F1B, m micro-batches): (m - 1) * max_i T_i + sum_i T_i, plus the
// activation and gradient transfers of one micro-batch across every stage boundary.
#pragma once

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/knapsack.h"
#include "planner/layer_chain.h"

namespace tandem::planner {

struct AdaPipeOptions {
  int stages = 1;            // p
  int microbatches = 1;      // m per pipeline per iteration
  double memory_bytes = 0;   // per device; 0 = unlimited
  bool allow_recompute = true;
  double p2p_bandwidth_bytes_per_second = 0;  // 0 = transfers not counted
};

struct AdaPipeStage {
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  int in_flight = 1;    // micro-batches stashed at peak (p - i)
  std::vector<int> recompute_layers;
  double seconds = 0;       // forward + backward + recomputation of one micro-batch
  double memory_bytes = 0;  // peak per device
};

struct AdaPipeResult {
  double bottleneck_seconds = 0;
  double iteration_seconds = 0;
  std::vector<AdaPipeStage> stages;
  bool exact = true;  // false if a knapsack search hit its node budget
};

// Plans over one layer chain for several pipeline depths, reusing per-stage knapsacks. The
// chain's layers are per device (take tensor-parallel variants first, see
// ProfileAtTensorParallel).
class AdaPipePlanner {
 public:
  AdaPipePlanner(const LayerChain& chain, double memory_bytes, bool allow_recompute = true);

  // Largest table of stage costs Plan keeps: (layers + 1)^2 x (stages + 1) entries of 8 bytes.
  static constexpr double kMaxCacheBytes = 2.0 * (int64_t{1} << 30);

  // ResourceExhausted when no partition into `stages` stages fits; OutOfRange when the search
  // would keep more than kMaxCacheBytes of stage costs (naming the size). With `replicas` > 1 every
  // stage runs on that many data-parallel devices taking turns with micro-batches, so stage i
  // holds ceil((p - i) / replicas) of them (pipeline templates use this).
  absl::StatusOr<AdaPipeResult> Plan(int stages, int microbatches,
                                     double p2p_bandwidth_bytes_per_second, int replicas = 1);

  // A stage [first, end) holding `in_flight` micro-batches: cheapest recomputation that fits
  // (infinite seconds when nothing fits). Exposed for tests and baselines.
  AdaPipeStage CostStage(int first, int end, int in_flight);

  // Iteration time of stages (1F1B estimate above).
  double IterationSeconds(const std::vector<AdaPipeStage>& stages, int microbatches,
                          double p2p_bandwidth_bytes_per_second) const;

 private:
  double StageSeconds(int first, int end, int in_flight);
  double StaticBytes(int first, int end) const;

  const LayerChain& chain_;
  double memory_bytes_;
  bool allow_recompute_;
  int max_in_flight_ = 0;
  std::vector<double> cache_;  // [(first * (L+1) + end) * (max_in_flight+1) + in_flight]
  CoverSolver solver_{KnapsackMode::kExact};
  std::vector<SwitchOption> items_;
  bool exact_ = true;
};

absl::StatusOr<AdaPipeResult> RunAdaPipe(const LayerChain& chain, const AdaPipeOptions& options);

// Megatron-LM's default layout for comparison: the middle layers split evenly (the first
// stages take one more when they do not divide), the first layer (embedding) with the first
// stage and the last (head) with the last stage, every layer recomputed.
// ResourceExhausted when it does not fit.
absl::StatusOr<AdaPipeResult> UniformFullRecompute(const LayerChain& chain,
                                                   const AdaPipeOptions& options);

// The profile as seen by one device of a tensor-parallel group of degree t: every layer takes
// its variant of degree t (time includes its communication; optimizer state and recompute
// figures scale with the variant; a sequence-parallel variant also divides the stage-boundary
// bytes and a recomputed layer's kept input by t). `sequence_parallel`: the variants that run
// with sequence parallelism (true) or without (false), where a profile has both; unset: the
// last variant of degree t each layer lists. `expert_parallel`: the variants that place a
// mixture's experts on that many parts of the group (1: split over all of it). InvalidArgument
// naming the first layer without one.
absl::StatusOr<pipeline::Profile> ProfileAtTensorParallel(
    const pipeline::Profile& profile, int degree,
    std::optional<bool> sequence_parallel = std::nullopt, int expert_parallel = 1);

}  // namespace tandem::planner
