#include "planner/piper.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/units.h"

namespace tandem::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr int kNoDevices = std::numeric_limits<int>::max() / 4;
// Piper's data-parallel resynchronisation moves each parameter byte four times (following
// PipeDream's parameter-server model).
constexpr double kResyncFactor = 4.0;
// Edge transfers count the activation and its gradient.
constexpr double kEdgeTransfers = 2.0;
// The load search stops when the bracket is this tight (relative).
constexpr double kLoadPrecision = 1e-9;
constexpr int kMaxSearchIterations = 200;
// The first limit tried is the lower bound times (1 + kFirstStep); the step grows 4x.
constexpr double kFirstStep = 1.0 / 64;

struct ConfigData {
  double time = 0, parameters = 0, memory_a = 0, memory_b = 0;
  // Incoming edges (source, bytes + sync) and outgoing edges (destination, bytes + sync).
  std::vector<std::pair<int, double>> in, out;
};

// Per node and degree: up to two configurations.
struct NodeDegree {
  bool present = false;
  std::vector<ConfigData> configs;
};

class PiperSolver {
 public:
  PiperSolver(const PiperInstance& instance, const PiperOptions& options)
      : instance_(instance), options_(options), n_(static_cast<int>(instance.nodes.size())) {}

  absl::StatusOr<PiperResult> Run();
  // Whether some plan fits the memory on the devices (any load).
  absl::StatusOr<bool> Fits();

 private:
  // One candidate stage [a, b) at degree index ti and data-parallel index di.
  struct Key {
    double fast_total = kInfinity;  // load with every node in its fastest configuration
    int y_fast = 0;                 // largest y at which the fastest configurations fit
    int y_lean = 0;                 // largest y at which the leanest configurations fit
    int known = -1;                 // index into known_ once a load has been evaluated
  };

  absl::Status Prepare();
  // A load no plan can beat (0 when unknown).
  double LowerBound() const;
  void PrepareStage(int a, int b, int ti);
  // Per node of the current stage: cost of each configuration at d, and memory terms.
  // With `edges_current`, edge_bytes_ already holds the stage's crossing bytes per layer.
  void StageCosts(int a, int b, int ti, int d, bool edges_current);
  // edge_bytes_[2v + l]: bytes of v's edges crossing [a, b) in configuration l (both ways).
  void SetEdgeBytes(int v, int a, int b, int ti);
  // fast_cost_/fast_index_[di * n + v]: v's fastest configuration at every d, from
  // edge_bytes_ (kept current while Prepare grows stages).
  void FastCosts(int v, int ti);
  double Load(int a, int b, int ti, int di, int y, std::vector<int>* choice);
  // The largest y whose load is at most `limit`; `next` = the load at y + 1 (infinity when
  // y cannot grow), the smallest limit at which the answer changes.
  int MaxInFlight(int a, int b, int ti, int di, double limit, double* next);
  // Fewest devices covering every layer with each stage's load <= limit; fills
  // best_/choice arrays when `record`. Sets next_limit_: the answer is the same for every
  // limit in [limit, next_limit_).
  int MinDevices(double limit, bool record);
  // The plan with the fewest devices whose stage loads are all <= limit.
  absl::StatusOr<PiperResult> Reconstruct(double limit);
  // Stages [a, b) with a < b, numbered row by row.
  size_t KeyIndex(int a, int b, int ti, int di) const {
    const size_t pair = static_cast<size_t>(a) * n_ - static_cast<size_t>(a) * (a - 1) / 2 +
                        (b - a - 1);
    return (pair * degrees_.size() + ti) * divisors_.size() + di;
  }

