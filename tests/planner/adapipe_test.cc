// AdaPipe: the small examples, brute force over partitions and recomputation sets, and
// the comparison with Megatron-LM's uniform partition with full recomputation on GPT-3.
#include "planner/adapipe.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "planner/gpt_profile.h"
#include "planner/importers.h"
#include "tests/planner/test_util.h"

namespace tandem::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kGB80 = 80e9;

// Six layers taking 1..6 seconds; `memory[i]` is layer i's fixed memory (no activations).
LayerChain SixLayers(const std::vector<double>& memory) {
  pipeline::Profile profile;
  for (int i = 0; i < 6; ++i) {
    pipeline::LayerProfile layer;
    layer.name = "l" + std::to_string(i);
    layer.forward_seconds = i + 1;
    layer.optimizer_state_bytes = memory.empty() ? 0 : memory[i];
    profile.layers.push_back(layer);
  }
  return *LayerChain::FromProfile(profile);
}

TEST(AdaPipe, SixLayersOnThreeStages) {
  const LayerChain chain = SixLayers({});
  auto result = RunAdaPipe(chain, {.stages = 3, .microbatches = 1});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_DOUBLE_EQ(result->bottleneck_seconds, 9);
  ASSERT_EQ(result->stages.size(), 3u);
  EXPECT_EQ(result->stages[0].end_layer, 3);
  EXPECT_EQ(result->stages[1].end_layer, 5);
  EXPECT_EQ(result->stages[2].end_layer, 6);
}

// A search whose table of stage costs would pass the limit is refused at once, naming its
// size (a 20,000-layer chain took 61 s and 21 GB before); a smaller one runs.
TEST(AdaPipe, SearchesBeyondTheTableLimitAreRefusedNamingTheirSize) {
  const LayerChain chain = *LayerChain::FromProfile(testing::UniformProfile(10000));
  AdaPipePlanner planner(chain, /*memory_bytes=*/0);
  auto refused = planner.Plan(/*stages=*/4, /*microbatches=*/8, /*p2p=*/0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("10000 layers in 4 stage(s) would keep"),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(RunAdaPipe(SixLayers({}), {.stages = 3, .microbatches = 1}).ok());
}

TEST(AdaPipe, SixLayersWithMemoryLimit) {
  const LayerChain chain = SixLayers({3, 3, 3, 1, 1, 1});
  auto result = RunAdaPipe(chain, {.stages = 3, .microbatches = 1, .memory_bytes = 6});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_DOUBLE_EQ(result->bottleneck_seconds, 11);
  for (const AdaPipeStage& stage : result->stages) EXPECT_LE(stage.memory_bytes, 6);
}

// Every partition into p stages and, per stage, every set of recomputed layers.
double BruteForce(const LayerChain& chain, int p, double memory) {
  const int n = chain.num_layers();
  double best = kInf;
  std::function<void(int, int, double)> extend = [&](int first, int stage, double worst) {
    if (stage == p) {
      if (first == n) best = std::min(best, worst);
      return;
    }
    const int in_flight = p - stage;
    for (int end = first + 1; end <= n - (p - stage - 1); ++end) {
      double stage_best = kInf;
      const int size = end - first;
      for (int mask = 0; mask < (1 << size); ++mask) {
        double time = 0, bytes = 0;
        for (int i = 0; i < size; ++i) {
          const pipeline::LayerProfile& l = chain.layer(first + i);
          const bool recompute = (mask >> i) & 1;
          time += l.forward_seconds + l.backward_seconds + (recompute ? l.recompute_seconds : 0);
          bytes += 2 * l.parameter_bytes + l.optimizer_state_bytes +
                   in_flight * (recompute ? l.recompute_stashed_bytes
                                          : l.stashed_activation_bytes);
        }
        if (bytes <= memory) stage_best = std::min(stage_best, time);
      }
      extend(end, stage + 1, std::max(worst, stage_best));
    }
  };
  extend(0, 0, 0.0);
  return best;
}

TEST(AdaPipe, MatchesBruteForceOnRandomInstances) {
  std::mt19937 rng(5);
  int feasible = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int layers = 3 + trial % 5;
    pipeline::Profile profile = testing::RandomProfile(layers, &rng);
    // Some layers share savings exactly (the grouped knapsack path).
    if (trial % 2 == 0) {
      for (auto& layer : profile.layers) {
        layer.stashed_activation_bytes = 8;
        layer.recompute_stashed_bytes = 1;
      }
    }
    auto chain = LayerChain::FromProfile(profile);
    ASSERT_TRUE(chain.ok());
    const int p = 1 + trial % std::min(3, layers);
    const double memory = 40 + 10 * (trial % 6);
    const double expected = BruteForce(*chain, p, memory);
    auto result = RunAdaPipe(*chain, {.stages = p, .microbatches = 4, .memory_bytes = memory});
    if (!std::isfinite(expected)) {
      ASSERT_FALSE(result.ok()) << "trial " << trial;
      EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
      continue;
    }
    ASSERT_TRUE(result.ok()) << "trial " << trial << ": " << result.status();
    EXPECT_NEAR(result->bottleneck_seconds, expected, 1e-9) << "trial " << trial;
    EXPECT_TRUE(result->exact);
    for (const AdaPipeStage& stage : result->stages) {
      EXPECT_LE(stage.memory_bytes, memory * (1 + 1e-12)) << "trial " << trial;
    }
    ++feasible;
  }
  EXPECT_GT(feasible, 30);
}

