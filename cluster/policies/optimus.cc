// Optimus (Peng et al., EuroSys'18) with an oracle for job progress, as Pollux's artifact
// simulates it (simulator/optimus.py): every job that fits gets one GPU; then GPUs go one at a
// time to the job whose remaining time, remaining iterations x seconds per iteration, drops the
// most from one more GPU (up to its max_replicas). A job keeps its placement when its GPU
// count is unchanged; new placements fill from the nodes with the most free GPUs, smallest
// jobs first.
#include <algorithm>
#include <numeric>

#include "cluster/policies.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

class OptimusPolicy : public Policy {
 public:
  std::string name() const override { return "optimus"; }
  BatchSizeMode batch_size_mode() const override { return BatchSizeMode::kFixedBatch; }

  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations& current,
                                       double /*now_seconds*/) override {
    const size_t n = jobs.size();
    std::vector<int> replicas(n, 0);
    std::vector<double> gain(n, 0.0);
    int free_gpus = cluster.total_gpus();
    auto marginal_gain = [&](size_t i) {
      const JobView& job = jobs[i];
      if (replicas[i] + 1 > job.max_replicas || free_gpus < 1 || !job.iteration_seconds) {
        return 0.0;
      }
      return (job.iteration_seconds(replicas[i]) - job.iteration_seconds(replicas[i] + 1)) *
             job.remaining_iterations;
    };
    // Every job starts with one GPU while there are GPUs (submission order).
    for (size_t i = 0; i < n; ++i) {
      if (free_gpus < 1) continue;
      replicas[i] = 1;
      --free_gpus;
      gain[i] = marginal_gain(i);
    }
    // Then the largest marginal gain, first job on ties.
    while (free_gpus > 0 && n > 0) {
      const size_t best = std::max_element(gain.begin(), gain.end()) - gain.begin();
      if (!(gain[best] > 0)) break;
      ++replicas[best];
      gain[best] = marginal_gain(best);
      --free_gpus;
    }
    // Placements: keep those whose size is unchanged, place the rest smallest first.
    Allocations allocations;
    for (size_t i = 0; i < n; ++i) {
      auto found = current.find(jobs[i].name);
      if (found != current.end() && static_cast<int>(found->second.size()) == replicas[i] &&
          replicas[i] > 0) {
        allocations[jobs[i].name] = found->second;
      }
    }
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return replicas[a] < replicas[b]; });
    std::vector<int> free = FreeGpus(cluster, allocations);
    for (size_t i : order) {
      if (replicas[i] == 0 || allocations.count(jobs[i].name) > 0) continue;
      TANDEM_ASSIGN_OR_RETURN(allocations[jobs[i].name], TakeFromMostFree(replicas[i], &free));
    }
    return allocations;
  }
};

}  // namespace

std::unique_ptr<Policy> MakeOptimusPolicy() { return std::make_unique<OptimusPolicy>(); }

}  // namespace tandem::cluster
