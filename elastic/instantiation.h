// Re-instantiating a job from pipeline templates after failures (Oobleck, Jang et al., SOSP
// 2023, sections 4.2 and 4.3): the pure planning part, computed independently and identically
// on every surviving rank (no MPI, no torch, no clocks, no hashing of pointers).
//
// 1. Iteration model. A template's predicted time for b micro-batches is
//      T(b) = (b - 1) * slowest stage / c + sum of stage times + constant,
//    the constant (activation transfers, gradient sync) recovered from the template's
//    iteration_seconds at the m micro-batches it was generated for, so T(m) is exactly that.
//
// 2. Batch distribution (section 4.3). The global batch of B micro-batches stays fixed across
//    failures; pipeline i gets b_i >= 1 with sum b_i = B minimising max_i T_i(b_i). Exact: the
//    optimum is max(max_i T_i(1), v) where v is the (B - k)-th smallest value of T_i(b) over
//    all i and b >= 2 (an allocation of max <= t holds every T_i(1) and at most
//    count(<= t) further values). v is found by bisection on the ordering of doubles with a
//    per-pipeline count, so it costs O(k log B) per probe whatever B is; ties at v go to the
//    earlier pipelines.
//
// 3. Instantiation (section 4.2). Choose a multiset of templates, node counts summing to the
//    live nodes N when any admissible multiset does (spare nodes only when unavoidable, e.g.
//    gaps in the template sizes), with min_pipelines <= pipelines <= B, minimising the
//    iteration time after batch distribution. Instead of enumerating multisets (exponential in
//    N) the optimal time T* is searched directly: a multiset meets a threshold t iff each of
//    its templates fits one micro-batch in t and their capacities cap_j(t) = #{b : T_j(b) <= t}
//    sum to at least B. For a fixed t that is an unbounded knapsack over (nodes, pipelines)
//    maximising total capacity, O(templates * N * K); T* is one of the values T_j(b), so a
//    bisection over their ranks needs about log2(templates * B) knapsacks. K, the pipeline
//    count dimension, is min_pipelines + 1 (counts saturate) unless B is smaller than the
//    largest possible pipeline count, when counts are exact up to B.
//    Ties on T* go to fewer pipelines, then to larger templates (the lexicographically
//    greatest list of node counts in descending order), reconstructed greedily from one
//    knapsack table with exact counts at T*.
//
// 4. Rank assignment. Pipelines lay their devices out node by node as the templates assume
//    (stage s of c devices on positions [s c, (s+1) c)), so a pipeline on n nodes is n "node
//    slots", each needing given layer ranges on its g positions. A node's value in a slot is
//    the best matching of its ranks to the slot's positions, counting the layers (or the state
//    bytes, when given) each rank already holds; nodes are then matched to slots. Both
//    matchings are solved exactly (Hungarian algorithm), so the total state kept in place is
//    the largest possible for the chosen templates. Unmatched nodes are the spare nodes.
//
// 5. State moves. Every (rank, layer) of the new layout that the rank does not hold gets a
//    source: a live rank that held the layer before, on the same node when one exists, else
//    the least loaded one so far (bytes, then moves, then lowest rank; layers in order), or
//    kFromCheckpoint when no live rank holds it. Sources are the old state: the runtime must
//    finish the moves before ranks drop layers they no longer need. Spare ranks can be sources.
//
// Nodes are named by their smallest rank; the input order of nodes and of ranks inside a node
// does not matter.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "planner/layer_chain.h"
#include "planner/templates.h"

namespace tandem::elastic {

// T(b) of one template (1. above). Seconds(b) is non-decreasing in b.
struct IterationModel {
  int64_t reference_microbatches = 1;  // m, the template's micro-batches
  double reference_seconds = 0;        // T(m), the template's iteration_seconds
  double per_microbatch_seconds = 0;   // slowest stage / c
  double stage_seconds = 0;            // sum of stage times
  double constant_seconds = 0;         // the rest of T(m): transfers and gradient sync

