#include "cluster/planned_throughput.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::cluster {

double PlannedThroughput::SamplesPerSecond(int nodes, int replicas) const {
  if (nodes <= 0 || replicas < nodes || samples_per_second.empty()) return 0;
  const int k = std::min(nodes, static_cast<int>(samples_per_second.size()));
  const std::vector<double>& row = samples_per_second[k - 1];
  const int d = std::min(replicas / nodes, static_cast<int>(row.size()));
  return d > 0 ? row[d - 1] : 0;
}

int PlannedThroughput::MinReplicas() const {
  const int most = static_cast<int>(samples_per_second.size()) * gpus_per_node;
  for (int replicas = 1; replicas <= most; ++replicas) {
    const int nodes = (replicas + gpus_per_node - 1) / gpus_per_node;
    if (SamplesPerSecond(nodes, replicas) > 0) return replicas;
  }
  return 0;
}

absl::StatusOr<PlannedThroughput> PlanThroughput(const planner::LayerChain& chain,
                                                 const planner::ClusterSpec& node_shape,
                                                 const planner::TemplateOptions& options,
                                                 const std::string& model) {
  TANDEM_RETURN_IF_ERROR(planner::ValidateCluster(node_shape, "node shape"));
  PlannedThroughput table;
  table.model = model;
  table.gpus_per_node = node_shape.devices_per_node;
  table.samples_per_second.assign(node_shape.nodes,
                                  std::vector<double>(node_shape.devices_per_node, 0.0));
  const planner::NetworkLevel& inter = node_shape.levels.back();
  bool any = false;
  for (int d = 1; d <= node_shape.devices_per_node; ++d) {
    planner::ClusterSpec shape = node_shape;
    shape.devices_per_node = d;
    shape.device_speeds.clear();
    absl::StatusOr<planner::TemplateSet> set =
        planner::GeneratePipelineTemplates(chain, shape, options);
    if (absl::IsResourceExhausted(set.status())) continue;
    TANDEM_RETURN_IF_ERROR(set.status());
    for (const planner::PipelineTemplate& pipeline : set->templates) {
      double largest_stage_bytes = 0;  // per device of the stage
      for (const planner::TemplateStage& stage : pipeline.stages) {
        largest_stage_bytes =
            std::max(largest_stage_bytes,
                     chain.ParameterBytes(stage.first_layer, stage.end_layer) / stage.devices);
      }
      const double samples = static_cast<double>(set->microbatches) * set->microbatch_size;
      for (int copies = 1; copies * pipeline.nodes <= node_shape.nodes; ++copies) {
        const double sync =
            copies == 1 ? 0
                        : 2.0 * (copies - 1) / copies * largest_stage_bytes /
                                  inter.bandwidth_bytes_per_second +
                              2.0 * (copies - 1) * inter.latency_seconds;
        const double rate = copies * samples / (pipeline.iteration_seconds + sync);
        // Every node count from copies x template nodes up can run this (spare nodes idle).
        for (int k = copies * pipeline.nodes; k <= node_shape.nodes; ++k) {
          double& cell = table.samples_per_second[k - 1][d - 1];
          cell = std::max(cell, rate);
        }
        any = true;
      }
    }
  }
  if (!any) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "planned throughput", model.empty() ? "" : " of " + model, ": no plan fits on ",
        node_shape.nodes, " nodes of ", node_shape.devices_per_node, " devices"));
  }
  return table;
}

}  // namespace tandem::cluster
