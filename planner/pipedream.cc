#include "planner/pipedream.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/units.h"

namespace tandem::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// PipeDream's all-reduce moves each parameter byte four times (push and pull of gradients
// and weights to a parameter server).
constexpr double kAllReduceFactor = 4.0;
// An activation and its gradient both cross a boundary.
constexpr double kActivationTransfers = 2.0;
// How the refusal of a graph with more than max_states antichain states begins.
constexpr absl::string_view kTooManyStates = "PipeDream's antichain DAG";
// What one candidate costs, in units of the replicated search's (split, replica count) pair
// (about 5 ns on one core): a straight pipeline's split evaluates a stage every time (about
// 20 ns), the fast replica search's about four stages and its crossing (about 40 ns, more on
// a million machines). The limits count these weighted updates, so that a search admitted
// under the default takes at most about 10 s whichever path it takes.
constexpr double kStraightUpdateCost = 4;
constexpr double kFastUpdateCost = 8;

// How [i, j) on `machines` machines of a level came about: one replicated stage (split < 0),
// or the best plan for [i, split) on `earlier` machines followed by stage [split, j) on
// `replicas` machines.
struct Choice {
  int split = -1;
  int earlier = -1;
  int replicas = 1;
};

// One level's table: best time per stage for layer ranges [i, j) on exactly (or, with
// use_fewer_machines, at most) m+1 machines. Outer levels only need i = 0.
class LevelTable {
 public:
  // `machine_major` lays entries out machine count by machine count (rows of positions)
  // instead of position by position: the fast replica search reads, for one machine count,
  // every split of a range at nearby machine counts, which on a million machines are 8 MB
  // apart in the other layout (a cache miss each; 40+ s instead of a few).
  LevelTable(int num_layers, int machines, bool all_starts, bool machine_major)
      : layers_(num_layers),
        machines_(machines),
        all_starts_(all_starts),
        machine_major_(machine_major) {
    const size_t starts = all_starts ? num_layers + 1 : 1;
    value_.assign(starts * (num_layers + 1) * machines, kInfinity);
    choice_.assign(value_.size(), Choice{});
  }
  double& Value(int i, int j, int m) { return value_[Index(i, j, m)]; }
  double Value(int i, int j, int m) const { return value_[Index(i, j, m)]; }
  Choice& At(int i, int j, int m) { return choice_[Index(i, j, m)]; }
  const Choice& At(int i, int j, int m) const { return choice_[Index(i, j, m)]; }
  int machines() const { return machines_; }

 private:
  size_t Index(int i, int j, int m) const {
    const size_t row = all_starts_ ? static_cast<size_t>(i) : 0;
    if (machine_major_) {
      const size_t starts = all_starts_ ? layers_ + 1 : 1;
      return (static_cast<size_t>(m) * starts + row) * (layers_ + 1) + j;
    }
    return (row * (layers_ + 1) + j) * machines_ + m;
  }
  int layers_, machines_;
  bool all_starts_, machine_major_;
  std::vector<double> value_;
  std::vector<Choice> choice_;
};

class Solver {
 public:
  Solver(const LayerChain& chain, const PipeDreamOptions& options)
      : chain_(chain), options_(options), num_layers_(chain.num_layers()) {}

  absl::StatusOr<PipeDreamResult> Run();

