// The elastic trainer's pure parts (elastic/trainer.h): pipelines from an elastic plan, the
// gradient segments that tie pipelines of different shapes together, and the encoding of
// moved state. The trainer itself runs in elastic_train_test (real processes, real kills).
#include "elastic/trainer.h"

#include "gtest/gtest.h"

namespace tandem::elastic {
namespace {

// A plan by hand: pipeline 0 on ranks 0 (layers [0,3)) and 1 ([3,6)), 5 micro-batches;
// pipeline 1 with a stage of two devices: ranks 2 and 3 hold [0,6), 3 micro-batches.
ElasticPlan HandPlan() {
  ElasticPlan plan;
  plan.instantiation.global_microbatches = 8;
  PipelineRanks a;
  a.microbatches = 5;
  a.stages = {{{0, 3}, {0}}, {{3, 6}, {1}}};
  PipelineRanks b;
  b.microbatches = 3;
  b.stages = {{{0, 6}, {2, 3}}};
  plan.assignment.pipelines = {a, b};
  return plan;
}

TEST(LayoutFromPlanTest, SplitsWideStagesIntoPipelinesAndKeepsTheGlobalBatch) {
  auto layout = LayoutFromPlan(HandPlan(), {0, 1, 2, 3, 4});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->pipelines.size(), 3u);
  EXPECT_EQ(layout->pipelines[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(layout->pipelines[0].microbatches, 5);
  EXPECT_EQ(layout->pipelines[0].first_microbatch, 0);
  // Three micro-batches over a stage of two devices: 2 + 1.
  EXPECT_EQ(layout->pipelines[1].ranks, (std::vector<int>{2}));
  EXPECT_EQ(layout->pipelines[1].microbatches, 2);
  EXPECT_EQ(layout->pipelines[1].first_microbatch, 5);
  EXPECT_EQ(layout->pipelines[2].ranks, (std::vector<int>{3}));
  EXPECT_EQ(layout->pipelines[2].microbatches, 1);
  EXPECT_EQ(layout->pipelines[2].first_microbatch, 7);
  EXPECT_EQ(layout->idle_ranks, (std::vector<int>{4}));
  const HeldLayers held = HeldUnder(*layout);
  EXPECT_EQ(held.at(1), (std::vector<LayerRange>{{3, 6}}));
  EXPECT_EQ(held.count(4), 0u);
}

TEST(LayoutFromPlanTest, APipelineWithoutMicrobatchesLeavesItsRanksIdle) {
  ElasticPlan plan = HandPlan();
  plan.assignment.pipelines[1].microbatches = 1;  // one for two devices
  plan.instantiation.global_microbatches = 6;
  auto layout = LayoutFromPlan(plan, {0, 1, 2, 3});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->pipelines.size(), 2u);
  EXPECT_EQ(layout->idle_ranks, (std::vector<int>{3}));
}

TEST(LayoutFromPlanTest, RefusesAPlanThatLosesMicrobatches) {
  ElasticPlan plan = HandPlan();
  plan.instantiation.global_microbatches = 9;
  EXPECT_FALSE(LayoutFromPlan(plan, {0, 1, 2, 3}).ok());
}

TEST(LayoutFromPlanTest, TensorParallelGroupsAreNamedByTheirFirstRank) {
  // The plan's devices are groups of two ranks: 0 = {0, 1}, 2 = {2, 3}, 4 = {4, 5}, 6 = {6, 7}.
  ElasticPlan plan;
  plan.instantiation.global_microbatches = 4;
  PipelineRanks a;
  a.microbatches = 4;
  a.stages = {{{0, 3}, {0}}, {{3, 6}, {4}}};
  plan.assignment.pipelines = {a};
  auto layout = LayoutFromPlan(plan, {0, 1, 2, 3, 4, 5, 7}, 2);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->tensor_parallel, 2);
  EXPECT_EQ(layout->pipelines[0].ranks, (std::vector<int>{0, 4}));
  // The unused group's ranks and a lone survivor of a broken group are idle.
  EXPECT_EQ(layout->idle_ranks, (std::vector<int>{2, 3, 7}));
  EXPECT_EQ(Describe(*layout).substr(0, 60),
            "1 pipeline(s) of tensor-parallel groups of 2: r0-1[0,3) > r4");
  a.stages[1].ranks = {3};  // not the first rank of a group
  plan.assignment.pipelines = {a};
  EXPECT_FALSE(LayoutFromPlan(plan, {0, 1, 2, 3}, 2).ok());
}

TEST(GradientSegmentsTest, RunsOfLayersWithTheSameHolders) {
  auto layout = LayoutFromPlan(HandPlan(), {0, 1, 2, 3});
  ASSERT_TRUE(layout.ok());
  auto segments = GradientSegments(*layout, 6);
  ASSERT_TRUE(segments.ok()) << segments.status();
  ASSERT_EQ(segments->size(), 2u);
  EXPECT_EQ((*segments)[0].layers, (LayerRange{0, 3}));
  EXPECT_EQ((*segments)[0].ranks, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ((*segments)[1].layers, (LayerRange{3, 6}));
  EXPECT_EQ((*segments)[1].ranks, (std::vector<int>{1, 2, 3}));
  // A layer nobody holds.
  EXPECT_FALSE(GradientSegments(*layout, 7).ok());
}

TEST(StateEncodingTest, RoundTripsValuesAndOptimizerState) {
  runtime::ParameterState a;
  a.name = "layers.3.weight";
  a.value = {1.5f, -2.0f, 3.25f};
  a.optimizer.steps = 7;
  a.optimizer.buffers = {{"exp_avg", {0.1f, 0.2f, 0.3f}}, {"exp_avg_sq", {1, 2, 3}}};
  runtime::ParameterState b;
  b.name = "layers.3.bias";
  b.value = {4};
  auto decoded = DecodeState(EncodeState({a, b}));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 2u);
  EXPECT_EQ((*decoded)[0].name, a.name);
  EXPECT_EQ((*decoded)[0].value, a.value);
  EXPECT_EQ((*decoded)[0].optimizer.steps, 7);
  EXPECT_EQ((*decoded)[0].optimizer.buffers, a.optimizer.buffers);
  EXPECT_EQ((*decoded)[1].value, b.value);
  std::string truncated = EncodeState({a});
  truncated.pop_back();
  EXPECT_FALSE(DecodeState(truncated).ok());
}

TEST(LayerOfParameterTest, ReadsTheLayerIndex) {
  EXPECT_EQ(*LayerOfParameter("layers.12.attn.weight"), 12);
  EXPECT_FALSE(LayerOfParameter("weight").ok());
  EXPECT_FALSE(LayerOfParameter("layers.x.weight").ok());
}

}  // namespace
}  // namespace tandem::elastic
