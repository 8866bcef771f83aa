#include "elastic/instantiation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/units.h"

namespace tandem::elastic {
namespace {

using planner::PipelineTemplate;
using planner::TemplateSet;

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Relative slack when recovering a template's constant term (its sums were rounded).
constexpr double kModelTolerance = 1e-9;

// ---------------------------------------------------------------------------------------------
// Validation of the template set.

absl::Status ValidateTemplate(const PipelineTemplate& t, const std::string& name) {
  if (t.nodes < 1 || t.devices_per_stage < 1 || t.stages.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": needs nodes, devices_per_stage and stages (got ", t.nodes,
                     " nodes, ", t.devices_per_stage, " devices per stage, ", t.stages.size(),
                     " stages)"));
  }
  if (!std::isfinite(t.iteration_seconds) || t.iteration_seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": iteration_seconds must be positive, got ", t.iteration_seconds));
  }
  int next_layer = 0;
  for (size_t s = 0; s < t.stages.size(); ++s) {
    const planner::TemplateStage& stage = t.stages[s];
    if (stage.first_layer != next_layer || stage.end_layer <= stage.first_layer) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": stage ", s, " holds layers [", stage.first_layer, ", ",
                       stage.end_layer, "), expected a non-empty range from layer ", next_layer));
    }
    if (stage.devices != t.devices_per_stage) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": stage ", s, " has ", stage.devices,
                                                     " devices, the template ",
                                                     t.devices_per_stage, " per stage"));
    }
    if (!std::isfinite(stage.seconds) || stage.seconds < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": stage ", s, " seconds must be finite and >= 0"));
    }
    next_layer = stage.end_layer;
  }
  return absl::OkStatus();
}

// Checks every template and that they agree (node counts increasing, same layers, same node
// size, the node size the set records if any); returns the number of layers.
absl::StatusOr<int> ValidateTemplateSet(const TemplateSet& set, int devices_per_node) {
  if (set.templates.empty()) return absl::InvalidArgumentError("templates: the set is empty");
  if (set.microbatches < 0 || set.microbatch_size < 0 || set.devices_per_node < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "templates: micro-batches (", set.microbatches, "), micro-batch size (",
        set.microbatch_size, ") and devices per node (", set.devices_per_node,
        ") must be >= 0 (0: not recorded)"));
  }
  if (set.devices_per_node > 0 && set.devices_per_node != devices_per_node) {
    return absl::InvalidArgumentError(absl::StrCat(
        "templates: generated for nodes of ", set.devices_per_node, " devices, the nodes have ",
        devices_per_node));
  }
  if (set.min_nodes != set.templates.front().nodes) {
    return absl::InvalidArgumentError(absl::StrCat("templates: min_nodes is ", set.min_nodes,
                                                   " but the first template has ",
                                                   set.templates.front().nodes, " nodes"));
  }
  const int layers = set.templates.front().stages.empty()
                         ? 0
                         : set.templates.front().stages.back().end_layer;
  for (size_t i = 0; i < set.templates.size(); ++i) {
    const PipelineTemplate& t = set.templates[i];
    const std::string name = absl::StrCat("templates[", i, "]");
    TANDEM_RETURN_IF_ERROR(ValidateTemplate(t, name));
    if (i > 0 && t.nodes <= set.templates[i - 1].nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": node counts must increase (", set.templates[i - 1].nodes,
                       " then ", t.nodes, ")"));
    }
    if (t.stages.back().end_layer != layers) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": covers ", t.stages.back().end_layer,
                                                     " layers, templates[0] ", layers));
    }
    const int64_t devices = static_cast<int64_t>(t.stages.size()) * t.devices_per_stage;
    if (devices != static_cast<int64_t>(t.nodes) * devices_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", t.stages.size(), " stages of ", t.devices_per_stage, " devices do not fill ",
          t.nodes, " nodes of ", devices_per_node, " devices"));
    }
  }
  return layers;
}

// ---------------------------------------------------------------------------------------------
// Counting and ranking the values T_i(b).

// Maps doubles to integers in the same order, so that bisection can visit every double.
uint64_t OrderKey(double x) {
  constexpr uint64_t kSign = uint64_t{1} << 63;
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & kSign) ? ~bits : (bits | kSign);
}

