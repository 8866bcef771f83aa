// Tiresias's discretised two-dimensional least-attained-service (2D-LAS) scheduler, following
// the policy Pollux's artifact simulates (simulator/tiresias.py): jobs enter the first queue;
// a job whose executed time x requested GPUs reaches a queue's threshold moves to the back of
// the next queue; queues are served in order, each first come first served, and a job runs
// with its whole gang or not at all (a job that does not fit is skipped, not waited for);
// running jobs that no longer fit are preempted. New gangs are placed from the nodes with the
// most free GPUs. Time is counted in whole seconds, as the artifact does.
#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "cluster/policies.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

class TiresiasPolicy : public Policy {
 public:
  explicit TiresiasPolicy(const TiresiasOptions& options)
      : options_(options), queues_(options.queue_thresholds_gpu_seconds.size() + 1) {}

  std::string name() const override { return "tiresias"; }
  BatchSizeMode batch_size_mode() const override {
    return BatchSizeMode::kFixedReplicasAndBatch;
  }

  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations& current,
                                       double now_seconds) override {
    const long long event_time = static_cast<long long>(now_seconds);
    absl::flat_hash_map<std::string, const JobView*> by_name;
    for (const JobView& job : jobs) by_name[job.name] = &job;
    // Forget finished jobs.
    for (auto& queue : queues_) {
      queue.erase(std::remove_if(queue.begin(), queue.end(),
                                 [&](const std::string& k) { return !by_name.contains(k); }),
                  queue.end());
    }
    for (auto it = state_.begin(); it != state_.end();) {
      if (by_name.contains(it->first)) {
        ++it;
      } else {
        state_.erase(it++);
      }
    }
    Allocations allocations;
    for (const auto& [name, allocation] : current) {
      if (by_name.contains(name)) allocations[name] = allocation;
    }
    // New jobs wait in the first queue.
    for (const JobView& job : jobs) {
      if (!state_.contains(job.name)) {
        state_[job.name] = JobState{};
        queues_[0].push_back(job.name);
      }
    }
    // Account executed and pending time; demote and (optionally) promote.
    for (const JobView& job : jobs) {
      JobState& s = state_[job.name];
      const long long elapsed = event_time - s.last_check;
      s.last_check = event_time;
      if (s.running) {
        s.total_executed += elapsed;
        s.executed += elapsed;
        const long long gpu_time = s.executed * job.max_replicas;
        const int q = QueueOf(job.name);
        if (q + 1 < static_cast<int>(queues_.size()) &&
            gpu_time >= options_.queue_thresholds_gpu_seconds[q]) {
          Move(job.name, q, q + 1);
        }
      } else {
        s.pending += elapsed;
        if (s.executed > 0) s.last_pending += elapsed;
        const int q = QueueOf(job.name);
        if (options_.starvation_factor > 0 && q != 0 && s.total_executed > 0 &&
            s.executed > 0 &&
            s.last_pending >= static_cast<long long>(s.executed * options_.starvation_factor)) {
          s.executed = 0;
          s.last_pending = 0;
          Move(job.name, q, 0);
        }
      }
    }
    // Who runs: queue order, whole gangs, skipping those that do not fit.
    int free_total = cluster.total_gpus();
    for (const auto& queue : queues_) {
      for (const std::string& name : queue) {
        const int gang = by_name[name]->max_replicas;
        JobState& s = state_[name];
        if (gang <= free_total) {
          s.running = true;
          free_total -= gang;
        } else {
          s.running = false;
          allocations.erase(name);
        }
      }
    }
    // Place the gangs that start now.
    std::vector<int> free = FreeGpus(cluster, allocations);
    for (const auto& queue : queues_) {
      for (const std::string& name : queue) {
        if (!state_[name].running) continue;
        auto found = allocations.find(name);
        if (found != allocations.end() && !found->second.empty()) continue;
        TANDEM_ASSIGN_OR_RETURN(allocations[name],
                                TakeFromMostFree(by_name[name]->max_replicas, &free));
      }
    }
    return allocations;
  }

 private:
  struct JobState {
    bool running = false;
    long long last_check = 0;
    long long total_executed = 0;
    long long executed = 0;  // since the last promotion: decides the queue
    long long pending = 0;
    long long last_pending = 0;
  };

  int QueueOf(const std::string& name) const {
    for (size_t q = 0; q < queues_.size(); ++q) {
      if (std::find(queues_[q].begin(), queues_[q].end(), name) != queues_[q].end()) {
        return static_cast<int>(q);
      }
    }
    return 0;
  }

  void Move(const std::string& name, int from, int to) {
    auto& source = queues_[from];
    source.erase(std::find(source.begin(), source.end(), name));
    queues_[to].push_back(name);
  }

  TiresiasOptions options_;
  std::vector<std::vector<std::string>> queues_;
  absl::flat_hash_map<std::string, JobState> state_;
};

}  // namespace

std::unique_ptr<Policy> MakeTiresiasPolicy(const TiresiasOptions& options) {
  return std::make_unique<TiresiasPolicy>(options);
}

}  // namespace tandem::cluster
