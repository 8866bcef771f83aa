// PipeDream's partitioner: PipeDream's own reference figures on its own VGG-16 profile, and
// brute force on small random instances.
#include "planner/pipedream.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "planner/importers.h"
#include "planner/layer_chain.h"
#include "tests/planner/pipedream_references.h"
#include "tests/planner/test_util.h"

namespace tandem::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kBandwidth = 1e9;

LayerChain Vgg16() {
  auto profile = ReadPipeDreamGraphFile(testing::DataPath("pipedream/vgg16.graph.txt"));
  EXPECT_TRUE(profile.ok()) << profile.status();
  auto chain = LayerChain::FromProfile(*profile);
  EXPECT_TRUE(chain.ok()) << chain.status();
  return *chain;
}

double Bottleneck(const LayerChain& chain, int machines, bool straight) {
  PipeDreamOptions options;
  options.levels = {{machines, kBandwidth}};
  options.straight = straight;
  auto result = RunPipeDream(chain, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->bottleneck_seconds : -1;
}

// The figures PipeDream's optimizer prints for these runs ("Time per stage in pipeline").
TEST(PipeDream, ReproducesReferenceFiguresOnVgg16) {
  const LayerChain chain = Vgg16();
  EXPECT_NEAR(Bottleneck(chain, 1, false), 0.672535, 1e-9);
  EXPECT_NEAR(Bottleneck(chain, 2, true), 0.370931, 1e-9);
  EXPECT_NEAR(Bottleneck(chain, 4, true), 0.21645, 1e-9);
  EXPECT_NEAR(Bottleneck(chain, 4, false), 0.175732624, 1e-9);
  EXPECT_NEAR(Bottleneck(chain, 8, false), 0.09351323, 1e-8);
}

// A search beyond the limits is refused before it starts, naming its size and the limits;
// within them it runs. VGG-16 (41 layers) on 1,000,000 machines: about 8.8e14 table updates.
TEST(PipeDream, SearchesBeyondTheLimitsAreRefusedNamingTheirSize) {
  const LayerChain chain = Vgg16();
  PipeDreamOptions options;
  options.levels = {{1000000, kBandwidth}};
  auto huge = RunPipeDream(chain, options);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("on 1000000 machines is too large"), std::string::npos)
      << huge.status();
  EXPECT_NE(huge.status().message().find("limits of 2e+09 updates"), std::string::npos)
      << huge.status();
  // Limits scale the refusal: the same 8-machine search runs under the default and is refused
  // under a limit below its ~1.1e5 updates.
  options.levels = {{8, kBandwidth}};
  EXPECT_TRUE(RunPipeDream(chain, options).ok());
  options.max_cell_updates = 1e4;
  EXPECT_EQ(RunPipeDream(chain, options).status().code(), absl::StatusCode::kResourceExhausted);
}

// ---- Work bounds ---------------------------------------------------------------------------

// A search admitted under the limits never does more work than they allow: the updates it
// counts (weighted by their cost, as the limit counts them) stay within the estimate checked
// before it starts, so a limit just below the work a search did refuses it before it starts.
TEST(PipeDream, CountedWorkNeverPassesTheLimitASearchWasAdmittedUnder) {
  const LayerChain vgg = Vgg16();
  PipeDreamGraph graph;
  auto profile = ReadPipeDreamGraphFile(testing::DataPath("pipedream/resnet50.graph.txt"), &graph);
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto resnet = LayerChain::FromProfile(*profile);
  ASSERT_TRUE(resnet.ok()) << resnet.status();
  struct Case {
    const LayerChain* chain;
    bool with_graph;
    std::vector<PipeDreamLevel> levels;
    bool straight;
    bool fewer;
  };
  const Case cases[] = {
      {&vgg, false, {{8, kBandwidth}}, false, false},
      {&vgg, false, {{16, kBandwidth}}, true, false},
      {&vgg, false, {{10000, 1e11}}, false, true},  // the fast replica search
      {&vgg, false, {{4, 10e9}, {2, kBandwidth}}, false, false},
      {&*resnet, true, {{8, kBandwidth}}, false, false},
      {&*resnet, true, {{16, kBandwidth}}, true, false},
  };
  for (const Case& c : cases) {
    PipeDreamOptions options;
    options.levels = c.levels;
    options.straight = c.straight;
    options.use_fewer_machines = c.fewer;
    if (c.with_graph) options.graph = graph;
    const std::string what = absl::StrCat(c.chain->num_layers(), " layers on ",
                                          c.levels[0].machines, c.straight ? " straight" : "",
                                          c.fewer ? " fewer" : "");
    auto result = RunPipeDream(*c.chain, options);
    ASSERT_TRUE(result.ok()) << what << ": " << result.status();
    const double work = result->table_updates;
    EXPECT_GT(work, 0) << what;
    EXPECT_LE(work, options.max_cell_updates) << what;
    options.max_cell_updates = work * (1 - 1e-9);
    auto refused = RunPipeDream(*c.chain, options);
    ASSERT_FALSE(refused.ok()) << what;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << what;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "is too large")) << refused.status();
  }
}

