// tandem's policy (cluster/policies/tandem.cc) and the reallocation costs a policy declares:
// the exact allocation of GPU counts against a brute-force oracle, placement that keeps jobs
// packed, the preference for young jobs, and the simulator charging a start, a grow and a
// shrink what the policy's mechanism declares.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "cluster/planned_throughput.h"
#include "cluster/policies.h"
#include "cluster/simulator.h"
#include "gtest/gtest.h"
#include "planner/gpt_profile.h"

namespace tandem::cluster {
namespace {

int DistinctNodes(const Allocation& allocation) {
  std::vector<int> nodes = allocation;
  std::sort(nodes.begin(), nodes.end());
  return static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
}

TEST(ReallocationCosts, ShrinkIsASubsetOfTheHeldGpus) {
  EXPECT_TRUE(ReallocationCosts::IsShrink({0, 0, 1, 1}, {0, 1}));
  EXPECT_TRUE(ReallocationCosts::IsShrink({0, 0, 1, 1}, {1, 1}));
  EXPECT_FALSE(ReallocationCosts::IsShrink({0, 0, 1, 1}, {0, 2}));     // moved
  EXPECT_FALSE(ReallocationCosts::IsShrink({0, 0, 1, 1}, {0, 0, 0}));  // 3 on node 0
  EXPECT_FALSE(ReallocationCosts::IsShrink({0, 1}, {0, 1}));           // unchanged
  EXPECT_FALSE(ReallocationCosts::IsShrink({0, 1}, {}));               // preempted
  EXPECT_TRUE(ReallocationCosts::IsGrow({0, 1}, {0, 1, 1}));
  EXPECT_TRUE(ReallocationCosts::IsGrow({0, 1}, {0, 1, 2, 2}));
  EXPECT_FALSE(ReallocationCosts::IsGrow({0, 0}, {0, 1, 1}));  // gives up a GPU on node 0
  EXPECT_FALSE(ReallocationCosts::IsGrow({0, 1}, {0, 1}));     // unchanged
  EXPECT_FALSE(ReallocationCosts::IsGrow({}, {0, 1}));         // a start
  const ReallocationCosts costs{/*start_seconds=*/10, /*grow_seconds=*/20,
                                /*shrink_seconds=*/1, /*move_seconds=*/50};
  EXPECT_EQ(costs.Seconds({}, {0, 0}), 10);
  EXPECT_EQ(costs.Seconds({0, 0}, {0, 0, 1}), 20);
  EXPECT_EQ(costs.Seconds({0, 0}, {0, 1, 1}), 50);
  EXPECT_EQ(costs.Seconds({0, 0}, {1, 1}), 50);
  EXPECT_EQ(costs.Seconds({0, 0}, {0}), 1);
  EXPECT_EQ(costs.Seconds({0, 0}, {0, 0}), 0);
  EXPECT_EQ(costs.Seconds({0, 0}, {}), 0);
}

// Runs a scripted sequence of allocations for one job and declares costs (or not).
class ScriptedPolicy : public Policy {
 public:
  ScriptedPolicy(std::vector<Allocation> script, std::optional<ReallocationCosts> costs)
      : script_(std::move(script)), costs_(costs) {}
  std::string name() const override { return "scripted"; }
  BatchSizeMode batch_size_mode() const override {
    return BatchSizeMode::kFixedReplicasAndBatch;
  }
  std::optional<ReallocationCosts> reallocation_costs() const override { return costs_; }
  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs, const ClusterView&,
                                       const Allocations&, double) override {
    const Allocation& next = script_[std::min(round_++, script_.size() - 1)];
    return Allocations{{jobs.at(0).name, next}};
  }

