// Policy decisions on small hand-made clusters, with a brute-force oracle for Optimus's greedy
// allocation.
#include "cluster/policies.h"

#include <functional>
#include <random>

#include "gtest/gtest.h"

namespace tandem::cluster {
namespace {

JobView Job(const std::string& name, int replicas, double submitted = 0) {
  JobView job;
  job.name = name;
  job.submission_seconds = submitted;
  job.requested_replicas = replicas;
  job.max_replicas = replicas;
  return job;
}

int Count(const Allocation& allocation, int node) {
  return static_cast<int>(std::count(allocation.begin(), allocation.end(), node));
}

TEST(PolicyRegistry, KnownAndUnknownNames) {
  for (const std::string& name : PolicyNames()) {
    auto policy = MakePolicy(name);
    ASSERT_TRUE(policy.ok()) << name;
    EXPECT_EQ((*policy)->name(), name);
  }
  auto unknown = MakePolicy("lottery");
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("lottery"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("tiresias"), std::string::npos);
}

TEST(Fifo, GangsInOrderPackedWithoutOvertaking) {
  auto fifo = MakeFifoPolicy();
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  const std::vector<JobView> jobs = {Job("a", 3, 0), Job("b", 2, 1), Job("c", 4, 2),
                                     Job("d", 1, 3)};
  auto next = fifo->Optimize(jobs, cluster, {}, 60);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->at("a"), (Allocation{0, 0, 0}));
  EXPECT_EQ(next->at("b"), (Allocation{1, 1}));  // best fit: the node that keeps 4 free
  EXPECT_EQ(next->count("c"), 0u);               // 3 GPUs free, needs 4
  EXPECT_EQ(next->count("d"), 0u);               // would fit, but c is first
  // When a finishes, c starts on node 0 and 1 (3 + 1 of the 5 free), d still waits behind it
  // only if it does not fit: here it fits after c.
  const std::vector<JobView> later = {jobs[1], jobs[2], jobs[3]};
  auto after = fifo->Optimize(later, cluster, {{"b", {1, 1}}}, 120);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->at("b"), (Allocation{1, 1}));
  EXPECT_EQ(after->at("c"), (Allocation{0, 0, 0, 0}));
  EXPECT_EQ(after->at("d"), (Allocation{1}));
}

TEST(Tiresias, QueuesDemoteAndPreempt) {
  TiresiasOptions options;
  options.queue_thresholds_gpu_seconds = {480};
  auto tiresias = MakeTiresiasPolicy(options);
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  const std::vector<JobView> jobs = {Job("a", 4), Job("b", 4), Job("c", 2)};
  Allocations current;
  auto round = [&](double now) {
    auto next = tiresias->Optimize(jobs, cluster, current, now);
    EXPECT_TRUE(next.ok()) << next.status();
    current = *next;
  };
  round(60);
  EXPECT_EQ(current.at("a"), (Allocation{0, 0, 0, 0}));
  EXPECT_EQ(current.at("b"), (Allocation{1, 1, 1, 1}));
  EXPECT_EQ(current.count("c"), 0u);
  round(120);  // a and b have 60 s x 4 GPUs = 240 GPU-seconds: still first queue
  EXPECT_EQ(current.count("c"), 0u);
  round(180);  // 480 GPU-seconds: both move to the second queue, behind c
  EXPECT_EQ(current.at("c").size(), 2u);
  EXPECT_EQ(current.at("a"), (Allocation{0, 0, 0, 0}));  // keeps its GPUs
  EXPECT_EQ(current.count("b"), 0u);                     // preempted: 4 do not fit in 2
  EXPECT_EQ(Count(current.at("c"), 1), 2);
}