double FromOrderKey(uint64_t key) {
  constexpr uint64_t kSign = uint64_t{1} << 63;
  const uint64_t bits = (key & kSign) ? (key & ~kSign) : ~key;
  double x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// The largest b in [1, limit] with Seconds(b) <= t; 0 when one micro-batch already exceeds t.
int64_t MicrobatchesWithin(const IterationModel& model, double t, int64_t limit) {
  if (!(model.Seconds(1) <= t)) return 0;
  if (model.Seconds(limit) <= t) return limit;
  int64_t within = 1, beyond = limit;  // Seconds(within) <= t < Seconds(beyond)
  while (beyond - within > 1) {
    const int64_t middle = within + (beyond - within) / 2;
    (model.Seconds(middle) <= t ? within : beyond) = middle;
  }
  return within;
}

// How many of the values T_i(b), b in [skip + 1, limit], of all models are <= t.
int64_t CountWithin(const std::vector<IterationModel>& models, double t, int64_t skip,
                    int64_t limit) {
  int64_t count = 0;
  for (const IterationModel& model : models) {
    count += std::max<int64_t>(0, MicrobatchesWithin(model, t, limit) - skip);
  }
  return count;
}

// The rank-th smallest of those values (1 <= rank <= their number): the smallest double t with
// CountWithin(t) >= rank, found by bisection over all doubles (at most 64 steps). The count
// only changes at the values themselves, so t is one of them, bit for bit.
double ValueOfRank(const std::vector<IterationModel>& models, int64_t rank, int64_t skip,
                   int64_t limit) {
  double smallest = kInfinity, largest = -kInfinity;
  for (const IterationModel& model : models) {
    smallest = std::min(smallest, model.Seconds(skip + 1));
    largest = std::max(largest, model.Seconds(limit));
  }
  uint64_t below = OrderKey(smallest) - 1;  // count < rank
  uint64_t at = OrderKey(largest);          // count >= rank
  while (at - below > 1) {
    const uint64_t middle = below + (at - below) / 2;
    (CountWithin(models, FromOrderKey(middle), skip, limit) >= rank ? at : below) = middle;
  }
  return FromOrderKey(at);
}

absl::Status ValidateModels(const std::vector<IterationModel>& models) {
  for (size_t i = 0; i < models.size(); ++i) {
    const IterationModel& m = models[i];
    if (m.reference_microbatches < 1 || !std::isfinite(m.reference_seconds) ||
        !std::isfinite(m.per_microbatch_seconds) || m.per_microbatch_seconds < 0 ||
        !std::isfinite(m.Seconds(1))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline ", i, ": the iteration model needs finite times, a slope >= 0 and "
          "reference micro-batches >= 1"));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Choosing templates: a knapsack over (nodes, pipelines) maximising capacity within a threshold.

struct Candidate {
  int template_index = 0;
  int nodes = 0;
};

// Pipeline counts tracked by the knapsack: exactly 0..max_count, or with `saturate` every count
// from max_count up merged into max_count.
struct CountSpace {
  int max_count = 0;
  bool saturate = false;
  int Next(int count) const {
    if (count < max_count) return count + 1;
    return saturate ? max_count : -1;
  }
};

// Saturated counts suffice when B cannot bound the pipelines (all multisets on `nodes` nodes
// have at most nodes / smallest of them); otherwise counts are exact up to B.
CountSpace SpaceFor(int nodes, int smallest, int64_t global_microbatches, int min_pipelines) {
  const int most = nodes / smallest;
  if (global_microbatches >= most) return {min_pipelines, true};
  return {static_cast<int>(global_microbatches), false};
}

// best[n][k]: the largest total capacity (clamped to `ceiling`) of a multiset of templates with
// exactly n nodes and k pipelines (k as the CountSpace tracks it); -1 when there is none.
// Templates with capacity 0 are left out.
struct CapacityTable {
  CountSpace space;
  std::vector<int64_t> best;
  int64_t At(int n, int k) const {
    return best[static_cast<size_t>(n) * (space.max_count + 1) + k];
  }
};

CapacityTable BuildCapacityTable(const std::vector<Candidate>& candidates,
                                 const std::vector<int64_t>& capacities, int nodes,
                                 CountSpace space, int64_t ceiling) {
  const size_t width = space.max_count + 1;
  CapacityTable table{space, std::vector<int64_t>((nodes + 1) * width, -1)};
  table.best[0] = 0;
  for (int n = 0; n < nodes; ++n) {
    for (int k = 0; k <= space.max_count; ++k) {
      const int64_t here = table.best[n * width + k];
      const int next = space.Next(k);
      if (here < 0 || next < 0) continue;
      for (size_t j = 0; j < candidates.size(); ++j) {  // ascending node counts
        if (n + candidates[j].nodes > nodes) break;
        if (capacities[j] == 0) continue;
        int64_t& there = table.best[(n + candidates[j].nodes) * width + next];
        there = std::max(there, std::min(ceiling, here + capacities[j]));
      }
    }
  }
  return table;
}

// The smallest count state k in [min_pipelines, max_count] with At(nodes, k) >= need, or -1.
int FirstCountMeeting(const CapacityTable& table, int nodes, int min_pipelines, int64_t need) {
  for (int k = min_pipelines; k <= table.space.max_count; ++k) {
    if (table.At(nodes, k) >= need) return k;
  }
  return -1;
}

class TemplateChooser {
 public:
  TemplateChooser(std::vector<Candidate> candidates, std::vector<IterationModel> models,
                  const InstantiationOptions& options)
      : candidates_(std::move(candidates)), models_(std::move(models)), options_(options) {}

  absl::StatusOr<Instantiation> Choose();

 private:
  int MostUsableNodes() const;
  std::vector<int64_t> Capacities(double threshold) const;
  bool Meets(double threshold) const;
  double OptimalSeconds() const;
  std::vector<int> Reconstruct(double threshold) const;

  std::vector<Candidate> candidates_;  // ascending node counts
  std::vector<IterationModel> models_;
  InstantiationOptions options_;
  int used_nodes_ = 0;
};

// The most nodes an admissible multiset (min_pipelines <= pipelines <= B) can use exactly.
int TemplateChooser::MostUsableNodes() const {
  const int nodes = options_.live_nodes;
  const CountSpace space = SpaceFor(nodes, candidates_.front().nodes,
                                    options_.global_microbatches, options_.min_pipelines);
  const CapacityTable table = BuildCapacityTable(
      candidates_, std::vector<int64_t>(candidates_.size(), 1), nodes, space, /*ceiling=*/1);
  for (int n = nodes; n > 0; --n) {
    if (FirstCountMeeting(table, n, options_.min_pipelines, /*need=*/0) >= 0) return n;
  }
  return 0;
}

std::vector<int64_t> TemplateChooser::Capacities(double threshold) const {
  std::vector<int64_t> capacities;
  for (const IterationModel& model : models_) {
    capacities.push_back(MicrobatchesWithin(model, threshold, options_.global_microbatches));
  }
  return capacities;
}

// Whether some multiset on exactly used_nodes_ nodes runs the global batch within `threshold`.
bool TemplateChooser::Meets(double threshold) const {
  const CountSpace space = SpaceFor(used_nodes_, candidates_.front().nodes,
                                    options_.global_microbatches, options_.min_pipelines);
  const CapacityTable table = BuildCapacityTable(candidates_, Capacities(threshold), used_nodes_,
                                                 space, options_.global_microbatches);
  return FirstCountMeeting(table, used_nodes_, options_.min_pipelines,
                           options_.global_microbatches) >= 0;
}

// T*: bisection over the ranks of the values T_j(b), b in [1, B] (the largest one is met).
double TemplateChooser::OptimalSeconds() const {
  const int64_t limit = options_.global_microbatches;
  int64_t failing = 0, meeting = static_cast<int64_t>(models_.size()) * limit;
  while (meeting - failing > 1) {
    const int64_t middle = failing + (meeting - failing) / 2;
    (Meets(ValueOfRank(models_, middle, /*skip=*/0, limit)) ? meeting : failing) = middle;
  }
  return ValueOfRank(models_, meeting, /*skip=*/0, limit);
}

// Candidate indices of the chosen multiset at `threshold`: fewest pipelines, then the largest
// template that some such multiset contains, repeatedly. Empty when none meets it.
std::vector<int> TemplateChooser::Reconstruct(double threshold) const {
  const int64_t need_total = options_.global_microbatches;
  const int most = std::min<int64_t>(need_total, used_nodes_ / candidates_.front().nodes);
  const std::vector<int64_t> capacities = Capacities(threshold);
  const CapacityTable table = BuildCapacityTable(candidates_, capacities, used_nodes_,
                                                 {most, /*saturate=*/false}, need_total);
  int count = FirstCountMeeting(table, used_nodes_, options_.min_pipelines, need_total);
  if (count < 0) return {};
  std::vector<int> chosen;
  int nodes = used_nodes_;
  int64_t need = need_total;
  while (count > 0) {
    int pick = -1;
    for (int j = static_cast<int>(candidates_.size()) - 1; j >= 0 && pick < 0; --j) {
      const int rest = nodes - candidates_[j].nodes;
      if (capacities[j] == 0 || rest < 0) continue;
      const int64_t before = table.At(rest, count - 1);
      if (before >= 0 && before + capacities[j] >= need) pick = j;
    }
    if (pick < 0) return {};
    chosen.push_back(pick);
    nodes -= candidates_[pick].nodes;
    need -= capacities[pick];
    --count;
  }
  return chosen;
}

absl::StatusOr<Instantiation> TemplateChooser::Choose() {
  used_nodes_ = MostUsableNodes();
  // Templates larger than the nodes used cannot take part.
  while (!candidates_.empty() && candidates_.back().nodes > used_nodes_) {
    candidates_.pop_back();
    models_.pop_back();
  }
  if (used_nodes_ == 0 || candidates_.empty()) {
    return absl::InternalError("instantiation: no admissible multiset of templates");
  }
  const double optimum = OptimalSeconds();
  const std::vector<int> chosen = Reconstruct(optimum);
  if (chosen.empty()) return absl::InternalError("instantiation: the optimum has no multiset");
  std::vector<IterationModel> chosen_models;
  for (int j : chosen) chosen_models.push_back(models_[j]);
  TANDEM_ASSIGN_OR_RETURN(std::vector<int64_t> microbatches,
                          DistributeMicrobatches(chosen_models, options_.global_microbatches));
  Instantiation result;
  result.live_nodes = options_.live_nodes;
  result.used_nodes = used_nodes_;
  result.global_microbatches = options_.global_microbatches;
  for (size_t i = 0; i < chosen.size(); ++i) {
    const Candidate& c = candidates_[chosen[i]];
    const double seconds = chosen_models[i].Seconds(microbatches[i]);
    result.pipelines.push_back({c.template_index, c.nodes, microbatches[i], seconds});
    result.iteration_seconds = std::max(result.iteration_seconds, seconds);
  }
  if (result.iteration_seconds != optimum) {
    return absl::InternalError(absl::StrCat("instantiation: distribution reached ",
                                            result.iteration_seconds, " s, the search ", optimum));
  }
  return result;
}

absl::Status ValidateOptions(const InstantiationOptions& o) {
  if (o.live_nodes < 1 || o.devices_per_node < 1 || o.global_microbatches < 1 ||
      o.min_pipelines < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "instantiation: live nodes (", o.live_nodes, "), devices per node (", o.devices_per_node,
        "), global micro-batches (", o.global_microbatches, ") and min pipelines (",
        o.min_pipelines, ") must be positive"));
  }
  if (o.template_microbatches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "instantiation: template micro-batches must be >= 0 (0: the set's), got ",
        o.template_microbatches));
  }
  return absl::OkStatus();
}

