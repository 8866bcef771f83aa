// The simulator: a lone job's completion time against its isolated run, the restart delay,
// invariants (over-full nodes, jobs that never finish), fixed-duration and heterogeneous jobs,
// the adaptive (Pollux) batch-size path, metrics, and a validation of Tiresias, Optimus and
// Pollux against the Pollux artifact's published average JCTs on its eight workloads.
#include "cluster/simulator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_format.h"
#include "cluster/metrics.h"
#include "cluster/policies.h"
#include "gtest/gtest.h"
#include "tests/cluster/test_util.h"

namespace tandem::cluster {
namespace {

using testing::DataPath;
using testing::PolluxApps;

Workload OneJob(const std::string& app, int replicas, int batch, double submitted = 10) {
  Workload workload;
  workload.source = "test";
  WorkloadJob job;
  job.name = app + "-0";
  job.application = app;
  job.num_replicas = replicas;
  job.batch_size = batch;
  job.submission_seconds = submitted;
  workload.jobs.push_back(job);
  return workload;
}

Workload FixedJobs(int count, double duration, int gpus) {
  Workload workload;
  workload.source = "fixed";
  for (int i = 0; i < count; ++i) {
    WorkloadJob job;
    job.name = "job-" + std::to_string(i);
    job.num_replicas = gpus;
    job.duration_seconds = duration;
    job.submission_seconds = 0;
    workload.jobs.push_back(job);
  }
  return workload;
}

TEST(Simulator, LoneJobTakesItsIsolatedTimePlusWaitAndRestart) {
  for (const auto& [app, replicas, batch] :
       std::vector<std::tuple<std::string, int, int>>{{"cifar10", 4, 512}, {"bert", 2, 24},
                                                      {"ncf", 1, 1024}}) {
    const Workload workload = OneJob(app, replicas, batch);
    auto policy = MakeTiresiasPolicy();
    auto result = Simulate(workload, PolluxApps(), ClusterView::Homogeneous(4, 4), *policy);
    ASSERT_TRUE(result.ok()) << result.status();
    const JobOutcome& job = result->jobs[0];
    auto isolated = IsolatedRunSeconds(workload.jobs[0], PolluxApps(), 4);
    ASSERT_TRUE(isolated.ok());
    EXPECT_DOUBLE_EQ(job.isolated_seconds, *isolated);
    // Allocated at the first round (60 s), 30 s restart, then its isolated run; epochs end on
    // whole seconds, so allow a second per epoch.
    const double expected = (60 - 10) + 30 + *isolated;
    EXPECT_NEAR(job.jct_seconds, expected, PolluxApps().at(app)->max_epochs()) << app;
    EXPECT_EQ(job.restarts, 0);
    // It held its GPUs from allocation to completion.
    EXPECT_NEAR(job.gpu_seconds, replicas * (job.completion_seconds - 60), 1e-6);
  }
}

TEST(Simulator, RestartDelayIsAnOption) {
  const Workload workload = OneJob("cifar10", 2, 256);
  SimulationOptions fast;
  fast.restart_seconds = 0;
  SimulationOptions slow;
  slow.restart_seconds = 300;
  auto p1 = MakeFifoPolicy();
  auto p2 = MakeFifoPolicy();
  auto a = Simulate(workload, PolluxApps(), ClusterView::Homogeneous(1, 4), *p1, fast);
  auto b = Simulate(workload, PolluxApps(), ClusterView::Homogeneous(1, 4), *p2, slow);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(b->jobs[0].jct_seconds - a->jobs[0].jct_seconds, 300, 100);
}

class OverfullPolicy : public Policy {
 public:
  std::string name() const override { return "overfull"; }
  BatchSizeMode batch_size_mode() const override {
    return BatchSizeMode::kFixedReplicasAndBatch;
  }
  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs, const ClusterView&,
                                       const Allocations&, double) override {
    Allocations out;
    for (const JobView& job : jobs) out[job.name] = Allocation(5, 0);
    return out;
  }
};

class IdlePolicy : public Policy {
 public:
  std::string name() const override { return "idle"; }
  BatchSizeMode batch_size_mode() const override {
    return BatchSizeMode::kFixedReplicasAndBatch;
  }
  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>&, const ClusterView&,
                                       const Allocations&, double) override {
    return Allocations{};
  }
};

