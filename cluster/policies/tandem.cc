// tandem's own policy: goodput-driven, with an exact allocation of GPU counts, node-aware
// placement, and reallocations weighed by what they cost on the job's mechanism (see
// docs/cluster.md, "tandem's policy").
//
// Every round, each active job j and GPU count n gets a value
//   U_j(n) = w_j * f(S_j(nodes, n) * keep_j)
// where S_j is the job's speedup on the nodes the placement would use: goodput relative to one
// GPU with the batch size chosen for the allocation (adaptive mode), or for a job planned by
// tandem's planner its planned throughput (JobView::planned_throughput) in GPU-equivalents.
// f(x) = -(x + 1e-3)^p for p < 0 (p = -1: Pollux's harmonic mean), log for p = 0, x^p for
// p > 0. w_j = S_j at the fair share (as Pollux normalises) x (1 + attained GPU-seconds /
// scale)^-e (e = 0 by default: e > 0 favours jobs with little service). keep_j discounts a
// change of a running job by its cost: Pollux's max(age - restarts x grow cost, 0) /
// (age + cost), or H / (H + cost) over a horizon H (the age, at least min_horizon_seconds).
// Three ways to hold n GPUs are valued: keep the current placement (n unchanged, no cost),
// shrink onto GPUs the job already holds (fewest nodes; the shrink cost), or a fresh packed
// placement on ceil(n / GPUs per node) nodes (the grow cost; none from no GPUs, where every n
// pays the same start).
//
// The counts maximise sum_j U_j(n_j) subject to sum_j n_j <= the cluster's GPUs, exactly, by
// dynamic programming over jobs and GPUs (a multiple-choice knapsack; O(GPUs x the sum of the
// jobs' largest counts)), so non-concave speedups (a drop when a job crosses a node) and the
// step of a reallocation cost need no heuristics. Past a size limit (thousands of jobs on
// thousands of GPUs) the counts come from each job's upper concave hull of U_j instead, its
// segments taken steepest first (exact for concave values; O(L log L) for rows of total length
// L). Placement: kept jobs first, then shrinks onto their own nodes, then fresh placements
// largest first, each on whole free nodes and the best-fitting partial node; then a repair: a
// kept or shrunk job is moved too when that lets a fresh one pack and raises the total value as
// the jobs would actually run (with many jobs, only a few next to a fresh job that was spread).
//
// Heterogeneous clusters (several device types): a job's speedup on a placement is multiplied
// by its throughput factor on the slowest type it uses (JobView::device_throughput, as the
// simulator runs it). A fresh placement of n GPUs is valued on the fastest type for the job
// that has n GPUs at all; placed, fresh jobs go in order of how much they lose off their best
// type (best factor over worst), each onto the fastest type with room for its whole gang, and
// only when no type has room across types. With one type nothing of this changes a decision.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "cluster/policies.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

// How a job gets its GPUs: as it holds them, a part of them, all of them and more (a live
// grow), or placed afresh.
enum class Variant { kNone, kKeep, kShrink, kGrow, kFresh };

struct Choice {
  double value = 0;
  Variant variant = Variant::kNone;
};