// The m the templates' iteration_seconds hold for: `requested`, or the set's when 0. A value
// the set contradicts is refused: the iteration model would be wrong for every template.
absl::StatusOr<int> TemplateMicrobatches(const TemplateSet& set, int requested) {
  if (requested == 0) {
    if (set.microbatches < 1) {
      return absl::InvalidArgumentError(
          "instantiation: the template set does not record its micro-batches "
          "(TemplateSet::microbatches is 0); pass template_microbatches");
    }
    return set.microbatches;
  }
  if (set.microbatches > 0 && requested != set.microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "instantiation: template_microbatches is ", requested,
        " but the templates were generated for ", set.microbatches, " micro-batches"));
  }
  return requested;
}

// Whether the live nodes can hold min_pipelines pipelines at all.
absl::Status CheckCapacity(const InstantiationOptions& o, int smallest) {
  if (o.live_nodes < smallest) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no pipeline template fits ", o.live_nodes, " live node", o.live_nodes == 1 ? "" : "s",
        ": the smallest template needs ", smallest, " nodes"));
  }
  const int most = o.live_nodes / smallest;
  if (most < o.min_pipelines) {
    return absl::FailedPreconditionError(absl::StrCat(
        o.live_nodes, " live nodes hold at most ", most, " pipeline", most == 1 ? "" : "s",
        " (the smallest template has ", smallest, " nodes), fewer than min_pipelines ",
        o.min_pipelines, ": a plan on them survives at most ", most - 1,
        " more failure", most - 1 == 1 ? "" : "s", ", not ", o.min_pipelines - 1));
  }
  if (o.global_microbatches < o.min_pipelines) {
    return absl::InvalidArgumentError(absl::StrCat(
        "instantiation: ", o.global_microbatches, " global micro-batches cannot feed ",
        o.min_pipelines, " pipelines (each needs at least one)"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Rank assignment.

// Live nodes in canonical order: ranks ascending inside a node, nodes by their smallest rank.
struct LiveNodes {
  std::vector<std::vector<int>> nodes;
  std::map<int, int> node_of_rank;  // index into nodes
  int devices_per_node = 0;
};

absl::StatusOr<LiveNodes> CanonicalNodes(const std::vector<std::vector<int>>& nodes) {
  if (nodes.empty()) return absl::InvalidArgumentError("live nodes: none given");
  LiveNodes live;
  live.nodes = nodes;
  for (std::vector<int>& ranks : live.nodes) std::sort(ranks.begin(), ranks.end());
  std::sort(live.nodes.begin(), live.nodes.end());
  live.devices_per_node = static_cast<int>(live.nodes.front().size());
  for (size_t u = 0; u < live.nodes.size(); ++u) {
    const std::vector<int>& ranks = live.nodes[u];
    if (ranks.empty() || static_cast<int>(ranks.size()) != live.devices_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "live nodes: every node needs the same number of ranks (", live.devices_per_node,
          "); a node has ", ranks.size(), ": [", absl::StrJoin(ranks, ", "), "]"));
    }
    for (int rank : ranks) {
      if (rank < 0) return absl::InvalidArgumentError(absl::StrCat("live nodes: rank ", rank));
      if (!live.node_of_rank.emplace(rank, static_cast<int>(u)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("live nodes: rank ", rank, " is listed twice"));
      }
    }
  }
  return live;
}

// Held layers of live ranks, checked against the layer count, sorted and merged.
absl::StatusOr<HeldLayers> MergeHeld(const HeldLayers& held, const LiveNodes& live,
                                     int num_layers) {
  HeldLayers merged;
  for (const auto& [rank, ranges] : held) {
    if (!live.node_of_rank.count(rank)) continue;
    std::vector<LayerRange> sorted;
    for (const LayerRange& r : ranges) {
      if (r.first_layer < 0 || r.end_layer < r.first_layer || r.end_layer > num_layers) {
        return absl::InvalidArgumentError(absl::StrCat("held layers: rank ", rank, " holds [",
                                                       r.first_layer, ", ", r.end_layer,
                                                       ") of ", num_layers, " layers"));
      }
      if (r.end_layer > r.first_layer) sorted.push_back(r);
    }
    std::sort(sorted.begin(), sorted.end(), [](const LayerRange& a, const LayerRange& b) {
      return a.first_layer < b.first_layer;
    });
    std::vector<LayerRange>& out = merged[rank];
    for (const LayerRange& r : sorted) {
      if (!out.empty() && r.first_layer <= out.back().end_layer) {
        out.back().end_layer = std::max(out.back().end_layer, r.end_layer);
      } else {
        out.push_back(r);
      }
    }
  }
  return merged;
}

// What one layer weighs when counting state kept in place: its bytes relative to the largest
// layer when bytes are known (and not all zero), else 1.
absl::StatusOr<std::vector<double>> LayerWeights(const std::vector<double>& bytes,
                                                 int num_layers) {
  if (!bytes.empty() && static_cast<int>(bytes.size()) != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer state bytes: ", bytes.size(),
                                                   " values for ", num_layers, " layers"));
  }
  double largest = 0;
  for (double b : bytes) {
    if (!std::isfinite(b) || b < 0) {
      return absl::InvalidArgumentError("layer state bytes: must be finite and >= 0");
    }
    largest = std::max(largest, b);
  }
  std::vector<double> weights(num_layers, 1.0);
  if (largest > 0) {
    for (int l = 0; l < num_layers; ++l) weights[l] = bytes[l] / largest;
  }
  return weights;
}