TEST(Simulator, RejectsAPolicyThatOverfillsANode) {
  OverfullPolicy policy;
  auto result = Simulate(FixedJobs(1, 100, 1), {}, ClusterView::Homogeneous(2, 4), policy);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(result.status().message().find("node 0"), std::string::npos) << result.status();
}

TEST(Simulator, StopsWhenJobsNeverFinish) {
  IdlePolicy policy;
  SimulationOptions options;
  options.max_rounds = 50;
  auto result = Simulate(FixedJobs(2, 100, 1), {}, ClusterView::Homogeneous(1, 4), policy, options);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(result.status().message().find("job-0"), std::string::npos);
}

TEST(Simulator, RejectsBadWorkloads) {
  auto policy = MakeFifoPolicy();
  auto wide = Simulate(FixedJobs(1, 100, 9), {}, ClusterView::Homogeneous(2, 4), *policy);
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  auto unknown = Simulate(OneJob("gpt5", 1, 128), PolluxApps(), ClusterView::Homogeneous(2, 4),
                          *policy);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Simulator, FixedDurationJobsQueueAndScaleWithDeviceSpeed) {
  // Three 4-GPU jobs of 600 s on one 4-GPU node under FIFO: they run one after another.
  auto policy = MakeFifoPolicy();
  auto result = Simulate(FixedJobs(3, 600, 4), {}, ClusterView::Homogeneous(1, 4), *policy);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_DOUBLE_EQ(result->jobs[0].jct_seconds, 60 + 30 + 600);
  EXPECT_GT(result->jobs[1].jct_seconds, result->jobs[0].jct_seconds + 600);
  EXPECT_GT(result->jobs[2].jct_seconds, result->jobs[1].jct_seconds + 600);
  const ClusterMetrics metrics = ComputeMetrics(*result);
  EXPECT_LE(metrics.utilisation, 1.0);
  EXPECT_GT(metrics.utilisation, 0.7);
  for (const TimelineEntry& entry : result->timeline) {
    int gpus = 0;
    for (const auto& [job, count] : entry.gpus) gpus += count;
    EXPECT_LE(gpus, result->total_gpus);
  }
  // The same job on nodes half as fast for it takes twice as long.
  Workload slow = FixedJobs(1, 600, 4);
  slow.jobs[0].device_throughput["k80"] = 0.5;
  ClusterView k80 = ClusterView::Homogeneous(1, 4, "k80");
  auto fifo = MakeFifoPolicy();
  auto slow_result = Simulate(slow, {}, k80, *fifo);
  ASSERT_TRUE(slow_result.ok());
  EXPECT_DOUBLE_EQ(slow_result->jobs[0].jct_seconds, 60 + 30 + 1200);
}

// A small adaptive policy: every job gets up to its max_replicas in submission order, placed
// from the most free nodes; asks each job's speedup function, as Pollux would.
class GreedyAdaptivePolicy : public Policy {
 public:
  std::string name() const override { return "greedy-adaptive"; }
  BatchSizeMode batch_size_mode() const override { return BatchSizeMode::kAdaptive; }
  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations&,
                                       double) override {
    Allocations out;
    std::vector<int> free = FreeGpus(cluster, out);
    int left = cluster.total_gpus();
    for (const JobView& job : jobs) {
      const double one = job.speedup(1, 1);
      if (!(one > 0)) return absl::InternalError("speedup(1, 1) must be positive");
      speedups_checked_ += std::fabs(one - 1.0) < 1e-9 ? 1 : 0;
      const int take = std::min(job.max_replicas, left);
      if (take == 0) break;
      auto allocation = TakeFromMostFree(take, &free);
      if (!allocation.ok()) return allocation.status();
      out[job.name] = *allocation;
      left -= take;
    }
    return out;
  }
  int speedups_checked_ = 0;
};

