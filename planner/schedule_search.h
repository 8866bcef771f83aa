// Schedule and micro-batch choice: for one pipeline shape (p ranks, a batch of samples per
// pipeline), try each schedule (1F1B, interleaved, Chimera, Hanayo, ZB-H1) and micro-batch
// size, partition the layers into the schedule's stages, time the generated programs with the
// simulator and count each rank's memory: the weights (with gradients and optimizer state) of
// every stage it holds (Chimera: both pipelines' copies; interleaved: all its chunks) plus its
// simulated peak of stashed activations. The fastest candidate that fits wins.
//
// Per candidate, the layers are split into the schedule's NumStages() stages minimising the
// slowest stage; two recomputation variants are tried, none and every layer (plus, when given,
// a fixed partition with per-stage recomputation such as AdaPipe's, for 1F1B and ZB-H1, whose
// activation memory is 1F1B's). Changing the micro-batch size scales times and activation
// bytes linearly from the profiled size (an approximation: small micro-batches run kernels less
// efficiently); the p2p latency then penalises many small micro-batches.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule.h"
#include "planner/layer_chain.h"

namespace tandem::planner {

struct FixedPartition {
  std::vector<int> stage_ends;                  // end layer of each of p stages
  std::vector<std::vector<int>> recompute;      // layers recomputed per stage
  std::string name = "given";
};

struct ScheduleSearchOptions {
  int ranks = 1;                        // p
  int64_t samples_per_pipeline = 1;     // micro-batch size x micro-batches
  int64_t profiled_microbatch_size = 1; // the profile's micro-batch size
  std::vector<int64_t> microbatch_sizes;  // candidates; empty = the profiled size only
  double memory_bytes = 0;                // per device; 0 = unlimited
  double p2p_bandwidth_bytes_per_second = 0;
  double p2p_latency_seconds = 0;
  std::vector<pipeline::ScheduleKind> kinds = {
      pipeline::ScheduleKind::k1F1B, pipeline::ScheduleKind::kInterleaved,
      pipeline::ScheduleKind::kChimera, pipeline::ScheduleKind::kHanayo,
      pipeline::ScheduleKind::kZBH1, pipeline::ScheduleKind::kDualPipe,
      pipeline::ScheduleKind::kDualPipeV};
  std::vector<int> interleaved_chunks = {2, 4};
  std::vector<int> hanayo_waves = {1, 2};
  std::vector<FixedPartition> fixed_partitions;  // tried with 1F1B and ZB-H1
};

struct ScheduleEvaluation {
  pipeline::ScheduleSpec spec;
  int64_t microbatch_size = 1;
  std::string partition;  // "balanced", "balanced+recompute" or a fixed partition's name
  std::vector<int> stage_ends;                // one per schedule stage
  std::vector<std::vector<int>> recompute;    // per schedule stage
  std::vector<double> stage_seconds;          // per-micro-batch compute per stage
  std::vector<double> rank_memory_bytes;      // per rank: weights + peak activations
  double makespan_seconds = 0;
  double peak_memory_bytes = 0;
  bool fits = false;
  std::string skipped;  // why the candidate could not be built (empty when evaluated)
};

struct ScheduleSearchResult {
  ScheduleEvaluation best;
  std::vector<ScheduleEvaluation> evaluated;  // every candidate, in the order tried
};

// ResourceExhausted naming the smallest peak memory seen when no candidate fits.
absl::StatusOr<ScheduleSearchResult> SearchSchedules(const LayerChain& chain,
                                                     const ScheduleSearchOptions& options);

// Contiguous split of the chain into `stages` stages minimising the slowest stage's forward +
// backward (+ recomputation when `recompute_all`); returns the end layer of each stage.
std::vector<int> BalancedPartition(const LayerChain& chain, int stages, bool recompute_all);

}  // namespace tandem::planner
