#include "cluster/pollux_search.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem::cluster {
namespace {

// Added to each scaled speedup before the power mean, so a job with nothing counts as 1e-3.
constexpr double kSpeedupFloor = 1e-3;
// Pollux's mutation rates: reset a job to its current row, pick a job for zeroing, zero one of
// its elements.
constexpr double kResetProbability = 0.1;
constexpr double kZeroRowProbability = 0.1;
constexpr double kZeroElementProbability = 0.1;
// pymoo keeps mating until it has a full set of offspring that are new to the population; we
// give up after this many attempts per wanted offspring (small problems run out of new states).
constexpr int kMatingAttemptsPerOffspring = 4;
constexpr int kMaxGpusPerNode = 255;  // states hold one byte per (job, node)

// xoshiro256** (Blackman and Vigna): fast, and the same on every platform, unlike the standard
// library's distributions.
class Random {
 public:
  explicit Random(const uint64_t state[4]) { std::memcpy(s_, state, sizeof(s_)); }
  void Save(uint64_t state[4]) const { std::memcpy(state, s_, sizeof(s_)); }

  uint64_t Next() {
    const uint64_t result = Rotate(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotate(s_[3], 45);
    return result;
  }
  // 16 random bits, a quarter of a 64-bit draw at a time (for Bernoulli draws against
  // Threshold16).
  uint32_t Next16() {
    if (spare_count_ == 0) {
      spare_ = Next();
      spare_count_ = 4;
    }
    const uint32_t bits = static_cast<uint32_t>(spare_ & 0xFFFF);
    spare_ >>= 16;
    --spare_count_;
    return bits;
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n), n >= 1 (Lemire's multiply-shift; the bias is below 2^-32).
  int Below(int n) {
    return static_cast<int>(((Next() >> 32) * static_cast<uint64_t>(n)) >> 32);
  }

 private:
  static uint64_t Rotate(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  uint64_t spare_ = 0;
  int spare_count_ = 0;
};

void SeedRandom(uint64_t seed, uint64_t state[4]) {
  // splitmix64, the seeding its authors recommend.
  for (int i = 0; i < 4; ++i) {
    seed += 0x9E3779B97F4A7C15ull;
    uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    state[i] = z ^ (z >> 31);
  }
}

double RestartFactor(const PolluxJob& job, double delay_seconds) {
  const double denominator = job.age_seconds + delay_seconds;
  if (!(denominator > 0)) return 1.0;  // no age and no delay: nothing to penalise
  return std::max(job.age_seconds - job.num_restarts * delay_seconds, 0.0) / denominator;
}

// Speedup scaled so that a node's worth of GPUs is worth 1 (Pollux: speedup times the dominant
// share of one replica times the number of nodes).
double ScaledSpeedup(double speedup, int cluster_gpus, int num_nodes) {
  if (speedup == 0) return 0;
  return speedup * (1.0 / cluster_gpus) * num_nodes;
}

// One job's term of the power mean, and the mean from the sum of terms.
double PowerTerm(double scaled, double p) {
  if (p == 0) return std::log(std::max(scaled, kSpeedupFloor));
  if (p == -1) return 1.0 / (scaled + kSpeedupFloor);
  return std::pow(scaled + kSpeedupFloor, p);
}

double PowerMean(double sum_of_terms, int num_jobs, double p) {
  if (num_jobs == 0) return 0;
  const double mean = sum_of_terms / num_jobs;
  if (p == 0) return std::exp(mean);
  if (p == -1) return 1.0 / mean;
  return std::pow(mean, 1.0 / p);
}

bool ValidSpeedup(double value) { return std::isfinite(value) && value >= 0; }

bool IsPinned(const PolluxJob& job) {
  if (job.preemptible) return false;
  for (int v : job.current) {
    if (v != 0) return true;
  }
  return false;
}

uint64_t HashState(const uint8_t* state, size_t size) {
  uint64_t h = 0x243F6A8885A308D3ull ^ size;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, state + i, 8);
    h = (h ^ word) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  for (int shift = 0; i < size; ++i, shift += 8) tail |= static_cast<uint64_t>(state[i]) << shift;
  h = (h ^ tail) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}

// Rows of a state are padded to a multiple of kLane bytes (the padding stays zero), so the
// element loops below run over fixed-size chunks the compiler can vectorise.
constexpr int kLane = 16;

// Element loops over one row, with restrict so the compiler may vectorise byte arrays.
// left[n] -= min(left[n], row[n]); row[n] = min(row[n], left[n]) before the subtraction.
void ClipToLeft(uint8_t* __restrict row, uint8_t* __restrict left, int stride) {
  for (int c = 0; c < stride; c += kLane) {
    for (int k = 0; k < kLane; ++k) {
      const uint8_t v = std::min(row[c + k], left[c + k]);
      left[c + k] -= v;
      row[c + k] = v;
    }
  }
}
// left[n] -= min(left[n], row[n]).
void SubtractFromLeft(const uint8_t* __restrict row, uint8_t* __restrict left, int stride) {
  for (int c = 0; c < stride; c += kLane) {
    for (int k = 0; k < kLane; ++k) left[c + k] -= std::min(row[c + k], left[c + k]);
  }
}
// active[n] |= row[n].
void OrInto(const uint8_t* __restrict row, uint8_t* __restrict active, int stride) {
  for (int c = 0; c < stride; c += kLane) {
    for (int k = 0; k < kLane; ++k) active[c + k] |= row[c + k];
  }
}
// Zeroes the row's elements on occupied nodes (unless exempt = 0xFF), then marks its nodes.
void KeepUnoccupied(uint8_t* __restrict row, uint8_t* __restrict occupied, uint8_t exempt,
                    int stride) {
  for (int c = 0; c < stride; c += kLane) {
    for (int k = 0; k < kLane; ++k) {
      const uint8_t v = row[c + k];
      row[c + k] = v & static_cast<uint8_t>(exempt | ~occupied[c + k]);
      occupied[c + k] |= static_cast<uint8_t>(v != 0 ? 0xFF : 0);
    }
  }
}

// The problem of one round: the operators and the memoised objective.
class Problem {
 public:
  Problem(const std::vector<PolluxJob>& jobs, const std::vector<int>& gpus_per_node,
          const PolluxSearchOptions& options)
      : jobs_(jobs),
        num_jobs_(static_cast<int>(jobs.size())),
        num_nodes_(static_cast<int>(gpus_per_node.size())),
        stride_((num_nodes_ + kLane - 1) / kLane * kLane),
        p_(options.p),
        max_nodes_per_job_(options.max_nodes_per_job) {
    cluster_gpus_ = std::accumulate(gpus_per_node.begin(), gpus_per_node.end(), 0);
    capacity_.assign(stride_, 0);
    for (int n = 0; n < num_nodes_; ++n) capacity_[n] = static_cast<uint8_t>(gpus_per_node[n]);
    base_.assign(static_cast<size_t>(num_jobs_) * stride_, 0);
    pinned_.assign(num_jobs_, 0);
    factor_.resize(num_jobs_);
    max_replicas_.resize(num_jobs_);
    table_replicas_.resize(num_jobs_);
    table_nodes_.resize(num_jobs_);
    table_offset_.resize(num_jobs_);
    size_t table_size = 0;
    for (int j = 0; j < num_jobs_; ++j) {
      const PolluxJob& job = jobs[j];
      int current_total = 0, current_nodes = 0;
      for (int n = 0; n < num_nodes_; ++n) {
        base_[Index(j, n)] = static_cast<uint8_t>(job.current[n]);
        current_total += job.current[n];
        current_nodes += job.current[n] != 0;
      }
      pinned_[j] = IsPinned(job);
      factor_[j] = RestartFactor(job, options.restart_delay_seconds);
      max_replicas_[j] = std::min(job.max_replicas, cluster_gpus_);
      // Largest (nodes, replicas) a repaired state can give this job.
      if (pinned_[j]) {
        table_replicas_[j] = current_total;
        table_nodes_[j] = current_nodes;
      } else {
        table_replicas_[j] = max_replicas_[j];
        table_nodes_[j] = std::min({num_nodes_, max_nodes_per_job_, max_replicas_[j]});
      }
      table_offset_[j] = table_size;
      table_size += static_cast<size_t>(table_nodes_[j] + 1) * (table_replicas_[j] + 1);
    }
    const double unknown = std::numeric_limits<double>::quiet_NaN();
    speedup_.assign(table_size, unknown);
    term_kept_.assign(table_size, unknown);
    term_changed_.assign(table_size, unknown);
    zero_term_ = PowerTerm(0, p_);
    // Repair priority: pinned jobs first, then the caller's order.
    for (int j = 0; j < num_jobs_; ++j) {
      if (pinned_[j]) {
        order_.push_back(j);
        pinned_list_.push_back(j);
      }
    }
    for (int j = 0; j < num_jobs_; ++j) {
      if (!pinned_[j]) {
        order_.push_back(j);
        free_list_.push_back(j);
        if (jobs[j].min_replicas > 0) min_list_.push_back(j);
      }
    }
    row_nodes_.resize(num_jobs_);
    remaining_.resize(stride_);
    occupied_.resize(stride_);
    active_.resize(stride_);
    permutation_.resize(num_nodes_);
    free_nodes_.reserve(num_nodes_);
  }

  size_t state_size() const { return base_.size(); }
  int stride() const { return stride_; }
  const uint8_t* base() const { return base_.data(); }
  int64_t speedup_calls() const { return speedup_calls_; }
  const std::string& error() const { return error_; }
  int error_job() const { return error_job_; }

  // The objective (matches PolluxObjective bit for bit) and Pollux's second objective, the
  // cluster utility: the sum of raw speedups over the GPUs of the nodes in use.
  double Evaluate(const uint8_t* state, double* utility) {
    double sum = 0, speedups = 0;
    std::fill(active_.begin(), active_.end(), 0);
    for (int j = 0; j < num_jobs_; ++j) {
      const uint8_t* row = state + Index(j, 0);
      const uint8_t* base_row = base_.data() + Index(j, 0);
      int nodes = 0, replicas = 0, differences = 0;
      for (int c = 0; c < stride_; c += kLane) {
        for (int k = 0; k < kLane; ++k) {
          const uint8_t v = row[c + k];
          nodes += v != 0;
          replicas += v;
          differences += v != base_row[c + k];
        }
      }
      OrInto(row, active_.data(), stride_);
      sum += Term(j, nodes, replicas, differences != 0, &speedups);
    }
    int active_gpus = 0;
    for (int n = 0; n < num_nodes_; ++n) active_gpus += active_[n] != 0 ? capacity_[n] : 0;
    *utility = active_gpus > 0 ? speedups / active_gpus : 0.0;
    return PowerMean(sum, num_jobs_, p_);
  }

  void Crossover(const uint8_t* a, const uint8_t* b, uint8_t* child_a, uint8_t* child_b,
                 double probability, Random& random) {
    const size_t size = state_size();
    if (random.Uniform() < probability) {
      // Single point over jobs: rows before the point from one parent, the rest from the other.
      const size_t point = static_cast<size_t>(random.Below(num_jobs_)) * stride_;
      std::memcpy(child_a, a, point);
      std::memcpy(child_a + point, b + point, size - point);
      std::memcpy(child_b, b, point);
      std::memcpy(child_b + point, a + point, size - point);
    } else {
      std::memcpy(child_a, a, size);
      std::memcpy(child_b, b, size);
    }
  }

  void Mutate(uint8_t* state, Random& random) {
    // (1) Reset a job to its current allocation; (2) zero some of a job's elements.
    static const uint32_t reset = Threshold16(kResetProbability);
    static const uint32_t zero_row = Threshold16(kZeroRowProbability);
    static const uint32_t zero_element = Threshold16(kZeroElementProbability);
    for (int j : free_list_) {
      uint8_t* row = state + Index(j, 0);
      if (random.Next16() < reset) std::memcpy(row, base_.data() + Index(j, 0), stride_);
      if (random.Next16() < zero_row) {
        for (int n = 0; n < num_nodes_; ++n) {
          if (random.Next16() < zero_element) row[n] = 0;
        }
      }
    }
    // (3) Grow elements on nodes with a free GPU, each to a uniform value between its own and the
    // node's size. A node is picked with probability 1/(free nodes), raised for nodes the job
    // already uses (1/(its free nodes)), so jobs tend to grow where they are.
    std::memcpy(remaining_.data(), capacity_.data(), stride_);
    for (int j = 0; j < num_jobs_; ++j) {
      SubtractFromLeft(state + Index(j, 0), remaining_.data(), stride_);
    }
    free_nodes_.clear();
    for (int n = 0; n < num_nodes_; ++n) {
      if (remaining_[n] > 0) free_nodes_.push_back(n);
    }
    if (free_nodes_.empty()) return;
    const double p_any = 1.0 / static_cast<double>(free_nodes_.size());
    const uint32_t any_threshold = Threshold16(p_any);
    for (int j : free_list_) {
      uint8_t* row = state + Index(j, 0);
      int own = 0;
      for (int n : free_nodes_) own += row[n] != 0;
      const double p_own = own > 0 ? 1.0 / own : 0.0;
      const uint32_t both_threshold = Threshold16(p_any + p_own - p_any * p_own);
      for (int n : free_nodes_) {
        const int v = row[n];
        if (random.Next16() < (v != 0 ? both_threshold : any_threshold)) {
          row[n] = static_cast<uint8_t>(v + random.Below(capacity_[n] - v + 1));
        }
      }
    }
  }

  // Pollux's repair; its result satisfies IsFeasiblePolluxState.
  void Repair(uint8_t* state, Random& random) {
    for (int j : pinned_list_) {
      std::memcpy(state + Index(j, 0), base_.data() + Index(j, 0), stride_);
    }
    // At most one distributed job per node: the first in priority order keeps the node.
    for (int j = 0; j < num_jobs_; ++j) row_nodes_[j] = CountNodes(state + Index(j, 0));
    std::fill(occupied_.begin(), occupied_.end(), 0);
    for (int j : order_) {
      if (row_nodes_[j] <= 1) continue;
      KeepUnoccupied(state + Index(j, 0), occupied_.data(), pinned_[j] ? 0xFF : 0, stride_);
    }
    // At most max_replicas replicas on at most max_nodes_per_job nodes, trimmed in a random node
    // order.
    for (int j : free_list_) {
      uint8_t* row = state + Index(j, 0);
      int replicas = 0, nodes = 0;
      for (int c = 0; c < stride_; c += kLane) {
        for (int k = 0; k < kLane; ++k) {
          replicas += row[c + k];
          nodes += row[c + k] != 0;
        }
      }
      if (replicas <= max_replicas_[j] && nodes <= max_nodes_per_job_) continue;
      for (int i = 0; i < num_nodes_; ++i) permutation_[i] = i;
      for (int i = num_nodes_ - 1; i > 0; --i) {
        std::swap(permutation_[i], permutation_[random.Below(i + 1)]);
      }
      int replicas_left = max_replicas_[j];
      int nodes_left = max_nodes_per_job_;
      for (int i = 0; i < num_nodes_; ++i) {
        const int n = permutation_[i];
        int v = std::min<int>(row[n], replicas_left);
        replicas_left -= v;
        if (v != 0) {
          if (nodes_left == 0) {
            v = 0;
          } else {
            --nodes_left;
          }
        }
        row[n] = static_cast<uint8_t>(v);
      }
    }
    // Node capacity, in priority order.
    std::memcpy(remaining_.data(), capacity_.data(), stride_);
    for (int j : order_) ClipToLeft(state + Index(j, 0), remaining_.data(), stride_);
    // A job runs with at least min_replicas or not at all.
    for (int j : min_list_) {
      uint8_t* row = state + Index(j, 0);
      int replicas = 0;
      for (int c = 0; c < stride_; c += kLane) {
        for (int k = 0; k < kLane; ++k) replicas += row[c + k];
      }
      if (replicas < jobs_[j].min_replicas) std::memset(row, 0, stride_);
    }
  }

 private:
  // A probability as a bound on a 16-bit random number (rounded down to a multiple of 2^-16).
  static uint32_t Threshold16(double probability) {
    return static_cast<uint32_t>(std::clamp(probability, 0.0, 1.0) * 65536.0);
  }

  size_t Index(int job, int node) const {
    return static_cast<size_t>(job) * stride_ + node;
  }

  int CountNodes(const uint8_t* row) const {
    int nodes = 0;
    for (int c = 0; c < stride_; c += kLane) {
      for (int k = 0; k < kLane; ++k) nodes += row[c + k] != 0;
    }
    return nodes;
  }

  // Job j's speedup, checked.
  double Speedup(int j, int nodes, int replicas) {
    ++speedup_calls_;
    const double speedup = jobs_[j].speedup(nodes, replicas);
    if (ValidSpeedup(speedup)) return speedup;
    if (error_.empty()) {
      error_ = absl::StrFormat("speedup(%d nodes, %d replicas) = %g", nodes, replicas, speedup);
      error_job_ = j;
    }
    return 0;
  }

  // Job j's term of the power mean; adds its speedup to *speedups.
  double Term(int j, int nodes, int replicas, bool changed, double* speedups) {
    if (replicas == 0) return zero_term_;
    if (replicas > table_replicas_[j] || nodes > table_nodes_[j]) {
      // Not reached for repaired states.
      const double speedup = Speedup(j, nodes, replicas);
      *speedups += speedup;
      const double scaled = ScaledSpeedup(speedup, cluster_gpus_, num_nodes_);
      return PowerTerm(changed ? scaled * factor_[j] : scaled, p_);
    }
    const size_t index =
        table_offset_[j] + static_cast<size_t>(nodes) * (table_replicas_[j] + 1) + replicas;
    if (std::isnan(speedup_[index])) {
      speedup_[index] = Speedup(j, nodes, replicas);
      const double scaled = ScaledSpeedup(speedup_[index], cluster_gpus_, num_nodes_);
      term_kept_[index] = PowerTerm(scaled, p_);
      term_changed_[index] = PowerTerm(scaled * factor_[j], p_);
    }
    *speedups += speedup_[index];
    return changed ? term_changed_[index] : term_kept_[index];
  }

  const std::vector<PolluxJob>& jobs_;
  int num_jobs_;
  int num_nodes_;
  int stride_;  // bytes per row: num_nodes_ rounded up to a multiple of kLane
  double p_;
  int max_nodes_per_job_;
  int cluster_gpus_ = 0;
  std::vector<uint8_t> capacity_;  // padded with zeros
  std::vector<uint8_t> base_;      // the current allocation
  std::vector<char> pinned_;
  std::vector<int> order_;        // repair priority: pinned jobs first
  std::vector<int> pinned_list_;  // pinned jobs
  std::vector<int> free_list_;    // jobs the search may change
  std::vector<int> min_list_;     // free jobs with a min_replicas
  std::vector<double> factor_;
  std::vector<int> max_replicas_;
  // Memoised terms per job, indexed by (nodes, replicas).
  std::vector<int> table_replicas_;
  std::vector<int> table_nodes_;
  std::vector<size_t> table_offset_;
  std::vector<double> speedup_;
  std::vector<double> term_kept_;
  std::vector<double> term_changed_;
  double zero_term_ = 0;
  int64_t speedup_calls_ = 0;
  std::string error_;
  int error_job_ = -1;
  // Scratch.
  std::vector<int> row_nodes_;
  std::vector<uint8_t> remaining_;
  std::vector<uint8_t> occupied_;
  std::vector<uint8_t> active_;
  std::vector<int> permutation_;
  std::vector<int> free_nodes_;
};

bool Dominates(double a1, double a2, double b1, double b2) {
  return a1 >= b1 && a2 >= b2 && (a1 > b1 || a2 > b2);
}

// NSGA-II's survival for two maximised objectives: non-dominated fronts first, then the
// crowding distance within a front. With one objective, the objective alone.
class Survival {
 public:
  explicit Survival(int slots)
      : rank_(slots), next_rank_(slots), crowding_(slots), next_crowding_(slots) {
    order_.reserve(slots);
    chosen_.reserve(slots);
    front_last_.reserve(slots);
  }

  // The `keep` best of the first `count` points, best first.
  const std::vector<int>& Select(const std::vector<double>& f1, const std::vector<double>& f2,
                                 int count, int keep, bool two_objectives) {
    order_.resize(count);
    std::iota(order_.begin(), order_.end(), 0);
    if (!two_objectives) {
      std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) { return f1[a] > f1[b]; });
      for (int i = 0; i < count; ++i) {
        rank_[order_[i]] = i;
        crowding_[order_[i]] = 0;
      }
    } else {
      std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) {
        return f1[a] != f1[b] ? f1[a] > f1[b] : f2[a] > f2[b];
      });
      // Fronts: in this order each front's f2 never decreases, so a point is dominated by a
      // front exactly when it is dominated by the front's latest member.
      front_last_.clear();
      for (int i : order_) {
        size_t k = 0;
        while (k < front_last_.size() &&
               Dominates(f1[front_last_[k]], f2[front_last_[k]], f1[i], f2[i])) {
          ++k;
        }
        if (k == front_last_.size()) {
          front_last_.push_back(i);
        } else {
          front_last_[k] = i;
        }
        rank_[i] = static_cast<int>(k);
      }
      // Crowding distance, front by front (members in the same order, f1 falling, f2 rising).
      std::stable_sort(order_.begin(), order_.end(),
                       [&](int a, int b) { return rank_[a] < rank_[b]; });
      const double infinity = std::numeric_limits<double>::infinity();
      for (int begin = 0; begin < count;) {
        int end = begin;
        while (end < count && rank_[order_[end]] == rank_[order_[begin]]) ++end;
        const int first = order_[begin], last = order_[end - 1];
        const double range1 = f1[first] - f1[last], range2 = f2[last] - f2[first];
        for (int m = begin; m < end; ++m) {
          const int i = order_[m];
          if (m == begin || m == end - 1) {
            crowding_[i] = infinity;
            continue;
          }
          const int previous = order_[m - 1], next = order_[m + 1];
          double distance = 0;
          if (range1 > 0) distance += (f1[previous] - f1[next]) / range1;
          if (range2 > 0) distance += (f2[next] - f2[previous]) / range2;
          crowding_[i] = distance;
        }
        begin = end;
      }
      std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) {
        return rank_[a] != rank_[b] ? rank_[a] < rank_[b] : crowding_[a] > crowding_[b];
      });
    }
    chosen_.assign(order_.begin(), order_.begin() + std::min(keep, count));
    return chosen_;
  }

  // Moves the ranks and crowding distances of the chosen points to slots 0, 1, ...
  void KeepRanks(const std::vector<int>& chosen) {
    for (size_t i = 0; i < chosen.size(); ++i) {
      next_rank_[i] = rank_[chosen[i]];
      next_crowding_[i] = crowding_[chosen[i]];
    }
    rank_.swap(next_rank_);
    crowding_.swap(next_crowding_);
  }

  int rank(int i) const { return rank_[i]; }
  double crowding(int i) const { return crowding_[i]; }

 private:
  std::vector<int> order_, chosen_, front_last_;
  std::vector<int> rank_, next_rank_;
  std::vector<double> crowding_, next_crowding_;
};