TEST(AdaPipe, EarlyStagesRecomputeMoreOnGpt3) {
  auto profile = ProfileAtTensorParallel(MakeGptProfile(Gpt3Shape(), A100Figures()), 8);
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto chain = LayerChain::FromProfile(*profile);
  ASSERT_TRUE(chain.ok());
  const AdaPipeOptions options{.stages = 8, .microbatches = 64, .memory_bytes = kGB80};
  auto adaptive = RunAdaPipe(*chain, options);
  ASSERT_TRUE(adaptive.ok()) << adaptive.status();
  auto uniform = UniformFullRecompute(*chain, options);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  // Uniform with full recomputation is one of AdaPipe's candidates.
  EXPECT_LT(adaptive->bottleneck_seconds, uniform->bottleneck_seconds);
  EXPECT_LT(adaptive->iteration_seconds, uniform->iteration_seconds);
  const double speedup = uniform->iteration_seconds / adaptive->iteration_seconds;
  EXPECT_GT(speedup, 1.05);
  EXPECT_LT(speedup, 1.34);  // full recomputation costs one extra forward: at most 4/3
  // Recomputed share falls from the first stage to the last.
  auto share = [](const AdaPipeStage& s) {
    return double(s.recompute_layers.size()) / (s.end_layer - s.first_layer);
  };
  EXPECT_GT(share(adaptive->stages.front()), share(adaptive->stages.back()));
  for (const AdaPipeStage& stage : adaptive->stages) EXPECT_LE(stage.memory_bytes, kGB80);
}

// Sequence parallelism (Korthikanti et al. 2022) divides the activations outside the split
// products by t: on 40 GB, where GPT-3 175B must recompute, AdaPipe keeps more and recomputes
// less, and its predicted iteration is shorter; the stage boundaries carry 1/t of the bytes.
TEST(AdaPipe, SequenceParallelismRecomputesLessOnGpt3) {
  GptShape shape = Gpt3Shape();
  auto plain = ProfileAtTensorParallel(MakeGptProfile(shape, A100Figures()), 8);
  shape.sequence_parallel = true;
  auto split = ProfileAtTensorParallel(MakeGptProfile(shape, A100Figures()), 8);
  ASSERT_TRUE(plain.ok() && split.ok());
  const pipeline::LayerProfile& a = plain->layers[1];
  const pipeline::LayerProfile& b = split->layers[1];
  EXPECT_DOUBLE_EQ(b.output_activation_bytes, a.output_activation_bytes / 8);
  EXPECT_DOUBLE_EQ(b.recompute_stashed_bytes, a.recompute_stashed_bytes / 8);
  EXPECT_LT(b.stashed_activation_bytes, a.stashed_activation_bytes);
  EXPECT_DOUBLE_EQ(b.forward_seconds, a.forward_seconds);  // the same bytes move
  const AdaPipeOptions options{.stages = 16, .microbatches = 64, .memory_bytes = 40e9};
  auto plain_chain = LayerChain::FromProfile(*plain);
  auto split_chain = LayerChain::FromProfile(*split);
  ASSERT_TRUE(plain_chain.ok() && split_chain.ok());
  auto without = RunAdaPipe(*plain_chain, options);
  auto with = RunAdaPipe(*split_chain, options);
  ASSERT_TRUE(without.ok()) << without.status();
  ASSERT_TRUE(with.ok()) << with.status();
  auto recomputed = [](const AdaPipeResult& r) {
    size_t n = 0;
    for (const AdaPipeStage& s : r.stages) n += s.recompute_layers.size();
    return n;
  };
  EXPECT_GT(recomputed(*without), 0u);
  EXPECT_LT(recomputed(*with), recomputed(*without));
  EXPECT_LT(with->iteration_seconds, 0.97 * without->iteration_seconds);
}

TEST(AdaPipe, MetisGpt3ProfileNeedsNoRecomputationWhenItFits) {
  auto profile = ReadProfileAs(testing::DataPath("metis/gpt3_a100_tp1_bs1.json"), "metis");
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto chain = LayerChain::FromProfile(*profile);
  ASSERT_TRUE(chain.ok());
  // 10 layer groups on 4 stages with 80 GB: everything fits, plain min-max partition.
  auto roomy = RunAdaPipe(*chain, {.stages = 4, .microbatches = 8, .memory_bytes = kGB80});
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  for (const AdaPipeStage& stage : roomy->stages) EXPECT_TRUE(stage.recompute_layers.empty());
  // With 16 GB the first stage (4 micro-batches in flight) must recompute.
  auto tight = RunAdaPipe(*chain, {.stages = 4, .microbatches = 8, .memory_bytes = 16e9});
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_GE(tight->bottleneck_seconds, roomy->bottleneck_seconds);
  EXPECT_FALSE(tight->stages.front().recompute_layers.empty());
}

TEST(AdaPipe, ReportsWhenNothingFits) {
  const LayerChain chain = SixLayers({3, 3, 3, 1, 1, 1});
  auto result = RunAdaPipe(chain, {.stages = 3, .microbatches = 1, .memory_bytes = 2});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tandem::planner
