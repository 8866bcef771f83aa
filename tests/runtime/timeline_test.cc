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

TEST(TimelineTest, MeasuredCostsAverageEachStage) {
  pipeline::ScheduleSpec spec;
  spec.kind = pipeline::ScheduleKind::k1F1B;
  spec.num_ranks = 2;
  spec.num_microbatches = 2;
  ChromeTrace trace;
  trace.Add(Compute("F", 0, 0, 0.0, 0.010));
  trace.Add(Compute("F", 0, 0, 0.1, 0.030));
  trace.Add(Compute("B", 0, 0, 0.2, 0.040));
  trace.Add(Compute("F", 1, 0, 0.0, 0.005));
  trace.Add(Compute("B", 1, 0, 0.2, 0.015));
  trace.Add(Compute("F", 1, 1, 5.0, 1.0));  // another iteration
  auto costs = MeasuredCosts(trace, spec, /*iteration=*/0);
  ASSERT_TRUE(costs.ok()) << costs.status();
  EXPECT_DOUBLE_EQ(costs->stages[0].forward_seconds, 0.020);
  EXPECT_DOUBLE_EQ(costs->stages[0].backward_seconds, 0.040);
  EXPECT_DOUBLE_EQ(costs->stages[1].forward_seconds, 0.005);
  auto all = MeasuredCosts(trace, spec);
  ASSERT_TRUE(all.ok());
  EXPECT_DOUBLE_EQ(all->stages[1].forward_seconds, (0.005 + 1.0) / 2);

  auto range = IterationRange(trace, 0);
  ASSERT_TRUE(range.ok());
  EXPECT_DOUBLE_EQ(range->start_seconds, 0.0);
  EXPECT_DOUBLE_EQ(range->end_seconds, 0.24);
  EXPECT_EQ(IterationRange(trace, 7).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SelectIteration(trace, 1).events().size(), 1u);

  ChromeTrace missing;
  missing.Add(Compute("F", 0, 0, 0, 1));
  EXPECT_EQ(MeasuredCosts(missing, spec).status().code(), absl::StatusCode::kNotFound);
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