TEST(Tiresias, StarvationGuardPromotesAWaitingJob) {
  // Two 4-GPU jobs on one 4-GPU node, demoted after 240 GPU-seconds. With the guard (factor 1)
  // a demoted job that has waited as long as it ran returns to the first queue and preempts.
  for (const double factor : {0.0, 1.0}) {
    TiresiasOptions options;
    options.queue_thresholds_gpu_seconds = {240};
    options.starvation_factor = factor;
    auto tiresias = MakeTiresiasPolicy(options);
    const ClusterView cluster = ClusterView::Homogeneous(1, 4);
    std::vector<JobView> jobs = {Job("a", 4)};
    Allocations current;
    auto round = [&](double now) {
      auto next = tiresias->Optimize(jobs, cluster, current, now);
      EXPECT_TRUE(next.ok()) << next.status();
      current = *next;
    };
    round(60);
    round(120);  // a: 240 GPU-seconds, demoted; alone, it keeps running
    EXPECT_EQ(current.count("a"), 1u);
    jobs.push_back(Job("b", 4));
    round(180);  // b (first queue) takes the node; a waits
    EXPECT_EQ(current.count("a"), 0u);
    EXPECT_EQ(current.count("b"), 1u);
    round(240);  // b demoted behind a: a runs again
    EXPECT_EQ(current.count("a"), 1u);
    EXPECT_EQ(current.count("b"), 0u);
    round(300);  // b has waited 60 s after running 60 s
    EXPECT_EQ(current.count("b"), factor > 0 ? 1u : 0u) << "factor " << factor;
    EXPECT_EQ(current.count("a"), factor > 0 ? 0u : 1u) << "factor " << factor;
  }
}

// Optimus: the greedy allocation equals the best of all allocations when each job's remaining
// time, remaining x (work / replicas + overhead), is convex in its replicas.
TEST(Optimus, GreedyMatchesBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> work(1, 100), overhead(0, 1), remaining(1, 50);
  auto optimus = MakeOptimusPolicy();
  for (int trial = 0; trial < 30; ++trial) {
    const ClusterView cluster = ClusterView::Homogeneous(2, 4);
    std::vector<JobView> jobs;
    const int n = 2 + trial % 3;
    for (int i = 0; i < n; ++i) {
      JobView job = Job("j" + std::to_string(i), 1);
      job.max_replicas = 1 + (trial + i) % 6;
      const double w = work(rng), o = overhead(rng);
      job.iteration_seconds = [w, o](int r) { return w / r + o * r; };
      job.remaining_iterations = remaining(rng);
      jobs.push_back(job);
    }
    auto next = optimus->Optimize(jobs, cluster, {}, 60);
    ASSERT_TRUE(next.ok()) << next.status();
    auto cost = [&](const std::vector<int>& r) {
      double total = 0;
      for (int i = 0; i < n; ++i) {
        total += jobs[i].remaining_iterations * jobs[i].iteration_seconds(r[i]);
      }
      return total;
    };
    std::vector<int> chosen(n);
    for (int i = 0; i < n; ++i) {
      auto found = next->find(jobs[i].name);
      chosen[i] = found == next->end() ? 0 : static_cast<int>(found->second.size());
      EXPECT_GE(chosen[i], 1);
      EXPECT_LE(chosen[i], jobs[i].max_replicas);
    }
    double best = 1e300;
    std::vector<int> r(n, 1);
    std::function<void(int, int)> search = [&](int i, int left) {
      if (i == n) {
        best = std::min(best, cost(r));
        return;
      }
      for (int k = 1; k <= jobs[i].max_replicas && k - 1 <= left; ++k) {
        r[i] = k;
        search(i + 1, left - (k - 1));
      }
    };
    search(0, cluster.total_gpus() - n);
    EXPECT_NEAR(cost(chosen), best, 1e-9 * best) << "trial " << trial;
  }
}

TEST(Optimus, KeepsPlacementWhenSizeUnchanged) {
  auto optimus = MakeOptimusPolicy();
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  JobView a = Job("a", 1);
  a.max_replicas = 1;
  a.iteration_seconds = [](int r) { return 10.0 / r; };
  a.remaining_iterations = 1;
  auto next = optimus->Optimize({a}, cluster, {{"a", {1}}}, 60);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->at("a"), (Allocation{1}));
}

TEST(Allocations, ValidationCatchesOverfullNodesAndUnknownJobs) {
  const ClusterView cluster = ClusterView::Homogeneous(2, 2);
  const std::vector<JobView> jobs = {Job("a", 2)};
  EXPECT_TRUE(ValidateAllocations({{"a", {0, 1}}}, jobs, cluster, "test").ok());
  EXPECT_EQ(ValidateAllocations({{"a", {0, 0, 0}}}, jobs, cluster, "test").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(ValidateAllocations({{"zz", {0}}}, jobs, cluster, "test").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(ValidateAllocations({{"a", {5}}}, jobs, cluster, "test").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(PlacementOf({3, 3, 1}), (std::vector<int>{2, 1}));
}

}  // namespace
}  // namespace tandem::cluster