 private:
  // Positions are where stages may start and end: 0..L over the chain's layers, or, with a
  // graph, 0 (nothing) and PipeDream's antichain states in a topological order. Sums up to a
  // position: over its layers (chain) or its state's down-set.
  absl::Status BuildPositions();
  absl::Status BuildStates();
  double Compute(int i, int j) const { return compute_[j] - compute_[i]; }
  double Parameters(int i, int j) const { return parameters_[j] - parameters_[i]; }
  // Compute time of [i, j) on one machine of `level`.
  double RangeTime(int level, int i, int j) const {
    if (level == 0) return Compute(i, j) / uniform_speed_;
    return tables_[level - 1].Value(i, j, options_.levels[level - 1].machines - 1);
  }
  double StageStash(int i, int j) const { return stash_[j] - stash_[i]; }
  // Whether a stage may run from position i to position j.
  bool Precedes(int i, int j) const {
    if (!states_ || states_in_line_) return i < j;
    if (i == 0) return j > 0;
    const int a = i - 1, b = j - 1;
    return (reach_[static_cast<size_t>(a) * reach_words_ + b / 64] >> (b % 64)) & 1;
  }
  // Calls fn(k) for every k with i < k < j where [i, k) and [k, j) may both be stages.
  template <typename Fn>
  void ForEachSplit(int i, int j, Fn fn) const {
    if (!states_ || states_in_line_) {
      for (int k = i + 1; k < j; ++k) fn(k);
      return;
    }
    for (int k : earlier_[j]) {
      if (k > i && (i == 0 || Precedes(i, k))) fn(k);
    }
  }
  // Time per stage of [i, j) on r replicas at `level`, with `prefix_machines` machines used by
  // this stage and those before it (for PipeDream's memory estimate); infinity when it does
  // not fit.
  double StageTime(int level, int i, int j, int r, int prefix_machines, int device) const;
  void SolveLevel(int level);
  // ResourceExhausted when the dynamic program would run past options_.max_cell_updates or
  // keep more than options_.max_table_bytes (SolveLevel's loops and tables, estimated).
  absl::Status CheckSearchSize() const;
  std::string MachinesText() const;  // "4 x 2"
  void Collect(int level, int i, int j, int machines, int replica_factor,
               std::vector<PipeDreamStage>* stages) const;
  // Stages over positions become stages over `layer_order`.
  void MapStatesToLayers(PipeDreamResult* result) const;
  bool InIdeal(int position, int layer) const {
    return position > 0 &&
           (ideal_[static_cast<size_t>(position - 1) * layer_words_ + layer / 64] >> (layer % 64)) &
               1;
  }

  const LayerChain& chain_;
  const PipeDreamOptions& options_;
  int num_layers_;
  // Positions 0..num_positions_ (num_positions_ plays the part of the layer count).
  int num_positions_ = 0;
  bool states_ = false;
  // The states form one line (each reaches every later one: a chain model's prefixes), so
  // positions precede as numbers do and reach_/earlier_, quadratic in the states, are not built.
  bool states_in_line_ = false;
  std::vector<double> compute_, parameters_, stash_, cut_;
  // With a graph: per state (position - 1), its down-set; reach_[a] has bit b
  // when state b descends from state a; earlier_[j] lists the positions k < j preceding j.
  size_t layer_words_ = 0;
  std::vector<uint64_t> ideal_;  // per state, its down-set (layer_words_ words each)
  size_t reach_words_ = 0;
  std::vector<uint64_t> reach_;
  std::vector<std::vector<int>> earlier_;
  double uniform_speed_ = 1.0;
  bool per_device_speed_ = false;
  std::vector<LevelTable> tables_;
  // Candidate (split, replica count) pairs the dynamic program has weighed, all levels: what
  // CheckSearchSize bounds.
  double updates_ = 0;
};

double Solver::StageTime(int level, int i, int j, int r, int prefix_machines,
                         int device) const {
  const PipeDreamLevel& lv = options_.levels[level];
  double compute = RangeTime(level, i, j);
  if (!std::isfinite(compute)) return kInfinity;
  if (per_device_speed_) compute = Compute(i, j) / options_.device_speeds[device];
  if (options_.use_memory_constraint) {
    const int later = lv.machines - prefix_machines;
    const double in_flight = std::ceil(static_cast<double>(later) / r);
    if (StageStash(i, j) * in_flight > options_.memory_bytes) return kInfinity;
  }
  const int within = level == 0 ? 1 : options_.levels[level - 1].machines;
  const double all_reduce = kAllReduceFactor * (r - 1) * Parameters(i, j) /
                            (lv.bandwidth_bytes_per_second * r) / within;
  double time = (compute + all_reduce) / r;
  if (options_.activation_compression_ratio > 0) {
    const double per_byte =
        kActivationTransfers / (lv.bandwidth_bytes_per_second * r) /
        options_.activation_compression_ratio;
    if (i > 0) time = std::max(time, cut_[i] * per_byte);
    if (j < num_positions_) time = std::max(time, cut_[j] * per_byte);
  }
  return time;
}