// prefix[l] = weight of layers [0, l).
std::vector<double> PrefixSums(const std::vector<double>& weights) {
  std::vector<double> prefix(weights.size() + 1, 0);
  for (size_t l = 0; l < weights.size(); ++l) prefix[l + 1] = prefix[l] + weights[l];
  return prefix;
}

// Weight of the layers of `need` found in `held` (merged ranges).
double KeptWeight(const std::vector<LayerRange>* held, const LayerRange& need,
                  const std::vector<double>& prefix) {
  if (held == nullptr) return 0;
  double kept = 0;
  for (const LayerRange& r : *held) {
    const int first = std::max(r.first_layer, need.first_layer);
    const int end = std::min(r.end_layer, need.end_layer);
    if (first < end) kept += prefix[end] - prefix[first];
  }
  return kept;
}

// Minimum-cost assignment of every row to a distinct column (rows <= columns): the Hungarian
// algorithm with row and column potentials (Kuhn 1955, Munkres 1957), O(rows^2 columns).
// Returns the column of each row.
std::vector<int> MinCostAssignment(const std::vector<std::vector<double>>& cost, int columns) {
  const int rows = static_cast<int>(cost.size());
  // 1-based; column 0 is a virtual column where each row's search starts.
  std::vector<double> row_potential(rows + 1, 0), column_potential(columns + 1, 0);
  std::vector<int> row_of_column(columns + 1, 0), came_from(columns + 1, 0);
  for (int row = 1; row <= rows; ++row) {
    row_of_column[0] = row;
    int column = 0;
    std::vector<double> slack(columns + 1, kInfinity);
    std::vector<char> visited(columns + 1, 0);
    do {  // grow a tree of tight edges until it reaches a free column
      visited[column] = 1;
      const int current = row_of_column[column];
      double delta = kInfinity;
      int next = 0;
      for (int j = 1; j <= columns; ++j) {
        if (visited[j]) continue;
        const double reduced =
            cost[current - 1][j - 1] - row_potential[current] - column_potential[j];
        if (reduced < slack[j]) {
          slack[j] = reduced;
          came_from[j] = column;
        }
        if (slack[j] < delta) {
          delta = slack[j];
          next = j;
        }
      }
      for (int j = 0; j <= columns; ++j) {
        if (visited[j]) {
          row_potential[row_of_column[j]] += delta;
          column_potential[j] -= delta;
        } else {
          slack[j] -= delta;
        }
      }
      column = next;
    } while (row_of_column[column] != 0);
    do {  // flip the augmenting path
      const int previous = came_from[column];
      row_of_column[column] = row_of_column[previous];
      column = previous;
    } while (column != 0);
  }
  std::vector<int> column_of_row(rows, -1);
  for (int j = 1; j <= columns; ++j) {
    if (row_of_column[j] != 0) column_of_row[row_of_column[j] - 1] = j - 1;
  }
  return column_of_row;
}

// One node of a pipeline: the layer range each of its device positions needs.
struct SlotShape {
  int template_index = 0;
  int node_in_pipeline = 0;
  std::vector<LayerRange> needs;  // per device position on the node
};

SlotShape ShapeOf(const PipelineTemplate& t, int template_index, int node_in_pipeline,
                  int devices_per_node) {
  SlotShape shape{template_index, node_in_pipeline, {}};
  for (int d = 0; d < devices_per_node; ++d) {
    const int device = node_in_pipeline * devices_per_node + d;
    const planner::TemplateStage& stage = t.stages[device / t.devices_per_stage];
    shape.needs.push_back({stage.first_layer, stage.end_layer});
  }
  return shape;
}

class RankAssigner {
 public:
  RankAssigner(const TemplateSet& set, const Instantiation& instantiation, LiveNodes live,
               HeldLayers held, std::vector<double> prefix)
      : set_(set),
        instantiation_(instantiation),
        live_(std::move(live)),
        held_(std::move(held)),
        prefix_(std::move(prefix)) {}

  RankAssignment Assign();

 private:
  void BuildSlots();
  // Ranks of `node` for each position of `shape` (best matching) and the weight they keep.
  std::vector<int> MatchNode(int node, const SlotShape& shape, double* kept) const;
  PipelineRanks PipelineOf(int pipeline, const std::vector<int>& node_of_slot) const;