 private:
  std::vector<Allocation> script_;
  std::optional<ReallocationCosts> costs_;
  size_t round_ = 0;
};

TEST(ReallocationCosts, SimulatorChargesWhatThePolicyDeclares) {
  // A fixed-duration job: 1000 s on 4 GPUs, half speed on 2.
  Workload workload;
  workload.source = "script";
  WorkloadJob job;
  job.name = "a";
  job.num_replicas = 4;
  job.duration_seconds = 1000;
  workload.jobs = {job};
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  auto completion = [&](std::vector<Allocation> script,
                        std::optional<ReallocationCosts> costs) {
    ScriptedPolicy policy(std::move(script), costs);
    auto result = Simulate(workload, {}, cluster, policy);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->jobs[0].completion_seconds : -1.0;
  };
  const ReallocationCosts costs{/*start_seconds=*/10, /*grow_seconds=*/20,
                                /*shrink_seconds=*/1, /*move_seconds=*/50};
  // Start at 60 s (10 s), 50 s of work at full speed, shrink at 120 s (1 s), 950 s of work at
  // half speed: 120 + 1 + 1900.
  EXPECT_EQ(completion({{0, 0, 0, 0}, {0, 0}}, costs), 2021);
  // Undeclared: the uniform 30 s restart for both: 30 s of work, then 120 + 30 + 1940.
  EXPECT_EQ(completion({{0, 0, 0, 0}, {0, 0}}, std::nullopt), 2090);
  // Moving to another node is a move (50 s), not a shrink: 120 + 50 + 1900.
  EXPECT_EQ(completion({{0, 0, 0, 0}, {1, 1}}, costs), 2070);
  // Growing from 2 GPUs to 4 (keeping both) is a grow (20 s): 10 s start at 60 s, 50 s at half
  // speed (25 s of work), grow at 120 s, then 975 s at full speed: 120 + 20 + 975.
  EXPECT_EQ(completion({{0, 0}, {0, 0, 1, 1}}, costs), 1115);
}

// The policy's objective, written out from the header of cluster/policies/tandem.cc, for an
// allocation as the jobs would run it.
double OracleValue(const std::vector<JobView>& jobs, const Allocations& current,
                   const Allocations& next, const TandemOptions& options, int gpus,
                   int gpus_per_node) {
  double total = 0;
  const int fair = std::max(1, gpus / static_cast<int>(jobs.size()));
  for (const JobView& job : jobs) {
    double weight = std::pow(
        1 + job.attained_service_gpu_seconds / options.service_scale_gpu_seconds,
        -options.service_exponent);
    if (options.normalise_to_fair_share) {
      weight *= job.speedup((fair + gpus_per_node - 1) / gpus_per_node, fair);
    }
    const double horizon = std::max(job.age_seconds, options.min_horizon_seconds);
    auto before = current.find(job.name);
    auto after = next.find(job.name);
    double speedup = 0, cost = 0;
    if (after != next.end() && !after->second.empty()) {
      speedup = job.speedup(DistinctNodes(after->second), after->second.size());
      if (before != current.end() && !before->second.empty()) {
        cost = options.costs.Seconds(before->second, after->second);
      }
    }
    double keep = horizon / (horizon + cost);
    if (options.restart_history && cost > 0) {
      keep = std::max(job.age_seconds - job.restarts * options.costs.move_seconds, 0.0) /
             (job.age_seconds + cost);
    }
    const double x = speedup * keep;
    total += weight * -std::pow(x + 1e-3, options.fairness_power);
  }
  return total;
}

TEST(TandemPolicy, CountsAreOptimalAgainstBruteForce) {
  // One node of 8 GPUs (placement cannot fragment), 4 jobs with random non-concave speedups,
  // random current allocations, service and ages; both cost models. The policy's allocation
  // must be worth as much as the best of every allocation of counts (each job kept where its
  // count is unchanged, shrunk onto its own GPUs, or placed afresh).
  std::mt19937 rng(7);
  for (int variant = 0; variant < 4; ++variant) {
    const bool elastic = variant % 2 == 1;
    TandemOptions options = elastic ? TandemElasticOptions() : TandemOptions{};
    options.restart_history = variant < 2;  // else the horizon form
    options.service_exponent = 1;
    for (int trial = 0; trial < 60; ++trial) {
      const ClusterView cluster = ClusterView::Homogeneous(1, 8);
      std::vector<JobView> jobs(4);
      std::vector<std::vector<double>> tables(4);
      Allocations current;
      int used = 0;
      for (int j = 0; j < 4; ++j) {
        JobView& job = jobs[j];
        job.name = "j" + std::to_string(j);
        job.max_replicas = 1 + static_cast<int>(rng() % 8);
        job.attained_service_gpu_seconds = static_cast<double>(rng() % 20000);
        job.age_seconds = 60.0 * (1 + rng() % 40);
        job.restarts = static_cast<int>(rng() % 4);
        tables[j].assign(9, 0);
        for (int n = 1; n <= 8; ++n) {
          tables[j][n] = std::uniform_real_distribution<double>(0.3, 1.2)(rng) * n;
        }
        const std::vector<double>& table = tables[j];
        job.speedup = [&table](int nodes, int replicas) { return nodes > 0 ? table[replicas] : 0; };
        const int held = std::min<int>(rng() % 4, 8 - used);
        if (held > 0 && held <= job.max_replicas) {
          current[job.name] = Allocation(held, 0);
          used += held;
        }
      }
      auto policy = MakeTandemPolicy(options);
      auto next = policy->Optimize(jobs, cluster, current, 600);
      ASSERT_TRUE(next.ok()) << next.status();
      ASSERT_TRUE(ValidateAllocations(*next, jobs, cluster, "tandem").ok());
      // Brute force over counts; on one node an allocation is its count.
      double best = -std::numeric_limits<double>::infinity();
      std::vector<int> counts(4, 0);
      std::function<void(int, int)> search = [&](int j, int left) {
        if (j == 4) {
          Allocations candidate;
          for (int k = 0; k < 4; ++k) {
            if (counts[k] > 0) candidate[jobs[k].name] = Allocation(counts[k], 0);
          }
          best = std::max(best, OracleValue(jobs, current, candidate, options, 8, 8));
          return;
        }
        auto held = current.find(jobs[j].name);
        const int most =
            std::max(jobs[j].max_replicas, held == current.end() ? 0 : static_cast<int>(held->second.size()));
        for (int n = 0; n <= std::min(most, left); ++n) {
          counts[j] = n;
          search(j + 1, left - n);
        }
        counts[j] = 0;
      };
      search(0, 8);
      EXPECT_NEAR(OracleValue(jobs, current, *next, options, 8, 8), best, 1e-9 * std::abs(best))
          << "trial " << trial << (elastic ? " elastic" : "");
    }
  }
}

TEST(TandemPolicy, LargeClusterCountsAreOptimalForConcaveSpeedups) {
  // 1,200 jobs on 4,096 GPUs (512 nodes of 8): past the dynamic programme's size limit, so the
  // counts come from the concave hulls, which is exact when every job's value is concave. The
  // oracle: with concave values an allocation is optimal when no GPU moved from one job to
  // another (or taken from the free ones) raises the total.
  std::mt19937 rng(11);
  const int gpus = 4096;
  const ClusterView cluster = ClusterView::Homogeneous(gpus / 8, 8);
  std::vector<JobView> jobs(1200);
  std::vector<double> scale(jobs.size()), exponent(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    JobView& job = jobs[j];
    job.name = "j" + std::to_string(j);
    job.max_replicas = 1 + static_cast<int>(rng() % 16);
    job.age_seconds = 600;
    scale[j] = std::uniform_real_distribution<double>(0.5, 2.0)(rng);
    exponent[j] = std::uniform_real_distribution<double>(0.3, 1.0)(rng);
    const double c = scale[j], e = exponent[j];
    job.speedup = [c, e](int nodes, int replicas) {
      return nodes > 0 && replicas > 0 ? c * std::pow(replicas, e) : 0.0;
    };
  }
  TandemOptions options;
  auto policy = MakeTandemPolicy(options);
  auto next = policy->Optimize(jobs, cluster, {}, 600);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(ValidateAllocations(*next, jobs, cluster, "tandem").ok());
  // A job's term of the objective at n GPUs (no current allocations: no costs).
  const int fair = std::max(1, gpus / static_cast<int>(jobs.size()));
  auto term = [&](size_t j, int n) {
    const double weight = jobs[j].speedup(1, fair);
    const double speedup = n > 0 ? jobs[j].speedup(1, n) : 0.0;
    return weight * -std::pow(speedup + 1e-3, options.fairness_power);
  };
  int used = 0;
  double best_gain = 0, least_loss = std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < jobs.size(); ++j) {
    auto found = next->find(jobs[j].name);
    const int n = found == next->end() ? 0 : static_cast<int>(found->second.size());
    used += n;
    if (n < jobs[j].max_replicas) best_gain = std::max(best_gain, term(j, n + 1) - term(j, n));
    if (n > 0) least_loss = std::min(least_loss, term(j, n) - term(j, n - 1));
  }
  EXPECT_EQ(used, gpus);  // the jobs want more GPUs than the cluster has
  EXPECT_LE(best_gain, least_loss * (1 + 1e-9));
}

