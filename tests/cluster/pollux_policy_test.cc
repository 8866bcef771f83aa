// The Pollux policy: its allocations against a brute-force optimum of the objective it documents
// (speedups normalised to the fair share, power mean, restart penalty), the shape of its
// allocations, restart avoidance, and determinism.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "cluster/policies.h"
#include "cluster/pollux_search.h"
#include "gtest/gtest.h"

namespace tandem::cluster {
namespace {

JobView Job(const std::string& name, int max_replicas, std::function<double(int, int)> speedup,
            double attained = 0, double submitted = 0) {
  JobView job;
  job.name = name;
  job.submission_seconds = submitted;
  job.age_seconds = 600 - submitted;
  job.attained_service_gpu_seconds = attained;
  job.max_replicas = max_replicas;
  job.speedup = std::move(speedup);
  return job;
}

double Linear(int nodes, int replicas) { return nodes > 0 ? replicas : 0.0; }

// Replicas per node of each job's allocation, in the order of `jobs`.
std::vector<std::vector<int>> StateOf(const Allocations& allocations,
                                      const std::vector<JobView>& jobs, int num_nodes) {
  std::vector<std::vector<int>> state(jobs.size(), std::vector<int>(num_nodes, 0));
  for (size_t j = 0; j < jobs.size(); ++j) {
    auto found = allocations.find(jobs[j].name);
    if (found == allocations.end()) continue;
    for (int node : found->second) ++state[j][node];
  }
  return state;
}

TEST(Pollux, RegisteredAndAdaptive) {
  auto policy = MakePolicy("pollux");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ((*policy)->name(), "pollux");
  EXPECT_EQ((*policy)->batch_size_mode(), BatchSizeMode::kAdaptive);
}

// Every state of a small cluster enumerated: the policy's answer is as good as the best feasible
// state under the documented objective, with speedups divided by their value at the fair share
// (ceil(GPUs / jobs) replicas on one node).
TEST(Pollux, MatchesTheBruteForceOptimumOfItsObjective) {
  const ClusterView cluster = ClusterView::Homogeneous(2, 2);
  const std::vector<int> gpus_per_node = {2, 2};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<JobView> jobs;
    for (int j = 0; j < 3; ++j) {
      const double network = 0.5 * unit(rng), scaling = 0.2 + 0.8 * unit(rng);
      auto speedup = [network, scaling](int nodes, int replicas) {
        if (replicas == 0) return 0.0;
        return (1 + scaling * (replicas - 1)) / (1 + (nodes > 1 ? network : 0.0));
      };
      // Attained service in reverse submission order: the policy must sort, not trust order.
      jobs.push_back(Job("job" + std::to_string(j), 1 + static_cast<int>(rng() % 4), speedup,
                         /*attained=*/100.0 * (3 - j), /*submitted=*/10.0 * j));
    }
    auto policy = MakePolluxPolicy();
    auto next = policy->Optimize(jobs, cluster, {}, 600);
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_TRUE(ValidateAllocations(*next, jobs, cluster, "pollux").ok());

    // The objective the policy documents, on every state.
    const int fair_replicas = 2;  // ceil(4 GPUs / 3 jobs)
    std::vector<PolluxJob> oracle_jobs;
    for (const JobView& view : jobs) {
      PolluxJob job;
      const double base = view.speedup(1, fair_replicas);
      job.speedup = [view, base](int n, int r) { return view.speedup(n, r) / base; };
      job.max_replicas = view.max_replicas;
      job.age_seconds = view.age_seconds;
      job.current = {0, 0};
      oracle_jobs.push_back(job);
    }
    PolluxSearchOptions options;
    double best = -1;
    std::vector<std::vector<int>> state(3, std::vector<int>(2));
    for (int code = 0; code < 729; ++code) {  // (3 x 3 values per job)^3 jobs
      int rest = code;
      for (int j = 0; j < 3; ++j) {
        for (int n = 0; n < 2; ++n) {
          state[j][n] = rest % 3;
          rest /= 3;
        }
      }
      if (!IsFeasiblePolluxState(oracle_jobs, state, gpus_per_node, options)) continue;
      best = std::max(best, PolluxObjective(oracle_jobs, state, gpus_per_node, options));
    }
    const double found =
        PolluxObjective(oracle_jobs, StateOf(*next, jobs, 2), gpus_per_node, options);
    EXPECT_NEAR(found, best, 1e-9 * best) << "trial " << trial;
  }
}

TEST(Pollux, AllocationsListNodesInOrderWithinLimits) {
  const ClusterView cluster = ClusterView::Homogeneous(4, 4);
  std::vector<JobView> jobs;
  for (int j = 0; j < 5; ++j) jobs.push_back(Job("j" + std::to_string(j), 2 + 2 * j, Linear));
  auto policy = MakePolluxPolicy();
  auto next = policy->Optimize(jobs, cluster, {}, 600);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(ValidateAllocations(*next, jobs, cluster, "pollux").ok());
  int used = 0;
  for (const JobView& job : jobs) {
    ASSERT_EQ(next->count(job.name), 1u) << job.name << " got nothing";
    const Allocation& allocation = next->at(job.name);
    EXPECT_TRUE(std::is_sorted(allocation.begin(), allocation.end())) << job.name;
    EXPECT_LE(static_cast<int>(allocation.size()), job.max_replicas) << job.name;
    used += static_cast<int>(allocation.size());
  }
  // Linear speedups and 2 + 4 + 6 + 8 + 10 replicas wanted: every GPU is worth giving away.
  EXPECT_EQ(used, 16);
}

TEST(Pollux, FavoursTheJobThatScales) {
  const ClusterView cluster = ClusterView::Homogeneous(1, 4);
  const std::vector<JobView> jobs = {
      Job("flat", 4, [](int n, int r) { return r > 0 ? 1.0 : 0.0; }), Job("linear", 4, Linear)};
  auto next = MakePolluxPolicy()->Optimize(jobs, cluster, {}, 600);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->at("flat").size(), 1u);
  EXPECT_EQ(next->at("linear"), (Allocation{0, 0, 0}));
}