absl::Status Solver::BuildPositions() {
  if (options_.graph.inputs.empty()) {
    num_positions_ = num_layers_;
    compute_.resize(num_layers_ + 1);
    parameters_.resize(num_layers_ + 1);
    stash_.resize(num_layers_ + 1);
    cut_.assign(num_layers_ + 1, 0);
    for (int p = 0; p <= num_layers_; ++p) {
      compute_[p] = chain_.ComputeSeconds(0, p);
      parameters_[p] = chain_.ParameterBytes(0, p);
      stash_[p] = chain_.StashedBytes(0, p) + chain_.ParameterBytes(0, p) +
                  chain_.OptimizerStateBytes(0, p);
      if (p > 0 && p < num_layers_) cut_[p] = chain_.CutBytes(p);
    }
    return absl::OkStatus();
  }
  return BuildStates();
}

// Bit sets over layers or states.
using Bits = std::vector<uint64_t>;
bool Test(const uint64_t* bits, int i) { return (bits[i / 64] >> (i % 64)) & 1; }
void Set(uint64_t* bits, int i) { bits[i / 64] |= uint64_t{1} << (i % 64); }

absl::Status Solver::BuildStates() {
  const PipeDreamGraph& graph = options_.graph;
  const int n = num_layers_;
  if (static_cast<int>(graph.inputs.size()) != n ||
      (!graph.ignored.empty() && static_cast<int>(graph.ignored.size()) != n)) {
    return absl::InvalidArgumentError(absl::StrCat("PipeDream graph: expected ", n,
                                                   " layers, got ", graph.inputs.size()));
  }
  auto ignored = [&](int v) { return !graph.ignored.empty() && graph.ignored[v]; };
  const size_t words = (n + 63) / 64;
  layer_words_ = words;
  // Ancestors and descendants of every layer as bit sets: n^2 / 4 bytes, refused (a quarter of
  // the table budget) before they are allocated.
  const double closure_bytes = 2.0 * static_cast<double>(words) * n * sizeof(uint64_t);
  if (closure_bytes > options_.max_table_bytes / 4) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "PipeDream's antichain search over ", n, " layers would need ",
        FormatBytes(closure_bytes), " for their ancestor sets (limit ",
        FormatBytes(options_.max_table_bytes / 4), ")"));
  }
  // Direct consumers, ancestors and descendants of every kept layer (inputs come earlier in
  // the chain, which is topological).
  std::vector<std::vector<int>> consumers(n);
  Bits ancestors(words * n, 0), descendants(words * n, 0);
  for (int v = 0; v < n; ++v) {
    for (int u : graph.inputs[v]) {
      if (u < 0 || u >= v) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PipeDream graph: layer ", v, " consumes layer ", u, ", which is not earlier"));
      }
      if (ignored(u) || ignored(v)) continue;
      consumers[u].push_back(v);
      for (size_t w = 0; w < words; ++w) ancestors[v * words + w] |= ancestors[u * words + w];
      Set(&ancestors[v * words], u);
    }
  }
  for (int v = n - 1; v >= 0; --v) {
    std::sort(consumers[v].begin(), consumers[v].end());
    consumers[v].erase(std::unique(consumers[v].begin(), consumers[v].end()),
                       consumers[v].end());
    for (int c : consumers[v]) {
      for (size_t w = 0; w < words; ++w) descendants[v * words + w] |= descendants[c * words + w];
      Set(&descendants[v * words], c);
    }
  }
  const int start = graph.start_layer;
  if (start < 0 || start >= n || ignored(start) || !graph.inputs[start].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipeDream graph: start layer ", start, " is not a kept source"));
  }
  auto is_ancestor = [&](int u, int v) { return Test(&ancestors[v * words], u); };
  // The augmented antichain: the antichain and the earlier layers with a consumer that is
  // neither the antichain layer they lead to nor one of its ancestors.
  auto augment = [&](const std::vector<int>& antichain) {
    std::vector<int> out = antichain;
    for (int a : antichain) {
      for (size_t w = 0; w < words; ++w) {
        for (uint64_t bits = ancestors[a * words + w]; bits != 0; bits &= bits - 1) {
          const int p = static_cast<int>(w * 64 + __builtin_ctzll(bits));
          for (int c : consumers[p]) {
            if (c != a && !is_ancestor(c, a)) {
              out.push_back(p);
              break;
            }
          }
        }
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  };
  // The layers of `set` that none of the others descends from.
  auto maximal = [&](const std::vector<int>& set) {
    std::vector<int> out;
    for (int x : set) {
      bool covered = false;
      for (int y : set) covered = covered || Test(&descendants[x * words], y);
      if (!covered) out.push_back(x);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  };
  std::map<std::vector<int>, int> id_of;
  std::vector<std::vector<int>> antichains;
  std::vector<std::vector<int>> next;  // edges of the state DAG
  id_of[{start}] = 0;
  antichains.push_back({start});
  next.emplace_back();
  for (size_t s = 0; s < antichains.size(); ++s) {
    const std::vector<int> antichain = antichains[s];
    const std::vector<int> augmented = augment(antichain);
    for (int x : augmented) {
      for (int c : consumers[x]) {
        if (std::binary_search(antichain.begin(), antichain.end(), c)) continue;
        bool blocked = false;
        for (int y : augmented) blocked = blocked || Test(&descendants[c * words], y);
        if (blocked) continue;
        std::vector<int> moved = augmented;
        std::replace(moved.begin(), moved.end(), x, c);
        std::vector<int> key = maximal(moved);
        auto [it, inserted] = id_of.emplace(key, static_cast<int>(antichains.size()));
        if (inserted) {
          if (static_cast<int>(antichains.size()) >= options_.max_states) {
            return absl::ResourceExhaustedError(absl::StrCat(
                kTooManyStates, " of this model has more than ", options_.max_states,
                " states, the limit"));
          }
          antichains.push_back(std::move(key));
          next.emplace_back();
        }
        next[s].push_back(it->second);
      }
    }
  }
  const int num_states = static_cast<int>(antichains.size());
  // A topological order of the states (Kahn's, from the first).
  std::vector<int> in_degree(num_states, 0);
  for (auto& out : next) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    for (int t : out) ++in_degree[t];
  }
  std::vector<int> order, ready = {0};
  while (!ready.empty()) {
    const int s = ready.back();
    ready.pop_back();
    order.push_back(s);
    for (int t : next[s]) {
      if (--in_degree[t] == 0) ready.push_back(t);
    }
  }
  std::vector<int> position(num_states);
  for (int k = 0; k < num_states; ++k) position[order[k]] = k + 1;
  // Down-sets and their sums.
  num_positions_ = num_states;
  states_ = true;
  ideal_.assign(words * num_states, 0);
  compute_.assign(num_states + 1, 0);
  parameters_.assign(num_states + 1, 0);
  stash_.assign(num_states + 1, 0);
  cut_.assign(num_states + 1, 0);
  int kept = 0;
  for (int v = 0; v < n; ++v) kept += ignored(v) ? 0 : 1;
  for (int s = 0; s < num_states; ++s) {
    const int p = position[s];
    uint64_t* ideal = &ideal_[(p - 1) * words];
    for (int a : antichains[s]) {
      for (size_t w = 0; w < words; ++w) ideal[w] |= ancestors[a * words + w];
      Set(ideal, a);
      cut_[p] += chain_.layer(a).output_activation_bytes;
    }
    int size = 0;
    for (int v = 0; v < n; ++v) {
      if (!Test(ideal, v)) continue;
      ++size;
      const pipeline::LayerProfile& layer = chain_.layer(v);
      compute_[p] += layer.forward_seconds + layer.backward_seconds;
      parameters_[p] += layer.parameter_bytes;
      stash_[p] += layer.stashed_activation_bytes + layer.parameter_bytes +
                   layer.optimizer_state_bytes;
    }
    if (p == num_states && size != kept) {
      return absl::FailedPreconditionError(absl::StrCat(
          "PipeDream graph: the antichain states do not reach every layer (", size, " of ",
          kept, "); is the graph connected?"));
    }
  }
  states_in_line_ = true;
  for (int k = 0; k + 1 < num_states && states_in_line_; ++k) {
    const std::vector<int>& out = next[order[k]];
    states_in_line_ = std::binary_search(out.begin(), out.end(), order[k + 1]);
  }
  if (states_in_line_) return absl::OkStatus();
  // Which states descend from which: a bit per pair of states, refused (like the closures)
  // beyond a quarter of the table budget before it is allocated.
  reach_words_ = (num_states + 63) / 64;
  const double reach_bytes = static_cast<double>(reach_words_) * num_states * sizeof(uint64_t);
  if (reach_bytes > options_.max_table_bytes / 4) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "PipeDream's search over ", num_states, " antichain states would need ",
        FormatBytes(reach_bytes), " for their descendant sets (limit ",
        FormatBytes(options_.max_table_bytes / 4), ")"));
  }
  reach_.assign(reach_words_ * num_states, 0);
  for (int k = num_states - 1; k >= 0; --k) {
    const int a = order[k];
    uint64_t* row = &reach_[static_cast<size_t>(k) * reach_words_];
    for (int t : next[a]) {
      const int b = position[t] - 1;
      const uint64_t* other = &reach_[static_cast<size_t>(b) * reach_words_];
      for (size_t w = 0; w < reach_words_; ++w) row[w] |= other[w];
      Set(row, b);
    }
  }
  earlier_.assign(num_states + 1, {});
  for (int a = 0; a < num_states; ++a) {
    const uint64_t* row = &reach_[static_cast<size_t>(a) * reach_words_];
    for (size_t w = 0; w < reach_words_; ++w) {
      for (uint64_t bits = row[w]; bits != 0; bits &= bits - 1) {
        earlier_[w * 64 + __builtin_ctzll(bits) + 1].push_back(a + 1);
      }
    }
  }
  return absl::OkStatus();
}