// A 100,000-layer chain as a PipeDream graph (the search is quadratic in layers) is refused
// before any search, naming the limit, whether over its states or its layers; a million
// machines with the fast replica search too (it took 40+ s before).
TEST(PipeDream, SearchesBeyondTheLimitsOfSmallInputsAreRefusedBeforeTheyStart) {
  constexpr int kLayers = 100000;
  std::string text;
  for (int v = 0; v < kLayers; ++v) {
    absl::StrAppend(&text, "node", v, " -- Linear -- forward_compute_time=1.0, ",
                    "backward_compute_time=2.0, activation_size=1000.0, parameter_size=100.0\n");
  }
  for (int v = 0; v + 1 < kLayers; ++v) absl::StrAppend(&text, "\tnode", v, " -- node", v + 1, "\n");
  PipeDreamGraph graph;
  auto profile = ImportPipeDreamGraph(text, "chain.graph.txt", &graph);
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto chain = LayerChain::FromProfile(*profile);
  ASSERT_TRUE(chain.ok()) << chain.status();
  for (bool straight : {false, true}) {
    PipeDreamOptions options;
    options.levels = {{4, kBandwidth}};
    options.straight = straight;
    auto over_layers = RunPipeDream(*chain, options);
    ASSERT_FALSE(over_layers.ok());
    EXPECT_EQ(over_layers.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(absl::StrContains(over_layers.status().message(),
                                  "over 100000 layers on 4 machines is too large"))
        << over_layers.status();
    options.graph = graph;
    auto over_states = RunPipeDream(*chain, options);
    ASSERT_FALSE(over_states.ok());
    EXPECT_EQ(over_states.status().code(), absl::StatusCode::kResourceExhausted)
        << over_states.status();
    EXPECT_TRUE(absl::StrContains(over_states.status().message(), "(limit "))
        << over_states.status();
  }
  PipeDreamOptions options;
  options.levels = {{1000000, 1e11}};
  options.use_fewer_machines = true;
  auto million = RunPipeDream(Vgg16(), options);
  ASSERT_FALSE(million.ok());
  EXPECT_TRUE(absl::StrContains(million.status().message(), "on 1000000 machines is too large"))
      << million.status();
}

TEST(PipeDream, ReplicatedVgg16UsesEveryMachineAndCoversTheModel) {
  const LayerChain chain = Vgg16();
  PipeDreamOptions options;
  options.levels = {{4, kBandwidth}};
  auto result = RunPipeDream(chain, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->devices_used, 4);
  ASSERT_FALSE(result->stages.empty());
  EXPECT_EQ(result->stages.front().first_layer, 0);
  EXPECT_EQ(result->stages.back().end_layer, chain.num_layers());
  double slowest = 0;
  for (size_t s = 0; s < result->stages.size(); ++s) {
    if (s > 0) EXPECT_EQ(result->stages[s].first_layer, result->stages[s - 1].end_layer);
    slowest = std::max(slowest, result->stages[s].seconds);
  }
  EXPECT_NEAR(slowest, result->bottleneck_seconds, 1e-12);
}

// ---- Brute force ---------------------------------------------------------------------------

struct BruteOptions {
  int machines = 1;
  bool straight = false;
  bool fewer = false;
  bool memory = false;
  double memory_bytes = 0;
  double compression = 0;
};

double StageTime(const LayerChain& chain, int i, int j, int r, int prefix_machines,
                 const BruteOptions& o) {
  if (o.memory) {
    const double stash = chain.StashedBytes(i, j) + chain.ParameterBytes(i, j) +
                         chain.OptimizerStateBytes(i, j);
    if (stash * std::ceil(double(o.machines - prefix_machines) / r) > o.memory_bytes) return kInf;
  }
  double t = (chain.ComputeSeconds(i, j) + 4.0 * (r - 1) * chain.ParameterBytes(i, j) /
                                               (kBandwidth * r)) /
             r;
  if (o.compression > 0) {
    const double per_byte = 2.0 / (kBandwidth * r) / o.compression;
    if (i > 0) t = std::max(t, chain.CutBytes(i) * per_byte);
    if (j < chain.num_layers()) t = std::max(t, chain.CutBytes(j) * per_byte);
  }
  return t;
}

// Every split of the layers into stages and every assignment of replicas.
double BruteForce(const LayerChain& chain, const BruteOptions& o) {
  double best = kInf;
  const int n = chain.num_layers();
  std::function<void(int, int, double)> extend = [&](int first, int used, double worst) {
    if (first == n) {
      if (used == o.machines || (o.fewer && used <= o.machines)) best = std::min(best, worst);
      return;
    }
    for (int end = first + 1; end <= n; ++end) {
      for (int r = 1; used + r <= o.machines && (r == 1 || !o.straight); ++r) {
        const double t = StageTime(chain, first, end, r, used + r, o);
        extend(end, used + r, std::max(worst, t));
      }
    }
  };
  extend(0, 0, 0.0);
  return best;
}

TEST(PipeDream, MatchesBruteForceOnRandomInstances) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int layers = 2 + trial % 5;
    pipeline::Profile profile = testing::RandomProfile(layers, &rng);
    // Parameters large enough that replication is not always worth it.
    for (auto& layer : profile.layers) layer.parameter_bytes *= 3e7;
    auto chain = LayerChain::FromProfile(profile);
    ASSERT_TRUE(chain.ok());
    BruteOptions o;
    o.machines = 1 + trial % 4;
    o.straight = trial % 3 == 0;
    o.fewer = trial % 2 == 0;
    o.memory = trial % 5 == 1;
    o.memory_bytes = 40;
    o.compression = trial % 7 == 3 ? 1e-8 : 0;
    PipeDreamOptions options;
    options.levels = {{o.machines, kBandwidth}};
    options.straight = o.straight;
    options.use_fewer_machines = o.fewer;
    options.use_memory_constraint = o.memory;
    options.memory_bytes = o.memory_bytes;
    options.activation_compression_ratio = o.compression;
    const double expected = BruteForce(*chain, o);
    auto result = RunPipeDream(*chain, options);
    if (!std::isfinite(expected)) {
      EXPECT_FALSE(result.ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(result.ok()) << "trial " << trial << ": " << result.status();
    EXPECT_NEAR(result->bottleneck_seconds, expected, 1e-12 * expected) << "trial " << trial;
    // The reported stages achieve the reported bottleneck.
    double worst = 0;
    int used = 0;
    for (const PipeDreamStage& stage : result->stages) {
      used += stage.replicas;
      worst = std::max(worst, StageTime(*chain, stage.first_layer, stage.end_layer,
                                        stage.replicas, used, o));
    }
    EXPECT_NEAR(worst, expected, 1e-12 * expected) << "trial " << trial;
    ++checked;
  }
  EXPECT_GT(checked, 40);
}

TEST(PipeDream, FastReplicaSearchMatchesExhaustiveSearch) {
  // use_fewer_machines takes the binary-search path; compare with brute force at more
  // machines than the small test above.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    pipeline::Profile profile = testing::RandomProfile(4, &rng);
    for (auto& layer : profile.layers) layer.parameter_bytes *= 1e8 * (trial % 3);
    auto chain = LayerChain::FromProfile(profile);
    ASSERT_TRUE(chain.ok());
    BruteOptions o;
    o.machines = 6 + trial % 11;
    o.fewer = true;
    PipeDreamOptions options;
    options.levels = {{o.machines, kBandwidth}};
    options.use_fewer_machines = true;
    auto result = RunPipeDream(*chain, options);
    ASSERT_TRUE(result.ok());
    const double expected = BruteForce(*chain, o);
    EXPECT_NEAR(result->bottleneck_seconds, expected, 1e-12 * expected) << "trial " << trial;
    EXPECT_LE(result->devices_used, o.machines);
  }
}

