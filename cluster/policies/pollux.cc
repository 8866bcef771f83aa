// Pollux (Qiao et al., OSDI'21) as its artifact simulates it (petuum/adaptdl, osdi21-artifact,
// simulator/pollux.py): every round a genetic search (cluster/pollux_search.h) chooses replicas
// per (job, node) to maximise a power mean (p = -1) of the jobs' speedups, penalising restarts;
// the simulator then picks each job's goodput-optimal batch size for its allocation
// (BatchSizeMode::kAdaptive).
//
// What the policy adds to the search, as the artifact's Problem does:
//   - jobs ordered by attained service, then submission (the repair keeps earlier jobs' GPUs);
//   - each job's speedup normalised to its goodput at the fair share, ceil(GPUs / jobs)
//     replicas on ceil(nodes / GPUs) nodes (one node here), instead of one GPU; a job not yet
//     profiled has the linear speedup replicas / fair replicas;
//   - the state turned into allocations: for each job, node indices in ascending order.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "cluster/policies.h"
#include "cluster/pollux_search.h"

namespace tandem::cluster {
namespace {

class PolluxPolicy : public Policy {
 public:
  explicit PolluxPolicy(const PolluxOptions& options)
      : options_(options), search_(options.search) {}

  std::string name() const override { return "pollux"; }
  BatchSizeMode batch_size_mode() const override { return BatchSizeMode::kAdaptive; }

  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations& current,
                                       double /*now_seconds*/) override {
    const int num_nodes = static_cast<int>(cluster.nodes.size());
    const int cluster_gpus = cluster.total_gpus();
    if (jobs.empty() || num_nodes == 0 || cluster_gpus == 0) return Allocations();

    // Pollux's order: least attained service first, then earliest submission (stable: the
    // caller's submission order breaks remaining ties).
    std::vector<size_t> order(jobs.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (jobs[a].attained_service_gpu_seconds != jobs[b].attained_service_gpu_seconds) {
        return jobs[a].attained_service_gpu_seconds < jobs[b].attained_service_gpu_seconds;
      }
      return jobs[a].submission_seconds < jobs[b].submission_seconds;
    });

    // The fair share of a job: one GPU is a dominant share of 1 / cluster GPUs.
    const int num_jobs = static_cast<int>(jobs.size());
    const int fair_replicas = (cluster_gpus + num_jobs - 1) / num_jobs;
    const int fair_nodes = std::max(1, (num_nodes + cluster_gpus - 1) / cluster_gpus);

    std::vector<std::string> ids;
    std::vector<PolluxJob> search_jobs;
    ids.reserve(jobs.size());
    search_jobs.reserve(jobs.size());
    for (size_t index : order) {
      const JobView& view = jobs[index];
      PolluxJob job;
      job.max_replicas = std::max(view.max_replicas, 0);
      job.min_replicas = std::max(view.min_replicas, 0);
      job.age_seconds = std::max(view.age_seconds, 0.0);
      job.num_restarts = view.restarts;
      job.preemptible = view.preemptible;
      job.current.assign(num_nodes, 0);
      if (auto found = current.find(view.name); found != current.end()) {
        for (int node : found->second) {
          if (node >= 0 && node < num_nodes) ++job.current[node];
        }
      }
      job.speedup = NormalisedSpeedup(view.speedup, fair_nodes, fair_replicas);
      ids.push_back(view.name);
      search_jobs.push_back(std::move(job));
    }
    std::vector<int> gpus_per_node(num_nodes);
    for (int n = 0; n < num_nodes; ++n) gpus_per_node[n] = cluster.nodes[n].gpus;

    absl::StatusOr<std::vector<std::vector<int>>> state =
        search_.Optimize(ids, search_jobs, gpus_per_node);
    if (!state.ok()) return state.status();

    Allocations allocations;
    for (size_t j = 0; j < ids.size(); ++j) {
      Allocation allocation;
      for (int n = 0; n < num_nodes; ++n) allocation.insert(allocation.end(), (*state)[j][n], n);
      if (!allocation.empty()) allocations[ids[j]] = std::move(allocation);
    }
    return allocations;
  }

 private:
  // speedup(nodes, replicas) / speedup(fair nodes, fair replicas): goodput relative to the fair
  // share, as the artifact sets it. Where the fair share has no goodput (a batch-size range it
  // cannot run; the artifact would divide by zero) or normalisation is off, the speedup
  // relative to one GPU is kept.
  std::function<double(int, int)> NormalisedSpeedup(const std::function<double(int, int)>& speedup,
                                                    int fair_nodes, int fair_replicas) const {
    if (!speedup) return [](int, int replicas) { return static_cast<double>(replicas); };
    if (!options_.normalise_to_fair_share) return speedup;
    const double base = speedup(std::min(fair_nodes, fair_replicas), fair_replicas);
    if (!(base > 0) || !std::isfinite(base)) return speedup;
    return [speedup, base](int nodes, int replicas) { return speedup(nodes, replicas) / base; };
  }

  PolluxOptions options_;
  PolluxSearch search_;
};

}  // namespace

std::unique_ptr<Policy> MakePolluxPolicy(const PolluxOptions& options) {
  return std::make_unique<PolluxPolicy>(options);
}

}  // namespace tandem::cluster