  const PiperInstance& instance_;
  const PiperOptions& options_;
  const int n_;
  int budget_s_ = 1;  // min(micro-batches, devices)
  std::vector<int> degrees_;   // tensor-parallel degrees
  std::vector<int> divisors_;  // data-parallel degrees (divide micro-batches per batch)
  std::vector<std::vector<NodeDegree>> data_;  // data_[v][ti]
  std::vector<std::vector<int>> missing_prefix_;  // [ti][v]: nodes < v lacking degree ti
  std::vector<Key> keys_;
  // Evaluated (y, load) per key that needed the knapsack, sorted by y.
  std::vector<std::vector<std::pair<int, double>>> known_;
  bool fits_only_ = false;  // Prepare only what the memory check needs
  CoverSolver cover_{KnapsackMode::kExact};
  double next_limit_ = kInfinity;

  // Scratch for the current stage.
  std::vector<double> cost_scratch_;  // [node][config]
  std::vector<double> edge_bytes_;    // [node][config]
  std::vector<double> fast_cost_;
  std::vector<int> fast_index_;
  std::vector<int> fast_scratch_;
  std::vector<SwitchOption> items_;
  std::vector<int> item_node_;

  // Dynamic program tables (size (n+1) x (S+1)).
  std::vector<int> g_, h_, h_arg_, choice_b_, choice_t_, choice_d_;
  // Per row a of h: the degree sums s where h drops (h[a][s] < h[a][s - 1]).
  std::vector<int> drops_, drops_begin_, drops_end_;
  void RecordDrops(int a);
};

absl::Status PiperSolver::Prepare() {
  const int mbs = instance_.microbatches_per_batch;
  const int devices = instance_.max_devices;
  budget_s_ = std::min(mbs, devices);
  for (int d = 1; d <= budget_s_; ++d) {
    if (mbs % d == 0 && (d == 1 || options_.allow_data_parallel)) divisors_.push_back(d);
  }
  std::vector<int> all_degrees;
  for (const PiperNode& node : instance_.nodes) {
    for (const auto& [t, configs] : node.configs) {
      if (t <= devices && (t == 1 || options_.allow_tensor_parallel)) all_degrees.push_back(t);
      if (configs.size() > 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node '", node.name, "' has ", configs.size(), " configurations at degree ", t,
            "; at most two (e.g. with and without recomputation) are supported"));
      }
    }
  }
  std::sort(all_degrees.begin(), all_degrees.end());
  all_degrees.erase(std::unique(all_degrees.begin(), all_degrees.end()), all_degrees.end());
  degrees_ = all_degrees;

  data_.assign(n_, std::vector<NodeDegree>(degrees_.size()));
  missing_prefix_.assign(degrees_.size(), std::vector<int>(n_ + 1, 0));
  std::vector<std::vector<std::pair<int, double>>> in_edges(n_), out_edges(n_);
  for (const PiperEdge& e : instance_.edges) {
    in_edges[e.destination].push_back({e.source, e.bytes});
    out_edges[e.source].push_back({e.destination, e.bytes});
  }
  for (size_t ti = 0; ti < degrees_.size(); ++ti) {
    for (int v = 0; v < n_; ++v) {
      auto it = instance_.nodes[v].configs.find(degrees_[ti]);
      const bool present = it != instance_.nodes[v].configs.end() && !it->second.empty();
      missing_prefix_[ti][v + 1] = missing_prefix_[ti][v] + (present ? 0 : 1);
      if (!present) continue;
      NodeDegree& nd = data_[v][ti];
      nd.present = true;
      for (const PiperConfig& c : it->second) {
        ConfigData cd;
        cd.time = c.time_per_sample;
        cd.parameters = c.parameter_bytes;
        cd.memory_a = c.memory_per_microbatch_bytes;
        cd.memory_b = c.memory_fixed_bytes;
        for (const auto& [u, bytes] : in_edges[v]) {
          auto s = c.sync_forward_bytes.find(u);
          cd.in.push_back({u, bytes + (s == c.sync_forward_bytes.end() ? 0.0 : s->second)});
        }
        for (const auto& [w, bytes] : out_edges[v]) {
          auto s = c.sync_backward_bytes.find(w);
          cd.out.push_back({w, bytes + (s == c.sync_backward_bytes.end() ? 0.0 : s->second)});
        }
        nd.configs.push_back(std::move(cd));
      }
    }
  }
  cover_ = CoverSolver(options_.knapsack);
  keys_.assign(static_cast<size_t>(n_) * (n_ + 1) / 2 * degrees_.size() * divisors_.size(),
               Key{});
  known_.clear();
  edge_bytes_.assign(2 * n_, 0.0);
  fast_cost_.assign(divisors_.size() * n_, 0.0);
  fast_index_.assign(divisors_.size() * n_, 0);
  for (size_t ti = 0; ti < degrees_.size(); ++ti) {
    for (int a = 0; a < n_; ++a) {
      // Stages [a, b) for growing b; every layer's edge bytes are kept current, so a layer's
      // edges are summed again only when b passes one of its consumers.
      for (int b = a + 1; b <= n_; ++b) {
        if (!data_[b - 1][ti].present) break;  // no longer stage from a has degree ti
        if (!fits_only_) {
          SetEdgeBytes(b - 1, a, b, static_cast<int>(ti));
          FastCosts(b - 1, static_cast<int>(ti));
          for (const auto& [u, bytes] : data_[b - 1][ti].configs[0].in) {
            if (u >= a) {
              SetEdgeBytes(u, a, b, static_cast<int>(ti));
              FastCosts(u, static_cast<int>(ti));
            }
          }
        }
        PrepareStage(a, b, static_cast<int>(ti));
      }
    }
  }
  return absl::OkStatus();
}

