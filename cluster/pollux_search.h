// Pollux's allocation search: the optimiser inside the Pollux scheduling policy (Qiao et al.,
// OSDI 2021; petuum/adaptdl simulator/pollux.py), rewritten for tandem.
//
// A state is an integer matrix state[job][node] = replicas (GPUs) of the job on the node. Its
// value is a power mean over jobs of each job's speedup, scaled so that one node's worth of GPUs
// is worth 1, and multiplied by a restart penalty for jobs whose allocation changes:
//
//   scaled_j  = speedup_j(nodes_j, replicas_j) * (nodes / cluster_gpus) * penalty_j
//   penalty_j = max(age_j - restarts_j * delay, 0) / (age_j + delay)   if row j != current_j
//               1                                                      otherwise
//   value     = (sum_j (scaled_j + 1e-3)^p / jobs)^(1/p)   (p = -1: a harmonic mean, fair)
//               exp(sum_j log(max(scaled_j, 1e-3)) / jobs)  when p = 0
//
// Feasible states are the fixed points of Pollux's repair operator:
//   - a pinned job (not preemptible, with a current allocation) keeps its current row exactly;
//   - on each node, at most one distributed job (a job on more than one node) has replicas,
//     unless every distributed job there is pinned;
//   - a job has at most max_replicas replicas on at most max_nodes_per_job nodes;
//   - the replicas on a node never exceed its GPUs;
//   - a job runs with zero replicas or with at least min_replicas.
// When repair has to trim, jobs earlier in the list keep their replicas (pinned jobs first).
// Pollux orders jobs by attained service, then creation time; callers should do the same.
//
// The search is a genetic algorithm with Pollux's operators (single-point crossover over jobs;
// mutation that resets a job to its current row, zeroes elements, and grows elements on nodes
// with free GPUs; the repair above). By default it is NSGA-II over Pollux's two objectives (the
// value above and the cluster utility, which Pollux needs only for autoscaling) and returns the
// state with the best value, as Pollux does on a fixed cluster; PolluxSearchOptions can make it a
// single-objective search on the value alone.
#ifndef TANDEM_CLUSTER_POLLUX_SEARCH_H_
#define TANDEM_CLUSTER_POLLUX_SEARCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cluster {

// One job as the search sees it.
struct PolluxJob {
  // Relative goodput on `num_nodes` nodes with `num_replicas` replicas in all
  // (1 <= num_nodes <= num_replicas). Never called with zero replicas (the speedup is 0 there).
  // Must be finite and non-negative. Pollux normalises it to the goodput at the job's fair share.
  std::function<double(int num_nodes, int num_replicas)> speedup;
  int max_replicas = 0;
  int min_replicas = 0;
  double age_seconds = 0;  // time since submission, for the restart penalty
  int num_restarts = 0;
  std::vector<int> current;  // current replicas per node (size = number of nodes)
  bool preemptible = true;   // false with a current allocation: the job is pinned to it
};

struct PolluxSearchOptions {
  int population = 100;
  int generations = 100;
  double restart_delay_seconds = 30;
  double p = -1;  // power-mean exponent; more negative is fairer, 0 is the geometric mean
  uint64_t seed = 1;
  int max_nodes_per_job = 16;          // Pollux's repair caps a job at 16 nodes
  double crossover_probability = 0.9;  // pymoo's default
  // true: NSGA-II with Pollux's second objective, the cluster utility (sum of speedups over the
  // GPUs of the nodes in use), which only shapes the population; the answer is the best value.
  // false: a single-objective search on the value (truncation survival). Both find states of
  // about the same value (bench/cluster/pollux_search_bench.cc).
  bool utility_objective = true;
};

// The value of `state` (rows = jobs, columns = nodes) as defined above. Does not check
// feasibility. Returns NaN when the shapes disagree or a speedup is not finite and non-negative.
double PolluxObjective(const std::vector<PolluxJob>& jobs,
                       const std::vector<std::vector<int>>& state,
                       const std::vector<int>& gpus_per_node, const PolluxSearchOptions& options);

// Whether `state` satisfies the feasibility rules above.
bool IsFeasiblePolluxState(const std::vector<PolluxJob>& jobs,
                           const std::vector<std::vector<int>>& state,
                           const std::vector<int>& gpus_per_node,
                           const PolluxSearchOptions& options);

// The search. It keeps the last round's population and starts the next round from it (together
// with the current allocation), matching populations by job id and node id, as Pollux does.
// Deterministic: the same options and the same sequence of calls give the same results.
// Not thread-safe; one instance per scheduler.
class PolluxSearch {
 public:
  // What the last successful Optimize did.
  struct Stats {
    int generations = 0;
    int64_t evaluations = 0;  // states evaluated (after repair)
    int64_t speedup_calls = 0;
    double best_objective = 0;
  };

  explicit PolluxSearch(PolluxSearchOptions options = {});

  // Returns replicas per (job, node) for the best state found. Node ids are the node indices.
  // gpus_per_node: capacity of each node (at most 255). InvalidArgument on inconsistent input or
  // a speedup that is not finite and non-negative.
  absl::StatusOr<std::vector<std::vector<int>>> Optimize(const std::vector<std::string>& job_ids,
                                                         const std::vector<PolluxJob>& jobs,
                                                         const std::vector<int>& gpus_per_node);
  // As above, with explicit node ids (for clusters whose node set changes between rounds).
  absl::StatusOr<std::vector<std::vector<int>>> Optimize(const std::vector<std::string>& job_ids,
                                                         const std::vector<std::string>& node_ids,
                                                         const std::vector<PolluxJob>& jobs,
                                                         const std::vector<int>& gpus_per_node);

  // Forgets the kept population; the next round starts from the current allocation only.
  void Reset();

  const Stats& last_stats() const { return stats_; }
  const PolluxSearchOptions& options() const { return options_; }

 private:
  PolluxSearchOptions options_;
  uint64_t rng_state_[4];
  Stats stats_;
  // The last round's population, each a row-major jobs x nodes matrix.
  std::vector<std::vector<uint8_t>> previous_population_;
  std::vector<std::string> previous_job_ids_;
  std::vector<std::string> previous_node_ids_;
};

}  // namespace tandem::cluster

#endif  // TANDEM_CLUSTER_POLLUX_SEARCH_H_