void Solver::MapStatesToLayers(PipeDreamResult* result) const {
  const PipeDreamGraph& graph = options_.graph;
  std::vector<int> order;
  for (int v = 0; v < num_layers_; ++v) {
    if (!graph.ignored.empty() && graph.ignored[v]) order.push_back(v);
  }
  int previous_end = 0;
  for (PipeDreamStage& stage : result->stages) {
    const int first = static_cast<int>(order.size());
    for (int v = 0; v < num_layers_; ++v) {
      if (InIdeal(stage.end_layer, v) && !InIdeal(stage.first_layer, v)) order.push_back(v);
    }
    stage.first_layer = previous_end == 0 ? 0 : first;
    stage.end_layer = previous_end = static_cast<int>(order.size());
  }
  bool identity = true;
  for (int v = 0; v < num_layers_; ++v) identity = identity && order[v] == v;
  if (!identity) result->layer_order = std::move(order);
}

std::string Solver::MachinesText() const {
  std::string machines;
  for (const PipeDreamLevel& level : options_.levels) {
    absl::StrAppend(&machines, machines.empty() ? "" : " x ", level.machines);
  }
  return machines;
}

absl::Status Solver::CheckSearchSize() const {
  const double n = num_positions_ + 1;
  double updates = 0, bytes = 0;
  for (size_t level = 0; level < options_.levels.size(); ++level) {
    const double m = options_.levels[level].machines;
    const bool final_level = level + 1 == options_.levels.size();
    const bool fast = options_.use_fewer_machines && !options_.use_memory_constraint &&
                      !options_.straight && !per_device_speed_;
    const double starts = final_level ? 1 : n;
    // (j, k) pairs per start, times machines, times the replica counts tried (each at its
    // cost: see kStraightUpdateCost).
    const double cost = options_.straight ? kStraightUpdateCost : fast ? kFastUpdateCost : m;
    updates += starts * n * n / 2 * m * cost;
    bytes += starts * n * m * (sizeof(double) + sizeof(Choice));
    if (fast) bytes = std::max(bytes, n * n * sizeof(int));  // the crossing table
  }
  if (updates <= options_.max_cell_updates && bytes <= options_.max_table_bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "PipeDream's search over %d %s on %s machines is too large: about %.3g table updates "
      "and %s of tables, beyond the limits of %.3g updates and %s (plan for fewer devices, "
      "or merge layers of the profile)",
      num_positions_, states_ ? "antichain states" : "layers", MachinesText(), updates,
      FormatBytes(bytes), options_.max_cell_updates, FormatBytes(options_.max_table_bytes)));
}

