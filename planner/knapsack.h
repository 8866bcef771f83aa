// The selection problem inside the Piper and AdaPipe planners: every item (layer) runs in its
// fast configuration unless switched to a lean one (e.g. with activation recomputation) that
// costs `extra_cost` more time and saves `saving` bytes. Choose the cheapest set of switches
// whose savings reach `need` bytes.
//
// Two solvers:
//  * kExact: the optimum. Items with equal savings are interchangeable except for cost, so
//    they are grouped (the cheapest taken first); a branch and bound over the groups, bounded
//    by the best cost per byte, finds the optimum. `max_nodes` bounds the search on
//    adversarial inputs with many distinct savings; when it is hit, the best solution found
//    (never worse than the greedy one) is returned with `exact` false.
//  * kGreedy: Piper's fast heuristic (as in its reference implementation): switch items in
//    order of extra cost per byte saved until the need is met.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::planner {

enum class KnapsackMode { kExact, kGreedy };

struct SwitchOption {
  double extra_cost = 0;  // >= 0
  double saving = 0;      // only items with saving > 0 are considered
};

struct CoverResult {
  bool feasible = false;
  bool exact = true;
  double extra_cost = 0;
  std::vector<int> switched;  // indices of switched items (ascending), when asked for
};

// Holds scratch space so that repeated solves do not allocate. Not thread-safe.
class CoverSolver {
 public:
  explicit CoverSolver(KnapsackMode mode, int64_t max_nodes = 200000)
      : mode_(mode), max_nodes_(max_nodes) {}
  // `need` <= 0 is met by switching nothing.
  CoverResult Solve(const std::vector<SwitchOption>& items, double need, bool want_items);

 private:
  CoverResult SolveGreedy(const std::vector<SwitchOption>& items, double need, bool want_items);
  CoverResult SolveExact(const std::vector<SwitchOption>& items, double need, bool want_items);
  void Search(int group, double saved, double cost);

  struct Group {
    double saving = 0;
    std::vector<double> prefix_cost;  // prefix_cost[k] = cost of the k cheapest
    std::vector<int> items;           // item indices, cheapest first
  };

  KnapsackMode mode_;
  int64_t max_nodes_;
  std::vector<Group> groups_;
  std::vector<int> order_;
  std::vector<int> counts_, best_counts_;
  double need_ = 0, best_cost_ = 0;
  int64_t nodes_ = 0;
  bool truncated_ = false;
  bool improved_ = false;
};

}  // namespace tandem::planner
