#include "runtime/timeline.h"

#include "gtest/gtest.h"
#include "pipeline/generators.h"

namespace tandem::runtime {
namespace {

TraceEvent Compute(const std::string& type, int stage, int64_t iteration, double start,
                   double duration) {
  TraceEvent e;
  e.name = type + std::to_string(stage);
  e.pid = stage;
  e.start_seconds = start;
  e.duration_seconds = duration;
  e.args = {{"iteration", iteration}, {"stage", stage}, {"type", type}};
  return e;
}

ActionTiming Timed(pipeline::ActionType type, int stage, double start, double duration) {
  ActionTiming t;
  t.action.type = type;
  t.action.stage = stage;
  t.start_seconds = start;
  t.end_seconds = start + duration;
  return t;
}

TEST(TimelineTest, MeasuredCostsAverageEachStageAndTakeTheLastOptimizerStep) {
  using pipeline::ActionType;
  pipeline::ScheduleSpec spec;
  spec.kind = pipeline::ScheduleKind::k1F1B;
  spec.num_ranks = 2;
  spec.num_microbatches = 2;
  WorldTimings timings(2);
  timings[0] = {Timed(ActionType::kForward, 0, 0.0, 0.010),
                Timed(ActionType::kForward, 0, 0.1, 0.030),
                Timed(ActionType::kBackward, 0, 0.2, 0.040),
                // Rank 0 reaches its step first and waits there for rank 1.
                Timed(ActionType::kOptimizerStep, -1, 0.25, 0.050)};
  timings[1] = {Timed(ActionType::kForward, 1, 0.0, 0.005),
                Timed(ActionType::kBackward, 1, 0.2, 0.015),
                Timed(ActionType::kOptimizerStep, -1, 0.28, 0.020)};
  auto costs = MeasuredCosts(timings, spec);
  ASSERT_TRUE(costs.ok()) << costs.status();
  EXPECT_DOUBLE_EQ(costs->stages[0].forward_seconds, 0.020);
  EXPECT_DOUBLE_EQ(costs->stages[0].backward_seconds, 0.040);
  EXPECT_DOUBLE_EQ(costs->stages[1].forward_seconds, 0.005);
  // The tail is the step of the rank that arrived last (rank 1), not rank 0's wait.
  EXPECT_NEAR(costs->optimizer_seconds, 0.020, 1e-12);

  // Two iterations concatenated: means over both, the tail averaged per iteration.
  WorldTimings two = timings;
  for (int r = 0; r < 2; ++r) {
    for (ActionTiming t : timings[r]) {
      t.start_seconds += 1.0;
      t.end_seconds += 1.0 + (t.action.type == ActionType::kOptimizerStep ? 0.010 : 0.0);
      two[r].push_back(t);
    }
  }
  auto both = MeasuredCosts(two, spec);
  ASSERT_TRUE(both.ok());
  EXPECT_NEAR(both->optimizer_seconds, 0.025, 1e-12);

  auto range = IterationRange(timings);
  ASSERT_TRUE(range.ok());
  EXPECT_DOUBLE_EQ(range->start_seconds, 0.0);
  EXPECT_DOUBLE_EQ(range->end_seconds, 0.30);
  EXPECT_EQ(IterationRange(WorldTimings(2)).status().code(), absl::StatusCode::kNotFound);

  WorldTimings missing(1);
  missing[0] = {Timed(ActionType::kForward, 0, 0, 1)};
  EXPECT_EQ(MeasuredCosts(missing, spec).status().code(), absl::StatusCode::kNotFound);
}

TEST(TimelineTest, SelectIterationKeepsOneIteration) {
  ChromeTrace trace;
  trace.Add(Compute("F", 0, 0, 0.0, 0.010));
  trace.Add(Compute("F", 1, 1, 5.0, 1.0));
  EXPECT_EQ(SelectIteration(trace, 1).events().size(), 1u);
}

TEST(TimelineTest, PredictionIsShiftedBesideTheMeasurement) {
  pipeline::ScheduleSpec spec;
  spec.kind = pipeline::ScheduleKind::kGPipe;
  spec.num_ranks = 2;
  spec.num_microbatches = 3;
  auto schedule = pipeline::GenerateSchedule(spec);
  ASSERT_TRUE(schedule.ok());
  ChromeTrace trace;
  auto result = AddPrediction(*schedule, pipeline::CostModel::Uniform(spec, 1.0, 2.0),
                              /*start_seconds=*/10.0, &trace);
  ASSERT_TRUE(result.ok()) << result.status();
  // GPipe, p=2, m=3, F=1, B=2: (m + p - 1) * (F + B) = 12.
  EXPECT_DOUBLE_EQ(result->makespan_seconds, 12.0);
  double first = 1e9, last = 0;
  for (const TraceEvent& e : trace.events()) {
    EXPECT_GE(e.pid, kPredictionPidOffset);
    first = std::min(first, e.start_seconds);
    last = std::max(last, e.start_seconds + e.duration_seconds);
  }
  EXPECT_DOUBLE_EQ(first, 10.0);
  EXPECT_DOUBLE_EQ(last, 22.0);
}

}  // namespace
}  // namespace tandem::runtime