TEST(Pollux, KeepsAllocationsARestartWouldCostMoreThanItGains) {
  // "held" restarted often: a restart is worth nothing (age 600 s, 20 restarts x 30 s), so it
  // keeps its two GPUs although "new" would scale onto them.
  const ClusterView cluster = ClusterView::Homogeneous(1, 4);
  JobView held = Job("held", 4, Linear, /*attained=*/1000);
  held.restarts = 20;
  JobView fresh = Job("new", 4, Linear);
  auto next = MakePolluxPolicy()->Optimize({held, fresh}, cluster, {{"held", {0, 0}}}, 600);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->at("held"), (Allocation{0, 0}));
  EXPECT_EQ(next->at("new"), (Allocation{0, 0}));
}

TEST(Pollux, SameSeedSameAllocations) {
  const ClusterView cluster = ClusterView::Homogeneous(4, 4);
  std::vector<JobView> jobs;
  for (int j = 0; j < 8; ++j) {
    const double scaling = 0.3 + 0.1 * j;
    jobs.push_back(Job("j" + std::to_string(j), 8,
                       [scaling](int n, int r) {
                         return r > 0 ? (1 + scaling * (r - 1)) / (n > 1 ? 1.2 : 1.0) : 0.0;
                       },
                       /*attained=*/10.0 * j));
  }
  auto a = MakePolluxPolicy();
  auto b = MakePolluxPolicy();
  Allocations current_a, current_b;
  for (int round = 0; round < 5; ++round) {
    for (JobView& job : jobs) job.age_seconds += 60;
    auto next_a = a->Optimize(jobs, cluster, current_a, 600 + 60 * round);
    auto next_b = b->Optimize(jobs, cluster, current_b, 600 + 60 * round);
    ASSERT_TRUE(next_a.ok() && next_b.ok());
    EXPECT_EQ(*next_a, *next_b) << "round " << round;
    current_a = *next_a;
    current_b = *next_b;
  }
}

TEST(Pollux, RejectsAnInvalidSpeedup) {
  const ClusterView cluster = ClusterView::Homogeneous(1, 4);
  const std::vector<JobView> jobs = {
      Job("bad", 4, [](int n, int r) { return r > 2 ? -1.0 : static_cast<double>(r); })};
  auto next = MakePolluxPolicy()->Optimize(jobs, cluster, {}, 600);
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(next.status().message().find("bad"), std::string::npos) << next.status();
}

}  // namespace
}  // namespace tandem::cluster