void PiperSolver::SetEdgeBytes(int v, int a, int b, int ti) {
  const NodeDegree& nd = data_[v][ti];
  for (size_t l = 0; l < nd.configs.size(); ++l) {
    const ConfigData& c = nd.configs[l];
    double edge_bytes = 0;
    for (const auto& [u, bytes] : c.in) {
      if (u < a) edge_bytes += kEdgeTransfers * bytes;
    }
    for (const auto& [w, bytes] : c.out) {
      if (w >= b) edge_bytes += kEdgeTransfers * bytes;
    }
    edge_bytes_[2 * v + l] = edge_bytes;
  }
}

void PiperSolver::FastCosts(int v, int ti) {
  const double bandwidth = instance_.bandwidth_bytes_per_second;
  const double mbs = instance_.microbatches_per_batch;
  const NodeDegree& nd = data_[v][ti];
  for (size_t di = 0; di < divisors_.size(); ++di) {
    const int d = divisors_[di];
    if (int64_t{degrees_[ti]} * d > instance_.max_devices) break;
    double best = kInfinity;
    int best_index = 0;
    for (size_t l = 0; l < nd.configs.size(); ++l) {
      const ConfigData& c = nd.configs[l];
      const double resync = kResyncFactor * (d - 1) * c.parameters / d / mbs;
      const double cost = (edge_bytes_[2 * v + l] / d + resync) / bandwidth + c.time / d;
      // Fastest configuration (the first on ties, as Piper).
      if (l == 0 || cost < best) {
        best = cost;
        best_index = static_cast<int>(l);
      }
    }
    fast_cost_[di * n_ + v] = best;
    fast_index_[di * n_ + v] = best_index;
  }
}

void PiperSolver::StageCosts(int a, int b, int ti, int d, bool edges_current) {
  const double bandwidth = instance_.bandwidth_bytes_per_second;
  const double mbs = instance_.microbatches_per_batch;
  cost_scratch_.assign(2 * (b - a), kInfinity);
  fast_scratch_.assign(b - a, 0);
  if (!edges_current) {
    for (int v = a; v < b; ++v) SetEdgeBytes(v, a, b, ti);
  }
  for (int v = a; v < b; ++v) {
    const NodeDegree& nd = data_[v][ti];
    for (size_t l = 0; l < nd.configs.size(); ++l) {
      const ConfigData& c = nd.configs[l];
      const double edge_bytes = edge_bytes_[2 * v + l];
      const double resync = kResyncFactor * (d - 1) * c.parameters / d / mbs;
      cost_scratch_[2 * (v - a) + l] = (edge_bytes / d + resync) / bandwidth + c.time / d;
    }
    // Fastest configuration (the first on ties, as Piper).
    if (nd.configs.size() == 2 && cost_scratch_[2 * (v - a) + 1] < cost_scratch_[2 * (v - a)]) {
      fast_scratch_[v - a] = 1;
    }
  }
}