void Solver::SolveLevel(int level) {
  const int n = options_.levels[level].machines;
  const bool final_level = level + 1 == static_cast<int>(options_.levels.size());
  const int max_start = final_level ? 0 : num_positions_ - 1;
  const bool straight = options_.straight;
  const bool fast = options_.use_fewer_machines && !options_.use_memory_constraint && !straight &&
                    !per_device_speed_;
  tables_.emplace_back(num_positions_, n, /*all_starts=*/!final_level, /*machine_major=*/fast);
  LevelTable& table = tables_.back();
  const double split_cost = straight ? kStraightUpdateCost : fast ? kFastUpdateCost : 1;
  // Fast path: per (k, j), the smallest r where the earlier stages are no faster than the
  // new one (see below).
  std::vector<int> crossing;
  for (int i = 0; i <= max_start; ++i) {
    if (fast) crossing.assign(static_cast<size_t>(num_positions_ + 1) * (num_positions_ + 1), 1);
    // One stage on m+1 replicas.
    const int max_replicas = straight ? 1 : n;
    for (int m = 0; m < max_replicas; ++m) {
      for (int j = i + 1; j <= num_positions_; ++j) {
        if (!Precedes(i, j)) continue;
        table.Value(i, j, m) = StageTime(level, i, j, m + 1, m + 1, /*device=*/m);
        table.At(i, j, m) = Choice{-1, -1, m + 1};
      }
    }
    for (int m = 1; m < n; ++m) {
      for (int j = i + 1; j <= num_positions_; ++j) {
        if (!Precedes(i, j)) continue;
        double best = table.Value(i, j, m);
        Choice best_choice = table.At(i, j, m);
        if (options_.use_fewer_machines && table.Value(i, j, m - 1) < best) {
          best = table.Value(i, j, m - 1);
          best_choice = table.At(i, j, m - 1);
        }
        ForEachSplit(i, j, [&](int k) {
          updates_ += split_cost;
          if (straight) {
            const double earlier = table.Value(i, k, m - 1);
            if (!(earlier < best)) return;
            const double candidate =
                std::max(earlier, StageTime(level, k, j, 1, m + 1, /*device=*/m));
            if (candidate < best) {
              best = candidate;
              best_choice = Choice{k, m - 1, 1};
            }
          } else if (fast) {
            // earlier(r) = table(i, k, m - r) rises with r (fewer machines are left for the
            // earlier stages); stage(r), the best over at most r replicas, falls with r. The
            // optimum is at their crossing, which only moves right as m grows: keep it per
            // (k, j) and advance it.
            const double one = StageTime(level, k, j, 1, m + 1, 0);
            auto stage_at_most = [&](int r) {
              return r == 1 ? one : std::min(one, StageTime(level, k, j, r, m + 1, 0));
            };
            int& lo = crossing[static_cast<size_t>(k) * (num_positions_ + 1) + j];
            while (lo < m && table.Value(i, k, m - lo) < stage_at_most(lo)) ++lo;
            for (int r = std::max(1, lo - 1); r <= std::min(lo, m); ++r) {
              const double candidate = std::max(table.Value(i, k, m - r), stage_at_most(r));
              if (candidate < best) {
                best = candidate;
                const double with_r = StageTime(level, k, j, r, m + 1, 0);
                best_choice = Choice{k, m - r, with_r <= one ? r : 1};
              }
            }
          } else {
            // A stage on r replicas takes at least compute / r: below some r nothing beats
            // the best so far.
            const double compute = RangeTime(level, k, j);
            for (int r = m; r >= 1; --r) {
              if (compute / r >= best) break;
              ++updates_;
              const double earlier = table.Value(i, k, m - r);
              if (!(earlier < best)) continue;
              const double candidate =
                  std::max(earlier, StageTime(level, k, j, r, m + 1, /*device=*/0));
              if (candidate < best) {
                best = candidate;
                best_choice = Choice{k, m - r, r};
              }
            }
          }
        });
        table.Value(i, j, m) = best;
        table.At(i, j, m) = best_choice;
      }
    }
  }
}