TEST(TandemPolicy, YoungJobsGetMoreGpus) {
  const ClusterView cluster = ClusterView::Homogeneous(1, 4);
  std::vector<JobView> jobs(2);
  for (int j = 0; j < 2; ++j) {
    jobs[j].name = j == 0 ? "old" : "young";
    jobs[j].max_replicas = 4;
    jobs[j].age_seconds = 3600;
    jobs[j].speedup = [](int nodes, int replicas) { return nodes > 0 ? replicas : 0.0; };
  }
  jobs[0].attained_service_gpu_seconds = 9 * 3600;  // weight 0.1
  TandemOptions options;
  options.service_exponent = 1;
  auto policy = MakeTandemPolicy(options);
  auto next = policy->Optimize(jobs, cluster, {}, 3600);
  ASSERT_TRUE(next.ok()) << next.status();
  // -1/3 - 0.1/1 beats -1/2 - 0.1/2; the old job keeps one GPU (none would cost 0.1 x 1000).
  EXPECT_EQ(next->at("young").size(), 3u);
  EXPECT_EQ(next->at("old").size(), 1u);
}

TEST(TandemPolicy, MovesAKeptJobToKeepANewOnePacked) {
  // Two 4-GPU nodes. a and b each hold 2 GPUs on their own node; c arrives and runs well only
  // on one node. Keeping a and b where they are would spread c over both nodes; the policy
  // moves a next to b and gives c a whole node.
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  std::vector<JobView> jobs(3);
  for (int j = 0; j < 3; ++j) {
    jobs[j].name = std::string(1, static_cast<char>('a' + j));
    jobs[j].max_replicas = 2;
    jobs[j].age_seconds = 3600;
    jobs[j].attained_service_gpu_seconds = 3600;
    jobs[j].speedup = [](int nodes, int replicas) { return nodes > 0 ? replicas : 0.0; };
  }
  jobs[2].max_replicas = 4;
  jobs[2].attained_service_gpu_seconds = 0;
  jobs[2].speedup = [](int nodes, int replicas) {
    return nodes == 0 ? 0.0 : nodes == 1 ? replicas : 1.0;
  };
  const Allocations current = {{"a", {0, 0}}, {"b", {1, 1}}};
  auto policy = MakeTandemPolicy();
  auto next = policy->Optimize(jobs, cluster, current, 3600);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->at("c").size(), 4u);
  EXPECT_EQ(DistinctNodes(next->at("c")), 1);
  EXPECT_EQ(next->at("c"), (Allocation{0, 0, 0, 0}));
  EXPECT_EQ(next->at("b"), (Allocation{1, 1}));  // kept
  EXPECT_EQ(next->at("a"), (Allocation{1, 1}));  // moved (a grow) next to b
}

