// Discrete-event timing of a schedule's programs.
//
// Compute actions take their stage's cost; a send is non-blocking and its data arrives
// latency + bytes / bandwidth after it is issued (zero when ranks are equal); a receive waits
// for that arrival. GradientSync starts an asynchronous synchronisation of its stage that
// takes `grad_sync_seconds[stage]`; OptimizerStep waits for all of the rank's syncs and takes
// `optimizer_seconds`. The result is what the runtime should measure for the same costs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/trace.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline {

// Cost of one stage (one chunk with interleaving/waves) for one micro-batch, in seconds.
struct StageCost {
  double forward_seconds = 0;
  double backward_seconds = 0;  // full backward; or the input-gradient part if weight > 0
  double weight_seconds = 0;    // weight-gradient part; 0 = not split in the costs
  double activation_bytes = 0;  // output bytes crossing to the next stage (and its gradient)
  // Activation memory stashed per micro-batch, in units of one p-th of the model's
  // activation for one micro-batch (1 for a plain stage, 1/v for a chunk). Used for peaks.
  double stash_units = 1;
};

struct CostModel {
  std::vector<StageCost> stages;  // one per stage of the pipeline (size = NumStages())
  double p2p_latency_seconds = 0;
  double p2p_bandwidth_bytes_per_second = 0;  // 0 = infinite
  std::vector<double> grad_sync_seconds;      // per stage; empty = 0
  double optimizer_seconds = 0;

  // Uniform costs for one full stage (1/p of the model) split over the schedule's chunks:
  // each of NumStages() stages gets forward * p / NumStages(), etc. As `tandem schedule`
  // --forward/--backward/--weight.
  static CostModel Uniform(const ScheduleSpec& spec, double forward, double backward,
                           double weight = 0);
};

struct SimulationResult {
  double makespan_seconds = 0;
  std::vector<double> busy_seconds;  // per rank: compute time
  std::vector<double> idle_seconds;  // per rank: makespan - busy
  double bubble_ratio = 0;           // 1 - sum(busy) / (ranks * makespan)
  // Peak stashed activations per rank in units of one p-th of the model's activation for one
  // micro-batch (a forward adds its stage's stash_units, the matching backward (or W when
  // split) frees them).
  std::vector<double> peak_activations;
  int64_t simulated_actions = 0;
  ChromeTrace trace;  // filled when SimulationOptions::record_trace
};

struct SimulationOptions {
  bool record_trace = false;
};

// InvalidArgument when costs do not match the schedule; FailedPrecondition on a deadlock.
absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const CostModel& costs,
                                          const SimulationOptions& options = {});

// SVG Gantt chart of a recorded trace (one row per rank).
std::string RenderSvgGantt(const SimulationResult& result, int num_ranks);

}  // namespace tandem::pipeline