  const TemplateSet& set_;
  const Instantiation& instantiation_;
  LiveNodes live_;
  HeldLayers held_;
  std::vector<double> prefix_;
  std::vector<SlotShape> shapes_;           // distinct (template, node in pipeline)
  std::vector<std::pair<int, int>> slots_;  // (pipeline, node in pipeline)
  std::vector<int> shape_of_slot_;
};

void RankAssigner::BuildSlots() {
  std::map<std::pair<int, int>, int> shape_index;
  const int g = live_.devices_per_node;
  for (size_t p = 0; p < instantiation_.pipelines.size(); ++p) {
    const int index = instantiation_.pipelines[p].template_index;
    const PipelineTemplate& t = set_.templates[index];
    for (int q = 0; q < t.nodes; ++q) {
      auto [it, added] = shape_index.emplace(std::make_pair(index, q), shapes_.size());
      if (added) shapes_.push_back(ShapeOf(t, index, q, g));
      slots_.emplace_back(static_cast<int>(p), q);
      shape_of_slot_.push_back(it->second);
    }
  }
}

std::vector<int> RankAssigner::MatchNode(int node, const SlotShape& shape, double* kept) const {
  const std::vector<int>& ranks = live_.nodes[node];
  std::vector<std::vector<double>> cost(shape.needs.size());
  for (size_t d = 0; d < shape.needs.size(); ++d) {
    for (int rank : ranks) {
      auto it = held_.find(rank);
      cost[d].push_back(-KeptWeight(it == held_.end() ? nullptr : &it->second, shape.needs[d],
                                    prefix_));
    }
  }
  const std::vector<int> rank_of_position =
      MinCostAssignment(cost, static_cast<int>(ranks.size()));
  std::vector<int> result;
  *kept = 0;
  for (size_t d = 0; d < rank_of_position.size(); ++d) {
    result.push_back(ranks[rank_of_position[d]]);
    *kept -= cost[d][rank_of_position[d]];
  }
  return result;
}

PipelineRanks RankAssigner::PipelineOf(int pipeline, const std::vector<int>& node_of_slot) const {
  const PipelineInstance& instance = instantiation_.pipelines[pipeline];
  const PipelineTemplate& t = set_.templates[instance.template_index];
  PipelineRanks out{instance.template_index, instance.microbatches, {}, {}};
  for (const planner::TemplateStage& stage : t.stages) {
    out.stages.push_back({{stage.first_layer, stage.end_layer}, {}});
  }
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].first != pipeline) continue;
    const int node = node_of_slot[s];
    out.nodes.push_back(live_.nodes[node].front());
    double kept = 0;
    const std::vector<int> ranks = MatchNode(node, shapes_[shape_of_slot_[s]], &kept);
    for (size_t d = 0; d < ranks.size(); ++d) {
      const int device = slots_[s].second * live_.devices_per_node + static_cast<int>(d);
      out.stages[device / t.devices_per_stage].ranks.push_back(ranks[d]);
    }
  }
  for (StageRanks& stage : out.stages) std::sort(stage.ranks.begin(), stage.ranks.end());
  return out;
}

RankAssignment RankAssigner::Assign() {
  BuildSlots();
  const int nodes = static_cast<int>(live_.nodes.size());
  // kept[node][shape]: the state a node keeps in a slot of that shape.
  std::vector<std::vector<double>> kept(nodes, std::vector<double>(shapes_.size()));
  for (int u = 0; u < nodes; ++u) {
    for (size_t k = 0; k < shapes_.size(); ++k) MatchNode(u, shapes_[k], &kept[u][k]);
  }
  std::vector<std::vector<double>> cost(slots_.size(), std::vector<double>(nodes));
  for (size_t s = 0; s < slots_.size(); ++s) {
    for (int u = 0; u < nodes; ++u) cost[s][u] = -kept[u][shape_of_slot_[s]];
  }
  const std::vector<int> node_of_slot = MinCostAssignment(cost, nodes);
  RankAssignment assignment;
  for (size_t p = 0; p < instantiation_.pipelines.size(); ++p) {
    assignment.pipelines.push_back(PipelineOf(static_cast<int>(p), node_of_slot));
  }
  std::vector<char> used(nodes, 0);
  for (int u : node_of_slot) used[u] = 1;
  for (int u = 0; u < nodes; ++u) {
    if (used[u]) continue;
    assignment.spare_nodes.push_back(live_.nodes[u].front());
    for (int rank : live_.nodes[u]) assignment.spare_ranks.push_back(rank);
  }
  std::sort(assignment.spare_ranks.begin(), assignment.spare_ranks.end());
  return assignment;
}

absl::Status ValidateInstantiation(const TemplateSet& set, const Instantiation& inst,
                                   int live_nodes) {
  if (inst.live_nodes != live_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("assignment: the instantiation is for ",
                                                   inst.live_nodes, " live nodes, ", live_nodes,
                                                   " given"));
  }
  int used = 0;
  for (size_t p = 0; p < inst.pipelines.size(); ++p) {
    const PipelineInstance& pipeline = inst.pipelines[p];
    const int index = pipeline.template_index;
    if (index < 0 || index >= static_cast<int>(set.templates.size()) ||
        set.templates[index].nodes != pipeline.nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "assignment: pipeline ", p, " names template ", index, " of ", pipeline.nodes,
          " nodes, which the template set does not have"));
    }
    used += pipeline.nodes;
  }
  if (inst.pipelines.empty() || used != inst.used_nodes || used > live_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("assignment: pipelines use ", used,
                                                   " nodes, the instantiation says ",
                                                   inst.used_nodes, " of ", live_nodes));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// State moves.

bool Holds(const std::vector<LayerRange>& ranges, int layer) {
  for (const LayerRange& r : ranges) {
    if (layer >= r.first_layer && layer < r.end_layer) return true;
  }
  return false;
}

// Live ranks by dense index (ascending rank): what they held, where they are and what they
// have been asked to send so far.
class MovePlanner {
 public:
  MovePlanner(const LiveNodes& live, const HeldLayers& held, int num_layers);

  // -1 when the rank is not live.
  int IndexOf(int rank) const;
  bool Holds(int index, int layer) const { return elastic::Holds(held_[index], layer); }
  // Sources for the destinations (indices, ascending) that need `layer`.
  void PlanLayer(int layer, const std::vector<int>& destinations, double bytes,
                 std::vector<LayerMove>* moves);
  void SummarizeSources(StateMovePlan* plan) const;

 private:
  using Load = std::tuple<double, int64_t, int>;  // bytes sent, copies sent, index
  Load LoadOf(int index) const { return {sent_bytes_[index], sent_copies_[index], index}; }
  int SameNodeSource(int layer, int destination) const;