TEST(TandemPolicy, GrowsAJobLiveWhereItRuns) {
  // Two 4-GPU nodes. a holds 2 GPUs on node 0 beside b's 2; node 1 is free. With a grow that
  // costs as much as a move (plain tandem) a goes to a whole node; when a grow is cheap
  // (tandem-elastic: live) a keeps its GPUs and takes the new ones beside them, over two nodes,
  // because its speedup barely suffers from the second node.
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  std::vector<JobView> jobs(2);
  for (int j = 0; j < 2; ++j) {
    jobs[j].name = j == 0 ? "a" : "b";
    jobs[j].max_replicas = j == 0 ? 4 : 2;
    jobs[j].age_seconds = 600;
    jobs[j].attained_service_gpu_seconds = 600;
    jobs[j].speedup = [](int nodes, int replicas) {
      return nodes > 0 ? replicas * (1.0 - 0.01 * (nodes - 1)) : 0.0;
    };
  }
  const Allocations current = {{"a", {0, 0}}, {"b", {0, 0}}};
  TandemOptions plain;
  plain.restart_history = false;
  auto moved = MakeTandemPolicy(plain)->Optimize(jobs, cluster, current, 600);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->at("a"), (Allocation{1, 1, 1, 1}));
  EXPECT_EQ(moved->at("b"), (Allocation{0, 0}));
  TandemOptions elastic = TandemElasticOptions();
  elastic.restart_history = false;
  auto grown = MakeTandemPolicy(elastic)->Optimize(jobs, cluster, current, 600);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->at("a").size(), 4u);
  EXPECT_TRUE(ReallocationCosts::IsGrow({0, 0}, grown->at("a"))) << grown->at("a").size();
  EXPECT_EQ(grown->at("b"), (Allocation{0, 0}));
}

