// Times Pollux's allocation search on rounds like the scheduling simulator's: 16 nodes of 4 GPUs
// (Pollux's simulated cluster), 10 to 40 active jobs, a 60 s round, a few jobs finishing and
// arriving between rounds, the search warm-started from the previous round. Prints wall time per
// call (one core), states evaluated and speedup calls, the objective against keeping the
// current allocation, and against a much longer search.
//
//   pollux_search_bench [--quick]      (--quick: fewer rounds)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cluster/pollux_search.h"

namespace tandem::cluster {
namespace {

// A goodput-shaped speedup: throughput grows with replicas, with a cost for crossing nodes, and
// statistical efficiency falls as the batch grows past the job's gradient noise scale.
PolluxJob MakeJob(std::mt19937_64& rng, int num_nodes) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double network_cost = 0.05 + 0.3 * unit(rng);
  const double noise_scale = 2.0 + 30.0 * unit(rng);
  PolluxJob job;
  job.speedup = [network_cost, noise_scale](int nodes, int replicas) {
    const double throughput = replicas / (1.0 + network_cost * (nodes > 1 ? 1 : 0) +
                                          0.02 * (nodes - 1));
    const double efficiency = (noise_scale + 1.0) / (noise_scale + replicas);
    return throughput * efficiency;
  };
  const int limits[] = {4, 8, 16, 32, 64};
  job.max_replicas = limits[rng() % 5];
  job.current.assign(num_nodes, 0);
  job.age_seconds = 0;
  return job;
}

struct Summary {
  double mean_ms = 0, max_ms = 0;
  double mean_evaluations = 0, mean_speedup_calls = 0;
  double mean_gain = 0;  // objective of the answer / objective of keeping the allocation
  // Every fifth round: the answer's objective over that of a fresh, much longer search
  // (population 200, 500 generations) on the same round.
  double mean_vs_long = 0, min_vs_long = 0;
  int long_runs = 0;
};

Summary Run(int active_jobs, int rounds, uint64_t seed, bool utility_objective,
            bool compare_with_long) {
  const int num_nodes = 16;
  const std::vector<int> gpus(num_nodes, 4);
  std::mt19937_64 rng(seed);
  PolluxSearchOptions options;
  options.seed = seed;
  options.utility_objective = utility_objective;
  PolluxSearch search(options);
  std::vector<PolluxJob> jobs;
  std::vector<std::string> ids;
  int next_id = 0;
  auto arrive = [&]() {
    jobs.push_back(MakeJob(rng, num_nodes));
    ids.push_back("job" + std::to_string(next_id++));
  };
  for (int i = 0; i < active_jobs; ++i) arrive();
  Summary summary;
  int counted = 0;
  for (int round = 0; round < rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    auto result = search.Optimize(ids, jobs, gpus);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count();
    if (!result.ok()) {
      std::cerr << result.status() << "\n";
      std::exit(1);
    }
    std::vector<std::vector<int>> current;
    for (const PolluxJob& job : jobs) current.push_back(job.current);
    const double kept = PolluxObjective(jobs, current, gpus, options);
    const double found = PolluxObjective(jobs, *result, gpus, options);
    if (round > 0) {  // the first round starts from nothing
      summary.mean_ms += ms;
      summary.max_ms = std::max(summary.max_ms, ms);
      summary.mean_evaluations += search.last_stats().evaluations;
      summary.mean_speedup_calls += search.last_stats().speedup_calls;
      summary.mean_gain += found / kept;
      ++counted;
      if (compare_with_long && round % 5 == 0) {
        PolluxSearchOptions long_options = options;
        long_options.utility_objective = true;
        long_options.population = 200;
        long_options.generations = 500;
        PolluxSearch long_search(long_options);
        auto long_result = long_search.Optimize(ids, jobs, gpus);
        if (!long_result.ok()) {
          std::cerr << long_result.status() << "\n";
          std::exit(1);
        }
        const double ratio = found / PolluxObjective(jobs, *long_result, gpus, options);
        summary.mean_vs_long += ratio;
        summary.min_vs_long = summary.long_runs == 0 ? ratio : std::min(summary.min_vs_long, ratio);
        ++summary.long_runs;
      }
    }
    // Apply the answer, age the jobs by one round, replace about a tenth of them.
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (jobs[j].current != (*result)[j] &&
          std::any_of(jobs[j].current.begin(), jobs[j].current.end(), [](int v) { return v; })) {
        ++jobs[j].num_restarts;
      }
      jobs[j].current = (*result)[j];
      jobs[j].age_seconds += 60;
    }
    const int leaving = std::max(1, active_jobs / 10);
    for (int i = 0; i < leaving; ++i) {
      const size_t victim = rng() % jobs.size();
      jobs.erase(jobs.begin() + victim);
      ids.erase(ids.begin() + victim);
      arrive();
    }
  }
  summary.mean_ms /= counted;
  summary.mean_evaluations /= counted;
  summary.mean_speedup_calls /= counted;
  summary.mean_gain /= counted;
  if (summary.long_runs > 0) summary.mean_vs_long /= summary.long_runs;
  return summary;
}

}  // namespace
}  // namespace tandem::cluster

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int rounds = quick ? 5 : 30;
  std::cout << "Pollux allocation search, 16 nodes x 4 GPUs, population 100, 100 generations, "
            << rounds << " rounds (warm-started; first round excluded)\n";
  std::cout << absl::StrFormat("%-14s %6s %9s %9s %12s %14s %8s %22s\n", "search", "jobs",
                               "mean ms", "max ms", "evaluations", "speedup calls", "gain",
                               "vs long search (min)");
  for (bool utility_objective : {true, false}) {
  for (int active : {10, 20, 30, 40}) {
    const auto s = tandem::cluster::Run(active, rounds, /*seed=*/1, utility_objective,
                                        /*compare_with_long=*/!quick);
    std::cout << absl::StrFormat("%-14s %6d %9.2f %9.2f %12.0f %14.0f %8.3f",
                                 utility_objective ? "NSGA-II" : "one objective", active,
                                 s.mean_ms, s.max_ms, s.mean_evaluations, s.mean_speedup_calls,
                                 s.mean_gain);
    if (s.long_runs > 0) {
      std::cout << absl::StrFormat(" %14.4f (%.4f)", s.mean_vs_long, s.min_vs_long);
    }
    std::cout << "\n";
  }
  }
  std::cout << "gain: objective of the answer over keeping the current allocation; vs long search:"
               " over a fresh search with population 200 and 500 generations (every 5th round)\n";
  return 0;
}