TEST(PipeDream, HeterogeneousStraightPipelineUsesEachDevicesSpeed) {
  auto chain = LayerChain::FromProfile(testing::UniformProfile(4));
  ASSERT_TRUE(chain.ok());
  PipeDreamOptions options;
  options.levels = {{2, kBandwidth}};
  options.straight = true;
  options.device_speeds = {3.0, 1.0};  // device 0 three times faster
  auto result = RunPipeDream(*chain, options);
  ASSERT_TRUE(result.ok()) << result.status();
  // Three layers on the fast device (1 s), one on the slow (1 s).
  EXPECT_NEAR(result->bottleneck_seconds, 1.0, 1e-12);
  ASSERT_EQ(result->stages.size(), 2u);
  EXPECT_EQ(result->stages[0].end_layer, 3);
}

TEST(PipeDream, TwoLevelHierarchyUsesEveryDevice) {
  const LayerChain chain = Vgg16();
  PipeDreamOptions options;
  options.levels = {{4, 10e9}, {2, 1e9}};
  auto result = RunPipeDream(chain, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->devices_used, 8);
  // Faster links inside a node can only help compared with a flat 8-machine cluster at 1e9.
  EXPECT_LE(result->bottleneck_seconds, 0.09351323 + 1e-9);
  EXPECT_LT(result->bottleneck_seconds, result->single_machine_seconds / 4);
}

