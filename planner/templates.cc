#include "planner/templates.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/units.h"
#include "planner/adapipe.h"

namespace tandem::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr double kRingFactor = 2.0;            // ring all-reduce moves 2 (c-1)/c of the bytes
constexpr double kTransfersPerBoundary = 2.0;  // activation forward, gradient backward

}  // namespace

absl::StatusOr<TemplateSet> GeneratePipelineTemplates(const LayerChain& chain,
                                                      const ClusterSpec& cluster,
                                                      const TemplateOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(ValidateCluster(cluster));
  if (options.microbatches < 1 || options.microbatch_size < 1) {
    return absl::InvalidArgumentError("templates: micro-batches and their size must be positive");
  }
  const int g = cluster.devices_per_node;
  const int layers = chain.num_layers();
  const double intra = cluster.levels.front().bandwidth_bytes_per_second;
  const double inter = cluster.levels.back().bandwidth_bytes_per_second;
  // One planner per devices-per-stage count c: its knapsack cache is shared by every n.
  std::map<int, std::unique_ptr<AdaPipePlanner>> planners;
  auto planner_for = [&](int c) -> AdaPipePlanner& {
    auto& slot = planners[c];
    if (!slot) slot = std::make_unique<AdaPipePlanner>(chain, cluster.device_memory_bytes);
    return *slot;
  };
  TemplateSet set;
  set.microbatches = options.microbatches;
  set.microbatch_size = options.microbatch_size;
  set.devices_per_node = g;
  for (int n = 1; n <= cluster.nodes; ++n) {
    std::vector<int> shapes;  // devices per stage
    for (int c = 1; c <= g; ++c) {
      if (g % c == 0) shapes.push_back(c);
    }
    for (int j = 2; j <= n; ++j) {
      if (n % j == 0) shapes.push_back(j * g);
    }
    PipelineTemplate best;
    best.iteration_seconds = kInfinity;
    for (int c : shapes) {
      const int p = n * g / c;
      if (p > layers) continue;
      auto plan = planner_for(c).Plan(p, options.microbatches, /*p2p=*/0, /*replicas=*/c);
      if (!plan.ok()) {
        if (plan.status().code() == absl::StatusCode::kResourceExhausted) continue;
        return plan.status();
      }
      double slowest = 0, total = 0, transfers = 0, sync = 0;
      PipelineTemplate candidate;
      candidate.nodes = n;
      candidate.devices_per_stage = c;
      for (size_t i = 0; i < plan->stages.size(); ++i) {
        const AdaPipeStage& s = plan->stages[i];
        slowest = std::max(slowest, s.seconds);
        total += s.seconds;
        // Boundaries inside a node use the intra-node link.
        const int first_device = static_cast<int>(i) * c;
        if (i > 0) {
          const bool same_node = (first_device - 1) / g == first_device / g;
          transfers += kTransfersPerBoundary * chain.CutBytes(s.first_layer) /
                       (same_node ? intra : inter);
        }
        if (c > 1) {
          sync = std::max(sync, kRingFactor * (c - 1) / c *
                                    chain.ParameterBytes(s.first_layer, s.end_layer) /
                                    (c <= g ? intra : inter));
        }
        candidate.stages.push_back({s.first_layer, s.end_layer, c, s.recompute_layers,
                                    s.seconds, s.memory_bytes});
      }
      candidate.iteration_seconds =
          (options.microbatches - 1) * slowest / c + total + transfers + sync;
      if (candidate.iteration_seconds < best.iteration_seconds) best = std::move(candidate);
    }
    // No shape fits n nodes: below the smallest node count that fits, or a larger count
    // without a template (e.g. more stages than layers). Either way the set skips n.
    if (!std::isfinite(best.iteration_seconds)) continue;
    best.throughput_samples_per_second =
        options.microbatches * options.microbatch_size / best.iteration_seconds;
    if (set.templates.empty()) set.min_nodes = n;
    set.templates.push_back(std::move(best));
  }
  if (set.templates.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no pipeline template fits ", FormatBytes(cluster.device_memory_bytes), " per device on ",
        cluster.nodes, " nodes of ", g, " devices"));
  }
  set.generation_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return set;
}

nlohmann::json ToJson(const TemplateSet& set) {
  nlohmann::json templates = nlohmann::json::array();
  for (const PipelineTemplate& t : set.templates) {
    nlohmann::json stages = nlohmann::json::array();
    for (const TemplateStage& s : t.stages) {
      stages.push_back({{"first_layer", s.first_layer},
                        {"end_layer", s.end_layer},
                        {"devices", s.devices},
                        {"recompute_layers", s.recompute_layers},
                        {"seconds", s.seconds},
                        {"memory_bytes", s.memory_bytes}});
    }
    templates.push_back({{"nodes", t.nodes},
                         {"devices_per_stage", t.devices_per_stage},
                         {"iteration_seconds", t.iteration_seconds},
                         {"throughput_samples_per_second", t.throughput_samples_per_second},
                         {"stages", std::move(stages)}});
  }
  return {{"min_nodes", set.min_nodes},
          {"microbatches", set.microbatches},
          {"microbatch_size", set.microbatch_size},
          {"devices_per_node", set.devices_per_node},
          {"generation_seconds", set.generation_seconds},
          {"templates", std::move(templates)}};
}

}  // namespace tandem::planner
