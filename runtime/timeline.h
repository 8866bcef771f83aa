// Timelines of what ran beside what the simulator predicts.
//
// The engine records one Chrome-trace process per world rank (lanes compute, send, receive,
// sync; every event carries args iteration, stage, microbatch, replica and type) and
// Engine::GatherTimeline merges them on rank 0. The helpers here measure per-stage compute
// costs in such a timeline, simulate the same schedule with those costs, and add the
// prediction as extra processes ("predicted: position q") aligned with the measured
// iteration, so Perfetto shows the schedule as it ran above the schedule as simulated.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/trace.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace tandem::runtime {

// First pid of the predicted processes: far above any world rank of a test or demo.
inline constexpr int kPredictionPidOffset = 100000;

// Mean forward / backward (or input-gradient) / weight-gradient time per stage over the
// events of `iteration` (-1: all iterations). NotFound if a stage has no forward or backward.
absl::StatusOr<pipeline::CostModel> MeasuredCosts(const ChromeTrace& trace,
                                                  const pipeline::ScheduleSpec& spec,
                                                  int64_t iteration = -1);

// Start and end of `iteration` over all ranks' events. NotFound if it has none.
struct TimeRange {
  double start_seconds = 0;
  double end_seconds = 0;
};
absl::StatusOr<TimeRange> IterationRange(const ChromeTrace& trace, int64_t iteration);

// Simulates `schedule` under `costs` and appends its timeline to `trace` as processes
// kPredictionPidOffset + q named "predicted: position q", shifted to begin at
// `start_seconds`. Returns the simulation (makespan, bubble).
absl::StatusOr<pipeline::SimulationResult> AddPrediction(const pipeline::Schedule& schedule,
                                                         const pipeline::CostModel& costs,
                                                         double start_seconds,
                                                         ChromeTrace* trace);

// Only the events of `iteration` (and every process/thread name) of `trace`.
ChromeTrace SelectIteration(const ChromeTrace& trace, int64_t iteration);

}  // namespace tandem::runtime
