// Scheduling at scale: the Philly trace on large clusters, with the wall time of every
// scheduling round (the policy's Optimize alone, and the whole round: advancing the jobs,
// building their views, the policy, the checks) and of the whole simulation, per policy.
//
// Workload: the first `jobs-per-gpu x GPUs` jobs of Pollux's copy of the Philly trace (jobs of
// at least 60 s), durations capped at --max-duration-hours, submissions compressed in time so
// that the jobs' GPU-seconds, spread over the submission window, would keep the cluster busy
// at --load (Philly's own arrivals fill only about 400 GPUs). Nodes of --gpus-per-node GPUs,
// 60 s rounds, 30 s restarts.
//
//   cluster_scale_bench [--gpus 1024,8192] [--gpus-per-node 8] [--jobs-per-gpu 2.5]
//       [--max-duration-hours 6] [--load 1.0] [--policies fifo,tiresias,optimus,gavel,...]
//       [--budget-seconds 600] [--data DIR]
//
// A policy this build does not have is reported as such (the adaptive policies register in
// cluster/policies.cc when they exist). A simulation that runs past --budget-seconds of wall
// time stops, and its timings so far are printed, marked "stopped".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cluster/metrics.h"
#include "cluster/policies.h"
#include "cluster/simulator.h"
#include "cluster/workload.h"

namespace {

using namespace tandem::cluster;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Timings {
  int rounds = 0;
  double sum = 0;
  double max = 0;
  void Add(double seconds) {
    ++rounds;
    sum += seconds;
    max = std::max(max, seconds);
  }
  double mean() const { return rounds > 0 ? sum / rounds : 0; }
};

// Times every Optimize call of the policy it wraps, and stops the simulation (DeadlineExceeded)
// once the wall-time budget is spent.
class TimedPolicy : public Policy {
 public:
  TimedPolicy(Policy& inner, double budget_seconds)
      : inner_(inner), budget_seconds_(budget_seconds), start_(Clock::now()) {}
  std::string name() const override { return inner_.name(); }
  BatchSizeMode batch_size_mode() const override { return inner_.batch_size_mode(); }
  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations& current,
                                       double now_seconds) override {
    if (Seconds(Clock::now() - start_) > budget_seconds_) {
      stopped_ = true;
      return absl::DeadlineExceededError("wall-time budget spent");
    }
    const auto begin = Clock::now();
    auto result = inner_.Optimize(jobs, cluster, current, now_seconds);
    timings_.Add(Seconds(Clock::now() - begin));
    max_active_ = std::max(max_active_, static_cast<int>(jobs.size()));
    return result;
  }
  const Timings& timings() const { return timings_; }
  bool stopped() const { return stopped_; }
  int max_active() const { return max_active_; }

 private:
  Policy& inner_;
  double budget_seconds_;
  Clock::time_point start_;
  Timings timings_;
  bool stopped_ = false;
  int max_active_ = 0;
};