void PiperSolver::PrepareStage(int a, int b, int ti) {
  const double memory = instance_.memory_per_device_bytes;
  // The leanest configurations do not depend on d: largest y at which they fit.
  auto lean_memory = [&](double y) {
    double total = 0;
    for (int v = a; v < b; ++v) {
      double best = kInfinity;
      for (const ConfigData& c : data_[v][ti].configs) {
        best = std::min(best, c.memory_a * y + c.memory_b);
      }
      total += best;
    }
    return total;
  };
  int y_lean = 0;
  if (lean_memory(1) <= memory) {
    int lo = 1, hi = budget_s_;
    if (lean_memory(hi) <= memory) {
      lo = hi;
    } else {
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        (lean_memory(mid) <= memory ? lo : hi) = mid;
      }
    }
    y_lean = lo;
  }
  for (size_t di = 0; di < divisors_.size(); ++di) {
    const int d = divisors_[di];
    if (int64_t{degrees_[ti]} * d > instance_.max_devices) break;
    Key& key = keys_[KeyIndex(a, b, ti, static_cast<int>(di))];
    key.y_lean = y_lean;
    if (fits_only_) continue;  // with no load limit only y_lean counts
    const double* cost = &fast_cost_[di * n_];
    const int* index = &fast_index_[di * n_];
    double total = 0, sum_a = 0, sum_b = 0;
    for (int v = a; v < b; ++v) {
      const ConfigData& c = data_[v][ti].configs[index[v]];
      total += cost[v];
      sum_a += c.memory_a;
      sum_b += c.memory_b;
    }
    key.fast_total = total;
    const int y_cap = (budget_s_ + d - 1) / d;
    if (sum_b > memory) {
      key.y_fast = 0;
    } else if (sum_a <= 0) {
      key.y_fast = y_cap;
    } else {
      key.y_fast = static_cast<int>(std::min<double>(y_cap, std::floor((memory - sum_b) / sum_a)));
    }
  }
}

double PiperSolver::Load(int a, int b, int ti, int di, int y, std::vector<int>* choice) {
  const int d = divisors_[di];
  StageCosts(a, b, ti, d, /*edges_current=*/false);
  double need = -instance_.memory_per_device_bytes;
  double total = 0;
  items_.clear();
  item_node_.clear();
  for (int v = a; v < b; ++v) {
    const NodeDegree& nd = data_[v][ti];
    const int f = fast_scratch_[v - a];
    const ConfigData& fast = nd.configs[f];
    need += fast.memory_a * y + fast.memory_b;
    total += cost_scratch_[2 * (v - a) + f];
    if (nd.configs.size() == 2) {
      const ConfigData& other = nd.configs[1 - f];
      const double saving =
          (fast.memory_a * y + fast.memory_b) - (other.memory_a * y + other.memory_b);
      if (saving > 1e-9) {
        items_.push_back({cost_scratch_[2 * (v - a) + 1 - f] - cost_scratch_[2 * (v - a) + f],
                          saving});
        item_node_.push_back(v);
      }
    }
  }
  if (choice != nullptr) {
    choice->assign(b - a, 0);
    for (int v = a; v < b; ++v) (*choice)[v - a] = fast_scratch_[v - a];
  }
  const CoverResult cover = cover_.Solve(items_, need, choice != nullptr);
  if (!cover.feasible) return kInfinity;
  if (choice != nullptr) {
    for (int i : cover.switched) {
      const int v = item_node_[i];
      (*choice)[v - a] = 1 - fast_scratch_[v - a];
    }
  }
  return total + cover.extra_cost;
}