TEST(TandemPolicy, PutsEachJobOnTheDeviceTypeItRunsFastestOn) {
  // One node of a fast type and one of a slow type (4 GPUs each). x runs at a quarter of its
  // speed on the slow type, y at the same speed on both; y comes first in the job list. A
  // heterogeneity-blind placement gives y the first whole node (the fast one); tandem gives it
  // to x, and x's value counts the type it runs on.
  ClusterView cluster;
  cluster.nodes = {NodeView{4, "fast"}, NodeView{4, "slow"}};
  std::vector<JobView> jobs(2);
  for (int j = 0; j < 2; ++j) {
    jobs[j].name = j == 0 ? "y" : "x";
    jobs[j].max_replicas = 4;
    jobs[j].age_seconds = 600;
    jobs[j].speedup = [](int nodes, int replicas) { return nodes > 0 ? replicas : 0.0; };
  }
  jobs[1].device_throughput = {{"fast", 1.0}, {"slow", 0.25}};
  jobs[0].device_throughput = {{"fast", 1.0}, {"slow", 1.0}};
  auto next = MakeTandemPolicy()->Optimize(jobs, cluster, {}, 600);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->at("x"), (Allocation{0, 0, 0, 0}));
  EXPECT_EQ(next->at("y"), (Allocation{1, 1, 1, 1}));
  // y already runs on the fast node when x arrives: moving y (30 s of 630) to make room for x
  // on the fast type is worth more than leaving x at a quarter speed, so y is moved.
  const Allocations current = {{"y", {0, 0, 0, 0}}};
  auto swapped = MakeTandemPolicy()->Optimize(jobs, cluster, current, 600);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_EQ(swapped->at("x"), (Allocation{0, 0, 0, 0}));
  EXPECT_EQ(swapped->at("y"), (Allocation{1, 1, 1, 1}));
}

TEST(TandemPolicy, RegisteredWithAndWithoutDeclaredCosts) {
  auto plain = MakePolicy("tandem");
  auto elastic = MakePolicy("tandem-elastic");
  ASSERT_TRUE(plain.ok() && elastic.ok());
  EXPECT_EQ((*plain)->batch_size_mode(), BatchSizeMode::kAdaptive);
  EXPECT_FALSE((*plain)->reallocation_costs().has_value());
  ASSERT_TRUE((*elastic)->reallocation_costs().has_value());
  EXPECT_EQ((*elastic)->reallocation_costs()->shrink_seconds, 2);
  EXPECT_EQ((*elastic)->reallocation_costs()->grow_seconds, 2);
  EXPECT_EQ((*elastic)->reallocation_costs()->move_seconds, 30);
}

