// Re-instantiation from pipeline templates: the iteration model, batch distribution and
// template choice against brute force, rank assignment keeping state in place (against brute
// force on small cases and after losing a node), state moves, determinism and errors, and the
// micro-batches and node size a template set records.
#include "elastic/instantiation.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "planner/layer_chain.h"
#include "planner/templates.h"

namespace tandem::elastic {
namespace {

using planner::PipelineTemplate;
using planner::TemplateSet;

constexpr int kTemplateMicrobatches = 4;

// A template on `nodes` nodes of `g` devices with stages of `c` devices over `layers` layers
// split evenly; iteration_seconds follows the templates' formula plus `constant`.
PipelineTemplate MakeTemplate(int nodes, int g, int c, int layers,
                              const std::vector<double>& stage_seconds, double constant) {
  PipelineTemplate t;
  t.nodes = nodes;
  t.devices_per_stage = c;
  const int p = nodes * g / c;
  double slowest = 0, total = 0;
  for (int s = 0; s < p; ++s) {
    planner::TemplateStage stage;
    stage.first_layer = s * layers / p;
    stage.end_layer = (s + 1) * layers / p;
    stage.devices = c;
    stage.seconds = stage_seconds[s % stage_seconds.size()];
    slowest = std::max(slowest, stage.seconds);
    total += stage.seconds;
    t.stages.push_back(stage);
  }
  t.iteration_seconds = (kTemplateMicrobatches - 1) * slowest / c + total + constant;
  return t;
}

// Random templates for nodes min..max_nodes with some sizes missing; times are multiples of
// 1/4 so that ties are frequent.
TemplateSet RandomTemplateSet(std::mt19937* rng, int g, int max_nodes, int layers) {
  std::uniform_int_distribution<int> quarter(1, 8);
  TemplateSet set;
  set.min_nodes = 1 + static_cast<int>((*rng)() % 2);
  for (int n = set.min_nodes; n <= max_nodes; ++n) {
    if (n > set.min_nodes && (*rng)() % 4 == 0) continue;
    const int c = (g > 1 && (*rng)() % 2 == 0) ? g : 1;
    std::vector<double> seconds;
    for (int s = 0; s < n * g / c; ++s) seconds.push_back(quarter(*rng) * 0.25);
    set.templates.push_back(MakeTemplate(n, g, c, layers, seconds, (quarter(*rng) - 1) * 0.25));
  }
  return set;
}

std::vector<IterationModel> ModelsOf(const TemplateSet& set) {
  std::vector<IterationModel> models;
  for (const PipelineTemplate& t : set.templates) {
    auto model = ModelIteration(t, kTemplateMicrobatches);
    EXPECT_TRUE(model.ok()) << model.status();
    models.push_back(*model);
  }
  return models;
}

// The smallest max_i T_i(b_i) by trying every composition of `total` into positive parts.
double BruteForceDistribution(const std::vector<IterationModel>& models, int64_t total) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> parts(models.size(), 1);
  std::function<void(size_t, int64_t)> extend = [&](size_t i, int64_t left) {
    if (i + 1 == models.size()) {
      parts[i] = left;
      double worst = 0;
      for (size_t j = 0; j < models.size(); ++j) worst = std::max(worst, models[j].Seconds(parts[j]));
      best = std::min(best, worst);
      return;
    }
    for (int64_t b = 1; b <= left - static_cast<int64_t>(models.size() - i - 1); ++b) {
      parts[i] = b;
      extend(i + 1, left - b);
    }
  };
  extend(0, total);
  return best;
}

// An independent optimum: hand out micro-batches one at a time to the pipeline that would
// finish the next one soonest.
double GreedyDistribution(const std::vector<IterationModel>& models, int64_t total) {
  std::vector<int64_t> b(models.size(), 1);
  for (int64_t extra = total - static_cast<int64_t>(models.size()); extra > 0; --extra) {
    size_t best = 0;
    for (size_t i = 1; i < models.size(); ++i) {
      if (models[i].Seconds(b[i] + 1) < models[best].Seconds(b[best] + 1)) best = i;
    }
    ++b[best];
  }
  double worst = 0;
  for (size_t i = 0; i < models.size(); ++i) worst = std::max(worst, models[i].Seconds(b[i]));
  return worst;
}

double MaxSeconds(const std::vector<IterationModel>& models, const std::vector<int64_t>& b) {
  double worst = 0;
  for (size_t i = 0; i < models.size(); ++i) worst = std::max(worst, models[i].Seconds(b[i]));
  return worst;
}

// Live ranks of `nodes` nodes of g devices: node u holds ranks u*g .. u*g + g - 1.
std::vector<std::vector<int>> Nodes(int nodes, int g) {
  std::vector<std::vector<int>> out(nodes);
  for (int u = 0; u < nodes; ++u) {
    for (int d = 0; d < g; ++d) out[u].push_back(u * g + d);
  }
  return out;
}

bool HeldBy(const HeldLayers& held, int rank, int layer) {
  auto it = held.find(rank);
  if (it == held.end()) return false;
  for (const LayerRange& r : it->second) {
    if (layer >= r.first_layer && layer < r.end_layer) return true;
  }
  return false;
}

// Layers of the new layout that their ranks already hold.
int KeptLayers(const RankAssignment& assignment, const HeldLayers& held) {
  int kept = 0;
  for (const PipelineRanks& p : assignment.pipelines) {
    for (const StageRanks& s : p.stages) {
      for (int rank : s.ranks) {
        for (int l = s.layers.first_layer; l < s.layers.end_layer; ++l) {
          kept += HeldBy(held, rank, l);
        }
      }
    }
  }
  return kept;
}

// A chain of equal layers: 2e8 bytes of weights and optimizer state each.
planner::LayerChain UniformChain(int layers) {
  pipeline::Profile profile;
  profile.model = "uniform";
  for (int i = 0; i < layers; ++i) {
    pipeline::LayerProfile layer;
    layer.name = "l" + std::to_string(i);
    layer.forward_seconds = 0.01;
    layer.backward_seconds = 0.02;
    layer.output_activation_bytes = 1e6;
    layer.stashed_activation_bytes = 5e7;
    layer.parameter_bytes = 5e7;
    layer.optimizer_state_bytes = 1e8;
    layer.recompute_seconds = 0.01;
    layer.recompute_stashed_bytes = 1e6;
    profile.layers.push_back(layer);
  }
  auto chain = planner::LayerChain::FromProfile(profile);
  EXPECT_TRUE(chain.ok()) << chain.status();
  return *chain;
}

// Templates of a 16-layer uniform chain on up to `nodes` nodes of 2 devices that hold at most
// seven layers each: the smallest template has two nodes.
TemplateSet GeneratedTemplates(const planner::LayerChain& chain, int nodes) {
  planner::ClusterSpec cluster;
  cluster.nodes = nodes;
  cluster.devices_per_node = 2;
  cluster.device_memory_bytes = 1.5e9;
  cluster.levels = {{100e9, 0}, {10e9, 0}};
  auto set = planner::GeneratePipelineTemplates(chain, cluster,
                                                {.microbatches = kTemplateMicrobatches});
  EXPECT_TRUE(set.ok()) << set.status();
  return *set;
}

// ----------------------------------------------------------------------------------------------

TEST(IterationModel, ReproducesTheTemplateAndItsSlope) {
  const planner::LayerChain chain = UniformChain(16);
  const TemplateSet set = GeneratedTemplates(chain, 6);
  ASSERT_FALSE(set.templates.empty());
  for (const PipelineTemplate& t : set.templates) {
    auto model = ModelIteration(t, kTemplateMicrobatches);
    ASSERT_TRUE(model.ok()) << model.status();
    double slowest = 0, total = 0;
    for (const planner::TemplateStage& s : t.stages) {
      slowest = std::max(slowest, s.seconds);
      total += s.seconds;
    }
    EXPECT_EQ(model->Seconds(kTemplateMicrobatches), t.iteration_seconds);
    EXPECT_NEAR(model->Seconds(9) - model->Seconds(8), slowest / t.devices_per_stage, 1e-12);
    EXPECT_NEAR(model->Seconds(1), total + model->constant_seconds, 1e-12);
    EXPECT_GE(model->constant_seconds, 0);  // transfers and sync
    // The templates were made for 4 micro-batches; 40 would leave a negative constant.
    EXPECT_EQ(ModelIteration(t, 40).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(DistributeMicrobatches, MatchesBruteForce) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> quarter(0, 8);
  for (int trial = 0; trial < 400; ++trial) {
    const int k = 1 + trial % 4;
    std::vector<IterationModel> models(k);
    for (IterationModel& m : models) {
      m.reference_microbatches = 1 + rng() % 4;
      m.per_microbatch_seconds = quarter(rng) * 0.25;  // 0 included
      m.reference_seconds = 0.25 * (1 + quarter(rng)) +
                            (m.reference_microbatches - 1) * m.per_microbatch_seconds;
    }
    const int64_t total = k + static_cast<int64_t>(rng() % 9);
    auto b = DistributeMicrobatches(models, total);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(b->size(), models.size());
    EXPECT_EQ(std::accumulate(b->begin(), b->end(), int64_t{0}), total) << "trial " << trial;
    for (int64_t x : *b) EXPECT_GE(x, 1);
    EXPECT_EQ(MaxSeconds(models, *b), BruteForceDistribution(models, total)) << "trial " << trial;
  }
}

TEST(DistributeMicrobatches, LargeBatchesFollowSpeed) {
  // Pipeline 0 takes 1 s per micro-batch, pipeline 1 takes 0.5 s: two thirds go to pipeline 1.
  std::vector<IterationModel> models(2);
  models[0].per_microbatch_seconds = 1.0;
  models[0].reference_seconds = 2.0;  // T(1)
  models[1].per_microbatch_seconds = 0.5;
  models[1].reference_seconds = 2.0;
  const int64_t total = 3'000'000'000;
  auto b = DistributeMicrobatches(models, total);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)[0] + (*b)[1], total);
  EXPECT_EQ((*b)[0], 1'000'000'000);
  EXPECT_EQ((*b)[1], 2'000'000'000);
}

TEST(DistributeMicrobatches, Errors) {
  std::vector<IterationModel> models(3);
  for (IterationModel& m : models) m.reference_seconds = 1;
  EXPECT_EQ(DistributeMicrobatches(models, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributeMicrobatches({}, 2).status().code(), absl::StatusCode::kInvalidArgument);
  models[1].per_microbatch_seconds = -1;
  EXPECT_EQ(DistributeMicrobatches(models, 6).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The best multiset by enumeration, in Instantiate's order: most nodes used, then the fastest
// iteration, then fewest pipelines, then larger templates first. Returns node counts,
// descending, and fills the time and nodes used.
std::vector<int> BruteForceInstantiation(const TemplateSet& set, int live_nodes,
                                         int64_t total, int min_pipelines, double* seconds,
                                         int* used_nodes) {
  const std::vector<IterationModel> all = ModelsOf(set);
  std::vector<int> best_sizes;
  int best_used = -1;
  double best_seconds = 0;
  std::vector<int> chosen;  // template indices, descending
  std::function<void(int, int)> extend = [&](int below, int used) {
    const int count = static_cast<int>(chosen.size());
    if (count >= min_pipelines && count <= total) {
      std::vector<IterationModel> models;
      std::vector<int> sizes;
      for (int j : chosen) {
        models.push_back(all[j]);
        sizes.push_back(set.templates[j].nodes);
      }
      const double t = GreedyDistribution(models, total);
      const bool better =
          best_used < 0 || used > best_used ||
          (used == best_used &&
           (t < best_seconds ||
            (t == best_seconds && (sizes.size() < best_sizes.size() ||
                                   (sizes.size() == best_sizes.size() && sizes > best_sizes)))));
      if (better) {
        best_used = used;
        best_seconds = t;
        best_sizes = sizes;
      }
    }
    for (int j = below; j >= 0; --j) {
      if (used + set.templates[j].nodes > live_nodes) continue;
      chosen.push_back(j);
      extend(j, used + set.templates[j].nodes);
      chosen.pop_back();
    }
  };
  extend(static_cast<int>(set.templates.size()) - 1, 0);
  *seconds = best_seconds;
  *used_nodes = best_used;
  return best_sizes;
}

TEST(Instantiate, MatchesBruteForceOnSmallClusters) {
  std::mt19937 rng(11);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int g = 1 + trial % 2;
    const TemplateSet set = RandomTemplateSet(&rng, g, 2 + rng() % 5, /*layers=*/12);
    InstantiationOptions options;
    options.live_nodes = 1 + rng() % 9;
    options.devices_per_node = g;
    options.global_microbatches = 1 + rng() % 12;
    options.min_pipelines = 1 + rng() % 3;
    options.template_microbatches = kTemplateMicrobatches;
    auto result = Instantiate(set, options);
    const int smallest = set.templates.front().nodes;
    if (options.live_nodes < smallest) {
      EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
      continue;
    }
    if (options.live_nodes / smallest < options.min_pipelines) {
      EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
      continue;
    }
    if (options.global_microbatches < options.min_pipelines) {
      EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ASSERT_TRUE(result.ok()) << "trial " << trial << ": " << result.status();
    double seconds = 0;
    int used = 0;
    const std::vector<int> expected =
        BruteForceInstantiation(set, options.live_nodes, options.global_microbatches,
                                options.min_pipelines, &seconds, &used);
    std::vector<int> sizes;
    int64_t microbatches = 0;
    for (const PipelineInstance& p : result->pipelines) {
      sizes.push_back(p.nodes);
      microbatches += p.microbatches;
      EXPECT_EQ(set.templates[p.template_index].nodes, p.nodes);
    }
    EXPECT_EQ(sizes, expected) << "trial " << trial << ": " << Describe(*result);
    EXPECT_EQ(result->iteration_seconds, seconds) << "trial " << trial;
    EXPECT_EQ(result->used_nodes, used) << "trial " << trial;
    EXPECT_EQ(microbatches, options.global_microbatches) << "trial " << trial;
    ++compared;
  }
  EXPECT_GT(compared, 100);
}

TEST(Instantiate, LeavesNodesSpareOnlyWhenNoMultisetFits) {
  TemplateSet set;
  set.min_nodes = 3;
  set.templates = {MakeTemplate(3, 1, 1, 6, {1.0}, 0.5), MakeTemplate(4, 1, 1, 6, {0.75}, 0.5)};
  InstantiationOptions options{.live_nodes = 5, .devices_per_node = 1,
                               .global_microbatches = 8, .min_pipelines = 1,
                               .template_microbatches = kTemplateMicrobatches};
  auto five = Instantiate(set, options);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(five->used_nodes, 4);  // neither 3 + 3 nor 4 + 1 makes five
  EXPECT_NE(Describe(*five).find("1 spare node"), std::string::npos) << Describe(*five);
  auto assignment = AssignRanks(set, *five, Nodes(5, 1), {}, {});
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  EXPECT_EQ(assignment->spare_nodes.size(), 1u);
  EXPECT_EQ(assignment->spare_ranks.size(), 1u);
  options.live_nodes = 7;  // 4 + 3: every node used
  auto seven = Instantiate(set, options);
  ASSERT_TRUE(seven.ok()) << seven.status();
  EXPECT_EQ(seven->used_nodes, 7);
  EXPECT_EQ(seven->pipelines.size(), 2u);
}

TEST(Instantiate, ThreeHundredNodesBeatEveryUniformChoice) {
  // Templates on 1..300 nodes: a pipeline on n nodes runs its micro-batches n / (1 + 0.05 n)
  // times faster than one node, with a fill time growing with n.
  TemplateSet set;
  set.min_nodes = 1;
  for (int n = 1; n <= 300; ++n) {
    const double stage = 1.0 / n * (1 + 0.05 * n);
    set.templates.push_back(MakeTemplate(n, 1, 1, 300, {stage}, 0.01 * n));
  }
  InstantiationOptions options{.live_nodes = 300, .devices_per_node = 1,
                               .global_microbatches = 1024, .min_pipelines = 2,
                               .template_microbatches = kTemplateMicrobatches};
  auto result = Instantiate(set, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->used_nodes, 300);
  EXPECT_GE(result->pipelines.size(), 2u);
  int64_t total = 0;
  for (const PipelineInstance& p : result->pipelines) total += p.microbatches;
  EXPECT_EQ(total, 1024);
  const std::vector<IterationModel> models = ModelsOf(set);
  for (int n = 1; n <= 150; ++n) {  // 300 / n copies of one template
    if (300 % n != 0) continue;
    std::vector<IterationModel> copies(300 / n, models[n - 1]);
    auto b = DistributeMicrobatches(copies, 1024);
    ASSERT_TRUE(b.ok());
    EXPECT_LE(result->iteration_seconds, MaxSeconds(copies, *b)) << n << " nodes each";
  }
}

TEST(Instantiate, Errors) {
  const planner::LayerChain chain = UniformChain(16);
  const TemplateSet set = GeneratedTemplates(chain, 6);
  ASSERT_EQ(set.min_nodes, 2);
  InstantiationOptions options{.live_nodes = 1, .devices_per_node = 2,
                               .global_microbatches = 16, .min_pipelines = 1,
                               .template_microbatches = kTemplateMicrobatches};
  auto too_few = Instantiate(set, options);
  EXPECT_EQ(too_few.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_few.status().message().find("needs 2 nodes"), std::string::npos)
      << too_few.status();
  EXPECT_NE(too_few.status().message().find("1 live node"), std::string::npos);

  options.live_nodes = 5;
  options.min_pipelines = 3;  // 5 nodes hold two 2-node pipelines: one more failure, not two
  auto survive = Instantiate(set, options);
  EXPECT_EQ(survive.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(survive.status().message().find("survives at most 1 more failure"),
            std::string::npos)
      << survive.status();

  options.min_pipelines = 2;
  options.global_microbatches = 1;
  EXPECT_EQ(Instantiate(set, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.global_microbatches = 16;
  options.devices_per_node = 4;  // the templates are for 2
  EXPECT_EQ(Instantiate(set, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.devices_per_node = 2;
  options.template_microbatches = 64;  // the templates were made for 4
  EXPECT_EQ(Instantiate(set, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.template_microbatches = kTemplateMicrobatches;
  TemplateSet broken = set;
  broken.templates[1].stages[1].first_layer += 1;  // a gap between stages
  EXPECT_EQ(Instantiate(broken, options).status().code(), absl::StatusCode::kInvalidArgument);
  broken = set;
  std::swap(broken.templates[1], broken.templates[2]);
  EXPECT_EQ(Instantiate(broken, options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Instantiate(TemplateSet{}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Instantiate(set, options).ok());
}

TEST(AssignRanks, KeepsAsMuchStateAsBruteForce) {
  std::mt19937 rng(5);
  const int g = 2, layers = 6;
  for (int trial = 0; trial < 40; ++trial) {
    TemplateSet set;
    set.min_nodes = 1;
    set.templates = {MakeTemplate(1, g, 1, layers, {1.0}, 0.1),
                     MakeTemplate(2, g, 1 + trial % 2, layers, {0.6}, 0.1),
                     MakeTemplate(3, g, 1, layers, {0.4}, 0.1)};
    const int live_nodes = 3;
    InstantiationOptions options{.live_nodes = live_nodes, .devices_per_node = g,
                                 .global_microbatches = 2 + trial % 7,
                                 .min_pipelines = 1 + trial % 2,
                                 .template_microbatches = kTemplateMicrobatches};
    auto inst = Instantiate(set, options);
    ASSERT_TRUE(inst.ok()) << inst.status();
    HeldLayers held;
    for (int rank = 0; rank < live_nodes * g; ++rank) {
      const int first = rng() % layers;
      held[rank].push_back({first, first + 1 + static_cast<int>(rng() % (layers - first))});
      if (rng() % 2) held[rank].push_back({0, 1});
    }
    held[99] = {{0, layers}};  // a dead rank: ignored
    auto assignment = AssignRanks(set, *inst, Nodes(live_nodes, g), held, {});
    ASSERT_TRUE(assignment.ok()) << assignment.status();
    // Every placement of nodes on the pipelines' node slots, ranks permuted inside a node.
    std::vector<std::pair<int, int>> slots;  // (template, node in pipeline)
    for (const PipelineInstance& p : inst->pipelines) {
      for (int q = 0; q < p.nodes; ++q) slots.emplace_back(p.template_index, q);
    }
    std::vector<int> order(live_nodes);
    std::iota(order.begin(), order.end(), 0);
    int best = 0;
    do {
      int kept = 0;
      for (size_t s = 0; s < slots.size(); ++s) {
        const PipelineTemplate& t = set.templates[slots[s].first];
        std::vector<int> ranks = Nodes(live_nodes, g)[order[s]];
        int node_best = 0;
        do {
          int node_kept = 0;
          for (int d = 0; d < g; ++d) {
            const planner::TemplateStage& stage =
                t.stages[(slots[s].second * g + d) / t.devices_per_stage];
            for (int l = stage.first_layer; l < stage.end_layer; ++l) {
              node_kept += HeldBy(held, ranks[d], l);
            }
          }
          node_best = std::max(node_best, node_kept);
        } while (std::next_permutation(ranks.begin(), ranks.end()));
        kept += node_best;
      }
      best = std::max(best, kept);
    } while (std::next_permutation(order.begin(), order.end()));
    EXPECT_EQ(KeptLayers(*assignment, held), best) << "trial " << trial;
  }
}

// Three 4-node pipelines are best on 12 nodes; on 11, two of them and a 3-node one.
TemplateSet FourNodeFavouringSet(int g) {
  TemplateSet set;
  set.min_nodes = 2;
  set.templates = {MakeTemplate(2, g, 1, 16, {1.0}, 0.2), MakeTemplate(3, g, 1, 16, {0.7}, 0.2),
                   MakeTemplate(4, g, 1, 16, {0.4}, 0.2), MakeTemplate(5, g, 1, 16, {0.45}, 0.2),
                   MakeTemplate(6, g, 1, 16, {0.4}, 0.2)};
  return set;
}

TEST(Instantiate, UsesTheMicrobatchesTheSetRecords) {
  const planner::LayerChain chain = UniformChain(16);
  const TemplateSet generated = GeneratedTemplates(chain, 6);
  ASSERT_EQ(generated.microbatches, kTemplateMicrobatches);
  InstantiationOptions options{.live_nodes = 5, .devices_per_node = 2,
                               .global_microbatches = 16, .min_pipelines = 2};
  ASSERT_EQ(options.template_microbatches, 0);  // the default: the set's
  auto recorded = Instantiate(generated, options);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  options.template_microbatches = kTemplateMicrobatches;  // explicit and equal: the same plan
  auto explicit_m = Instantiate(generated, options);
  ASSERT_TRUE(explicit_m.ok()) << explicit_m.status();
  EXPECT_EQ(ToJson(*recorded).dump(), ToJson(*explicit_m).dump());

  // A hand-made set: the recorded m changes the iteration model, and so the plan. At m = 1 a
  // template's whole iteration_seconds is the time of one micro-batch; at m = 4 three slowest
  // stages of it are per micro-batch.
  TemplateSet set = FourNodeFavouringSet(2);
  options = {.live_nodes = 11, .devices_per_node = 2, .global_microbatches = 24,
             .min_pipelines = 2};
  auto unrecorded = Instantiate(set, options);
  EXPECT_EQ(unrecorded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unrecorded.status().message().find("pass template_microbatches"), std::string::npos)
      << unrecorded.status();
  for (int m : {1, kTemplateMicrobatches}) {
    set.microbatches = 0;
    options.template_microbatches = m;
    auto expected = Instantiate(set, options);
    ASSERT_TRUE(expected.ok()) << expected.status();
    set.microbatches = m;
    options.template_microbatches = 0;
    auto from_set = Instantiate(set, options);
    ASSERT_TRUE(from_set.ok()) << from_set.status();
    EXPECT_EQ(ToJson(*from_set).dump(), ToJson(*expected).dump()) << "m = " << m;
    const std::vector<IterationModel> models = ModelsOf(set);  // at m = 4
    const PipelineInstance& first = from_set->pipelines.front();
    const double at_four = models[first.template_index].Seconds(first.microbatches);
    if (m == 1) {
      EXPECT_NE(first.predicted_seconds, at_four);
    } else {
      EXPECT_EQ(first.predicted_seconds, at_four);
    }
  }
  set.microbatches = kTemplateMicrobatches;
  options.template_microbatches = 1;  // contradicts the set
  auto contradicted = Instantiate(set, options);
  EXPECT_EQ(contradicted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(contradicted.status().message().find("generated for 4 micro-batches"),
            std::string::npos)
      << contradicted.status();
  options.template_microbatches = -1;
  EXPECT_EQ(Instantiate(set, options).status().code(), absl::StatusCode::kInvalidArgument);

  // PlanReinstantiation takes the same default.
  ReinstantiationInput input;
  input.nodes = Nodes(11, 2);
  input.global_microbatches = 24;
  input.min_pipelines = 2;
  auto plan = PlanReinstantiation(set, input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  options.template_microbatches = 0;
  EXPECT_EQ(ToJson(plan->instantiation).dump(), ToJson(*Instantiate(set, options)).dump());
}

TEST(Instantiate, RefusesNodesOfAnotherSizeThanTheSetRecords) {
  const planner::LayerChain chain = UniformChain(16);
  const TemplateSet generated = GeneratedTemplates(chain, 6);
  ASSERT_EQ(generated.devices_per_node, 2);
  InstantiationOptions options{.live_nodes = 6, .devices_per_node = 4,
                               .global_microbatches = 16, .min_pipelines = 1};
  auto wrong = Instantiate(generated, options);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("generated for nodes of 2 devices, the nodes have 4"),
            std::string::npos)
      << wrong.status();
  ReinstantiationInput input;
  input.nodes = Nodes(3, 4);
  input.global_microbatches = 16;
  auto plan = PlanReinstantiation(generated, input);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("nodes of 2 devices"), std::string::npos)
      << plan.status();

  // A set whose templates fill nodes of 2 devices but that records 4: its layout alone would
  // pass with 2, the record does not.
  TemplateSet mislabelled = FourNodeFavouringSet(2);
  mislabelled.devices_per_node = 4;
  options = {.live_nodes = 6, .devices_per_node = 2, .global_microbatches = 12,
             .min_pipelines = 1, .template_microbatches = kTemplateMicrobatches};
  EXPECT_EQ(Instantiate(mislabelled, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  mislabelled.devices_per_node = 0;  // not recorded: the layout decides
  auto inst = Instantiate(mislabelled, options);
  ASSERT_TRUE(inst.ok()) << inst.status();
  mislabelled.devices_per_node = 4;
  EXPECT_EQ(AssignRanks(mislabelled, *inst, Nodes(6, 2), {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  mislabelled.devices_per_node = 2;
  EXPECT_TRUE(AssignRanks(mislabelled, *inst, Nodes(6, 2), {}, {}).ok());
}

TEST(PlanReinstantiation, OneLostNodeMovesOnlyTheRebuiltPipeline) {
  const int g = 2;
  const TemplateSet set = FourNodeFavouringSet(g);
  ReinstantiationInput input;
  input.nodes = Nodes(12, g);
  input.global_microbatches = 24;
  input.min_pipelines = 2;
  input.template_microbatches = kTemplateMicrobatches;
  input.layer_state_bytes.assign(16, 1e9);
  auto before = PlanReinstantiation(set, input);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(Describe(before->instantiation).substr(0, 24), "3 pipelines: 3x4 nodes; ");
  EXPECT_EQ(before->moves.checkpoint_layers.size(), 16u);  // nothing was held
  EXPECT_EQ(before->moves.ranks_unchanged, 0);

  input.held = HeldAfter(before->assignment);
  input.nodes.erase(input.nodes.begin() + 5);  // node 5 (ranks 10, 11) dies
  auto after = PlanReinstantiation(set, input);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(Describe(after->instantiation).substr(0, 36), "3 pipelines: 2x4 nodes + 1x3 nodes; ")
      << Describe(*after);
  // Every 4-node slot can be filled by a survivor holding exactly its layers, so only the
  // 3-node pipeline receives state: at least 16 of 22 ranks keep theirs.
  EXPECT_EQ(after->moves.ranks_in_layout, 22);
  EXPECT_GE(after->moves.ranks_unchanged, 16) << Describe(*after);
  std::set<int> receivers;
  for (const LayerMove& move : after->moves.moves) receivers.insert(move.destination_rank);
  for (int p = 0; p < 2; ++p) {
    for (const StageRanks& stage : after->assignment.pipelines[p].stages) {
      for (int rank : stage.ranks) EXPECT_EQ(receivers.count(rank), 0u) << "rank " << rank;
    }
  }
  EXPECT_TRUE(after->moves.checkpoint_layers.empty());
  EXPECT_EQ(after->moves.bytes_from_checkpoint, 0);
  for (const LayerMove& move : after->moves.moves) {
    ASSERT_NE(move.source_rank, kFromCheckpoint);
    EXPECT_TRUE(HeldBy(input.held, move.source_rank, move.layer));
    EXPECT_FALSE(HeldBy(input.held, move.destination_rank, move.layer));
    EXPECT_NE(move.source_rank / g, 5) << "a dead node sends";
    EXPECT_EQ(move.bytes, 1e9);
  }
  EXPECT_NE(Describe(*after).find("; 0 layers from checkpoint"), std::string::npos)
      << Describe(*after);
}

TEST(PlanReinstantiation, GeneratedTemplatesLoseANode) {
  const planner::LayerChain chain = UniformChain(16);
  const TemplateSet set = GeneratedTemplates(chain, 8);
  ReinstantiationInput input;
  input.nodes = Nodes(8, 2);
  input.global_microbatches = 32;
  input.min_pipelines = 2;
  input.template_microbatches = kTemplateMicrobatches;
  input.layer_state_bytes = LayerStateBytes(chain);
  auto before = PlanReinstantiation(set, input);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->instantiation.used_nodes, 8);
  input.held = HeldAfter(before->assignment);
  input.nodes.erase(input.nodes.begin());
  auto after = PlanReinstantiation(set, input);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->instantiation.used_nodes, 7);
  EXPECT_TRUE(after->moves.checkpoint_layers.empty()) << Describe(*after);
  EXPECT_GT(2 * after->moves.ranks_unchanged, after->moves.ranks_in_layout) << Describe(*after);
  EXPECT_EQ(after->moves.bytes_from_ranks,
            after->moves.copies_from_ranks * (5e7 + 1e8));
}

TEST(PlanStateMoves, CheckpointExactlyWhenNoReplicaSurvives) {
  // One pipeline of 4 nodes, one rank each: losing node 1 loses its layers for good.
  TemplateSet set;
  set.min_nodes = 1;
  for (int n = 1; n <= 4; ++n) set.templates.push_back(MakeTemplate(n, 1, 1, 8, {4.0 / n}, 0));
  ReinstantiationInput input;
  input.nodes = Nodes(4, 1);
  input.held = {{0, {{0, 2}}}, {1, {{2, 4}}}, {2, {{4, 6}}}, {3, {{6, 8}}}};
  input.global_microbatches = 3;
  input.template_microbatches = kTemplateMicrobatches;
  input.nodes.erase(input.nodes.begin() + 1);
  auto plan = PlanReinstantiation(set, input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->moves.checkpoint_layers, (std::vector<int>{2, 3}));
  for (const LayerMove& move : plan->moves.moves) {
    bool replica = false;
    for (const std::vector<int>& node : input.nodes) {
      for (int rank : node) replica = replica || HeldBy(input.held, rank, move.layer);
    }
    EXPECT_EQ(move.source_rank == kFromCheckpoint, !replica) << "layer " << move.layer;
    if (replica) EXPECT_TRUE(HeldBy(input.held, move.source_rank, move.layer));
  }
  EXPECT_FALSE(plan->moves.bytes_known);
  EXPECT_NE(Describe(*plan).find("2 layers from checkpoint"), std::string::npos)
      << Describe(*plan);
}

TEST(PlanStateMoves, PrefersTheSameNodeThenSpreadsTheLoad) {
  // New layout: one pipeline whose single stage needs all 4 layers on ranks 0..3 (nodes {0,1},
  // {2,3}); ranks 4..7 are spare holders.
  RankAssignment assignment;
  assignment.pipelines.push_back({0, 4, {0, 2}, {{{0, 4}, {0, 1, 2, 3}}}});
  const std::vector<std::vector<int>> nodes = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  HeldLayers held = {{1, {{0, 1}}}, {4, {{0, 4}}}, {5, {{0, 4}}}, {6, {{0, 4}}},
                     {7, {{0, 4}}}};
  auto plan = PlanStateMoves(assignment, nodes, held, {1, 1, 1, 1}, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<int, int> sent;
  for (const LayerMove& move : plan->moves) {
    ++sent[move.source_rank];
    if (move.layer == 0 && move.destination_rank == 0) EXPECT_EQ(move.source_rank, 1);
    EXPECT_TRUE(HeldBy(held, move.source_rank, move.layer));
  }
  EXPECT_EQ(plan->moves.size(), 15u);  // 16 needed, rank 1 holds layer 0
  EXPECT_EQ(sent[1], 1);
  // 14 copies over four equal holders: 3 or 4 each.
  for (int rank : {4, 5, 6, 7}) {
    EXPECT_GE(sent[rank], 3) << rank;
    EXPECT_LE(sent[rank], 4) << rank;
  }
  EXPECT_EQ(plan->max_bytes_from_one_rank, 4);
  EXPECT_EQ(plan->source_ranks, 5);
  EXPECT_EQ(plan->ranks_unchanged, 0);
}

TEST(PlanReinstantiation, DeterministicAndIndependentOfInputOrder) {
  const TemplateSet set = FourNodeFavouringSet(2);
  ReinstantiationInput input;
  input.nodes = Nodes(12, 2);
  input.global_microbatches = 30;
  input.min_pipelines = 2;
  input.template_microbatches = kTemplateMicrobatches;
  auto first = PlanReinstantiation(set, input);
  ASSERT_TRUE(first.ok()) << first.status();
  input.held = HeldAfter(first->assignment);
  input.nodes.erase(input.nodes.begin() + 3);
  input.nodes.erase(input.nodes.begin() + 7);
  auto once = PlanReinstantiation(set, input);
  auto twice = PlanReinstantiation(set, input);
  ASSERT_TRUE(once.ok() && twice.ok());
  EXPECT_EQ(ToJson(*once).dump(), ToJson(*twice).dump());
  std::mt19937 rng(9);
  for (int shuffle = 0; shuffle < 5; ++shuffle) {
    ReinstantiationInput shuffled = input;
    std::shuffle(shuffled.nodes.begin(), shuffled.nodes.end(), rng);
    for (std::vector<int>& node : shuffled.nodes) std::shuffle(node.begin(), node.end(), rng);
    auto again = PlanReinstantiation(set, shuffled);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(ToJson(*again).dump(), ToJson(*once).dump()) << "shuffle " << shuffle;
  }
  const nlohmann::json json = ToJson(*once);
  EXPECT_EQ(json["instantiation"]["used_nodes"], 10);
  EXPECT_EQ(json["summary"], Describe(*once));
}

TEST(PlanReinstantiation, BadInputs) {
  const TemplateSet set = FourNodeFavouringSet(2);
  ReinstantiationInput input;
  input.nodes = Nodes(6, 2);
  input.global_microbatches = 12;
  input.template_microbatches = kTemplateMicrobatches;
  ASSERT_TRUE(PlanReinstantiation(set, input).ok());
  ReinstantiationInput bad = input;
  bad.nodes[2].pop_back();  // a node with one rank
  EXPECT_EQ(PlanReinstantiation(set, bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = input;
  bad.nodes[2][0] = 0;  // rank 0 twice
  EXPECT_EQ(PlanReinstantiation(set, bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = input;
  bad.held[3] = {{10, 17}};  // past the 16 layers
  EXPECT_EQ(PlanReinstantiation(set, bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = input;
  bad.layer_state_bytes = {1, 2, 3};
  EXPECT_EQ(PlanReinstantiation(set, bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = input;
  bad.nodes.clear();
  EXPECT_EQ(PlanReinstantiation(set, bad).status().code(), absl::StatusCode::kInvalidArgument);
  auto inst = Instantiate(set, {.live_nodes = 6, .devices_per_node = 2,
                                .global_microbatches = 12, .min_pipelines = 1,
                                .template_microbatches = kTemplateMicrobatches});
  ASSERT_TRUE(inst.ok());
  EXPECT_EQ(AssignRanks(set, *inst, Nodes(5, 2), {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // planned for 6 nodes
}

}  // namespace
}  // namespace tandem::elastic