absl::Status CheckOptions(const PolluxSearchOptions& options) {
  if (options.population < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Pollux search: population must be at least 1, got %d",
                        options.population));
  }
  if (options.generations < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Pollux search: generations must be non-negative, got %d", options.generations));
  }
  if (!(options.restart_delay_seconds >= 0) || !std::isfinite(options.restart_delay_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Pollux search: restart_delay_seconds must be finite and >= 0, got %g",
                        options.restart_delay_seconds));
  }
  if (!std::isfinite(options.p)) {
    return absl::InvalidArgumentError("Pollux search: p must be finite");
  }
  if (options.max_nodes_per_job < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Pollux search: max_nodes_per_job must be at least 1, got %d", options.max_nodes_per_job));
  }
  if (!(options.crossover_probability >= 0 && options.crossover_probability <= 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Pollux search: crossover_probability must be in [0, 1], got %g",
        options.crossover_probability));
  }
  return absl::OkStatus();
}

absl::Status CheckInput(const std::vector<std::string>& job_ids,
                        const std::vector<std::string>& node_ids,
                        const std::vector<PolluxJob>& jobs,
                        const std::vector<int>& gpus_per_node) {
  if (job_ids.size() != jobs.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Pollux search: %d job ids for %d jobs", job_ids.size(), jobs.size()));
  }
  if (node_ids.size() != gpus_per_node.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Pollux search: %d node ids for %d nodes", node_ids.size(), gpus_per_node.size()));
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::string& id : job_ids) {
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Pollux search: job id '%s' appears twice", id));
    }
  }
  seen.clear();
  for (const std::string& id : node_ids) {
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Pollux search: node id '%s' appears twice", id));
    }
  }
  const size_t num_nodes = gpus_per_node.size();
  for (size_t n = 0; n < num_nodes; ++n) {
    if (gpus_per_node[n] < 0 || gpus_per_node[n] > kMaxGpusPerNode) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Pollux search: node '%s' has %d GPUs; expected 0 to %d", node_ids[n],
                          gpus_per_node[n], kMaxGpusPerNode));
    }
  }
  std::vector<int> pinned_use(num_nodes, 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PolluxJob& job = jobs[j];
    const std::string& id = job_ids[j];
    if (!job.speedup) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Pollux search: job '%s' has no speedup function", id));
    }
    if (job.max_replicas < 0 || job.min_replicas < 0 || job.min_replicas > job.max_replicas) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Pollux search: job '%s' has min_replicas %d and max_replicas %d", id,
          job.min_replicas, job.max_replicas));
    }
    if (!(job.age_seconds >= 0) || !std::isfinite(job.age_seconds) || job.num_restarts < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Pollux search: job '%s' has age %g s and %d restarts", id,
                          job.age_seconds, job.num_restarts));
    }
    if (job.current.size() != num_nodes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Pollux search: job '%s' has a current allocation over %d nodes; the "
                          "cluster has %d",
                          id, job.current.size(), num_nodes));
    }
    for (size_t n = 0; n < num_nodes; ++n) {
      if (job.current[n] < 0 || job.current[n] > gpus_per_node[n]) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "Pollux search: job '%s' holds %d replicas on node '%s', which has %d GPUs", id,
            job.current[n], node_ids[n], gpus_per_node[n]));
      }
    }
    if (IsPinned(job)) {
      for (size_t n = 0; n < num_nodes; ++n) pinned_use[n] += job.current[n];
    }
  }
  for (size_t n = 0; n < num_nodes; ++n) {
    if (pinned_use[n] > gpus_per_node[n]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Pollux search: non-preemptible jobs hold %d replicas on node '%s', which has %d GPUs",
          pinned_use[n], node_ids[n], gpus_per_node[n]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

double PolluxObjective(const std::vector<PolluxJob>& jobs,
                       const std::vector<std::vector<int>>& state,
                       const std::vector<int>& gpus_per_node, const PolluxSearchOptions& options) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (state.size() != jobs.size()) return nan;
  const int num_nodes = static_cast<int>(gpus_per_node.size());
  const int cluster_gpus = std::accumulate(gpus_per_node.begin(), gpus_per_node.end(), 0);
  double sum = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PolluxJob& job = jobs[j];
    if (static_cast<int>(state[j].size()) != num_nodes ||
        static_cast<int>(job.current.size()) != num_nodes) {
      return nan;
    }
    int nodes = 0, replicas = 0;
    bool changed = false;
    for (int n = 0; n < num_nodes; ++n) {
      nodes += state[j][n] != 0;
      replicas += state[j][n];
      changed |= state[j][n] != job.current[n];
    }
    double speedup = 0;
    if (replicas > 0) {
      if (!job.speedup) return nan;
      speedup = job.speedup(nodes, replicas);
      if (!ValidSpeedup(speedup)) return nan;
    }
    double scaled = ScaledSpeedup(speedup, cluster_gpus, num_nodes);
    if (changed) scaled *= RestartFactor(job, options.restart_delay_seconds);
    sum += PowerTerm(scaled, options.p);
  }
  return PowerMean(sum, static_cast<int>(jobs.size()), options.p);
}