int PiperSolver::MaxInFlight(int a, int b, int ti, int di, double limit, double* next) {
  Key& key = keys_[KeyIndex(a, b, ti, di)];
  const int d = divisors_[di];
  const int y_cap = (budget_s_ + d - 1) / d;
  const int hi_bound = std::min(key.y_lean, y_cap);
  *next = kInfinity;
  if (!(key.fast_total <= limit)) {
    if (hi_bound > 0) *next = key.fast_total;
    return 0;
  }
  // Up to y_lean the leanest configurations fit, so every load there is finite.
  if (key.y_fast >= hi_bound || limit == kInfinity) return hi_bound;
  // Largest y in [y_fast, hi_bound] with load <= limit; load(y_fast) <= limit already. Use
  // what is known first.
  int lo = key.y_fast, hi = hi_bound + 1;  // load(lo) <= limit < load(hi) (hi unknown = inf)
  double hi_load = kInfinity;
  if (key.known < 0) {
    key.known = static_cast<int>(known_.size());
    known_.emplace_back();
  }
  std::vector<std::pair<int, double>>& known = known_[key.known];
  for (const auto& [y, load] : known) {
    if (load <= limit) {
      lo = std::max(lo, y);
    } else if (y < hi) {
      hi = y;
      hi_load = load;
    }
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    const double load = Load(a, b, ti, di, mid, nullptr);
    auto pos = std::lower_bound(known.begin(), known.end(), std::make_pair(mid, -1.0));
    known.insert(pos, {mid, load});
    if (load <= limit) {
      lo = mid;
    } else {
      hi = mid;
      hi_load = load;
    }
  }
  *next = hi_load;
  return lo;
}

void PiperSolver::RecordDrops(int a) {
  // Rows are filled from the last layer down; row a's drops go to [a * width, ...).
  const size_t width = budget_s_ + 1;
  const int* h_row = &h_[a * width];
  int* out = &drops_[a * width];
  int count = 0;
  for (int s = 1; s <= budget_s_; ++s) {
    if (h_row[s] < h_row[s - 1]) out[count++] = s;
  }
  drops_begin_[a] = static_cast<int>(a * width);
  drops_end_[a] = static_cast<int>(a * width) + count;
}