TEST(Simulator, AdaptiveBatchSizesRunThroughTheGoodputModel) {
  auto full = ReadPolluxWorkload(DataPath("pollux/workloads/workload-3.csv"));
  ASSERT_TRUE(full.ok());
  Workload workload = *full;
  workload.jobs.resize(12);
  GreedyAdaptivePolicy policy;
  auto result = Simulate(workload, PolluxApps(), ClusterView::Homogeneous(4, 4), policy);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(policy.speedups_checked_, 0);
  for (const JobOutcome& job : result->jobs) EXPECT_GT(job.jct_seconds, 0) << job.name;
}

TEST(Metrics, PercentilesAndFairnessOfALoneJob) {
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({5}, 99), 5);
  EXPECT_NEAR(Percentile({0, 100}, 99), 99, 1e-12);
  SimulationResult result;
  result.total_gpus = 8;
  result.jobs.push_back({"a", "", 0, 100, 100, 0, 400, 4, 50});
  const ClusterMetrics metrics = ComputeMetrics(result);
  EXPECT_DOUBLE_EQ(metrics.avg_jct_seconds, 100);
  EXPECT_DOUBLE_EQ(metrics.makespan_seconds, 100);
  EXPECT_DOUBLE_EQ(metrics.utilisation, 0.5);
  EXPECT_DOUBLE_EQ(metrics.avg_ftf, 2.0);  // alone: its share is the cluster; 100 / 50
  // Two overlapping jobs of 8 GPUs each on 8 GPUs: N = 2, share 4, T_fair = 2 x alone.
  result.jobs = {{"a", "", 0, 100, 100, 0, 800, 8, 50}, {"b", "", 0, 100, 100, 0, 0, 8, 50}};
  EXPECT_DOUBLE_EQ(FinishTimeFairness(result)[0], 1.0);
}

// Pollux artifact, results-jobload/{tiresias,optimus}-1.0/summary.json: average JCT (s) on
// workloads 1..8 (16 nodes x 4 GPUs, 60 s rounds, 30 s restarts).
struct Published {
  const char* policy;
  double avg_jct[8];
};
constexpr Published kPublished[] = {
    {"tiresias", {2473.7, 5145.0, 3876.3, 3280.3, 3501.0, 3469.7, 5479.9, 5079.7}},
    {"optimus", {4087.1, 6913.9, 3944.0, 5967.8, 5656.2, 5301.9, 7290.9, 6293.8}},
};

// Tolerance: 5% per workload, 2% on the mean over the eight. The simulator follows the
// artifact's model except for the interpolation of unmeasured placements (see
// cluster/application.h), which moves single workloads by up to about 3%.
TEST(Validation, TiresiasAndOptimusReproducePublishedAverageJct) {
  const ClusterView cluster = ClusterView::Homogeneous(16, 4);
  for (const Published& published : kPublished) {
    double sum = 0, sum_published = 0;
    for (int w = 1; w <= 8; ++w) {
      auto workload = ReadPolluxWorkload(
          DataPath(absl::StrFormat("pollux/workloads/workload-%d.csv", w)));
      ASSERT_TRUE(workload.ok()) << workload.status();
      auto policy = MakePolicy(published.policy);
      ASSERT_TRUE(policy.ok());
      const auto start = std::chrono::steady_clock::now();
      auto result = Simulate(*workload, PolluxApps(), cluster, **policy);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ASSERT_TRUE(result.ok()) << result.status();
      const double avg = ComputeMetrics(*result).avg_jct_seconds;
      const double reference = published.avg_jct[w - 1];
      EXPECT_NEAR(avg / reference, 1.0, 0.05)
          << published.policy << " workload-" << w << ": " << avg << " s vs " << reference;
      EXPECT_LT(seconds, 20.0) << "simulation too slow";
      sum += avg;
      sum_published += reference;
    }
    EXPECT_NEAR(sum / sum_published, 1.0, 0.02) << published.policy;
  }
}

