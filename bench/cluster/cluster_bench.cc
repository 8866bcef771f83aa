// Runs each policy on Pollux's eight workloads (16 nodes x 4 GPUs, 60 s rounds, 30 s restarts)
// and prints the average job completion time beside the Pollux artifact's published figures
// (simulator/results-jobload/*-1.0/summary.json), plus the wall time of each simulation.
//
//   cluster_bench [--policies pollux,tiresias,optimus,fifo] [--workloads 1,2,...,8] [--data DIR]
//                 [--seed N] [--pollux-speedups fair-share|one-gpu]
//   --seed: the seed of Pollux's search (default 1); --pollux-speedups: what Pollux's speedups
//   are relative to (the artifact: the goodput at the job's fair share).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cluster/application.h"
#include "cluster/metrics.h"
#include "cluster/policies.h"
#include "cluster/simulator.h"
#include "cluster/workload.h"

namespace {

// Published average JCT (seconds) per workload 1..8, Pollux artifact at relative load 1.0.
const std::map<std::string, std::vector<double>>& Published() {
  static const auto* published = new std::map<std::string, std::vector<double>>{
      {"pollux", {2088.8, 3322.9, 2188.5, 2721.0, 2673.7, 2446.1, 3616.1, 2951.9}},
      {"tiresias", {2473.7, 5145.0, 3876.3, 3280.3, 3501.0, 3469.7, 5479.9, 5079.7}},
      {"optimus", {4087.1, 6913.9, 3944.0, 5967.8, 5656.2, 5301.9, 7290.9, 6293.8}},
  };
  return *published;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem::cluster;
  std::string data = TANDEM_BENCH_DATA_DIR;
  std::vector<std::string> policies = {"pollux",   "tandem",  "tandem-elastic",
                                       "tiresias", "optimus", "fifo"};
  std::vector<int> workloads = {1, 2, 3, 4, 5, 6, 7, 8};
  PolluxOptions pollux;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--policies") == 0) {
      policies = absl::StrSplit(argv[i + 1], ',');
    } else if (std::strcmp(argv[i], "--workloads") == 0) {
      workloads.clear();
      for (absl::string_view w : absl::StrSplit(argv[i + 1], ',')) {
        int n = 0;
        if (absl::SimpleAtoi(w, &n)) workloads.push_back(n);
      }
    } else if (std::strcmp(argv[i], "--data") == 0) {
      data = argv[i + 1];
    } else if (std::strcmp(argv[i], "--seed") == 0) {
      if (!absl::SimpleAtoi(argv[i + 1], &pollux.search.seed)) {
        std::fprintf(stderr, "cluster_bench: --seed needs a non-negative integer\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--pollux-speedups") == 0) {
      const std::string value = argv[i + 1];
      if (value != "fair-share" && value != "one-gpu") {
        std::fprintf(stderr, "cluster_bench: --pollux-speedups is fair-share or one-gpu\n");
        return 2;
      }
      pollux.normalise_to_fair_share = value == "fair-share";
    }
  }
  auto apps = LoadPolluxApplications(data + "/cluster/pollux/apps");
  if (!apps.ok()) {
    std::fprintf(stderr, "cluster_bench: %s\n", std::string(apps.status().message()).c_str());
    return 2;
  }
  const ClusterView cluster = ClusterView::Homogeneous(16, 4);
  std::printf("Average JCT (hours), 16 nodes x 4 GPUs; published: Pollux artifact summary.json\n");
  std::printf("%-10s %-9s %9s %9s %8s %8s %6s %8s %9s\n", "policy", "workload", "avg_jct_h",
              "published", "error", "p99_h", "util", "max_ftf", "seconds");
  // policy -> workload -> {average, p99} JCT, for the check of tandem's policy at the end.
  std::map<std::string, std::map<int, std::pair<double, double>>> jcts;
  for (const std::string& name : policies) {
    double sum = 0, sum_published = 0, sum_seconds = 0;
    int count = 0;
    for (int w : workloads) {
      auto workload = ReadPolluxWorkload(
          absl::StrFormat("%s/cluster/pollux/workloads/workload-%d.csv", data, w));
      absl::StatusOr<std::unique_ptr<Policy>> policy =
          name == "pollux" ? MakePolluxPolicy(pollux) : MakePolicy(name);
      if (!workload.ok() || !policy.ok()) {
        std::fprintf(stderr, "cluster_bench: %s\n",
                     std::string((workload.ok() ? policy.status() : workload.status()).message())
                         .c_str());
        return 2;
      }
      const auto start = std::chrono::steady_clock::now();
      auto result = Simulate(*workload, *apps, cluster, **policy);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!result.ok()) {
        std::fprintf(stderr, "cluster_bench: %s\n", std::string(result.status().message()).c_str());
        return 1;
      }
      const ClusterMetrics m = ComputeMetrics(*result);
      jcts[name][w] = {m.avg_jct_seconds, m.p99_jct_seconds};
      auto published = Published().find(name);
      const double reference = published == Published().end() ? 0 : published->second[w - 1];
      std::printf("%-10s %-9d %9.3f %9s %8s %8.3f %6.3f %8.2f %9.2f\n", name.c_str(), w,
                  m.avg_jct_seconds / 3600,
                  reference > 0 ? absl::StrFormat("%.3f", reference / 3600).c_str() : "-",
                  reference > 0
                      ? absl::StrFormat("%+.1f%%", 100 * (m.avg_jct_seconds / reference - 1)).c_str()
                      : "-",
                  m.p99_jct_seconds / 3600, m.utilisation, m.max_ftf, seconds);
      std::fflush(stdout);  // rows as they finish when the output is a file
      sum += m.avg_jct_seconds;
      sum_published += reference;
      sum_seconds += seconds;
      ++count;
    }
    if (count > 0) {
      std::printf("%-10s %-9s %9.3f %9s %8s %8s %6s %8s %9.2f\n", name.c_str(), "mean",
                  sum / count / 3600,
                  sum_published > 0 ? absl::StrFormat("%.3f", sum_published / count / 3600).c_str()
                                    : "-",
                  sum_published > 0
                      ? absl::StrFormat("%+.1f%%", 100 * (sum / sum_published - 1)).c_str()
                      : "-",
                  "", "", "", sum_seconds);
    }
  }
  // tandem's goal (issue #11): average and p99 JCT at or below Pollux's, below every other
  // policy's, on each workload; with the uniform 30 s restart (tandem) and with the elastic
  // layer's costs (tandem-elastic).
  for (const std::string& mine : {"tandem", "tandem-elastic"}) {
    if (jcts.count(mine) == 0) continue;
    for (int w : workloads) {
      const auto [avg, p99] = jcts[mine][w];
      std::string verdict;
      for (const auto& [other, rows] : jcts) {
        if (other == "tandem" || other == "tandem-elastic" || rows.count(w) == 0) continue;
        const auto [other_avg, other_p99] = rows.at(w);
        const bool ok = other == "pollux" ? avg <= other_avg && p99 <= other_p99
                                          : avg < other_avg && p99 < other_p99;
        verdict += absl::StrFormat(" %s:%s(%+.1f%%/%+.1f%%)", other, ok ? "ok" : "NOT",
                                   100 * (avg / other_avg - 1), 100 * (p99 / other_p99 - 1));
      }
      std::printf("check %-14s workload %d avg/p99 vs%s\n", mine.c_str(), w, verdict.c_str());
    }
  }
  return 0;
}
