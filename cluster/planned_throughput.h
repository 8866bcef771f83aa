// Throughput of a job as tandem's planner predicts it, per placement: the hook through which
// the cluster allocator sees pipeline, data and tensor parallel plans instead of a measured
// speedup curve (docs/cluster.md, "Planner-fed throughput").
//
// For every node count k and devices per node d (the placement a policy chooses: k nodes, d =
// replicas / k of each node's GPUs used), the best of P identical data-parallel copies of the
// planner's pipeline template on k / P nodes of d devices (planner/templates.h: stages,
// devices per stage, recomputation, tensor parallelism through the profile), each copy running
// the template's micro-batches per iteration:
//   samples/s = P x microbatches x microbatch size / (T_template + T_sync(P))
//   T_sync(P) = 2 (P - 1) / P x (largest stage's parameter bytes / its devices) / inter-node
//               bandwidth + 2 (P - 1) x latency           (ring all-reduce across the copies)
// Mixed templates (Oobleck's heterogeneous pipelines, elastic/instantiation.h) are not used
// here: identical copies keep the table a pure function of (k, d). A placement with no
// template that fits memory is worth 0.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cluster.h"
#include "planner/layer_chain.h"
#include "planner/templates.h"

namespace tandem::cluster {

struct PlannedThroughput {
  std::string model;
  int gpus_per_node = 0;
  // samples_per_second[k - 1][d - 1]: k nodes with d devices each; 0 where nothing fits.
  std::vector<std::vector<double>> samples_per_second;

  // On `replicas` GPUs spread over `nodes` nodes: the table at (nodes, replicas / nodes),
  // clamped to the table (0 for no GPUs or fewer GPUs than nodes).
  double SamplesPerSecond(int nodes, int replicas) const;
  // The fewest GPUs, packed gpus_per_node to a node, with a plan (0 if none).
  int MinReplicas() const;
};

// Plans `chain` on nodes shaped like `node_shape` (devices_per_node = GPUs per node, memory,
// network levels) for 1..node_shape.nodes nodes and 1..devices_per_node devices per node.
// ResourceExhausted when nothing fits even on every node.
absl::StatusOr<PlannedThroughput> PlanThroughput(const planner::LayerChain& chain,
                                                 const planner::ClusterSpec& node_shape,
                                                 const planner::TemplateOptions& options,
                                                 const std::string& model = "");

}  // namespace tandem::cluster