bool IsFeasiblePolluxState(const std::vector<PolluxJob>& jobs,
                           const std::vector<std::vector<int>>& state,
                           const std::vector<int>& gpus_per_node,
                           const PolluxSearchOptions& options) {
  const size_t num_nodes = gpus_per_node.size();
  if (state.size() != jobs.size()) return false;
  std::vector<int> used(num_nodes, 0);
  std::vector<int> distributed(num_nodes, 0);
  std::vector<int> distributed_free(num_nodes, 0);  // distributed jobs that are not pinned
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PolluxJob& job = jobs[j];
    const std::vector<int>& row = state[j];
    if (row.size() != num_nodes || job.current.size() != num_nodes) return false;
    int nodes = 0, replicas = 0;
    for (size_t n = 0; n < num_nodes; ++n) {
      if (row[n] < 0) return false;
      nodes += row[n] != 0;
      replicas += row[n];
      used[n] += row[n];
    }
    const bool pinned = IsPinned(job);
    if (pinned) {
      if (row != job.current) return false;
    } else {
      if (replicas > job.max_replicas || nodes > options.max_nodes_per_job) return false;
      if (replicas != 0 && replicas < job.min_replicas) return false;
    }
    if (nodes > 1) {
      for (size_t n = 0; n < num_nodes; ++n) {
        if (row[n] == 0) continue;
        ++distributed[n];
        if (!pinned) ++distributed_free[n];
      }
    }
  }
  for (size_t n = 0; n < num_nodes; ++n) {
    if (used[n] > gpus_per_node[n]) return false;
    if (distributed_free[n] > 0 && distributed[n] > 1) return false;
  }
  return true;
}