TEST(PipeDream, InfeasibleMemoryIsResourceExhausted) {
  const LayerChain chain = Vgg16();
  PipeDreamOptions options;
  // PipeDream's estimate charges a stage for the machines after it, so the last stage always
  // fits; earlier stages of a straight pipeline cannot hold VGG-16 in 1 MB.
  options.levels = {{4, kBandwidth}};
  options.straight = true;
  options.use_memory_constraint = true;
  options.memory_bytes = 1e6;
  auto result = RunPipeDream(chain, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tandem::planner

namespace tandem::planner {
namespace {

// GNMT is a DAG (skip connections around LSTM layers): the topological linearization plans it
// like any chain, and counting activation transfers (every tensor crossing a cut) can only
// slow the pipeline down.
TEST(PipeDream, PlansTheGnmtDag) {
  auto profile = ReadPipeDreamGraphFile(testing::DataPath("pipedream/gnmt.graph.txt"));
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto chain = LayerChain::FromProfile(*profile);
  ASSERT_TRUE(chain.ok());
  PipeDreamOptions options;
  options.levels = {{4, kBandwidth}};
  auto plain = RunPipeDream(*chain, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_LT(plain->bottleneck_seconds, plain->single_machine_seconds);
  options.activation_compression_ratio = 1;
  auto with_transfers = RunPipeDream(*chain, options);
  ASSERT_TRUE(with_transfers.ok()) << with_transfers.status();
  EXPECT_GE(with_transfers->bottleneck_seconds, plain->bottleneck_seconds);
  // Brute force agrees with the transfers counted.
  BruteOptions o;
  o.machines = 4;
  o.compression = 1;
  EXPECT_NEAR(with_transfers->bottleneck_seconds, BruteForce(*chain, o),
              1e-12 * with_transfers->bottleneck_seconds);
}

}  // namespace
}  // namespace tandem::planner

namespace tandem::planner {
namespace {

using testing::kInfeasible;
using testing::kReferences;
using testing::Reference;

class PipeDreamReference : public ::testing::TestWithParam<Reference> {};

TEST_P(PipeDreamReference, BottleneckIsPipeDreams) {
  const Reference& ref = GetParam();
  PipeDreamGraph graph;
  auto profile = ReadPipeDreamGraphFile(
      testing::DataPath(std::string("pipedream/") + ref.model + ".graph.txt"), &graph);
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto chain = LayerChain::FromProfile(*profile);
  ASSERT_TRUE(chain.ok()) << chain.status();
  PipeDreamOptions options;
  options.levels = {{ref.machines, 1e9}};
  options.straight = ref.straight;
  options.graph = graph;
  auto result = RunPipeDream(*chain, options);
  if (ref.time_per_stage_seconds == kInfeasible) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
    return;
  }
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->bottleneck_seconds, ref.time_per_stage_seconds,
              1e-9 * ref.time_per_stage_seconds);
  // The stages cover every layer once, in an order that keeps each one contiguous.
  std::vector<int> order = result->layer_order;
  if (order.empty()) {
    for (int v = 0; v < chain->num_layers(); ++v) order.push_back(v);
  }
  std::vector<int> position(order.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  for (int v = 0; v < chain->num_layers(); ++v) {
    for (int u : graph.inputs[v]) EXPECT_LT(position[u], position[v]);
  }
  ASSERT_FALSE(result->stages.empty());
  EXPECT_EQ(result->stages.front().first_layer, 0);
  EXPECT_EQ(result->stages.back().end_layer, chain->num_layers());
  int devices = 0;
  for (size_t s = 0; s < result->stages.size(); ++s) {
    if (s > 0) EXPECT_EQ(result->stages[s].first_layer, result->stages[s - 1].end_layer);
    devices += result->stages[s].replicas;
  }
  EXPECT_EQ(devices, ref.machines);
}

std::string Name(const ::testing::TestParamInfo<Reference>& info) {
  return std::string(info.param.model) + "_" + std::to_string(info.param.machines) +
         (info.param.straight ? "_straight" : "_replicated");
}

INSTANTIATE_TEST_SUITE_P(PublishedProfiles, PipeDreamReference,
                         ::testing::ValuesIn(kReferences), Name);

}  // namespace
}  // namespace tandem::planner
