#include "planner/knapsack.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::planner {
namespace {

// Relative tolerance for "the need is met" and "these savings are equal".
constexpr double kTolerance = 1e-9;

}  // namespace

CoverResult CoverSolver::Solve(const std::vector<SwitchOption>& items, double need,
                               bool want_items) {
  CoverResult result;
  if (need <= 0) {
    result.feasible = true;
    return result;
  }
  double total_saving = 0;
  for (const SwitchOption& item : items) {
    if (item.saving > 0) total_saving += item.saving;
  }
  if (total_saving < need * (1 - kTolerance)) return result;  // infeasible
  return mode_ == KnapsackMode::kGreedy ? SolveGreedy(items, need, want_items)
                                        : SolveExact(items, need, want_items);
}

CoverResult CoverSolver::SolveGreedy(const std::vector<SwitchOption>& items, double need,
                                     bool want_items) {
  order_.clear();
  for (int i = 0; i < static_cast<int>(items.size()); ++i) {
    if (items[i].saving > 0) order_.push_back(i);
  }
  // Cheapest per byte first; ties by index, as Piper's sort of (ratio, index) tuples.
  std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) {
    return items[a].extra_cost / items[a].saving < items[b].extra_cost / items[b].saving;
  });
  CoverResult result;
  result.feasible = true;
  double left = need;
  for (int i : order_) {
    left -= items[i].saving;
    result.extra_cost += items[i].extra_cost;
    if (want_items) result.switched.push_back(i);
    if (left < kTolerance * need) break;
  }
  std::sort(result.switched.begin(), result.switched.end());
  return result;
}

CoverResult CoverSolver::SolveExact(const std::vector<SwitchOption>& items, double need,
                                    bool want_items) {
  order_.clear();
  for (int i = 0; i < static_cast<int>(items.size()); ++i) {
    if (items[i].saving > 0) order_.push_back(i);
  }
  std::sort(order_.begin(), order_.end(), [&](int a, int b) {
    if (items[a].saving != items[b].saving) return items[a].saving > items[b].saving;
    if (items[a].extra_cost != items[b].extra_cost) {
      return items[a].extra_cost < items[b].extra_cost;
    }
    return a < b;
  });
  groups_.clear();
  for (int i : order_) {
    const bool same = !groups_.empty() && std::fabs(groups_.back().saving - items[i].saving) <=
                                              kTolerance * items[i].saving;
    if (!same) {
      groups_.emplace_back();
      groups_.back().saving = items[i].saving;
      groups_.back().prefix_cost.push_back(0.0);
    }
    Group& g = groups_.back();
    g.items.push_back(i);
    g.prefix_cost.push_back(g.prefix_cost.back() + items[i].extra_cost);
  }
  // The group with the cheapest first byte first: good solutions early, tight bounds.
  std::sort(groups_.begin(), groups_.end(), [](const Group& a, const Group& b) {
    return a.prefix_cost[1] / a.saving < b.prefix_cost[1] / b.saving;
  });

  CoverResult greedy = SolveGreedy(items, need, want_items);
  best_cost_ = greedy.extra_cost;
  improved_ = false;
  counts_.assign(groups_.size(), 0);
  need_ = need;
  nodes_ = 0;
  truncated_ = false;
  Search(0, 0.0, 0.0);

  if (!improved_) {
    greedy.exact = !truncated_;
    return greedy;
  }
  CoverResult result;
  result.feasible = true;
  result.exact = !truncated_;
  result.extra_cost = best_cost_;
  if (want_items) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (int k = 0; k < best_counts_[g]; ++k) result.switched.push_back(groups_[g].items[k]);
    }
    std::sort(result.switched.begin(), result.switched.end());
  }
  return result;
}

void CoverSolver::Search(int group, double saved, double cost) {
  if (++nodes_ > max_nodes_) {
    truncated_ = true;
    return;
  }
  const double left = need_ - saved;
  if (left < kTolerance * need_) {
    if (cost < best_cost_ * (1 - 1e-12)) {
      best_cost_ = cost;
      best_counts_ = counts_;
      improved_ = true;
    }
    return;
  }
  if (group == static_cast<int>(groups_.size())) return;
  // Lower bound: every byte still needed at the best rate among the remaining groups.
  double best_rate = std::numeric_limits<double>::infinity();
  double remaining_saving = 0;
  for (size_t g = group; g < groups_.size(); ++g) {
    best_rate = std::min(best_rate, groups_[g].prefix_cost[1] / groups_[g].saving);
    remaining_saving += groups_[g].saving * static_cast<double>(groups_[g].items.size());
  }
  if (remaining_saving < left * (1 - kTolerance)) return;
  if (cost + left * best_rate >= best_cost_ * (1 - 1e-12)) return;

  const Group& g = groups_[group];
  const int available = static_cast<int>(g.items.size());
  // Taking more than enough of one group never helps (extra costs are non-negative).
  const int enough = static_cast<int>(
      std::min<double>(available, std::ceil(left * (1 - kTolerance) / g.saving)));
  for (int k = enough; k >= 0; --k) {
    counts_[group] = k;
    Search(group + 1, saved + k * g.saving, cost + g.prefix_cost[k]);
    if (truncated_) break;
  }
  counts_[group] = 0;
}

}  // namespace tandem::planner