  std::vector<int> ranks_;
  std::vector<int> node_of_;
  std::vector<std::vector<int>> node_members_;  // indices, ascending
  std::vector<std::vector<LayerRange>> held_;
  std::vector<std::vector<int>> holders_;  // by layer: indices, ascending
  std::vector<double> sent_bytes_;
  std::vector<int64_t> sent_copies_;
};

MovePlanner::MovePlanner(const LiveNodes& live, const HeldLayers& held, int num_layers)
    : node_members_(live.nodes.size()), holders_(num_layers) {
  for (const auto& [rank, node] : live.node_of_rank) {  // ascending ranks
    const int index = static_cast<int>(ranks_.size());
    ranks_.push_back(rank);
    node_of_.push_back(node);
    node_members_[node].push_back(index);
    auto it = held.find(rank);
    held_.push_back(it == held.end() ? std::vector<LayerRange>{} : it->second);
    for (const LayerRange& r : held_.back()) {
      for (int l = r.first_layer; l < r.end_layer; ++l) holders_[l].push_back(index);
    }
  }
  sent_bytes_.assign(ranks_.size(), 0);
  sent_copies_.assign(ranks_.size(), 0);
}

int MovePlanner::IndexOf(int rank) const {
  auto it = std::lower_bound(ranks_.begin(), ranks_.end(), rank);
  return it != ranks_.end() && *it == rank ? static_cast<int>(it - ranks_.begin()) : -1;
}

int MovePlanner::SameNodeSource(int layer, int destination) const {
  int best = -1;
  for (int index : node_members_[node_of_[destination]]) {
    if (Holds(index, layer) && (best < 0 || LoadOf(index) < LoadOf(best))) best = index;
  }
  return best;
}

// A holder on the destination's node when there is one, else the least loaded holder (a heap
// with stale entries refreshed when they surface).
void MovePlanner::PlanLayer(int layer, const std::vector<int>& destinations, double bytes,
                            std::vector<LayerMove>* moves) {
  std::vector<Load> loads;
  for (int index : holders_[layer]) loads.push_back(LoadOf(index));
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap(std::greater<Load>(),
                                                                      std::move(loads));
  for (int destination : destinations) {
    int source = SameNodeSource(layer, destination);
    const bool from_heap = source < 0;
    while (source < 0 && !heap.empty()) {
      const Load top = heap.top();
      heap.pop();
      const int index = std::get<2>(top);
      if (top == LoadOf(index)) {
        source = index;
      } else {
        heap.push(LoadOf(index));
      }
    }
    if (source >= 0) {
      sent_bytes_[source] += bytes;
      ++sent_copies_[source];
      if (from_heap) heap.push(LoadOf(source));
    }
    moves->push_back({layer, source < 0 ? kFromCheckpoint : ranks_[source],
                      ranks_[destination], bytes});
  }
}

void MovePlanner::SummarizeSources(StateMovePlan* plan) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (sent_copies_[i] > 0) ++plan->source_ranks;
    plan->max_bytes_from_one_rank = std::max(plan->max_bytes_from_one_rank, sent_bytes_[i]);
  }
}

// Destinations (indices, ascending) per layer that the new layout needs and do not hold the
// layer; checks that the assignment's ranks are live and appear once.
absl::StatusOr<std::vector<std::vector<int>>> MissingLayers(const RankAssignment& assignment,
                                                            const MovePlanner& planner,
                                                            int num_layers, int* ranks) {
  std::vector<std::vector<int>> missing(num_layers);
  std::set<int> seen;
  for (const PipelineRanks& pipeline : assignment.pipelines) {
    for (const StageRanks& stage : pipeline.stages) {
      const LayerRange& r = stage.layers;
      if (r.first_layer < 0 || r.end_layer <= r.first_layer || r.end_layer > num_layers) {
        return absl::InvalidArgumentError(absl::StrCat("moves: a stage holds [", r.first_layer,
                                                       ", ", r.end_layer, ") of ", num_layers,
                                                       " layers"));
      }
      for (int rank : stage.ranks) {
        const int index = planner.IndexOf(rank);
        if (index < 0 || !seen.insert(rank).second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "moves: rank ", rank, " of the layout is not live or appears twice"));
        }
        for (int l = r.first_layer; l < r.end_layer; ++l) {
          if (!planner.Holds(index, l)) missing[l].push_back(index);
        }
      }
    }
  }
  for (std::vector<int>& destinations : missing) {
    std::sort(destinations.begin(), destinations.end());
  }
  *ranks = static_cast<int>(seen.size());
  return missing;
}

// Counts over the moves (sorted by destination).
void SummarizeMoves(StateMovePlan* plan, int num_layers) {
  std::vector<char> from_checkpoint(num_layers, 0);
  int receivers = 0;
  for (size_t i = 0; i < plan->moves.size(); ++i) {
    const LayerMove& move = plan->moves[i];
    if (i == 0 || plan->moves[i - 1].destination_rank != move.destination_rank) ++receivers;
    if (move.source_rank == kFromCheckpoint) {
      from_checkpoint[move.layer] = 1;
      ++plan->copies_from_checkpoint;
      plan->bytes_from_checkpoint += move.bytes;
    } else {
      ++plan->copies_from_ranks;
      plan->bytes_from_ranks += move.bytes;
    }
  }
  for (int l = 0; l < num_layers; ++l) {
    if (from_checkpoint[l]) plan->checkpoint_layers.push_back(l);
  }
  plan->ranks_unchanged = plan->ranks_in_layout - receivers;
}

// "1 node", "3 nodes"; `plural` when adding "s" is wrong.
std::string Plural(int64_t count, const std::string& noun, const std::string& plural = "") {
  if (count == 1) return absl::StrCat(count, " ", noun);
  return absl::StrCat(count, " ", plural.empty() ? noun + "s" : plural);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

absl::StatusOr<IterationModel> ModelIteration(const PipelineTemplate& pipeline_template,
                                              int template_microbatches) {
  TANDEM_RETURN_IF_ERROR(ValidateTemplate(pipeline_template, "template"));
  if (template_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "template: micro-batches must be positive, got ", template_microbatches));
  }
  double slowest = 0, total = 0;
  for (const planner::TemplateStage& stage : pipeline_template.stages) {
    slowest = std::max(slowest, stage.seconds);
    total += stage.seconds;
  }
  IterationModel model;
  model.reference_microbatches = template_microbatches;
  model.reference_seconds = pipeline_template.iteration_seconds;
  model.per_microbatch_seconds = slowest / pipeline_template.devices_per_stage;
  model.stage_seconds = total;
  model.constant_seconds = pipeline_template.iteration_seconds -
                           (template_microbatches - 1) * model.per_microbatch_seconds - total;
  if (model.constant_seconds < -kModelTolerance * pipeline_template.iteration_seconds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "template on ", pipeline_template.nodes, " nodes: iteration_seconds ",
        pipeline_template.iteration_seconds, " is below its stage times for ",
        template_microbatches, " micro-batches (",
        total + (template_microbatches - 1) * model.per_microbatch_seconds,
        " s); were the templates generated for that many?"));
  }
  return model;
}