// Nodes (most GPUs first) that hold `gpus` of the job's current GPUs, as {node, count}.
std::vector<std::pair<int, int>> ShrinkNodes(const Allocation& current, int gpus) {
  std::map<int, int> held;
  for (int node : current) ++held[node];
  std::vector<std::pair<int, int>> nodes(held.begin(), held.end());
  std::stable_sort(nodes.begin(), nodes.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::pair<int, int>> taken;
  for (const auto& [node, count] : nodes) {
    if (gpus <= 0) break;
    const int take = std::min(count, gpus);
    taken.emplace_back(node, take);
    gpus -= take;
  }
  return taken;
}

int DistinctNodes(const Allocation& allocation) {
  std::vector<int> nodes = allocation;
  std::sort(nodes.begin(), nodes.end());
  return static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
}

// The dynamic programme's size limits: table cells (jobs x (GPUs + 1)) and steps (the sum of
// the rows' lengths x (GPUs + 1)). 40 jobs on 64 GPUs take 0.2 M steps; 1,000 jobs on 1,024
// GPUs would take 30 M (about 1 s), 10,000 on 8,192 GPUs 80 M cells (1 GB) and 10^9 steps.
constexpr double kExactMaxCells = 1e6;
constexpr double kExactMaxSteps = 4e6;
// With more jobs than this the repair tries at most kLargeRepairTries kept or shrunk jobs, those
// next to a fresh job that was spread (with fewer, every kept or shrunk job is tried).
constexpr size_t kFullRepairMaxJobs = 256;
constexpr size_t kLargeRepairTries = 16;

bool ExactIsSmall(const std::vector<std::vector<Choice>>& choices, int capacity) {
  double steps = 0;
  for (const std::vector<Choice>& row : choices) steps += static_cast<double>(row.size());
  steps *= capacity + 1.0;
  const double cells = static_cast<double>(choices.size()) * (capacity + 1.0);
  return cells <= kExactMaxCells && steps <= kExactMaxSteps;
}

// The counts maximising sum_j choices[j][n_j].value with sum_j n_j <= capacity, exactly: a
// multiple-choice knapsack by dynamic programming over jobs and GPUs (best[j][g]: the best total
// of jobs [0, j) on g GPUs).
std::vector<int> ExactCounts(const std::vector<std::vector<Choice>>& choices, int capacity) {
  const size_t n_jobs = choices.size();
  const double kMinus = -std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(n_jobs + 1, std::vector<double>(capacity + 1, kMinus));
  std::vector<std::vector<int>> pick(n_jobs + 1, std::vector<int>(capacity + 1, 0));
  std::fill(best[0].begin(), best[0].end(), 0.0);
  for (size_t j = 0; j < n_jobs; ++j) {
    const std::vector<Choice>& row = choices[j];
    for (int g = 0; g <= capacity; ++g) {
      for (int n = 0; n < static_cast<int>(row.size()) && n <= g; ++n) {
        if (best[j][g - n] == kMinus || row[n].value == kMinus) continue;
        const double total = best[j][g - n] + row[n].value;
        if (total > best[j + 1][g]) {
          best[j + 1][g] = total;
          pick[j + 1][g] = n;
        }
      }
    }
  }
  std::vector<int> counts(n_jobs, 0);
  int g = capacity;
  for (size_t j = n_jobs; j > 0; --j) {
    counts[j - 1] = pick[j][g];
    g -= counts[j - 1];
  }
  return counts;
}

// The same problem for large clusters, in O(L log L) for rows of total length L: each job's
// values are replaced by their upper concave hull from 0 GPUs, and the hulls' segments are
// taken steepest first while they fit (a job's segments in order: a segment that does not fit
// ends that job's growth); GPUs left over then go, job by job, to the best count within reach.
// Exact for concave values and when the GPUs are not all wanted; otherwise short of the optimum
// by at most about one segment's value per job whose growth the capacity ended.
std::vector<int> HullCounts(const std::vector<std::vector<Choice>>& choices, int capacity) {
  struct Segment {
    double slope;
    int job;
    int from;
    int to;
  };
  std::vector<Segment> segments;
  std::vector<int> hull;
  for (size_t j = 0; j < choices.size(); ++j) {
    const std::vector<Choice>& row = choices[j];
    hull.clear();
    for (int n = 0; n < static_cast<int>(row.size()); ++n) {
      if (!std::isfinite(row[n].value)) continue;
      // Pop points on or below the chord from the one before them to n.
      while (hull.size() >= 2) {
        const int a = hull[hull.size() - 2], b = hull.back();
        const double cross = (row[b].value - row[a].value) * (n - a) -
                             (row[n].value - row[a].value) * (b - a);
        if (cross > 0) break;
        hull.pop_back();
      }
      hull.push_back(n);
    }
    for (size_t k = 1; k < hull.size(); ++k) {
      const int from = hull[k - 1], to = hull[k];
      const double slope = (row[to].value - row[from].value) / (to - from);
      if (!(slope > 0)) break;  // the hull only falls from here
      segments.push_back({slope, static_cast<int>(j), from, to});
    }
  }
  std::stable_sort(segments.begin(), segments.end(),
                   [](const Segment& a, const Segment& b) { return a.slope > b.slope; });
  std::vector<int> counts(choices.size(), 0);
  std::vector<bool> ended(choices.size(), false);
  int left = capacity;
  for (const Segment& segment : segments) {
    if (ended[segment.job] || counts[segment.job] != segment.from) continue;
    if (segment.to - segment.from <= left) {
      left -= segment.to - segment.from;
      counts[segment.job] = segment.to;
    } else {
      ended[segment.job] = true;
    }
  }
  for (size_t j = 0; j < choices.size() && left > 0; ++j) {
    const std::vector<Choice>& row = choices[j];
    int chosen = counts[j];
    const int most = std::min(static_cast<int>(row.size()) - 1, counts[j] + left);
    for (int n = counts[j] + 1; n <= most; ++n) {
      if (row[n].value > row[chosen].value) chosen = n;
    }
    left -= chosen - counts[j];
    counts[j] = chosen;
  }
  return counts;
}

// One job as a round values it.
struct JobContext {
  const JobView* job = nullptr;
  Allocation now;  // current allocation (empty: none)
  double weight = 1;
  double horizon_seconds = 0;
  // Planned jobs: samples/s per GPU at the fewest GPUs the plan runs on, so that the planned
  // throughput divided by it is a speedup like the others' (GPU-equivalents).
  double planned_reference = 0;
  // Heterogeneous clusters: the device types by the job's factor, fastest first, and how much
  // it loses off its best type (best factor / worst). Empty, 1: one type.
  std::vector<std::pair<double, std::string>> types;
  double type_advantage = 1;
};

// The device types of a cluster and their GPUs (one entry: homogeneous).
std::map<std::string, int> TypeGpus(const ClusterView& cluster) {
  std::map<std::string, int> gpus;
  for (const NodeView& node : cluster.nodes) gpus[node.device_type] += node.gpus;
  return gpus;
}

double TypeFactor(const JobView& job, const std::string& type) {
  auto found = job.device_throughput.find(type);
  return found == job.device_throughput.end() ? 1.0 : found->second;
}

class TandemPolicy : public Policy {
 public:
  TandemPolicy(std::string name, TandemOptions options)
      : name_(std::move(name)), options_(options) {}

  std::string name() const override { return name_; }
  BatchSizeMode batch_size_mode() const override { return BatchSizeMode::kAdaptive; }
  std::optional<ReallocationCosts> reallocation_costs() const override {
    if (options_.declare_costs) return options_.costs;
    return std::nullopt;
  }

  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations& current,
                                       double /*now_seconds*/) override {
    const int capacity = cluster.total_gpus();
    const int per_node = std::max(1, cluster.max_gpus_per_node());
    const size_t n_jobs = jobs.size();
    const std::map<std::string, int> type_gpus = TypeGpus(cluster);
    const bool heterogeneous = type_gpus.size() > 1;
    std::vector<JobContext> contexts(n_jobs);
    // choices[j][n]: the best way for job j to hold n GPUs.
    std::vector<std::vector<Choice>> choices(n_jobs);
    for (size_t j = 0; j < n_jobs; ++j) {
      const JobView& job = jobs[j];
      JobContext& context = contexts[j];
      context.job = &job;
      auto found = current.find(job.name);
      if (found != current.end()) context.now = found->second;
      context.weight =
          std::pow(1.0 + job.attained_service_gpu_seconds / options_.service_scale_gpu_seconds,
                   -options_.service_exponent);
      context.horizon_seconds = std::max(job.age_seconds, options_.min_horizon_seconds);
      if (job.planned_throughput) {
        const int fewest = std::max(1, job.min_replicas);
        context.planned_reference =
            job.planned_throughput((fewest + per_node - 1) / per_node, fewest) / fewest;
      }
      if (heterogeneous) {
        for (const auto& [type, gpus] : type_gpus) {
          context.types.emplace_back(TypeFactor(job, type), type);
        }
        std::stable_sort(context.types.begin(), context.types.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        if (context.types.back().first > 0) {
          context.type_advantage = context.types.front().first / context.types.back().first;
        }
      }
      // The factor of a fresh placement of n GPUs: the fastest type that has n GPUs, else the
      // slowest (the gang spans types).
      auto fresh_factor = [&](int n) {
        if (!heterogeneous) return 1.0;
        for (const auto& [factor, type] : context.types) {
          if (type_gpus.at(type) >= n) return factor;
        }
        return context.types.back().first;
      };
      if (options_.normalise_to_fair_share) {
        const int fair = std::max(1, capacity / static_cast<int>(n_jobs));
        const double at_fair = Speedup(context, (fair + per_node - 1) / per_node, fair);
        if (at_fair > 0) context.weight *= at_fair;
      }
      const int held = static_cast<int>(context.now.size());
      const int most = std::clamp(std::max(job.max_replicas, held), 0, capacity);
      std::vector<Choice>& row = choices[j];
      row.assign(most + 1, Choice{});
      row[0] = {context.weight * Utility(0), Variant::kNone};
      for (int n = 1; n <= most; ++n) {
        if (n < job.min_replicas || (n > job.max_replicas && n != held)) {
          row[n] = {-std::numeric_limits<double>::infinity(), Variant::kNone};
          continue;
        }
        const double fresh_cost = held == 0 ? 0 : options_.costs.move_seconds;
        Choice best{Value(context, (n + per_node - 1) / per_node, n, fresh_cost, fresh_factor(n)),
                    Variant::kFresh};
        const double held_factor = heterogeneous ? FactorOf(context, cluster, context.now) : 1;
        if (n == held) {
          const double keep = Value(context, DistinctNodes(context.now), n, 0, held_factor);
          if (keep >= best.value) best = {keep, Variant::kKeep};
        } else if (n < held && options_.costs.shrink_seconds <= options_.costs.move_seconds) {
          const std::vector<std::pair<int, int>> kept = ShrinkNodes(context.now, n);
          double factor = 1;
          if (heterogeneous) {
            Allocation nodes;
            for (const auto& [node, count] : kept) nodes.push_back(node);
            factor = FactorOf(context, cluster, nodes);
          }
          const double shrink = Value(context, static_cast<int>(kept.size()), n,
                                      options_.costs.shrink_seconds, factor);
          if (shrink >= best.value) best = {shrink, Variant::kShrink};
        } else if (n > held && held > 0 &&
                   options_.costs.grow_seconds < options_.costs.move_seconds) {
          // Keeping what it holds: at least its nodes now, and as many as n GPUs need.
          const int nodes = std::max(DistinctNodes(context.now), (n + per_node - 1) / per_node);
          const double grow = Value(context, nodes, n, options_.costs.grow_seconds, held_factor);
          if (grow > best.value) best = {grow, Variant::kGrow};
        }
        row[n] = best;
      }
    }
    // The counts: exact while the dynamic programme is small, else from the jobs' concave hulls.
    const bool exact = ExactIsSmall(choices, capacity);
    const std::vector<int> counts =
        exact ? ExactCounts(choices, capacity) : HullCounts(choices, capacity);
    std::vector<Variant> variants(n_jobs, Variant::kNone);
    for (size_t j = 0; j < n_jobs; ++j) variants[j] = choices[j][counts[j]].variant;
    // Placement, then a repair for fragmentation: a kept or shrunk job whose GPUs keep a
    // fresh job from being packed is moved too when that raises the total value.
    TANDEM_ASSIGN_OR_RETURN(Allocations placed, Place(contexts, cluster, counts, variants));
    double placed_value = TotalValue(contexts, cluster, placed);
    const bool full_repair = n_jobs <= kFullRepairMaxJobs;
    for (size_t j : RepairCandidates(contexts, cluster, counts, variants, placed, full_repair)) {
      std::vector<Variant> tried = variants;
      tried[j] = Variant::kFresh;
      absl::StatusOr<Allocations> other = Place(contexts, cluster, counts, tried);
      if (!other.ok()) continue;
      const double other_value = TotalValue(contexts, cluster, *other);
      if (other_value > placed_value + 1e-12 * std::abs(placed_value)) {
        variants = std::move(tried);
        placed = std::move(*other);
        placed_value = other_value;
      }
    }
    return placed;
  }

 private:
  double Utility(double speedup) const {
    constexpr double kFloor = 1e-3;
    const double p = options_.fairness_power;
    if (p < 0) return -std::pow(speedup + kFloor, p);
    if (p == 0) return std::log(speedup + kFloor);
    return std::pow(speedup, p);
  }

  // The job's speedup: from its plan when it has one, else the simulator's (goodput model).
  static double Speedup(const JobContext& context, int nodes, int gpus) {
    if (gpus <= 0 || nodes <= 0) return 0;
    const JobView& job = *context.job;
    double speedup = gpus;
    if (job.planned_throughput) {
      speedup = context.planned_reference > 0
                    ? job.planned_throughput(nodes, gpus) / context.planned_reference
                    : 0;
    } else if (job.speedup) {
      speedup = job.speedup(nodes, gpus);
    }
    return std::isfinite(speedup) && speedup > 0 ? speedup : 0;
  }

  // The job's factor on `allocation`: its slowest device type there (1 on one type).
  static double FactorOf(const JobContext& context, const ClusterView& cluster,
                         const Allocation& allocation) {
    if (context.types.empty() || allocation.empty()) return 1;
    double factor = std::numeric_limits<double>::infinity();
    for (int node : allocation) {
      factor = std::min(factor, TypeFactor(*context.job, cluster.nodes[node].device_type));
    }
    return factor;
  }

  // U_j for `gpus` GPUs on `nodes` nodes after a change costing `cost_seconds`, at `factor`
  // of the speed (the device type).
  double Value(const JobContext& context, int nodes, int gpus, double cost_seconds,
               double factor = 1) const {
    const double speedup = Speedup(context, nodes, gpus) * factor;
    const double horizon = context.horizon_seconds;
    double keep = horizon / (horizon + cost_seconds);
    if (options_.restart_history && cost_seconds > 0) {
      // Pollux's penalty: the share of the job's life not spent in its past restarts.
      const JobView& job = *context.job;
      keep = std::max(job.age_seconds - job.restarts * options_.costs.move_seconds, 0.0) /
             (job.age_seconds + cost_seconds);
    }
    return context.weight * Utility(speedup * keep);
  }

  // The kept and shrunk jobs the repair tries moving: every one (in job order) when `all`;
  // else those holding GPUs on a node that a fresh job spread over more nodes than it needs
  // uses, at most kLargeRepairTries of them.
  std::vector<size_t> RepairCandidates(const std::vector<JobContext>& contexts,
                                       const ClusterView& cluster,
                                       const std::vector<int>& counts,
                                       const std::vector<Variant>& variants,
                                       const Allocations& placed, bool all) const {
    std::vector<size_t> candidates;
    auto movable = [&](size_t j) {
      return variants[j] == Variant::kKeep || variants[j] == Variant::kShrink ||
             variants[j] == Variant::kGrow;
    };
    if (all) {
      for (size_t j = 0; j < contexts.size(); ++j) {
        if (movable(j)) candidates.push_back(j);
      }
      return candidates;
    }
    const int per_node = std::max(1, cluster.max_gpus_per_node());
    std::vector<bool> contested(cluster.nodes.size(), false);
    bool any = false;
    for (size_t j = 0; j < contexts.size(); ++j) {
      if (variants[j] != Variant::kFresh || counts[j] == 0) continue;
      auto found = placed.find(contexts[j].job->name);
      if (found == placed.end()) continue;
      if (DistinctNodes(found->second) <= (counts[j] + per_node - 1) / per_node) continue;
      for (int node : found->second) contested[node] = true;
      any = true;
    }
    if (!any) return candidates;
    for (size_t j = 0; j < contexts.size() && candidates.size() < kLargeRepairTries; ++j) {
      if (!movable(j)) continue;
      auto found = placed.find(contexts[j].job->name);
      if (found == placed.end()) continue;
      for (int node : found->second) {
        if (contested[node]) {
          candidates.push_back(j);
          break;
        }
      }
    }
    return candidates;
  }

  // The value of placed allocations as the jobs would run them (actual nodes, types, costs).
  double TotalValue(const std::vector<JobContext>& contexts, const ClusterView& cluster,
                    const Allocations& placed) const {
    double total = 0;
    for (const JobContext& context : contexts) {
      auto found = placed.find(context.job->name);
      if (found == placed.end()) {
        total += Value(context, 0, 0, 0);
        continue;
      }
      const Allocation& after = found->second;
      const double cost = context.now.empty() ? 0 : options_.costs.Seconds(context.now, after);
      total += Value(context, DistinctNodes(after), static_cast<int>(after.size()), cost,
                     FactorOf(context, cluster, after));
    }
    return total;
  }

  absl::StatusOr<Allocations> Place(const std::vector<JobContext>& contexts,
                                    const ClusterView& cluster, const std::vector<int>& counts,
                                    const std::vector<Variant>& variants) const {
    Allocations allocations;
    std::vector<int> free(cluster.nodes.size());
    for (size_t i = 0; i < free.size(); ++i) free[i] = cluster.nodes[i].gpus;
    std::vector<size_t> fresh, grown;
    // Kept placements and shrinks first: they only use GPUs their job holds now.
    for (size_t j = 0; j < contexts.size(); ++j) {
      if (counts[j] == 0) continue;
      const std::string& name = contexts[j].job->name;
      if (variants[j] == Variant::kKeep) {
        allocations[name] = contexts[j].now;
      } else if (variants[j] == Variant::kShrink) {
        Allocation& allocation = allocations[name];
        for (const auto& [node, count] : ShrinkNodes(contexts[j].now, counts[j])) {
          allocation.insert(allocation.end(), count, node);
        }
      } else if (variants[j] == Variant::kGrow) {
        allocations[name] = contexts[j].now;  // extended below
        grown.push_back(j);
      } else {
        fresh.push_back(j);
        continue;
      }
      for (int node : allocations[name]) --free[node];
    }
    // Live grows next: what the job holds, more GPUs on its nodes while they have free ones,
    // then as a fresh job takes them.
    for (size_t j : grown) {
      Allocation allocation = contexts[j].now;
      int left = counts[j] - static_cast<int>(allocation.size());
      for (const auto& [node, count] : ShrinkNodes(contexts[j].now, counts[j])) {
        const int take = std::min(free[node], left);
        allocation.insert(allocation.end(), take, node);
        free[node] -= take;
        left -= take;
      }
      // The rest on the job's own type where it has room (a gang runs at its slowest type).
      const std::string& own = cluster.nodes[allocation.front()].device_type;
      const bool room = FreeOfType(cluster, free, &own) >= left;
      TANDEM_RETURN_IF_ERROR(TakeFree(cluster, contexts[j].job->name, left, free, allocation,
                                      room ? &own : nullptr));
      std::sort(allocation.begin(), allocation.end());
      allocations[contexts[j].job->name] = std::move(allocation);
    }
    // Largest first; on several device types, those that lose most off their best type first.
    std::stable_sort(fresh.begin(), fresh.end(), [&](size_t a, size_t b) {
      if (contexts[a].type_advantage != contexts[b].type_advantage) {
        return contexts[a].type_advantage > contexts[b].type_advantage;
      }
      return counts[a] > counts[b];
    });
    for (size_t j : fresh) {
      Allocation allocation;
      // The fastest type with room for the whole gang; across types only when none has.
      const std::string* type = nullptr;
      for (const auto& [factor, name] : contexts[j].types) {
        if (FreeOfType(cluster, free, &name) >= counts[j]) {
          type = &name;
          break;
        }
      }
      TANDEM_RETURN_IF_ERROR(
          TakeFree(cluster, contexts[j].job->name, counts[j], free, allocation, type));
      allocations[contexts[j].job->name] = std::move(allocation);
    }
    return allocations;
  }

  // Free GPUs on nodes of `type` (nullptr: every node).
  static int FreeOfType(const ClusterView& cluster, const std::vector<int>& free,
                        const std::string* type) {
    int total = 0;
    for (size_t i = 0; i < free.size(); ++i) {
      if (type == nullptr || cluster.nodes[i].device_type == *type) total += free[i];
    }
    return total;
  }

  // `left` free GPUs added to `allocation`, on nodes of `type` (nullptr: any node).
  static absl::Status TakeFree(const ClusterView& cluster, const std::string& job, int left,
                               std::vector<int>& free, Allocation& allocation,
                               const std::string* type = nullptr) {
    // Nodes of another type look full.
    std::vector<int> usable = free;
    if (type != nullptr) {
      for (size_t i = 0; i < usable.size(); ++i) {
        if (cluster.nodes[i].device_type != *type) usable[i] = 0;
      }
    }
    while (left > 0) {
      // Whole free nodes while the job needs at least a node; then the node that fits the rest
      // most tightly; the node with most free GPUs when none fits.
      int chosen = -1;
      for (size_t i = 0; i < usable.size() && chosen < 0; ++i) {
        if (usable[i] > 0 && usable[i] == cluster.nodes[i].gpus && usable[i] <= left) {
          chosen = static_cast<int>(i);
        }
      }
      if (chosen < 0) {
        for (size_t i = 0; i < usable.size(); ++i) {
          if (usable[i] >= left && (chosen < 0 || usable[i] < usable[chosen])) {
            chosen = static_cast<int>(i);
          }
        }
      }
      if (chosen < 0) {
        for (size_t i = 0; i < usable.size(); ++i) {
          if (usable[i] > 0 && (chosen < 0 || usable[i] > usable[chosen])) {
            chosen = static_cast<int>(i);
          }
        }
      }
      if (chosen < 0) {
        return absl::InternalError(
            absl::StrCat("tandem: no free GPU left for job ", job, " (", left, " more)"));
      }
      const int take = std::min(usable[chosen], left);
      allocation.insert(allocation.end(), take, chosen);
      usable[chosen] -= take;
      free[chosen] -= take;
      left -= take;
    }
    return absl::OkStatus();
  }

  std::string name_;
  TandemOptions options_;
};

}  // namespace

TandemOptions TandemElasticOptions() {
  TandemOptions options;
  options.costs.shrink_seconds = 2;
  options.costs.grow_seconds = 2;
  options.declare_costs = true;
  return options;
}

std::unique_ptr<Policy> MakeTandemPolicy(const TandemOptions& options) {
  return std::make_unique<TandemPolicy>(options.declare_costs ? "tandem-elastic" : "tandem",
                                        options);
}

}  // namespace tandem::cluster