int PiperSolver::MinDevices(double limit, bool record) {
  const int S = budget_s_;
  const int N = instance_.max_devices;
  const size_t width = S + 1;
  g_.assign((n_ + 1) * width, kNoDevices);
  h_.assign((n_ + 1) * width, kNoDevices);
  if (record) {
    h_arg_.assign((n_ + 1) * width, -1);
    choice_b_.assign((n_ + 1) * width, -1);
    choice_t_.assign((n_ + 1) * width, -1);
    choice_d_.assign((n_ + 1) * width, -1);
  }
  // The empty suffix: no devices, degree sum 0 (h: at most s).
  for (int s = 0; s <= S; ++s) {
    h_[n_ * width + s] = 0;
    if (record) h_arg_[n_ * width + s] = 0;
  }
  g_[n_ * width + 0] = 0;
  drops_.assign((n_ + 1) * width, 0);
  drops_begin_.assign(n_ + 1, 0);
  drops_end_.assign(n_ + 1, 0);
  RecordDrops(n_);
  // Per degree index: the largest degree sum it serves (d * y_max(d); 0 = none).
  std::vector<int> reach(divisors_.size());
  next_limit_ = kInfinity;
  for (int a = n_ - 1; a >= 0; --a) {
    int* g_row = &g_[a * width];
    for (int b = a + 1; b <= n_; ++b) {
      const int* h_next = &h_[b * width];
      const int* drops_next = drops_.data() + drops_begin_[b];
      const int* drops_next_end = drops_.data() + drops_end_[b];
      for (size_t ti = 0; ti < degrees_.size(); ++ti) {
        if (missing_prefix_[ti][b] - missing_prefix_[ti][a] > 0) continue;
        const int t = degrees_[ti];
        // d serves every s in [d, d * y_max(d)]; the smallest d serving s is the best (fewest
        // devices, most of the budget left for later stages).
        int usable = 0;
        bool any = false;
        for (size_t di = 0; di < divisors_.size(); ++di) {
          const int d = divisors_[di];
          // Stages with more devices than the budget leaves after the cheapest rest can be
          // part of no plan within the budget (and t * d + h_next[S - d] grows with d).
          if (d > S || int64_t{t} * d + h_next[S - d] > N) break;
          usable = static_cast<int>(di) + 1;
          double next;
          const int y =
              MaxInFlight(a, b, static_cast<int>(ti), static_cast<int>(di), limit, &next);
          reach[di] = static_cast<int>(std::min<int64_t>(S, int64_t{d} * y));
          // Past S a larger y changes nothing.
          if (int64_t{d} * y < S) next_limit_ = std::min(next_limit_, next);
          any = any || y > 0;
        }
        if (!any) continue;
        // Degree index k serves s in (max reach of smaller degrees, reach[k]], s >= d. There
        // g(s) = t*d + h_next(s - d) changes only where h_next drops, and only the prefix
        // minima of g matter, so it is evaluated at the start of the range and after each drop.
        int covered = 0;
        for (int k = 0; k < usable && covered < S; ++k) {
          if (reach[k] <= covered) continue;
          const int d = divisors_[k];
          const int first = std::max(covered + 1, d);
          const int last = reach[k];
          covered = last;
          if (first > last) continue;
          const int* drop = std::upper_bound(drops_next, drops_next_end, first - d);
          int s = first;
          while (true) {
            const int rest = h_next[s - d];
            if (rest < kNoDevices) {
              const int devices = t * d + rest;
              if (devices < g_row[s]) {
                g_row[s] = devices;
                if (record) {
                  choice_b_[a * width + s] = b;
                  choice_t_[a * width + s] = static_cast<int>(ti);
                  choice_d_[a * width + s] = k;
                }
              }
            }
            if (drop == drops_next_end || *drop + d > last) break;
            s = *drop + d;
            ++drop;
          }
        }
      }
    }
    int* h_row = &h_[a * width];
    h_row[0] = g_row[0];
    if (record) h_arg_[a * width] = 0;
    for (int s = 1; s <= S; ++s) {
      const bool take = g_row[s] < h_row[s - 1];
      h_row[s] = take ? g_row[s] : h_row[s - 1];
      if (record) h_arg_[a * width + s] = take ? s : h_arg_[a * width + s - 1];
    }
    RecordDrops(a);
  }
  return h_[S];
}

