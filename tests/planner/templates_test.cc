// Pipeline templates: the smallest node count that fits, per-shape optimality against brute
// force, GPT-3 175B on A100 nodes, and node counts without a template.
#include "planner/templates.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner/adapipe.h"
#include "planner/gpt_profile.h"
#include "tests/planner/test_util.h"

namespace tandem::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Smallest slowest-stage time over partitions into p stages with in-flight ceil((p-i)/c) and
// every recomputation subset.
double BruteForceBottleneck(const LayerChain& chain, int p, int c, double memory) {
  const int n = chain.num_layers();
  double best = kInf;
  std::function<void(int, int, double)> extend = [&](int first, int stage, double worst) {
    if (stage == p) {
      if (first == n) best = std::min(best, worst);
      return;
    }
    const int in_flight = (p - stage + c - 1) / c;
    for (int end = first + 1; end <= n - (p - stage - 1); ++end) {
      double stage_best = kInf;
      const int size = end - first;
      for (int mask = 0; mask < (1 << size); ++mask) {
        double time = 0, bytes = 0;
        for (int i = 0; i < size; ++i) {
          const pipeline::LayerProfile& l = chain.layer(first + i);
          const bool r = (mask >> i) & 1;
          time += l.forward_seconds + l.backward_seconds + (r ? l.recompute_seconds : 0);
          bytes += 2 * l.parameter_bytes + l.optimizer_state_bytes +
                   in_flight * (r ? l.recompute_stashed_bytes : l.stashed_activation_bytes);
        }
        if (bytes <= memory) stage_best = std::min(stage_best, time);
      }
      extend(end, stage + 1, std::max(worst, stage_best));
    }
  };
  extend(0, 0, 0.0);
  return best;
}