absl::StatusOr<std::vector<int64_t>> DistributeMicrobatches(
    const std::vector<IterationModel>& pipelines, int64_t global_microbatches) {
  if (pipelines.empty()) return absl::InvalidArgumentError("distribution: no pipelines");
  TANDEM_RETURN_IF_ERROR(ValidateModels(pipelines));
  const int64_t count = static_cast<int64_t>(pipelines.size());
  if (global_microbatches < count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distribution: ", global_microbatches, " micro-batches for ", count,
        " pipelines: every pipeline needs at least one"));
  }
  std::vector<int64_t> microbatches(count, 1);
  const int64_t extra = global_microbatches - count;
  if (extra == 0) return microbatches;
  const int64_t limit = extra + 1;  // the most one pipeline can get
  const double level = ValueOfRank(pipelines, extra, /*skip=*/1, limit);
  const double below = std::nextafter(level, -kInfinity);
  int64_t left = extra;
  for (int64_t i = 0; i < count; ++i) {  // every value below the level
    microbatches[i] = std::max<int64_t>(1, MicrobatchesWithin(pipelines[i], below, limit));
    left -= microbatches[i] - 1;
  }
  for (int64_t i = 0; i < count && left > 0; ++i) {  // values at the level, earlier first
    const int64_t at_level =
        std::max<int64_t>(1, MicrobatchesWithin(pipelines[i], level, limit)) - microbatches[i];
    const int64_t take = std::min(left, at_level);
    microbatches[i] += take;
    left -= take;
  }
  return microbatches;
}

absl::StatusOr<Instantiation> Instantiate(const TemplateSet& templates,
                                          const InstantiationOptions& options) {
  TANDEM_RETURN_IF_ERROR(ValidateOptions(options));
  TANDEM_RETURN_IF_ERROR(ValidateTemplateSet(templates, options.devices_per_node).status());
  TANDEM_ASSIGN_OR_RETURN(const int template_microbatches,
                          TemplateMicrobatches(templates, options.template_microbatches));
  TANDEM_RETURN_IF_ERROR(CheckCapacity(options, templates.templates.front().nodes));
  std::vector<Candidate> candidates;
  std::vector<IterationModel> models;
  for (size_t i = 0; i < templates.templates.size(); ++i) {
    const PipelineTemplate& t = templates.templates[i];
    if (t.nodes > options.live_nodes) break;
    auto model = ModelIteration(t, template_microbatches);
    if (!model.ok()) return Annotate(model.status(), absl::StrCat("templates[", i, "]"));
    candidates.push_back({static_cast<int>(i), t.nodes});
    models.push_back(*model);
  }
  return TemplateChooser(std::move(candidates), std::move(models), options).Choose();
}

absl::StatusOr<RankAssignment> AssignRanks(const TemplateSet& templates,
                                           const Instantiation& instantiation,
                                           const std::vector<std::vector<int>>& nodes,
                                           const HeldLayers& held,
                                           const std::vector<double>& layer_state_bytes) {
  TANDEM_ASSIGN_OR_RETURN(LiveNodes live, CanonicalNodes(nodes));
  TANDEM_ASSIGN_OR_RETURN(const int num_layers,
                          ValidateTemplateSet(templates, live.devices_per_node));
  TANDEM_RETURN_IF_ERROR(
      ValidateInstantiation(templates, instantiation, static_cast<int>(live.nodes.size())));
  TANDEM_ASSIGN_OR_RETURN(HeldLayers merged, MergeHeld(held, live, num_layers));
  TANDEM_ASSIGN_OR_RETURN(std::vector<double> weights,
                          LayerWeights(layer_state_bytes, num_layers));
  return RankAssigner(templates, instantiation, std::move(live), std::move(merged),
                      PrefixSums(weights))
      .Assign();
}

absl::StatusOr<StateMovePlan> PlanStateMoves(const RankAssignment& assignment,
                                             const std::vector<std::vector<int>>& nodes,
                                             const HeldLayers& held,
                                             const std::vector<double>& layer_state_bytes,
                                             int num_layers) {
  if (num_layers < 1) return absl::InvalidArgumentError("moves: the model needs layers");
  TANDEM_ASSIGN_OR_RETURN(LiveNodes live, CanonicalNodes(nodes));
  TANDEM_RETURN_IF_ERROR(LayerWeights(layer_state_bytes, num_layers).status());
  TANDEM_ASSIGN_OR_RETURN(HeldLayers merged, MergeHeld(held, live, num_layers));
  MovePlanner planner(live, merged, num_layers);
  StateMovePlan plan;
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::vector<int>> missing,
                          MissingLayers(assignment, planner, num_layers, &plan.ranks_in_layout));
  plan.bytes_known = !layer_state_bytes.empty();
  for (int layer = 0; layer < num_layers; ++layer) {
    const double bytes = plan.bytes_known ? layer_state_bytes[layer] : 0;
    planner.PlanLayer(layer, missing[layer], bytes, &plan.moves);
  }
  std::sort(plan.moves.begin(), plan.moves.end(), [](const LayerMove& a, const LayerMove& b) {
    return std::make_pair(a.destination_rank, a.layer) <
           std::make_pair(b.destination_rank, b.layer);
  });
  SummarizeMoves(&plan, num_layers);
  planner.SummarizeSources(&plan);
  return plan;
}

