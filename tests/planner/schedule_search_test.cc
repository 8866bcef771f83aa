// Schedule and micro-batch choice: the simulator-timed search picks the fastest candidate that
// fits, counts each schedule's weight copies, and falls back to leaner candidates under
// memory pressure.
#include "planner/schedule_search.h"

#include <limits>

#include "gtest/gtest.h"
#include "planner/layer_chain.h"

namespace tandem::planner {
namespace {

// `layers` identical layers: forward 1 s, backward 2 s, 10 bytes stashed, 100 bytes of
// weights (with optimizer state), recomputation keeps 1 byte.
LayerChain Uniform(int layers, double optimizer_seconds = 0) {
  pipeline::Profile profile;
  for (int i = 0; i < layers; ++i) {
    pipeline::LayerProfile layer;
    layer.name = "l" + std::to_string(i);
    layer.forward_seconds = 1;
    layer.backward_seconds = 2;
    layer.stashed_activation_bytes = 10;
    layer.parameter_bytes = 25;
    layer.optimizer_state_bytes = 50;
    layer.recompute_seconds = 1;
    layer.recompute_stashed_bytes = 1;
    layer.optimizer_seconds = optimizer_seconds;
    profile.layers.push_back(layer);
  }
  return *LayerChain::FromProfile(profile);
}

TEST(ScheduleSearch, PicksTheFastestCandidateThatFits) {
  const LayerChain chain = Uniform(16);
  ScheduleSearchOptions options;
  options.ranks = 4;
  options.samples_per_pipeline = 8;
  auto result = SearchSchedules(chain, options);
  ASSERT_TRUE(result.ok()) << result.status();
  double fastest = std::numeric_limits<double>::infinity();
  double one_f_one_b = 0;
  for (const ScheduleEvaluation& e : result->evaluated) {
    if (!e.skipped.empty() || !e.fits) continue;
    fastest = std::min(fastest, e.makespan_seconds);
    if (e.spec.kind == pipeline::ScheduleKind::k1F1B && e.partition == "balanced") {
      one_f_one_b = e.makespan_seconds;
    }
  }
  EXPECT_DOUBLE_EQ(result->best.makespan_seconds, fastest);
  // 16 layers of 3 s on 4 ranks, 8 micro-batches: 1F1B takes (8 + 3) * 12 s.
  EXPECT_DOUBLE_EQ(one_f_one_b, 11 * 12.0);
  // Something beats plain 1F1B (interleaving or zero-bubble) when memory is unlimited.
  EXPECT_LT(result->best.makespan_seconds, one_f_one_b);
}

// The profile's optimizer step per layer ends every iteration: a stage of four layers adds
// four steps to 1F1B's makespan, and Chimera's ranks (two stages each) twice that.
TEST(ScheduleSearch, OptimizerStepEndsTheIteration) {
  ScheduleSearchOptions options;
  options.ranks = 4;
  options.samples_per_pipeline = 8;
  options.kinds = {pipeline::ScheduleKind::k1F1B, pipeline::ScheduleKind::kChimera};
  auto without = SearchSchedules(Uniform(16), options);
  auto with = SearchSchedules(Uniform(16, /*optimizer_seconds=*/0.5), options);
  ASSERT_TRUE(without.ok() && with.ok());
  auto makespan = [](const ScheduleSearchResult& r, pipeline::ScheduleKind kind) {
    for (const ScheduleEvaluation& e : r.evaluated) {
      if (e.spec.kind == kind && e.partition == "balanced" && e.skipped.empty()) {
        return e.makespan_seconds;
      }
    }
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(makespan(*with, pipeline::ScheduleKind::k1F1B),
                   makespan(*without, pipeline::ScheduleKind::k1F1B) + 4 * 0.5);
  EXPECT_DOUBLE_EQ(makespan(*with, pipeline::ScheduleKind::kChimera),
                   makespan(*without, pipeline::ScheduleKind::kChimera) + 8 * 0.5);
}

TEST(ScheduleSearch, CountsChimerasTwoWeightCopies) {
  const LayerChain chain = Uniform(16);
  ScheduleSearchOptions options;
  options.ranks = 4;
  options.samples_per_pipeline = 8;
  options.kinds = {pipeline::ScheduleKind::k1F1B, pipeline::ScheduleKind::kChimera};
  auto result = SearchSchedules(chain, options);
  ASSERT_TRUE(result.ok()) << result.status();
  double weights_1f1b = 0, weights_chimera = 0;
  for (const ScheduleEvaluation& e : result->evaluated) {
    if (e.partition != "balanced" || !e.skipped.empty()) continue;
    // Four layers per stage, 100 bytes of weights each (2 x 25 + 50).
    const double activations_rank0 = e.rank_memory_bytes[0];
    if (e.spec.kind == pipeline::ScheduleKind::k1F1B) weights_1f1b = activations_rank0;
    if (e.spec.kind == pipeline::ScheduleKind::kChimera) weights_chimera = activations_rank0;
  }
  // 1F1B rank 0: 400 bytes of weights + 4 micro-batches x 40 bytes.
  EXPECT_DOUBLE_EQ(weights_1f1b, 400 + 4 * 40);
  // Chimera rank 0 holds stage 0 of one pipeline and stage 3 of the other: 800 bytes of
  // weights at least.
  EXPECT_GE(weights_chimera, 800);
}

TEST(ScheduleSearch, TightMemoryForcesRecomputationOrFails) {
  const LayerChain chain = Uniform(16);
  ScheduleSearchOptions options;
  options.ranks = 4;
  options.samples_per_pipeline = 8;
  // 1F1B without recomputation needs 560 bytes on rank 0; with it 400 + 4 x 4.
  options.memory_bytes = 450;
  auto result = SearchSchedules(chain, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->best.fits);
  EXPECT_LE(result->best.peak_memory_bytes, 450);
  EXPECT_EQ(result->best.partition, "balanced+recompute");
  options.memory_bytes = 300;  // the weights alone do not fit
  auto none = SearchSchedules(chain, options);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ScheduleSearch, LatencyMakesTinyMicroBatchesLoseAndMemoryMakesHugeOnesLose) {
  const LayerChain chain = Uniform(8);
  ScheduleSearchOptions options;
  options.ranks = 4;
  options.kinds = {pipeline::ScheduleKind::k1F1B};
  options.samples_per_pipeline = 64;
  options.profiled_microbatch_size = 4;
  options.microbatch_sizes = {1, 2, 4, 8, 16, 32, 64};
  options.p2p_latency_seconds = 2.0;
  auto result = SearchSchedules(chain, options);
  ASSERT_TRUE(result.ok()) << result.status();
  // With a large latency per transfer, neither extreme is best.
  EXPECT_GT(result->best.microbatch_size, 1);
  EXPECT_LT(result->best.microbatch_size, 64);
  // Memory for activations of big micro-batches rules them out.
  options.memory_bytes = 400;
  auto tight = SearchSchedules(chain, options);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_LE(tight->best.peak_memory_bytes, 400);
  EXPECT_LE(tight->best.microbatch_size, result->best.microbatch_size);
}

TEST(ScheduleSearch, BalancedPartitionMinimisesTheSlowestStage) {
  pipeline::Profile profile;
  for (int i = 0; i < 6; ++i) {
    pipeline::LayerProfile layer;
    layer.name = "l" + std::to_string(i);
    layer.forward_seconds = i + 1;
    profile.layers.push_back(layer);
  }
  const LayerChain chain = *LayerChain::FromProfile(profile);
  EXPECT_EQ(BalancedPartition(chain, 3, false), (std::vector<int>{3, 5, 6}));
}

}  // namespace
}  // namespace tandem::planner