absl::StatusOr<PiperResult> PiperSolver::Reconstruct(double limit) {
  PiperResult result;
  result.devices_used = MinDevices(limit, /*record=*/true);
  if (result.devices_used > instance_.max_devices) {
    return absl::ResourceExhaustedError("no plan within the load limit");
  }
  const size_t width = budget_s_ + 1;
  // Fewest devices, then the smallest degree sum attaining it (as Piper reports).
  int s = h_arg_[budget_s_];
  int a = 0;
  while (a < n_) {
    s = h_arg_[a * width + s];
    const int b = choice_b_[a * width + s];
    const int ti = choice_t_[a * width + s];
    const int di = choice_d_[a * width + s];
    if (b <= a || ti < 0 || di < 0) {
      return absl::InternalError(absl::StrCat("Piper: no recorded stage at layer ", a));
    }
    PiperStage stage;
    stage.first_node = a;
    stage.end_node = b;
    stage.tensor_parallel = degrees_[ti];
    stage.data_parallel = divisors_[di];
    result.stages.push_back(stage);
    s -= divisors_[di];
    a = b;
  }
  // Loads and configurations with the exact suffix sums.
  int suffix = 0;
  for (auto it = result.stages.rbegin(); it != result.stages.rend(); ++it) {
    suffix += it->data_parallel;
    it->in_flight = (suffix + it->data_parallel - 1) / it->data_parallel;
  }
  result.sum_data_parallel = suffix;
  for (PiperStage& stage : result.stages) {
    const int ti = static_cast<int>(
        std::find(degrees_.begin(), degrees_.end(), stage.tensor_parallel) - degrees_.begin());
    const int di = static_cast<int>(
        std::find(divisors_.begin(), divisors_.end(), stage.data_parallel) - divisors_.begin());
    std::vector<int> choice;
    stage.load = Load(stage.first_node, stage.end_node, ti, di, stage.in_flight, &choice);
    for (int v = stage.first_node; v < stage.end_node; ++v) {
      const int l = choice[v - stage.first_node];
      const PiperConfig& c = instance_.nodes[v].configs.at(stage.tensor_parallel)[l];
      stage.config_ids.push_back(c.id);
      stage.memory_bytes += c.memory_per_microbatch_bytes * stage.in_flight + c.memory_fixed_bytes;
    }
    result.time_per_sample = std::max(result.time_per_sample, stage.load);
  }
  return result;
}

absl::StatusOr<bool> PiperSolver::Fits() {
  TANDEM_RETURN_IF_ERROR(ValidatePiperInstance(instance_, "piper"));
  fits_only_ = true;
  TANDEM_RETURN_IF_ERROR(Prepare());
  return MinDevices(kInfinity, false) <= instance_.max_devices;
}

double PiperSolver::LowerBound() const {
  // A stage on t * d devices has load at least (sum of its layers' times) / d, so its
  // device-time t * d * load is at least the sum of t * time over its layers; all stages share
  // max_devices. One layer alone needs time / (largest usable d).
  const int N = instance_.max_devices;
  double work = 0, single = 0;
  for (int v = 0; v < n_; ++v) {
    double best_work = kInfinity, best_single = kInfinity;
    for (size_t ti = 0; ti < degrees_.size(); ++ti) {
      const int t = degrees_[ti];
      int d_max = 0;
      for (int d : divisors_) {
        if (int64_t{t} * d <= N) d_max = d;
      }
      if (d_max == 0) continue;
      for (const ConfigData& c : data_[v][ti].configs) {
        best_work = std::min(best_work, t * c.time);
        best_single = std::min(best_single, c.time / d_max);
      }
    }
    if (best_work == kInfinity) return 0;
    work += best_work;
    single = std::max(single, best_single);
  }
  // Slightly below, so that rounding cannot put it above the optimum.
  return std::max(work / N, single) * (1 - 1e-12);
}