// Pollux artifact, results-jobload/pollux-1.0/summary.json (mean 2751.1 s = 0.764 h).
constexpr double kPublishedPollux[8] = {2088.8, 3322.9, 2188.5, 2721.0,
                                        2673.7, 2446.1, 3616.1, 2951.9};

// Tolerance: 6% per workload, 3% on the mean (the issue asks for 10% on the mean). Pollux's
// search is random: the artifact's figures are one draw of pymoo's NSGA-II, ours one seeded draw
// of the same search; across seeds single workloads move by a few percent (docs/cluster.md).
// Then tandem's policy on the elastic layer's costs (tandem-elastic) on the same workloads: its
// average JCT at or below Pollux's on every workload and 2% below on the mean, its p99 at most
// 1% above Pollux's on any workload (measured: -0.9% to -7.3%), and both below the published
// Tiresias and Optimus averages. The sixteen simulations (Pollux about 20 s each on one core,
// tandem about 6 s) run on up to four threads.
TEST(Validation, PolluxReproducesPublishedAverageJctAndTandemBeatsIt) {
  const ClusterView cluster = ClusterView::Homogeneous(16, 4);
  std::vector<Workload> workloads;
  for (int w = 1; w <= 8; ++w) {
    auto workload = ReadPolluxWorkload(
        DataPath(absl::StrFormat("pollux/workloads/workload-%d.csv", w)));
    ASSERT_TRUE(workload.ok()) << workload.status();
    workloads.push_back(std::move(*workload));
  }
  const ApplicationCatalog& apps = PolluxApps();
  // [0, 8): Pollux; [8, 16): tandem-elastic.
  std::vector<absl::StatusOr<SimulationResult>> results(
      16, absl::UnknownError("not simulated"));
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int k = next++; k < 16; k = next++) {
      auto policy = k < 8 ? MakePolluxPolicy() : MakeTandemPolicy(TandemElasticOptions());
      results[k] = Simulate(workloads[k % 8], apps, cluster, *policy);
    }
  };
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& thread : pool) thread.join();
  double sum = 0, sum_published = 0;
  for (int w = 0; w < 8; ++w) {
    ASSERT_TRUE(results[w].ok()) << "workload-" << w + 1 << ": " << results[w].status();
    const double avg = ComputeMetrics(*results[w]).avg_jct_seconds;
    EXPECT_NEAR(avg / kPublishedPollux[w], 1.0, 0.06)
        << "pollux workload-" << w + 1 << ": " << avg << " s vs " << kPublishedPollux[w];
    sum += avg;
    sum_published += kPublishedPollux[w];
  }
  EXPECT_NEAR(sum / sum_published, 1.0, 0.03)
      << "pollux mean: " << sum / 8 << " s vs " << sum_published / 8;

  double tandem_sum = 0;
  for (int w = 0; w < 8; ++w) {
    ASSERT_TRUE(results[8 + w].ok()) << "workload-" << w + 1 << ": " << results[8 + w].status();
    const ClusterMetrics pollux = ComputeMetrics(*results[w]);
    const ClusterMetrics tandem = ComputeMetrics(*results[8 + w]);
    EXPECT_LE(tandem.avg_jct_seconds, pollux.avg_jct_seconds)
        << "tandem-elastic workload-" << w + 1;
    EXPECT_LE(tandem.p99_jct_seconds, 1.01 * pollux.p99_jct_seconds)
        << "tandem-elastic workload-" << w + 1;
    for (const Published& other : kPublished) {
      EXPECT_LT(tandem.avg_jct_seconds, other.avg_jct[w])
          << "tandem-elastic vs " << other.policy << " workload-" << w + 1;
    }
    tandem_sum += tandem.avg_jct_seconds;
  }
  EXPECT_LE(tandem_sum, 0.98 * sum) << "tandem-elastic mean " << tandem_sum / 8 << " s vs "
                                    << "pollux " << sum / 8 << " s";
}

}  // namespace
}  // namespace tandem::cluster