PolluxSearch::PolluxSearch(PolluxSearchOptions options) : options_(options) {
  SeedRandom(options_.seed, rng_state_);
}

void PolluxSearch::Reset() {
  previous_population_.clear();
  previous_job_ids_.clear();
  previous_node_ids_.clear();
}

absl::StatusOr<std::vector<std::vector<int>>> PolluxSearch::Optimize(
    const std::vector<std::string>& job_ids, const std::vector<PolluxJob>& jobs,
    const std::vector<int>& gpus_per_node) {
  std::vector<std::string> node_ids(gpus_per_node.size());
  for (size_t n = 0; n < node_ids.size(); ++n) node_ids[n] = std::to_string(n);
  return Optimize(job_ids, node_ids, jobs, gpus_per_node);
}

absl::StatusOr<std::vector<std::vector<int>>> PolluxSearch::Optimize(
    const std::vector<std::string>& job_ids, const std::vector<std::string>& node_ids,
    const std::vector<PolluxJob>& jobs, const std::vector<int>& gpus_per_node) {
  if (absl::Status status = CheckOptions(options_); !status.ok()) return status;
  if (absl::Status status = CheckInput(job_ids, node_ids, jobs, gpus_per_node); !status.ok()) {
    return status;
  }
  const int num_jobs = static_cast<int>(jobs.size());
  const int num_nodes = static_cast<int>(gpus_per_node.size());
  stats_ = Stats();
  if (num_jobs == 0 || num_nodes == 0) {
    return std::vector<std::vector<int>>(num_jobs, std::vector<int>(num_nodes, 0));
  }

  Problem problem(jobs, gpus_per_node, options_);
  Random random(rng_state_);
  const size_t size = problem.state_size();
  const int stride = problem.stride();
  const int population_size = options_.population;

  // The pool holds the population in its first slots and one generation's offspring after it.
  const int pool_slots = 2 * population_size;
  std::vector<uint8_t> pool(static_cast<size_t>(pool_slots) * size);
  std::vector<uint8_t> next_pool(pool.size());
  std::vector<double> objective(pool_slots), utility(pool_slots);
  std::vector<double> next_objective(pool_slots), next_utility(pool_slots);
  Survival survival(pool_slots);
  int population_count = 0;
  absl::flat_hash_map<uint64_t, const uint8_t*> seen;
  seen.reserve(2 * pool_slots);
  auto is_new = [&](const uint8_t* state, uint64_t hash) {
    auto it = seen.find(hash);
    return it == seen.end() || std::memcmp(it->second, state, size) != 0;
  };
  auto slot = [&](int i) { return pool.data() + static_cast<size_t>(i) * size; };
  // Keeps the best population_size of the first `count` slots, best first.
  auto survive = [&](int count) {
    const std::vector<int>& chosen =
        survival.Select(objective, utility, count, population_size, options_.utility_objective);
    population_count = static_cast<int>(chosen.size());
    for (int i = 0; i < population_count; ++i) {
      std::memcpy(next_pool.data() + static_cast<size_t>(i) * size, slot(chosen[i]), size);
      next_objective[i] = objective[chosen[i]];
      next_utility[i] = utility[chosen[i]];
    }
    survival.KeepRanks(chosen);
    pool.swap(next_pool);
    objective.swap(next_objective);
    utility.swap(next_utility);
  };

  // Initial population: the current allocation, then last round's states mapped onto this
  // round's jobs and nodes, each repaired, duplicates dropped.
  {
    int count = 0;
    auto add = [&](const uint8_t* state) {
      if (count == pool_slots) return;
      uint8_t* target = slot(count);
      std::memcpy(target, state, size);
      problem.Repair(target, random);
      const uint64_t hash = HashState(target, size);
      if (!is_new(target, hash)) return;
      seen.emplace(hash, target);
      objective[count] = problem.Evaluate(target, &utility[count]);
      ++stats_.evaluations;
      ++count;
    };
    add(problem.base());
    absl::flat_hash_map<std::string, int> previous_job_index, previous_node_index;
    for (size_t i = 0; i < previous_job_ids_.size(); ++i) {
      previous_job_index[previous_job_ids_[i]] = static_cast<int>(i);
    }
    for (size_t i = 0; i < previous_node_ids_.size(); ++i) {
      previous_node_index[previous_node_ids_[i]] = static_cast<int>(i);
    }
    std::vector<int> job_source(num_jobs, -1), node_source(num_nodes, -1);
    for (int j = 0; j < num_jobs; ++j) {
      if (auto it = previous_job_index.find(job_ids[j]); it != previous_job_index.end()) {
        job_source[j] = it->second;
      }
    }
    for (int n = 0; n < num_nodes; ++n) {
      if (auto it = previous_node_index.find(node_ids[n]); it != previous_node_index.end()) {
        node_source[n] = it->second;
      }
    }
    const size_t previous_nodes = previous_node_ids_.size();
    std::vector<uint8_t> state(size);
    for (const std::vector<uint8_t>& previous : previous_population_) {
      std::fill(state.begin(), state.end(), 0);
      for (int j = 0; j < num_jobs; ++j) {
        if (job_source[j] < 0) continue;
        for (int n = 0; n < num_nodes; ++n) {
          if (node_source[n] < 0) continue;
          state[static_cast<size_t>(j) * stride + n] =
              previous[job_source[j] * previous_nodes + node_source[n]];
        }
      }
      add(state.data());
    }
    survive(count);
  }

  std::vector<uint8_t> children(2 * size);
  for (int generation = 0; generation < options_.generations; ++generation) {
    seen.clear();
    for (int i = 0; i < population_count; ++i) seen.emplace(HashState(slot(i), size), slot(i));
    // Binary tournament: NSGA-II's comparison (dominance, then crowding distance), or the
    // objective alone.
    auto tournament = [&]() {
      const int a = random.Below(population_count);
      const int b = random.Below(population_count);
      if (!options_.utility_objective) return objective[b] > objective[a] ? b : a;
      if (Dominates(objective[a], utility[a], objective[b], utility[b])) return a;
      if (Dominates(objective[b], utility[b], objective[a], utility[a])) return b;
      const double crowding_a = survival.crowding(a), crowding_b = survival.crowding(b);
      if (crowding_a != crowding_b) return crowding_a > crowding_b ? a : b;
      return (random.Next16() & 1) ? a : b;
    };
    int count = population_count;
    const int wanted = population_count + population_size;
    const int max_attempts = kMatingAttemptsPerOffspring * population_size;
    for (int attempts = 0; count < wanted && attempts < max_attempts; attempts += 2) {
      const uint8_t* parent_a = slot(tournament());
      const uint8_t* parent_b = slot(tournament());
      problem.Crossover(parent_a, parent_b, children.data(), children.data() + size,
                        options_.crossover_probability, random);
      for (int c = 0; c < 2 && count < wanted; ++c) {
        uint8_t* child = slot(count);
        std::memcpy(child, children.data() + c * size, size);
        problem.Mutate(child, random);
        problem.Repair(child, random);
        const uint64_t hash = HashState(child, size);
        if (!is_new(child, hash)) continue;  // pymoo drops duplicates too
        seen.emplace(hash, child);
        objective[count] = problem.Evaluate(child, &utility[count]);
        ++stats_.evaluations;
        ++count;
      }
    }
    survive(count);
    ++stats_.generations;
  }
  random.Save(rng_state_);
  stats_.speedup_calls = problem.speedup_calls();
  if (!problem.error().empty()) {
    Reset();
    return absl::InvalidArgumentError(absl::StrFormat(
        "Pollux search: job '%s': speedup is not finite and non-negative (%s)",
        job_ids[problem.error_job()], problem.error()));
  }

  // The answer: the best objective (Pollux's choice on its Pareto front). Kept for the next
  // round: the non-dominated states (Pollux keeps pymoo's optimum set), or the whole population
  // with the single objective.
  int best = 0;
  for (int i = 1; i < population_count; ++i) {
    if (objective[i] > objective[best]) best = i;
  }
  previous_population_.clear();
  for (int i = 0; i < population_count; ++i) {
    if (options_.utility_objective && survival.rank(i) != 0) continue;
    std::vector<uint8_t>& kept =
        previous_population_.emplace_back(static_cast<size_t>(num_jobs) * num_nodes);
    for (int j = 0; j < num_jobs; ++j) {
      std::memcpy(kept.data() + static_cast<size_t>(j) * num_nodes,
                  slot(i) + static_cast<size_t>(j) * stride, num_nodes);
    }
  }
  previous_job_ids_ = job_ids;
  previous_node_ids_ = node_ids;

  stats_.best_objective = objective[best];
  std::vector<std::vector<int>> result(num_jobs, std::vector<int>(num_nodes));
  for (int j = 0; j < num_jobs; ++j) {
    for (int n = 0; n < num_nodes; ++n) {
      result[j][n] = slot(best)[static_cast<size_t>(j) * stride + n];
    }
  }
  return result;
}

}  // namespace tandem::cluster
