// Pipeline templates for the elastic layer (Oobleck, Jang et al., SOSP 2023): for every node
// count n from the smallest that fits the model up to the cluster's, the best single pipeline
// on exactly n nodes, so that after failures the survivors can be re-formed from templates
// without planning from scratch.
//
// A template on n nodes of g devices splits the layers into p contiguous stages that all use c
// devices each (n * g = p * c): c divides g (several stages per node) or is a whole number of
// nodes (a stage spans nodes). A stage's c devices are data-parallel replicas taking turns
// with micro-batches, so stage i holds ceil((p - i) / c) micro-batches' activations; layers
// are recomputed where memory needs it (AdaPipe's per-stage knapsack). Among the shapes for n
// the fastest predicted iteration wins:
//   (m - 1) * slowest stage / c + sum of stage times            (1F1B with replicated stages)
//   + activation transfers of one micro-batch across the boundaries
//   + the slowest stage's gradient all-reduce over its c devices (ring, 2 (c-1)/c of the
//     bytes; intra-node bandwidth when c <= g).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "planner/cluster.h"
#include "planner/layer_chain.h"

namespace tandem::planner {

struct TemplateStage {
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  int devices = 1;       // c
  std::vector<int> recompute_layers;
  double seconds = 0;        // forward + backward (+ recomputation) of one micro-batch
  double memory_bytes = 0;   // per device
};

struct PipelineTemplate {
  int nodes = 0;
  int devices_per_stage = 1;
  std::vector<TemplateStage> stages;
  double iteration_seconds = 0;  // predicted, for `microbatches` micro-batches
  double throughput_samples_per_second = 0;
};

// What GeneratePipelineTemplates made, and for what: a template's iteration_seconds holds only
// at `microbatches` micro-batches of `microbatch_size` samples, on nodes of `devices_per_node`
// devices. A set built by hand may leave those 0 (not recorded).
struct TemplateSet {
  int min_nodes = 0;  // the smallest node count with a template
  // Node counts increasing from min_nodes up to at most the cluster's, with gaps: a node count
  // without a template (no shape fits it) is skipped, so templates[i] need not be for
  // min_nodes + i nodes: look at PipelineTemplate::nodes.
  std::vector<PipelineTemplate> templates;
  int microbatches = 0;         // TemplateOptions::microbatches
  int64_t microbatch_size = 0;  // TemplateOptions::microbatch_size
  int devices_per_node = 0;     // ClusterSpec::devices_per_node
  double generation_seconds = 0;
};

struct TemplateOptions {
  int microbatches = 16;           // per iteration of one pipeline
  int64_t microbatch_size = 1;     // samples per micro-batch (for throughput)
};

// ResourceExhausted when no node count up to the cluster's fits the model.
absl::StatusOr<TemplateSet> GeneratePipelineTemplates(const LayerChain& chain,
                                                      const ClusterSpec& cluster,
                                                      const TemplateOptions& options);

nlohmann::json ToJson(const TemplateSet& templates);

}  // namespace tandem::planner