TEST(PipelineTemplates, MatchBruteForcePerShape) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 12; ++trial) {
    pipeline::Profile profile = testing::RandomProfile(5 + trial % 2, &rng);
    auto chain = LayerChain::FromProfile(profile);
    ASSERT_TRUE(chain.ok());
    ClusterSpec cluster;
    cluster.nodes = 3;
    cluster.devices_per_node = 2;
    cluster.device_memory_bytes = 60 + 15 * (trial % 4);
    cluster.levels = {{1e3, 0}, {1e2, 0}};
    auto set = GeneratePipelineTemplates(*chain, cluster, {.microbatches = 8});
    // The smallest n with any feasible shape.
    int expected_min = 0;
    for (int n = 1; n <= cluster.nodes && expected_min == 0; ++n) {
      for (int c : {1, 2, 4, 6}) {
        if ((n * 2) % c != 0 || (c > 2 && c % 2 != 0) || (c > 2 && n % (c / 2) != 0)) continue;
        const int p = n * 2 / c;
        if (p > chain->num_layers()) continue;
        if (std::isfinite(BruteForceBottleneck(*chain, p, c, cluster.device_memory_bytes))) {
          expected_min = n;
          break;
        }
      }
    }
    if (expected_min == 0) {
      EXPECT_FALSE(set.ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(set.ok()) << "trial " << trial << ": " << set.status();
    EXPECT_EQ(set->min_nodes, expected_min) << "trial " << trial;
    EXPECT_EQ(set->microbatches, 8);
    EXPECT_EQ(set->microbatch_size, 1);
    EXPECT_EQ(set->devices_per_node, 2);
    for (const PipelineTemplate& t : set->templates) {
      const int p = static_cast<int>(t.stages.size());
      double slowest = 0;
      int devices = 0;
      for (const TemplateStage& s : t.stages) {
        slowest = std::max(slowest, s.seconds);
        devices += s.devices;
        EXPECT_LE(s.memory_bytes, cluster.device_memory_bytes * (1 + 1e-12));
      }
      EXPECT_EQ(devices, t.nodes * cluster.devices_per_node);
      EXPECT_NEAR(slowest,
                  BruteForceBottleneck(*chain, p, t.devices_per_stage,
                                       cluster.device_memory_bytes),
                  1e-9)
          << "trial " << trial << " nodes " << t.nodes;
      EXPECT_GT(t.iteration_seconds, 0);
    }
  }
}

TEST(PipelineTemplates, Gpt3OnA100Nodes) {
  auto profile = ProfileAtTensorParallel(MakeGptProfile(Gpt3Shape(), A100Figures()), 8);
  ASSERT_TRUE(profile.ok());
  auto chain = LayerChain::FromProfile(*profile);
  ASSERT_TRUE(chain.ok());
  // Tensor parallelism of 8 makes a node's 8 GPUs one device of 8x the memory for the planner;
  // model it as nodes of one device with 8 x 80 GB.
  ClusterSpec cluster;
  cluster.nodes = 32;
  cluster.devices_per_node = 1;
  cluster.device_memory_bytes = 80e9;
  cluster.levels = {{25e9, 0}};
  auto set = GeneratePipelineTemplates(*chain, cluster, {.microbatches = 64});
  ASSERT_TRUE(set.ok()) << set.status();
  // 175e9 parameters x 16 bytes over 8-way tensor parallelism and 80 GB: at least
  // 2.8e12 / 8 / 80e9 = 4.4 pipeline stages.
  EXPECT_GE(set->min_nodes, 5);
  EXPECT_LE(set->min_nodes, 16);
  EXPECT_EQ(set->templates.back().nodes, 32);
  EXPECT_EQ(static_cast<int>(set->templates.size()), 32 - set->min_nodes + 1);
  // More nodes never make the best template slower here.
  EXPECT_LT(set->templates.back().iteration_seconds, set->templates.front().iteration_seconds);
  EXPECT_GT(set->generation_seconds, 0);
  EXPECT_EQ(set->microbatches, 64);
  EXPECT_EQ(set->devices_per_node, 1);
}

// Four equal layers of which a device holds two, on nodes of one device: n nodes need a shape
// of 2..4 stages (c = n / p devices each), which 5 and 7 nodes do not have (5 or 7 stages, or
// one stage of the whole model). The set skips them.
TEST(PipelineTemplates, SkipsNodeCountsWithoutATemplateAndRecordsItsInputs) {
  pipeline::Profile profile;
  profile.model = "four";
  for (int i = 0; i < 4; ++i) {
    pipeline::LayerProfile layer;
    layer.name = "l" + std::to_string(i);
    layer.forward_seconds = 1;
    layer.backward_seconds = 2;
    layer.parameter_bytes = 10;  // 2 x 10 bytes per layer with gradients
    profile.layers.push_back(layer);
  }
  auto chain = LayerChain::FromProfile(profile);
  ASSERT_TRUE(chain.ok()) << chain.status();
  ClusterSpec cluster;
  cluster.nodes = 8;
  cluster.devices_per_node = 1;
  cluster.device_memory_bytes = 50;
  cluster.levels = {{1e3, 0}};
  auto set = GeneratePipelineTemplates(*chain, cluster, {.microbatches = 6, .microbatch_size = 3});
  ASSERT_TRUE(set.ok()) << set.status();
  std::vector<int> nodes;
  for (const PipelineTemplate& t : set->templates) nodes.push_back(t.nodes);
  EXPECT_EQ(nodes, (std::vector<int>{2, 3, 4, 6, 8}));
  EXPECT_EQ(set->min_nodes, 2);
  EXPECT_EQ(set->templates[3].nodes, 6);  // not min_nodes + 3
  EXPECT_EQ(set->microbatches, 6);
  EXPECT_EQ(set->microbatch_size, 3);
  EXPECT_EQ(set->devices_per_node, 1);
  // Throughput counts micro-batches of 3 samples.
  EXPECT_DOUBLE_EQ(set->templates[0].throughput_samples_per_second,
                   6 * 3 / set->templates[0].iteration_seconds);
  const nlohmann::json json = ToJson(*set);
  EXPECT_EQ(json["min_nodes"], 2);
  EXPECT_EQ(json["microbatches"], 6);
  EXPECT_EQ(json["microbatch_size"], 3);
  EXPECT_EQ(json["devices_per_node"], 1);
  ASSERT_EQ(json["templates"].size(), 5u);
  EXPECT_EQ(json["templates"][4]["nodes"], 8);
}

}  // namespace
}  // namespace tandem::planner
