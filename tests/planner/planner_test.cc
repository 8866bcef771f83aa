// MakePlan: plans from every algorithm are valid plan.json, carry their provenance and
// predictions, and respect heterogeneous device speeds.
#include "planner/planner.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "planner/importers.h"
#include "tests/planner/test_util.h"

namespace tandem::planner {
namespace {

pipeline::Profile EightLayers() {
  pipeline::Profile profile;
  profile.model = "eight";
  for (int i = 0; i < 8; ++i) {
    pipeline::LayerProfile layer;
    layer.name = "l" + std::to_string(i);
    layer.forward_seconds = 1;
    layer.backward_seconds = 2;
    layer.stashed_activation_bytes = 10;
    layer.parameter_bytes = 10;
    layer.recompute_seconds = 1;
    layer.recompute_stashed_bytes = 1;
    profile.layers.push_back(layer);
  }
  return profile;
}

PlanRequest Request(Algorithm algorithm, int devices) {
  PlanRequest request;
  request.algorithm = algorithm;
  request.profile = EightLayers();
  request.cluster = *MakeCluster(devices, 0, 0, {1e9});
  request.microbatches = 8;
  request.inputs = {{"test", true}};
  return request;
}

TEST(MakePlan, EveryAlgorithmWritesAValidPlan) {
  for (Algorithm algorithm : {Algorithm::kPipeDream, Algorithm::kPiper, Algorithm::kAdaPipe}) {
    auto outcome = MakePlan(Request(algorithm, 4));
    ASSERT_TRUE(outcome.ok()) << AlgorithmName(algorithm) << ": " << outcome.status();
    const pipeline::Plan& plan = outcome->plan;
    EXPECT_TRUE(pipeline::ValidatePlan(plan, -1, 8).ok()) << pipeline::ValidatePlan(plan);
    EXPECT_EQ(plan.algorithm, AlgorithmName(algorithm));
    EXPECT_EQ(plan.inputs["test"], true);
    EXPECT_GT(plan.predicted_iteration_seconds, 0);
    EXPECT_LE(plan.world_size, 4);
    // Identical layers on 4 devices: 2 layers (6 s) per stage, or replicas doing as well.
    auto round_trip = pipeline::PlanFromJson(pipeline::ToJson(plan));
    ASSERT_TRUE(round_trip.ok()) << round_trip.status();
    EXPECT_EQ(*round_trip, plan);
    EXPECT_TRUE(absl::StrContains(outcome->summary, "stage  layers"));
  }
}

TEST(MakePlan, AdaPipeOnFourDevicesIsFourStagesOfTwoLayers) {
  PlanRequest request = Request(Algorithm::kAdaPipe, 4);
  request.stages = 4;
  auto outcome = MakePlan(request);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  const pipeline::Plan& plan = outcome->plan;
  ASSERT_EQ(plan.stages.size(), 4u);
  for (const pipeline::PlanStage& stage : plan.stages) {
    EXPECT_EQ(stage.end_layer - stage.first_layer, 2);
    EXPECT_DOUBLE_EQ(stage.predicted_compute_seconds, 6);
  }
  // 1F1B estimate: (8 - 1) * 6 + 4 * 6.
  EXPECT_DOUBLE_EQ(plan.predicted_iteration_seconds, 7 * 6 + 24);
}

TEST(MakePlan, SlowDevicesSlowEveryPlan) {
  PlanRequest fast = Request(Algorithm::kAdaPipe, 4);
  fast.stages = 4;
  PlanRequest slow = fast;
  slow.cluster.device_speeds = {1, 1, 0.5, 1};
  auto a = MakePlan(fast);
  auto b = MakePlan(slow);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_DOUBLE_EQ(b->plan.predicted_iteration_seconds, 2 * a->plan.predicted_iteration_seconds);
  PlanRequest piper_fast = Request(Algorithm::kPiper, 4);
  PlanRequest piper_slow = piper_fast;
  piper_slow.cluster.device_speeds = {0.5, 0.5, 0.5, 0.5};
  auto c = MakePlan(piper_fast);
  auto d = MakePlan(piper_slow);
  ASSERT_TRUE(c.ok() && d.ok());
  EXPECT_NEAR(d->plan.time_per_sample, 2 * c->plan.time_per_sample,
              1e-9 * c->plan.time_per_sample);
}

TEST(MakePlan, TooLittleMemoryNamesTheSmallestThatFits) {
  PlanRequest request = Request(Algorithm::kAdaPipe, 2);
  request.stages = 2;
  // Each stage holds 4 layers: 80 bytes of weights and gradients, then activations.
  request.cluster.device_memory_bytes = 50;
  auto outcome = MakePlan(request);
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(outcome.status().message(), "smallest memory per device"))
      << outcome.status().message();
  // With full recomputation the first stage needs 80 + 2 x 4 = 88 bytes.
  request.cluster.device_memory_bytes = 88;
  EXPECT_TRUE(MakePlan(request).ok());
  request.cluster.device_memory_bytes = 87;
  EXPECT_FALSE(MakePlan(request).ok());
}

}  // namespace
}  // namespace tandem::planner
