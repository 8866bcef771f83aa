// First come, first served with gang allocation: jobs start in submission order with their
// requested GPUs and keep them to the end; the first job that does not fit blocks the ones
// behind it.
#include <algorithm>
#include <numeric>

#include "cluster/policies.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

// `gpus` GPUs on the fewest nodes: the fullest node that still fits them all (best fit), else
// nodes in order of most free GPUs.
absl::StatusOr<Allocation> PackFewestNodes(int gpus, std::vector<int>* free) {
  int best = -1;
  for (size_t i = 0; i < free->size(); ++i) {
    if ((*free)[i] >= gpus && (best < 0 || (*free)[i] < (*free)[best])) best = static_cast<int>(i);
  }
  if (best >= 0) {
    (*free)[best] -= gpus;
    return Allocation(gpus, best);
  }
  return TakeFromMostFree(gpus, free);
}

class FifoPolicy : public Policy {
 public:
  std::string name() const override { return "fifo"; }
  BatchSizeMode batch_size_mode() const override {
    return BatchSizeMode::kFixedReplicasAndBatch;
  }

  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations& current,
                                       double /*now_seconds*/) override {
    std::vector<size_t> order(jobs.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return jobs[a].submission_seconds < jobs[b].submission_seconds;
    });
    Allocations next;
    for (const JobView& job : jobs) {
      auto found = current.find(job.name);
      if (found != current.end() && !found->second.empty()) next[job.name] = found->second;
    }
    std::vector<int> free = FreeGpus(cluster, next);
    int free_total = 0;
    for (int f : free) free_total += f;
    for (size_t index : order) {
      const JobView& job = jobs[index];
      if (next.count(job.name) > 0) continue;
      const int gpus = std::max(1, job.requested_replicas);
      if (gpus > free_total) break;  // head of the line waits; nobody overtakes it
      TANDEM_ASSIGN_OR_RETURN(next[job.name], PackFewestNodes(gpus, &free));
      free_total -= gpus;
    }
    return next;
  }
};

}  // namespace

std::unique_ptr<Policy> MakeFifoPolicy() { return std::make_unique<FifoPolicy>(); }

}  // namespace tandem::cluster