TEST(TandemPolicy, UsesThePlannedThroughputOfAPlannedJob) {
  // The speedup a policy knows without the plan is linear; the plan says the job runs best on
  // one node (4 GPUs) and slower across two. tandem follows the plan.
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  JobView job;
  job.name = "gpt";
  job.max_replicas = 8;
  job.requested_replicas = 2;
  job.age_seconds = 600;
  job.speedup = [](int nodes, int replicas) { return nodes > 0 ? replicas : 0.0; };
  job.planned_throughput = [](int nodes, int replicas) {
    return nodes == 1 ? 10.0 * replicas : 6.0 * replicas / nodes;
  };
  auto policy = MakeTandemPolicy();
  auto next = policy->Optimize({job}, cluster, {}, 600);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->at("gpt").size(), 4u);
  EXPECT_EQ(DistinctNodes(next->at("gpt")), 1);
}

// A GPT of 8 layers (h = 1024, sequence 512) on nodes of 4 devices with 2 GB each: the model
// needs at least 2 devices; nodes are joined by a slow 10 Gb/s network.
absl::StatusOr<PlannedThroughput> SmallGptPlan() {
  planner::GptShape shape;
  shape.name = "gpt-small";
  shape.layers = 8;
  shape.hidden = 1024;
  shape.heads = 16;
  shape.sequence = 512;
  shape.vocabulary = 32000;
  auto chain = planner::LayerChain::FromProfile(
      planner::MakeGptProfile(shape, planner::A100Figures()));
  if (!chain.ok()) return chain.status();
  planner::ClusterSpec nodes;
  nodes.nodes = 2;
  nodes.devices_per_node = 4;
  nodes.device_memory_bytes = 2e9;
  nodes.levels = {{300e9, 5e-6}, {1.25e9, 2e-5}};
  return PlanThroughput(*chain, nodes, {.microbatches = 8}, shape.name);
}

TEST(PlannedThroughput, FromTheSmallGptTemplates) {
  auto plan = SmallGptPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->gpus_per_node, 4);
  EXPECT_EQ(plan->SamplesPerSecond(1, 1), 0);  // does not fit one device
  EXPECT_GE(plan->MinReplicas(), 2);
  EXPECT_GT(plan->SamplesPerSecond(1, 4), plan->SamplesPerSecond(1, 2));
  EXPECT_GT(plan->SamplesPerSecond(2, 8), 0);
  EXPECT_EQ(plan->SamplesPerSecond(2, 1), 0);   // fewer GPUs than nodes
  EXPECT_EQ(plan->SamplesPerSecond(2, 7), plan->SamplesPerSecond(2, 6));  // 3 per node used
}

TEST(PlannedThroughput, TandemRunsAPlannedJobOnItsBestPlacement) {
  auto plan = SmallGptPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto shared = std::make_shared<const PlannedThroughput>(*plan);
  Workload workload;
  workload.source = "planned";
  WorkloadJob job;
  job.name = "gpt";
  job.num_replicas = 2;
  job.duration_seconds = 7200;  // on its 2 requested GPUs
  job.planned = shared;
  workload.jobs = {job};
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  // The best placement by the plan, and the time it takes there.
  double best_rate = 0;
  for (int nodes = 1; nodes <= 2; ++nodes) {
    for (int replicas = nodes; replicas <= 4 * nodes; ++replicas) {
      best_rate = std::max(best_rate, plan->SamplesPerSecond(nodes, replicas));
    }
  }
  const double speedup = best_rate / plan->SamplesPerSecond(1, 2);
  ASSERT_GT(speedup, 1.5);
  auto tandem = MakeTandemPolicy();
  auto tiresias = MakePolicy("tiresias");
  ASSERT_TRUE(tiresias.ok());
  auto with_plan = Simulate(workload, {}, cluster, *tandem);
  auto gang = Simulate(workload, {}, cluster, **tiresias);
  ASSERT_TRUE(with_plan.ok()) << with_plan.status();
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(gang->jobs[0].completion_seconds, 60 + 30 + 7200);
  // Started at 60 s on the best placement (30 s start), no reallocation after.
  EXPECT_EQ(with_plan->jobs[0].restarts, 0);
  EXPECT_NEAR(with_plan->jobs[0].completion_seconds, 60 + 30 + 7200 / speedup, 1.0);
}

}  // namespace
}  // namespace tandem::cluster