void Solver::Collect(int level, int i, int j, int machines, int replica_factor,
                     std::vector<PipeDreamStage>* stages) const {
  const LevelTable& table = tables_[level];
  std::vector<std::pair<std::pair<int, int>, int>> ranges;  // ((first, end), replicas)
  int end = j;
  int m = machines - 1;
  while (true) {
    const Choice& c = table.At(i, end, m);
    if (c.split < 0) {
      ranges.push_back({{i, end}, c.replicas});
      break;
    }
    ranges.push_back({{c.split, end}, c.replicas});
    end = c.split;
    m = c.earlier;
  }
  std::reverse(ranges.begin(), ranges.end());
  for (const auto& [range, replicas] : ranges) {
    if (level == 0) {
      PipeDreamStage stage;
      stage.first_layer = range.first;
      stage.end_layer = range.second;
      stage.replicas = replicas * replica_factor;
      const PipeDreamLevel& inner = options_.levels[0];
      stage.seconds = (Compute(range.first, range.second) / uniform_speed_ +
                       kAllReduceFactor * (replicas - 1) * Parameters(range.first, range.second) /
                           (inner.bandwidth_bytes_per_second * replicas)) /
                      replicas;
      stages->push_back(stage);
    } else {
      Collect(level - 1, range.first, range.second, options_.levels[level - 1].machines,
              replicas * replica_factor, stages);
    }
  }
}