absl::StatusOr<PiperResult> PiperSolver::Run() {
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(ValidatePiperInstance(instance_, "piper"));
  TANDEM_RETURN_IF_ERROR(Prepare());
  const int N = instance_.max_devices;
  if (MinDevices(kInfinity, false) > N) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no Piper plan fits ", FormatBytes(instance_.memory_per_device_bytes), " per device on ",
        N, " devices"));
  }
  // Every limit below lo is infeasible; hi is the slowest stage of a plan found. Each feasible
  // limit yields a plan whose slowest stage is at or below it (hi jumps there); an infeasible
  // limit also rules out every limit below the next load at which some stage's in-flight bound
  // changes (lo jumps there), so the search ends as soon as no stage load lies strictly
  // between the bounds. Limits are tried upwards from the lower bound first, with growing
  // steps: near the optimum few stages are fast enough to need their configurations chosen.
  PiperResult best;
  const double bound = LowerBound();
  double lo = bound;
  double hi = kInfinity;
  double step = kFirstStep;
  int iteration = 0;
  for (; iteration < kMaxSearchIterations && bound > 0 && hi == kInfinity; ++iteration) {
    const double limit = std::max(lo, bound * (1 + step));
    if (MinDevices(limit, false) <= N) {
      TANDEM_ASSIGN_OR_RETURN(best, Reconstruct(limit));
      hi = std::min(limit, best.time_per_sample);
    } else {
      if (next_limit_ == kInfinity) break;  // as infeasible as it gets (cannot happen)
      lo = std::max(limit, next_limit_);
      step *= 4;
    }
  }
  if (hi == kInfinity) {
    TANDEM_ASSIGN_OR_RETURN(best, Reconstruct(kInfinity));
    hi = best.time_per_sample;
    lo = std::min(lo, hi);
  }
  for (; iteration < kMaxSearchIterations && lo < hi && hi - lo > kLoadPrecision * hi;
       ++iteration) {
    const double mid = lo + (hi - lo) / 2;
    if (MinDevices(mid, false) <= N) {
      TANDEM_ASSIGN_OR_RETURN(best, Reconstruct(mid));
      hi = std::min(mid, best.time_per_sample);
    } else {
      lo = std::max(mid, next_limit_);
    }
  }
  // The fewest devices reaching the optimum.
  TANDEM_ASSIGN_OR_RETURN(best, Reconstruct(hi));
  best.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return best;
}

}  // namespace

absl::StatusOr<PiperResult> RunPiper(const PiperInstance& instance, const PiperOptions& options) {
  PiperSolver solver(instance, options);
  return solver.Run();
}

absl::StatusOr<bool> PiperFits(const PiperInstance& instance, const PiperOptions& options) {
  PiperSolver solver(instance, options);
  return solver.Fits();
}

absl::StatusOr<PiperStageCost> EvaluatePiperStage(const PiperInstance& instance, int first,
                                                  int end, int tensor_parallel,
                                                  int data_parallel, int in_flight,
                                                  const std::vector<int>& config_indices) {
  if (first < 0 || end > static_cast<int>(instance.nodes.size()) || first >= end ||
      static_cast<int>(config_indices.size()) != end - first) {
    return absl::InvalidArgumentError("EvaluatePiperStage: bad stage range or configurations");
  }
  PiperStageCost cost;
  const double bandwidth = instance.bandwidth_bytes_per_second;
  for (int v = first; v < end; ++v) {
    auto it = instance.nodes[v].configs.find(tensor_parallel);
    if (it == instance.nodes[v].configs.end() ||
        config_indices[v - first] >= static_cast<int>(it->second.size())) {
      return absl::InvalidArgumentError(absl::StrCat("node ", v, " has no configuration ",
                                                     config_indices[v - first], " at degree ",
                                                     tensor_parallel));
    }
    const PiperConfig& c = it->second[config_indices[v - first]];
    double edge_bytes = 0;
    for (const PiperEdge& e : instance.edges) {
      if (e.destination == v && e.source < first) {
        auto s = c.sync_forward_bytes.find(e.source);
        edge_bytes += kEdgeTransfers *
                      (e.bytes + (s == c.sync_forward_bytes.end() ? 0.0 : s->second));
      }
      if (e.source == v && e.destination >= end) {
        auto s = c.sync_backward_bytes.find(e.destination);
        edge_bytes += kEdgeTransfers *
                      (e.bytes + (s == c.sync_backward_bytes.end() ? 0.0 : s->second));
      }
    }
    const double resync = kResyncFactor * (data_parallel - 1) * c.parameter_bytes /
                          data_parallel / instance.microbatches_per_batch;
    cost.load += (edge_bytes / data_parallel + resync) / bandwidth +
                 c.time_per_sample / data_parallel;
    cost.memory_bytes += c.memory_per_microbatch_bytes * in_flight + c.memory_fixed_bytes;
  }
  return cost;
}

}  // namespace tandem::planner