// The scale workload (see the header).
Workload ScaleWorkload(const Workload& philly, int gpus, double jobs_per_gpu,
                       double max_duration_seconds, double load) {
  Workload workload;
  workload.source = philly.source;
  const size_t count = std::min(philly.jobs.size(), static_cast<size_t>(jobs_per_gpu * gpus));
  workload.jobs.assign(philly.jobs.begin(), philly.jobs.begin() + count);
  double gpu_seconds = 0;
  for (WorkloadJob& job : workload.jobs) {
    job.duration_seconds = std::min(job.duration_seconds, max_duration_seconds);
    gpu_seconds += job.duration_seconds * job.num_replicas;
  }
  const double span = workload.jobs.back().submission_seconds;
  const double window = gpu_seconds / (load * gpus);
  const double compress = span > 0 ? span / window : 1;
  for (WorkloadJob& job : workload.jobs) job.submission_seconds /= compress;
  return workload;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = TANDEM_BENCH_DATA_DIR;
  std::vector<int> cluster_gpus = {1024, 8192};
  std::vector<std::string> policies = {"fifo", "tiresias", "optimus", "gavel",
                                       "pollux", "tandem"};
  int gpus_per_node = 8;
  double jobs_per_gpu = 2.5, max_duration_hours = 6, load = 1.0, budget_seconds = 600;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    bool ok = true;
    if (flag == "--gpus") {
      cluster_gpus.clear();
      for (absl::string_view g : absl::StrSplit(value, ',')) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(g, &n) && n > 0;
        cluster_gpus.push_back(n);
      }
    } else if (flag == "--policies") {
      policies = absl::StrSplit(value, ',');
    } else if (flag == "--gpus-per-node") {
      ok = absl::SimpleAtoi(value, &gpus_per_node) && gpus_per_node > 0;
    } else if (flag == "--jobs-per-gpu") {
      ok = absl::SimpleAtod(value, &jobs_per_gpu) && jobs_per_gpu > 0;
    } else if (flag == "--max-duration-hours") {
      ok = absl::SimpleAtod(value, &max_duration_hours) && max_duration_hours > 0;
    } else if (flag == "--load") {
      ok = absl::SimpleAtod(value, &load) && load > 0;
    } else if (flag == "--budget-seconds") {
      ok = absl::SimpleAtod(value, &budget_seconds) && budget_seconds > 0;
    } else if (flag == "--data") {
      data = value;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "cluster_scale_bench: bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  auto philly = ReadPhillyTrace(data + "/cluster/pollux/philly.csv");
  if (!philly.ok()) {
    std::fprintf(stderr, "cluster_scale_bench: %s\n",
                 std::string(philly.status().message()).c_str());
    return 2;
  }
  std::printf("Philly trace at scale: %.1f jobs per GPU, durations capped at %.0f h, arrivals "
              "compressed to load %.2f; %d GPUs per node, 60 s rounds\n",
              jobs_per_gpu, max_duration_hours, load, gpus_per_node);
  std::printf("%-8s %-15s %6s %6s %7s %10s %10s %10s %10s %9s %8s %6s\n", "gpus", "policy",
              "jobs", "active", "rounds", "opt_mean_ms", "opt_max_ms", "round_mean", "round_max",
              "total_s", "avg_jct_h", "util");
  for (int gpus : cluster_gpus) {
    if (gpus % gpus_per_node != 0) {
      std::fprintf(stderr, "cluster_scale_bench: %d GPUs is not a multiple of %d per node\n",
                   gpus, gpus_per_node);
      return 2;
    }
    const ClusterView cluster = ClusterView::Homogeneous(gpus / gpus_per_node, gpus_per_node);
    const Workload workload =
        ScaleWorkload(*philly, gpus, jobs_per_gpu, max_duration_hours * 3600, load);
    for (const std::string& name : policies) {
      auto policy = MakePolicy(name);
      if (!policy.ok()) {
        std::printf("%-8d %-15s not in this build: %s\n", gpus, name.c_str(),
                    std::string(policy.status().message()).c_str());
        continue;
      }
      TimedPolicy timed(**policy, budget_seconds);
      Timings rounds;
      auto last = Clock::now();
      SimulationOptions options;
      options.record_timeline = false;
      options.on_round = [&](const SimulationProgress&) {
        const auto now = Clock::now();
        rounds.Add(Seconds(now - last));
        last = now;
      };
      const auto start = Clock::now();
      auto result = Simulate(workload, {}, cluster, timed, options);
      const double total = Seconds(Clock::now() - start);
      std::string jct = "-", util = "-";
      if (result.ok()) {
        const ClusterMetrics m = ComputeMetrics(*result);
        jct = absl::StrFormat("%.3f", m.avg_jct_seconds / 3600);
        util = absl::StrFormat("%.3f", m.utilisation);
      } else if (!timed.stopped()) {
        std::fprintf(stderr, "cluster_scale_bench: %s on %d GPUs: %s\n", name.c_str(), gpus,
                     std::string(result.status().message()).c_str());
        return 1;
      }
      std::printf("%-8d %-15s %6zu %6d %7d %10.2f %10.2f %10.2f %10.2f %9.1f %8s %6s%s\n", gpus,
                  name.c_str(), workload.jobs.size(), timed.max_active(), rounds.rounds,
                  1e3 * timed.timings().mean(), 1e3 * timed.timings().max, 1e3 * rounds.mean(),
                  1e3 * rounds.max, total, jct.c_str(), util.c_str(),
                  timed.stopped() ? "  stopped (budget)" : "");
      std::fflush(stdout);
    }
  }
  return 0;
}