absl::StatusOr<PipeDreamResult> Solver::Run() {
  if (options_.levels.empty()) {
    return absl::InvalidArgumentError("PipeDream needs at least one network level");
  }
  int64_t devices = 1;
  for (const PipeDreamLevel& level : options_.levels) {
    if (level.machines < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("PipeDream: machines per level must be at least 1, got ", level.machines));
    }
    if (!(level.bandwidth_bytes_per_second > 0)) {
      return absl::InvalidArgumentError("PipeDream: bandwidth must be positive");
    }
    devices *= level.machines;
  }
  if (!options_.device_speeds.empty()) {
    if (static_cast<int64_t>(options_.device_speeds.size()) != devices) {
      return absl::InvalidArgumentError(absl::StrCat("PipeDream: expected ", devices,
                                                     " device speeds, got ",
                                                     options_.device_speeds.size()));
    }
    uniform_speed_ =
        *std::min_element(options_.device_speeds.begin(), options_.device_speeds.end());
    per_device_speed_ = options_.straight && options_.levels.size() == 1;
  }
  TANDEM_RETURN_IF_ERROR(BuildPositions());
  if (options_.straight && options_.levels.back().machines > num_positions_ &&
      !options_.use_fewer_machines) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a straight pipeline on ", options_.levels.back().machines, " machines needs at least ",
        options_.levels.back().machines, states_ ? " antichain states" : " layers",
        "; the model has ", num_positions_, " (use fewer devices or allow unused machines)"));
  }
  TANDEM_RETURN_IF_ERROR(CheckSearchSize());
  for (size_t level = 0; level < options_.levels.size(); ++level) {
    SolveLevel(static_cast<int>(level));
  }
  const int top = static_cast<int>(options_.levels.size()) - 1;
  const int top_machines = options_.levels[top].machines;
  PipeDreamResult result;
  result.bottleneck_seconds = tables_[top].Value(0, num_positions_, top_machines - 1);
  result.num_states = num_positions_;
  result.table_updates = updates_;
  if (!std::isfinite(result.bottleneck_seconds) && !options_.use_memory_constraint) {
    // Only a straight pipeline over antichain states can run out of places to split.
    return absl::ResourceExhaustedError(absl::StrCat(
        "no straight pipeline of ", top_machines, " stages: PipeDream's antichain states of ",
        "this model allow fewer (use fewer devices or allow unused machines)"));
  }
  if (!std::isfinite(result.bottleneck_seconds)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no PipeDream partition of ", num_layers_, " layers on ", devices,
                     " devices fits ", FormatBytes(options_.memory_bytes), " per device"));
  }
  Collect(top, 0, num_positions_, top_machines, 1, &result.stages);
  if (states_) MapStatesToLayers(&result);
  for (const PipeDreamStage& stage : result.stages) result.devices_used += stage.replicas;
  result.single_machine_seconds = chain_.ComputeSeconds(0, num_layers_);
  double data_parallel = result.single_machine_seconds;
  int within = 1;
  for (const PipeDreamLevel& level : options_.levels) {
    const double all_reduce = kAllReduceFactor * (level.machines - 1) *
                              chain_.ParameterBytes(0, num_layers_) /
                              (level.bandwidth_bytes_per_second * level.machines) / within;
    data_parallel = (data_parallel + all_reduce) / level.machines;
    within = level.machines;
  }
  result.data_parallel_seconds = data_parallel;
  return result;
}

}  // namespace

absl::StatusOr<PipeDreamResult> RunPipeDream(const LayerChain& chain,
                                             const PipeDreamOptions& options) {
  Solver solver(chain, options);
  return solver.Run();
}

bool IsTooManyStates(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         absl::StartsWith(status.message(), kTooManyStates);
}

}  // namespace tandem::planner
