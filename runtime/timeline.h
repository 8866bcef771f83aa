// Timelines of what ran beside what the simulator predicts.
//
// The engine records one Chrome-trace process per world rank (lanes compute, send, receive,
// sync; every event carries args iteration, stage, microbatch, replica and type) and
// Engine::GatherTimeline merges them on rank 0. The engine also keeps typed timings of every
// action (ActionTiming, gathered by Engine::GatherTimings). The helpers here measure
// per-stage costs from those timings (compute, and the optimizer step with the gradient
// synchronisation it waits for), simulate the same schedule with those costs, and add the
// prediction as extra processes ("predicted: position q") aligned with the measured
// iteration, so Perfetto shows the schedule as it ran above the schedule as simulated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/trace.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace tandem::runtime {

// First pid of the predicted processes: far above any world rank of a test or demo.
inline constexpr int kPredictionPidOffset = 100000;

// When one action of a rank's program ran (seconds since the engine's epoch, which all ranks
// take right after a world barrier at creation).
struct ActionTiming {
  pipeline::Action action;
  double start_seconds = 0;
  double end_seconds = 0;
};
// Timings of every rank (index: world rank), one or more iterations each, in program order.
using WorldTimings = std::vector<std::vector<ActionTiming>>;

// From measured timings: the mean forward / backward (or input-gradient) / weight-gradient
// time per stage, and optimizer_seconds, the tail of an iteration after the last backward:
// per iteration, the optimizer step of the rank that reached it last (it waits for that
// stage's gradient synchronisation, agrees on the loss and norm with every rank and updates
// the parameters), averaged over iterations. The simulator adds it after every rank's work, so
// the prediction covers the whole iteration. NotFound if a stage has no forward or backward.
absl::StatusOr<pipeline::CostModel> MeasuredCosts(const WorldTimings& timings,
                                                  const pipeline::ScheduleSpec& spec);

// Start and end over all ranks' timings. NotFound if there are none.
struct TimeRange {
  double start_seconds = 0;
  double end_seconds = 0;
};
absl::StatusOr<TimeRange> IterationRange(const WorldTimings& timings);

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