  double Seconds(int64_t microbatches) const {
    return reference_seconds +
           static_cast<double>(microbatches - reference_microbatches) * per_microbatch_seconds;
  }
};

// `template_microbatches`: TemplateOptions::microbatches the template was generated with.
// InvalidArgument when the template is malformed or its iteration_seconds is below its stage
// times at that many micro-batches (a sign of the wrong m).
absl::StatusOr<IterationModel> ModelIteration(const planner::PipelineTemplate& pipeline_template,
                                              int template_microbatches);

// Micro-batches per pipeline (2. above): b_i >= 1, sum = global_microbatches, max_i T_i(b_i)
// minimal. InvalidArgument when global_microbatches < the number of pipelines.
absl::StatusOr<std::vector<int64_t>> DistributeMicrobatches(
    const std::vector<IterationModel>& pipelines, int64_t global_microbatches);

struct InstantiationOptions {
  int live_nodes = 0;
  int devices_per_node = 1;
  int64_t global_microbatches = 0;  // B, the same before and after failures
  int min_pipelines = 1;            // f + 1 to survive f more failures
  // TemplateOptions::microbatches of the template set. 0: the set's TemplateSet::microbatches
  // (InvalidArgument when it records none); a value the set contradicts is InvalidArgument.
  int template_microbatches = 0;
};

struct PipelineInstance {
  int template_index = 0;  // into TemplateSet::templates
  int nodes = 0;
  int64_t microbatches = 0;
  double predicted_seconds = 0;  // T(microbatches)
};

struct Instantiation {
  std::vector<PipelineInstance> pipelines;  // larger templates first
  int live_nodes = 0;
  int used_nodes = 0;  // live_nodes - used_nodes nodes are spare
  int64_t global_microbatches = 0;
  double iteration_seconds = 0;  // max over pipelines of predicted_seconds
};

// 3. above. ResourceExhausted when no template fits the live nodes; FailedPrecondition when
// they cannot hold min_pipelines pipelines (the message says how many failures the largest
// possible number of pipelines survives); InvalidArgument for malformed input, including
// devices_per_node or template_microbatches other than the ones the set records.
absl::StatusOr<Instantiation> Instantiate(const planner::TemplateSet& templates,
                                          const InstantiationOptions& options);

struct LayerRange {
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  bool operator==(const LayerRange& o) const {
    return first_layer == o.first_layer && end_layer == o.end_layer;
  }
};

// Layers each rank holds (parameters and optimizer state), by world rank. Ranks absent hold
// nothing; entries of ranks that are not live are ignored, so an old layout can be passed whole.
using HeldLayers = std::map<int, std::vector<LayerRange>>;

struct StageRanks {
  LayerRange layers;
  std::vector<int> ranks;  // the stage's data-parallel devices, ascending
};

struct PipelineRanks {
  int template_index = 0;
  int64_t microbatches = 0;
  std::vector<int> nodes;  // node names (smallest rank), in pipeline order
  std::vector<StageRanks> stages;
};

struct RankAssignment {
  std::vector<PipelineRanks> pipelines;  // in Instantiation::pipelines order
  std::vector<int> spare_nodes;          // node names, ascending
  std::vector<int> spare_ranks;          // ascending
};

// 4. above. `nodes`: the live world ranks grouped by node, every node with devices_per_node
// ranks; `layer_state_bytes`: parameter + optimizer bytes per layer (empty: count layers).
absl::StatusOr<RankAssignment> AssignRanks(const planner::TemplateSet& templates,
                                           const Instantiation& instantiation,
                                           const std::vector<std::vector<int>>& nodes,
                                           const HeldLayers& held,
                                           const std::vector<double>& layer_state_bytes);

inline constexpr int kFromCheckpoint = -1;

struct LayerMove {
  int layer = 0;
  int source_rank = kFromCheckpoint;  // a live rank that held the layer, or kFromCheckpoint
  int destination_rank = 0;
  double bytes = 0;  // 0 when layer bytes are unknown
};

struct StateMovePlan {
  std::vector<LayerMove> moves;     // by destination rank, then layer
  std::vector<int> checkpoint_layers;  // layers no live rank holds, ascending
  int64_t copies_from_ranks = 0;
  int64_t copies_from_checkpoint = 0;
  bool bytes_known = false;
  double bytes_from_ranks = 0;
  double bytes_from_checkpoint = 0;
  double max_bytes_from_one_rank = 0;
  int source_ranks = 0;       // distinct ranks that send
  int ranks_unchanged = 0;    // ranks of the new layout that receive nothing
  int ranks_in_layout = 0;
};

// 5. above. `num_layers`: the model's layer count (every held range must lie inside it).
absl::StatusOr<StateMovePlan> PlanStateMoves(const RankAssignment& assignment,
                                             const std::vector<std::vector<int>>& nodes,
                                             const HeldLayers& held,
                                             const std::vector<double>& layer_state_bytes,
                                             int num_layers);

// Everything above from one input, as every surviving rank computes it.
struct ReinstantiationInput {
  std::vector<std::vector<int>> nodes;  // live world ranks, grouped by node
  HeldLayers held;                      // what each rank held before the failure
  int64_t global_microbatches = 0;
  int min_pipelines = 1;
  int template_microbatches = 0;          // as InstantiationOptions: 0 = the set's
  std::vector<double> layer_state_bytes;  // per layer; empty = unknown
};

struct ElasticPlan {
  Instantiation instantiation;
  RankAssignment assignment;
  StateMovePlan moves;
};

absl::StatusOr<ElasticPlan> PlanReinstantiation(const planner::TemplateSet& templates,
                                                const ReinstantiationInput& input);

// The layers every rank holds once `assignment` is in place: the next failure's HeldLayers.
HeldLayers HeldAfter(const RankAssignment& assignment);

// Parameter + optimizer-state bytes of every layer of a chain.
std::vector<double> LayerStateBytes(const planner::LayerChain& chain);

nlohmann::json ToJson(const Instantiation& instantiation);
nlohmann::json ToJson(const RankAssignment& assignment);
nlohmann::json ToJson(const StateMovePlan& moves);
nlohmann::json ToJson(const ElasticPlan& plan);

// One line: "3 pipelines: 2x4 nodes + 1x3 nodes; micro-batches 6/6/4; predicted 1.23
// s/iteration; 1 spare node; 12 layer copies (1.50 GiB) from 5 ranks; 2 layers from checkpoint".
std::string Describe(const Instantiation& instantiation);
std::string Describe(const ElasticPlan& plan);

}  // namespace tandem::elastic
