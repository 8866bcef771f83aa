// Gavel's policy on hand-made heterogeneous clusters: each job on the type that suits it, time
// shares delivered over rounds, invariants every round of a simulation, and a JCT figure
// against a heterogeneity-blind policy.
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "cluster/cluster_file.h"
#include "cluster/gavel_lp.h"
#include "cluster/metrics.h"
#include "cluster/policies.h"
#include "cluster/simulator.h"
#include "gtest/gtest.h"

namespace tandem::cluster {
namespace {

JobView Job(const std::string& name, int replicas, std::map<std::string, double> speeds) {
  JobView job;
  job.name = name;
  job.requested_replicas = replicas;
  job.max_replicas = replicas;
  job.device_throughput = std::move(speeds);
  return job;
}

ClusterView TwoTypes(int fast_nodes, int slow_nodes, int gpus_per_node) {
  ClusterView cluster;
  for (int n = 0; n < fast_nodes; ++n) cluster.nodes.push_back({gpus_per_node, "fast"});
  for (int n = 0; n < slow_nodes; ++n) cluster.nodes.push_back({gpus_per_node, "slow"});
  return cluster;
}

std::unique_ptr<Policy> Gavel(double round_seconds = 360) {
  GavelPolicyOptions options;
  options.round_seconds = round_seconds;
  auto policy = MakeGavelPolicy(options);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return std::move(*policy);
}

std::string TypeOf(const ClusterView& cluster, const Allocation& allocation) {
  std::set<std::string> types;
  for (int node : allocation) types.insert(cluster.nodes[node].device_type);
  return types.size() == 1 ? *types.begin() : "mixed";
}

TEST(GavelPolicy, EachJobGetsTheTypeThatSuitsIt) {
  // a is 10x faster on "fast", b 10x faster on "slow" (Gavel's recommendation model is faster
  // on K80 than on V100). Either submission order, every round: a on fast, b on slow.
  const ClusterView cluster = TwoTypes(1, 1, 2);
  for (bool swapped : {false, true}) {
    std::vector<JobView> jobs = {Job("a", 2, {{"fast", 1.0}, {"slow", 0.1}}),
                                 Job("b", 2, {{"fast", 0.1}, {"slow", 1.0}})};
    if (swapped) std::swap(jobs[0], jobs[1]);
    auto gavel = Gavel();
    Allocations current;
    for (int round = 1; round <= 5; ++round) {
      auto next = gavel->Optimize(jobs, cluster, current, 360.0 * round);
      ASSERT_TRUE(next.ok()) << next.status();
      ASSERT_EQ(next->size(), 2u);
      EXPECT_EQ(next->at("a"), (Allocation{0, 0}));
      EXPECT_EQ(next->at("b"), (Allocation{1, 1}));
      current = *next;
    }
  }
}

TEST(GavelPolicy, RoundsDeliverTheTimeShares) {
  // Three one-GPU jobs on one fast and one slow GPU: more jobs than GPUs, so they time-share.
  // Over many rounds, the fraction of rounds each job runs on each type approaches the LP's
  // time shares.
  const ClusterView cluster = TwoTypes(1, 1, 1);
  const std::vector<JobView> jobs = {Job("a", 1, {{"fast", 1.0}, {"slow", 0.2}}),
                                     Job("b", 1, {{"fast", 1.0}, {"slow", 0.5}}),
                                     Job("c", 1, {{"fast", 1.0}, {"slow", 0.9}})};
  GavelProblem problem;
  problem.devices_per_type = {1, 1};
  for (const JobView& job : jobs) {
    problem.throughput.push_back(
        {job.device_throughput.at("fast"), job.device_throughput.at("slow")});
    problem.scale_factor.push_back(1);
  }
  auto solution = SolveMaxMinFairness(problem);
  ASSERT_TRUE(solution.ok()) << solution.status();

  auto gavel = Gavel();
  Allocations current;
  std::map<std::string, std::map<std::string, int>> rounds_on;
  constexpr int kRounds = 400;
  for (int round = 1; round <= kRounds; ++round) {
    auto next = gavel->Optimize(jobs, cluster, current, 360.0 * round);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->size(), 2u) << "round " << round << ": a GPU idle";
    for (const auto& [name, allocation] : *next) ++rounds_on[name][TypeOf(cluster, allocation)];
    current = *next;
  }
  for (int j = 0; j < 3; ++j) {
    for (int k = 0; k < 2; ++k) {
      const std::string type = k == 0 ? "fast" : "slow";
      EXPECT_NEAR(rounds_on[jobs[j].name][type] / static_cast<double>(kRounds),
                  solution->time_share[j][k], 0.02)
          << jobs[j].name << " on " << type;
    }
  }
}

TEST(GavelPolicy, BetweenRoundsRunningJobsStayAndFreeGpusFill) {
  const ClusterView cluster = TwoTypes(1, 0, 2);
  auto gavel = Gavel(/*round_seconds=*/360);
  std::vector<JobView> jobs = {Job("a", 1, {}), Job("b", 1, {}), Job("c", 1, {})};
  auto first = gavel->Optimize(jobs, cluster, {}, 60);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 2u);
  // A minute later, within the round: the same two run.
  auto second = gavel->Optimize(jobs, cluster, *first, 120);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *first);
  // One of them finishes mid-round: the waiting job takes its GPU, the other keeps its own.
  const std::string finished = first->begin()->first;
  const std::string staying = std::next(first->begin())->first;
  std::vector<JobView> left;
  for (const JobView& job : jobs) {
    if (job.name != finished) left.push_back(job);
  }
  Allocations current = *first;
  current.erase(finished);
  auto third = gavel->Optimize(left, cluster, current, 180);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->size(), 2u);
  EXPECT_EQ(third->at(staying), first->at(staying));
}