absl::StatusOr<ElasticPlan> PlanReinstantiation(const TemplateSet& templates,
                                                const ReinstantiationInput& input) {
  TANDEM_ASSIGN_OR_RETURN(LiveNodes live, CanonicalNodes(input.nodes));
  InstantiationOptions options;
  options.live_nodes = static_cast<int>(live.nodes.size());
  options.devices_per_node = live.devices_per_node;
  options.global_microbatches = input.global_microbatches;
  options.min_pipelines = input.min_pipelines;
  options.template_microbatches = input.template_microbatches;
  ElasticPlan plan;
  TANDEM_ASSIGN_OR_RETURN(plan.instantiation, Instantiate(templates, options));
  TANDEM_ASSIGN_OR_RETURN(plan.assignment,
                          AssignRanks(templates, plan.instantiation, input.nodes, input.held,
                                      input.layer_state_bytes));
  const int num_layers = templates.templates.front().stages.back().end_layer;
  TANDEM_ASSIGN_OR_RETURN(plan.moves,
                          PlanStateMoves(plan.assignment, input.nodes, input.held,
                                         input.layer_state_bytes, num_layers));
  return plan;
}

HeldLayers HeldAfter(const RankAssignment& assignment) {
  HeldLayers held;
  for (const PipelineRanks& pipeline : assignment.pipelines) {
    for (const StageRanks& stage : pipeline.stages) {
      for (int rank : stage.ranks) held[rank].push_back(stage.layers);
    }
  }
  return held;
}

std::vector<double> LayerStateBytes(const planner::LayerChain& chain) {
  std::vector<double> bytes;
  for (const pipeline::LayerProfile& layer : chain.layers()) {
    bytes.push_back(layer.parameter_bytes + layer.optimizer_state_bytes);
  }
  return bytes;
}

nlohmann::json ToJson(const Instantiation& instantiation) {
  nlohmann::json pipelines = nlohmann::json::array();
  for (const PipelineInstance& p : instantiation.pipelines) {
    pipelines.push_back({{"template_index", p.template_index},
                         {"nodes", p.nodes},
                         {"microbatches", p.microbatches},
                         {"predicted_seconds", p.predicted_seconds}});
  }
  return {{"live_nodes", instantiation.live_nodes},
          {"used_nodes", instantiation.used_nodes},
          {"global_microbatches", instantiation.global_microbatches},
          {"iteration_seconds", instantiation.iteration_seconds},
          {"pipelines", std::move(pipelines)}};
}

nlohmann::json ToJson(const RankAssignment& assignment) {
  nlohmann::json pipelines = nlohmann::json::array();
  for (const PipelineRanks& p : assignment.pipelines) {
    nlohmann::json stages = nlohmann::json::array();
    for (const StageRanks& s : p.stages) {
      stages.push_back({{"first_layer", s.layers.first_layer},
                        {"end_layer", s.layers.end_layer},
                        {"ranks", s.ranks}});
    }
    pipelines.push_back({{"template_index", p.template_index},
                         {"microbatches", p.microbatches},
                         {"nodes", p.nodes},
                         {"stages", std::move(stages)}});
  }
  return {{"pipelines", std::move(pipelines)},
          {"spare_nodes", assignment.spare_nodes},
          {"spare_ranks", assignment.spare_ranks}};
}

nlohmann::json ToJson(const StateMovePlan& plan) {
  nlohmann::json moves = nlohmann::json::array();
  for (const LayerMove& m : plan.moves) {
    moves.push_back({{"layer", m.layer},
                     {"source_rank", m.source_rank},
                     {"destination_rank", m.destination_rank},
                     {"bytes", m.bytes}});
  }
  return {{"moves", std::move(moves)},
          {"checkpoint_layers", plan.checkpoint_layers},
          {"copies_from_ranks", plan.copies_from_ranks},
          {"copies_from_checkpoint", plan.copies_from_checkpoint},
          {"bytes_known", plan.bytes_known},
          {"bytes_from_ranks", plan.bytes_from_ranks},
          {"bytes_from_checkpoint", plan.bytes_from_checkpoint},
          {"max_bytes_from_one_rank", plan.max_bytes_from_one_rank},
          {"source_ranks", plan.source_ranks},
          {"ranks_unchanged", plan.ranks_unchanged},
          {"ranks_in_layout", plan.ranks_in_layout}};
}

nlohmann::json ToJson(const ElasticPlan& plan) {
  return {{"instantiation", ToJson(plan.instantiation)},
          {"assignment", ToJson(plan.assignment)},
          {"moves", ToJson(plan.moves)},
          {"summary", Describe(plan)}};
}

std::string Describe(const Instantiation& inst) {
  std::vector<std::string> groups;  // pipelines come larger templates first
  std::vector<int64_t> microbatches;
  for (size_t i = 0; i < inst.pipelines.size();) {
    size_t j = i;
    while (j < inst.pipelines.size() && inst.pipelines[j].nodes == inst.pipelines[i].nodes) ++j;
    groups.push_back(absl::StrCat(j - i, "x", Plural(inst.pipelines[i].nodes, "node")));
    i = j;
  }
  for (const PipelineInstance& p : inst.pipelines) microbatches.push_back(p.microbatches);
  std::string line = absl::StrCat(Plural(inst.pipelines.size(), "pipeline"), ": ",
                                  absl::StrJoin(groups, " + "), "; micro-batches ");
  if (microbatches.size() <= 16) {
    absl::StrAppend(&line, absl::StrJoin(microbatches, "/"));
  } else {
    const auto [low, high] = std::minmax_element(microbatches.begin(), microbatches.end());
    if (*low == *high) {
      absl::StrAppend(&line, *low, " per pipeline");
    } else {
      absl::StrAppend(&line, *low, "..", *high, " per pipeline");
    }
  }
  absl::StrAppend(&line, "; predicted ", FormatSeconds(inst.iteration_seconds), "/iteration");
  if (inst.used_nodes < inst.live_nodes) {
    absl::StrAppend(&line, "; ", Plural(inst.live_nodes - inst.used_nodes, "spare node"));
  }
  return line;
}

std::string Describe(const ElasticPlan& plan) {
  const StateMovePlan& moves = plan.moves;
  std::string line = Describe(plan.instantiation);
  if (moves.copies_from_ranks == 0) {
    absl::StrAppend(&line, "; no layer copies between ranks");
  } else {
    absl::StrAppend(&line, "; ", Plural(moves.copies_from_ranks, "layer copy", "layer copies"));
    if (moves.bytes_known) absl::StrAppend(&line, " (", FormatBytes(moves.bytes_from_ranks), ")");
    absl::StrAppend(&line, " from ", Plural(moves.source_ranks, "rank"));
  }
  absl::StrAppend(&line, "; ",
                  Plural(static_cast<int64_t>(moves.checkpoint_layers.size()), "layer"),
                  " from checkpoint");
  return line;
}

}  // namespace tandem::elastic