TEST(GavelPolicy, AJobWiderThanEveryTypeIsRefused) {
  const ClusterView cluster = TwoTypes(1, 1, 4);
  auto gavel = Gavel();
  auto next = gavel->Optimize({Job("wide", 6, {})}, cluster, {}, 60);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(next.status().message().find("wide"), std::string::npos) << next.status();
}

TEST(GavelPolicy, RegisteredByName) {
  auto gavel = MakePolicy("gavel");
  ASSERT_TRUE(gavel.ok()) << gavel.status();
  EXPECT_EQ((*gavel)->name(), "gavel");
  const std::vector<std::string> names = PolicyNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "gavel"), names.end());
  GavelPolicyOptions bad;
  bad.round_seconds = 0;
  EXPECT_EQ(MakeGavelPolicy(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Checks every round of the policy it wraps: each gang on one device type, of its requested
// size, and no job waiting while a type it can use has room for its gang.
class CheckedPolicy : public Policy {
 public:
  explicit CheckedPolicy(std::unique_ptr<Policy> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  BatchSizeMode batch_size_mode() const override { return inner_->batch_size_mode(); }
  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations& current,
                                       double now_seconds) override {
    auto next = inner_->Optimize(jobs, cluster, current, now_seconds);
    if (!next.ok()) return next;
    ++rounds_;
    std::map<std::string, int> free_per_type;
    const std::vector<int> free = FreeGpus(cluster, *next);
    for (size_t n = 0; n < free.size(); ++n) free_per_type[cluster.nodes[n].device_type] += free[n];
    for (const JobView& job : jobs) {
      auto found = next->find(job.name);
      if (found != next->end()) {
        EXPECT_EQ(static_cast<int>(found->second.size()), job.requested_replicas) << job.name;
        EXPECT_NE(TypeOf(cluster, found->second), "mixed") << job.name;
        continue;
      }
      for (const auto& [type, count] : free_per_type) {
        auto speed = job.device_throughput.find(type);
        const bool usable = speed == job.device_throughput.end() || speed->second > 0;
        EXPECT_FALSE(usable && count >= job.requested_replicas)
            << job.name << " waits while " << count << " " << type << " GPUs are free at "
            << now_seconds;
      }
    }
    return next;
  }
  int rounds() const { return rounds_; }

 private:
  std::unique_ptr<Policy> inner_;
  int rounds_ = 0;
};

// Fixed-duration jobs of two kinds on two types: half run 4x faster on "fast", half 4x faster on
// "slow".
Workload TwoKindsOfJobs(int count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> gang(1, 4);
  std::uniform_real_distribution<double> duration(600, 7200), gap(0, 300);
  Workload workload;
  workload.source = "two-kinds";
  double now = 0;
  for (int i = 0; i < count; ++i) {
    WorkloadJob job;
    job.name = "job-" + std::to_string(i);
    job.submission_seconds = now;
    job.num_replicas = gang(rng);
    job.duration_seconds = duration(rng);
    if (i % 2 == 0) {
      job.device_throughput = {{"fast", 1.0}, {"slow", 0.25}};
    } else {
      job.device_throughput = {{"fast", 0.25}, {"slow", 1.0}};
    }
    workload.jobs.push_back(job);
    now += gap(rng);
  }
  return workload;
}

TEST(GavelPolicy, SimulationKeepsItsInvariantsAndBeatsAHeterogeneityBlindPolicy) {
  const ClusterView cluster = TwoTypes(2, 2, 4);
  const Workload workload = TwoKindsOfJobs(60, 11);
  CheckedPolicy gavel(Gavel());
  auto gavel_result = Simulate(workload, {}, cluster, gavel);
  ASSERT_TRUE(gavel_result.ok()) << gavel_result.status();
  EXPECT_GT(gavel.rounds(), 10);
  auto tiresias = MakeTiresiasPolicy();
  auto tiresias_result = Simulate(workload, {}, cluster, *tiresias);
  ASSERT_TRUE(tiresias_result.ok()) << tiresias_result.status();
  const double gavel_jct = ComputeMetrics(*gavel_result).avg_jct_seconds;
  const double tiresias_jct = ComputeMetrics(*tiresias_result).avg_jct_seconds;
  // Tiresias places gangs wherever GPUs are free, so about half the time a job runs at a
  // quarter of its speed; Gavel puts each kind on its type.
  EXPECT_LT(gavel_jct, 0.8 * tiresias_jct) << "gavel " << gavel_jct << " s, tiresias "
                                           << tiresias_jct << " s";
}

TEST(Simulator, ProgressDependsOnTheDeviceType) {
  // One 2-GPU job of 1000 s on a cluster of "slow" nodes at speed 0.5 takes 2000 s (+ the
  // restart pause).
  Workload workload;
  workload.source = "one";
  workload.jobs.push_back({"a", 0, "", 2, 0, 1000, {{"slow", 0.5}}});
  auto fifo = MakeFifoPolicy();
  SimulationOptions options;
  options.restart_seconds = 0;
  options.interval_seconds = 10;
  auto result = Simulate(workload, {}, ClusterView::Homogeneous(1, 2, "slow"), *fifo, options);
  ASSERT_TRUE(result.ok()) << result.status();
  // Submitted at 0, placed at the end of the first interval.
  EXPECT_NEAR(result->jobs[0].jct_seconds, 10 + 2000, 1e-6);
  auto fast = Simulate(workload, {}, ClusterView::Homogeneous(1, 2, "fast"), *fifo, options);
  ASSERT_TRUE(fast.ok());
  EXPECT_NEAR(fast->jobs[0].jct_seconds, 10 + 1000, 1e-6);
}

}  // namespace
}  // namespace tandem::cluster
