// Tests of Pollux's allocation search: the objective against its formula, the search against a
// brute-force optimum on tiny clusters, feasibility of every answer, the restart penalty,
// non-preemptible jobs, warm starts and determinism.
#include "cluster/pollux_search.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace tandem::cluster {
namespace {

using State = std::vector<std::vector<int>>;

std::vector<std::string> Ids(int count, const std::string& prefix = "job") {
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) ids.push_back(prefix + std::to_string(i));
  return ids;
}

// A speedup table with diminishing returns in replicas and a penalty for spreading over nodes,
// drawn at random.
std::function<double(int, int)> RandomSpeedup(std::mt19937_64& rng, int max_replicas) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> by_replicas(max_replicas + 1, 0.0);
  double value = 0;
  double step = 0.5 + unit(rng);
  for (int r = 1; r <= max_replicas; ++r) {
    value += step;
    step *= 0.4 + 0.6 * unit(rng);
    by_replicas[r] = value;
  }
  const double spread_penalty = 0.3 * unit(rng);
  return [by_replicas, spread_penalty](int nodes, int replicas) {
    // Non-preemptible jobs may hold more than max_replicas; they get the largest entry.
    const int r = std::min<int>(replicas, static_cast<int>(by_replicas.size()) - 1);
    return by_replicas[r] * std::pow(1.0 - spread_penalty, nodes - 1);
  };
}

// Every feasible state of a tiny problem; returns the best objective.
double BruteForceBest(const std::vector<PolluxJob>& jobs, const std::vector<int>& gpus,
                      const PolluxSearchOptions& options, State* best_state) {
  const int num_jobs = static_cast<int>(jobs.size());
  const int num_nodes = static_cast<int>(gpus.size());
  State state(num_jobs, std::vector<int>(num_nodes, 0));
  double best = -1;
  while (true) {
    if (IsFeasiblePolluxState(jobs, state, gpus, options)) {
      const double value = PolluxObjective(jobs, state, gpus, options);
      if (value > best) {
        best = value;
        *best_state = state;
      }
    }
    // Next state, as a mixed-radix counter.
    int j = 0, n = 0;
    for (;;) {
      if (state[j][n] < gpus[n]) {
        ++state[j][n];
        break;
      }
      state[j][n] = 0;
      if (++n == num_nodes) {
        n = 0;
        if (++j == num_jobs) return best;
      }
    }
  }
}

// A random tiny problem: random speedups, limits, ages, restarts and current allocations that
// respect node capacity; sometimes a non-preemptible job.
std::vector<PolluxJob> RandomProblem(std::mt19937_64& rng, int num_jobs,
                                     const std::vector<int>& gpus) {
  const int num_nodes = static_cast<int>(gpus.size());
  int cluster_gpus = 0;
  for (int g : gpus) cluster_gpus += g;
  std::vector<int> free = gpus;
  std::vector<PolluxJob> jobs(num_jobs);
  for (PolluxJob& job : jobs) {
    job.max_replicas = 1 + static_cast<int>(rng() % cluster_gpus);
    job.min_replicas = rng() % 4 == 0 ? 2 : 0;
    job.min_replicas = std::min(job.min_replicas, job.max_replicas);
    job.speedup = RandomSpeedup(rng, job.max_replicas);
    job.age_seconds = static_cast<double>(rng() % 2000);
    job.num_restarts = static_cast<int>(rng() % 4);
    job.current.assign(num_nodes, 0);
    for (int n = 0; n < num_nodes; ++n) {
      if (rng() % 2 == 0) continue;
      const int v = static_cast<int>(rng() % (free[n] + 1));
      job.current[n] = v;
      free[n] -= v;
    }
  }
  if (rng() % 3 == 0) jobs[rng() % num_jobs].preemptible = false;
  return jobs;
}

TEST(PolluxObjectiveTest, MatchesTheFormula) {
  // Two nodes of two GPUs; speedup = replicas.
  std::vector<int> gpus = {2, 2};
  std::vector<PolluxJob> jobs(2);
  for (PolluxJob& job : jobs) {
    job.speedup = [](int, int replicas) { return static_cast<double>(replicas); };
    job.max_replicas = 4;
  }
  jobs[0].current = {2, 0};
  jobs[0].age_seconds = 500;
  jobs[1].current = {0, 0};
  jobs[1].age_seconds = 60;
  jobs[1].num_restarts = 1;
  const State state = {{2, 0}, {0, 1}};
  PolluxSearchOptions options;
  // Job 0 keeps its allocation: 2 replicas * (1/4 GPUs) * 2 nodes = 1. Job 1 starts: 1 * 1/4 * 2
  // = 0.5, times the penalty (60 - 1 * 30) / (60 + 30) = 1/3.
  const double scaled0 = 1.0;
  const double scaled1 = 0.5 * (30.0 / 90.0);
  EXPECT_NEAR(PolluxObjective(jobs, state, gpus, options),
              2.0 / (1.0 / (scaled0 + 1e-3) + 1.0 / (scaled1 + 1e-3)), 1e-12);
  options.p = 1;
  EXPECT_NEAR(PolluxObjective(jobs, state, gpus, options), (scaled0 + scaled1 + 2e-3) / 2, 1e-12);
  options.p = 0;
  EXPECT_NEAR(PolluxObjective(jobs, state, gpus, options), std::sqrt(scaled0 * scaled1), 1e-12);
  // A starved job counts as 1e-3 and dominates the harmonic mean.
  options.p = -1;
  EXPECT_NEAR(PolluxObjective(jobs, {{2, 0}, {0, 0}}, gpus, options),
              2.0 / (1.0 / (scaled0 + 1e-3) + 1.0 / 1e-3), 1e-12);
  // Shapes that disagree give NaN.
  EXPECT_TRUE(std::isnan(PolluxObjective(jobs, {{2, 0}}, gpus, options)));
}

TEST(PolluxFeasibilityTest, Rules) {
  std::vector<int> gpus = {2, 2};
  std::vector<PolluxJob> jobs(2);
  for (PolluxJob& job : jobs) {
    job.speedup = [](int, int r) { return 1.0 * r; };
    job.max_replicas = 3;
    job.current = {0, 0};
  }
  PolluxSearchOptions options;
  EXPECT_TRUE(IsFeasiblePolluxState(jobs, {{2, 1}, {0, 1}}, gpus, options));
  EXPECT_FALSE(IsFeasiblePolluxState(jobs, {{2, 2}, {0, 0}}, gpus, options));  // max_replicas
  EXPECT_FALSE(IsFeasiblePolluxState(jobs, {{2, 1}, {0, 2}}, gpus, options));  // capacity
  EXPECT_FALSE(IsFeasiblePolluxState(jobs, {{1, 1}, {1, 1}}, gpus, options));  // two distributed
  jobs[1].min_replicas = 2;
  EXPECT_FALSE(IsFeasiblePolluxState(jobs, {{2, 1}, {0, 1}}, gpus, options));  // min_replicas
  options.max_nodes_per_job = 1;
  EXPECT_FALSE(IsFeasiblePolluxState(jobs, {{2, 1}, {0, 0}}, gpus, options));  // node cap
}

class PolluxBruteForceTest : public ::testing::TestWithParam<int> {};

TEST_P(PolluxBruteForceTest, FindsTheOptimum) {
  const int instance = GetParam();
  std::mt19937_64 rng(1000 + instance);
  const std::vector<std::vector<int>> clusters = {{2, 2}, {2, 2}, {2, 2, 2}, {4, 3}};
  const std::vector<int> gpus = clusters[instance % clusters.size()];
  const int num_jobs = instance % 2 == 0 ? 2 : 3;
  const std::vector<PolluxJob> jobs = RandomProblem(rng, num_jobs, gpus);
  PolluxSearchOptions options;
  options.seed = 7 + instance;
  State best_state;
  const double best = BruteForceBest(jobs, gpus, options, &best_state);
  for (bool utility_objective : {true, false}) {
    options.utility_objective = utility_objective;
    PolluxSearch search(options);
    auto result = search.Optimize(Ids(num_jobs), jobs, gpus);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(IsFeasiblePolluxState(jobs, *result, gpus, options));
    const double found = PolluxObjective(jobs, *result, gpus, options);
    EXPECT_NEAR(found, best, 1e-12 * best)
        << "instance " << instance << (utility_objective ? " (NSGA-II)" : " (one objective)");
    EXPECT_DOUBLE_EQ(search.last_stats().best_objective, found);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyClusters, PolluxBruteForceTest, ::testing::Range(0, 24));

TEST(PolluxSearchTest, RestartPenaltyKeepsAnAllocationWhenAChangeGainsLittle) {
  // One job on one GPU; a second GPU on the same node gains 5 %, spreading over both nodes
  // gains 4 % per replica (16 % with all four GPUs).
  std::vector<int> gpus = {2, 2};
  PolluxJob job;
  job.speedup = [](int nodes, int replicas) {
    if (replicas == 1) return 1.0;
    return nodes == 1 ? 1.05 : 1.0 + 0.04 * replicas;
  };
  job.max_replicas = 4;
  job.current = {1, 0};
  PolluxSearchOptions options;

  // A young job that restarted once: penalty (300 - 30) / (300 + 30) = 0.82, so it stays.
  job.age_seconds = 300;
  job.num_restarts = 1;
  {
    PolluxSearch search(options);
    auto result = search.Optimize({"a"}, {job}, gpus);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(*result, State({{1, 0}}));
  }
  // An old job that never restarted pays almost nothing, so it takes all four GPUs.
  job.age_seconds = 1e6;
  job.num_restarts = 0;
  {
    PolluxSearch search(options);
    auto result = search.Optimize({"a"}, {job}, gpus);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(*result, State({{2, 2}}));
  }
  // With a zero restart delay the penalty vanishes whatever the age.
  job.age_seconds = 300;
  job.num_restarts = 1;
  options.restart_delay_seconds = 0;
  {
    PolluxSearch search(options);
    auto result = search.Optimize({"a"}, {job}, gpus);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(*result, State({{2, 2}}));
  }
}

TEST(PolluxSearchTest, FairnessGivesEveryJobSomething) {
  // Four jobs, four GPUs, perfectly scaling jobs: the harmonic mean wants one GPU each.
  std::vector<int> gpus = {2, 2};
  std::vector<PolluxJob> jobs(4);
  for (PolluxJob& job : jobs) {
    job.speedup = [](int, int replicas) { return 1.0 * replicas; };
    job.max_replicas = 4;
    job.current = {0, 0};
    job.age_seconds = 1e6;
  }
  jobs[0].current = {2, 2};  // one job holds everything now
  PolluxSearch search;
  auto result = search.Optimize(Ids(4), jobs, gpus);
  ASSERT_TRUE(result.ok()) << result.status();
  for (const auto& row : *result) EXPECT_EQ(row[0] + row[1], 1);
}

TEST(PolluxSearchTest, NonPreemptibleJobKeepsItsAllocation) {
  std::mt19937_64 rng(5);
  std::vector<int> gpus = {4, 4, 4};
  std::vector<PolluxJob> jobs = RandomProblem(rng, 5, gpus);
  for (PolluxJob& job : jobs) job.preemptible = true;
  jobs[3].preemptible = false;
  jobs[3].current = {0, 3, 1};  // distributed, and over its max_replicas: still kept
  jobs[3].max_replicas = 2;
  jobs[3].speedup = [](int, int) { return 0.1; };
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (j != 3) jobs[j].current = {0, 0, 0};
  }
  PolluxSearchOptions options;
  PolluxSearch search(options);
  auto result = search.Optimize(Ids(5), jobs, gpus);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ((*result)[3], std::vector<int>({0, 3, 1}));
  EXPECT_TRUE(IsFeasiblePolluxState(jobs, *result, gpus, options));
}

// A 30-job, 16-node round like the simulator's: 4 GPUs per node.
std::vector<PolluxJob> LargeProblem(std::mt19937_64& rng, int num_jobs, int num_nodes) {
  std::vector<int> gpus(num_nodes, 4);
  std::vector<PolluxJob> jobs = RandomProblem(rng, num_jobs, gpus);
  for (PolluxJob& job : jobs) {
    job.max_replicas = 1 + static_cast<int>(rng() % 32);
    job.min_replicas = std::min(job.min_replicas, job.max_replicas);
    job.speedup = RandomSpeedup(rng, job.max_replicas);
    job.preemptible = rng() % 10 != 0;
  }
  return jobs;
}

TEST(PolluxSearchTest, AnswersAreFeasibleAcrossRounds) {
  std::mt19937_64 rng(11);
  const int num_nodes = 16;
  const std::vector<int> gpus(num_nodes, 4);
  PolluxSearchOptions options;
  PolluxSearch search(options);
  std::vector<PolluxJob> jobs = LargeProblem(rng, 30, num_nodes);
  std::vector<std::string> ids = Ids(30);
  int next_id = 30;
  for (int round = 0; round < 4; ++round) {
    auto result = search.Optimize(ids, jobs, gpus);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->size(), jobs.size());
    EXPECT_TRUE(IsFeasiblePolluxState(jobs, *result, gpus, options)) << "round " << round;
    std::vector<int> used(num_nodes, 0);
    for (size_t j = 0; j < jobs.size(); ++j) {
      int replicas = 0;
      for (int n = 0; n < num_nodes; ++n) {
        used[n] += (*result)[j][n];
        replicas += (*result)[j][n];
      }
      if (jobs[j].preemptible) {
        EXPECT_LE(replicas, jobs[j].max_replicas);
      }
    }
    for (int n = 0; n < num_nodes; ++n) EXPECT_LE(used[n], gpus[n]);
    // Never worse than staying put, when staying put is feasible.
    State current;
    for (const PolluxJob& job : jobs) current.push_back(job.current);
    if (IsFeasiblePolluxState(jobs, current, gpus, options)) {
      EXPECT_GE(PolluxObjective(jobs, *result, gpus, options),
                PolluxObjective(jobs, current, gpus, options));
    }
    // Next round: the answer becomes the current allocation, five jobs finish, five arrive.
    for (size_t j = 0; j < jobs.size(); ++j) {
      jobs[j].current = (*result)[j];
      jobs[j].age_seconds += 60;
    }
    jobs.erase(jobs.begin(), jobs.begin() + 5);
    ids.erase(ids.begin(), ids.begin() + 5);
    std::vector<PolluxJob> arrivals = LargeProblem(rng, 5, num_nodes);
    for (PolluxJob& job : arrivals) {
      job.current.assign(num_nodes, 0);
      job.age_seconds = 30;
      job.num_restarts = 0;
      jobs.push_back(job);
      ids.push_back("job" + std::to_string(next_id++));
    }
  }
}

TEST(PolluxSearchTest, WarmStartNeverLosesTheBest) {
  std::mt19937_64 rng(3);
  const std::vector<int> gpus(16, 4);
  std::vector<PolluxJob> jobs = LargeProblem(rng, 30, 16);
  PolluxSearchOptions options;
  options.generations = 20;
  PolluxSearch search(options);
  auto first = search.Optimize(Ids(30), jobs, gpus);
  ASSERT_TRUE(first.ok()) << first.status();
  const double first_value = PolluxObjective(jobs, *first, gpus, options);
  auto second = search.Optimize(Ids(30), jobs, gpus);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GE(PolluxObjective(jobs, *second, gpus, options), first_value);
  // A fresh search with the same budget starts from the current allocation only.
  search.Reset();
  auto third = search.Optimize(Ids(30), jobs, gpus);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(IsFeasiblePolluxState(jobs, *third, gpus, options));
}

TEST(PolluxSearchTest, DeterministicForASeed) {
  std::mt19937_64 rng(21);
  const std::vector<int> gpus(16, 4);
  const std::vector<PolluxJob> jobs = LargeProblem(rng, 30, 16);
  PolluxSearchOptions options;
  options.seed = 99;
  PolluxSearch a(options), b(options);
  for (int round = 0; round < 3; ++round) {
    auto result_a = a.Optimize(Ids(30), jobs, gpus);
    auto result_b = b.Optimize(Ids(30), jobs, gpus);
    ASSERT_TRUE(result_a.ok() && result_b.ok());
    EXPECT_EQ(*result_a, *result_b) << "round " << round;
    EXPECT_EQ(a.last_stats().evaluations, b.last_stats().evaluations);
  }
}

TEST(PolluxSearchTest, MinReplicasAreRespected) {
  std::vector<int> gpus = {2, 2};
  std::vector<PolluxJob> jobs(2);
  for (PolluxJob& job : jobs) {
    job.speedup = [](int, int replicas) { return 1.0 * replicas; };
    job.max_replicas = 4;
    job.current = {0, 0};
    job.age_seconds = 1e6;
  }
  jobs[1].min_replicas = 3;
  PolluxSearchOptions options;
  PolluxSearch search(options);
  auto result = search.Optimize(Ids(2), jobs, gpus);
  ASSERT_TRUE(result.ok()) << result.status();
  const int replicas = (*result)[1][0] + (*result)[1][1];
  EXPECT_TRUE(replicas == 0 || replicas >= 3);
  State best;
  EXPECT_NEAR(PolluxObjective(jobs, *result, gpus, options),
              BruteForceBest(jobs, gpus, options, &best), 1e-12);
}

TEST(PolluxSearchTest, EmptyInputs) {
  PolluxSearch search;
  auto none = search.Optimize({}, {}, {4, 4});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  PolluxJob job;
  job.speedup = [](int, int r) { return 1.0 * r; };
  job.max_replicas = 2;
  auto no_nodes = search.Optimize({"a"}, {job}, {});
  ASSERT_TRUE(no_nodes.ok());
  EXPECT_EQ(*no_nodes, State({{}}));
}

TEST(PolluxSearchTest, RejectsBadInput) {
  PolluxJob job;
  job.speedup = [](int, int r) { return 1.0 * r; };
  job.max_replicas = 2;
  job.current = {0, 0};
  const std::vector<int> gpus = {2, 2};
  PolluxSearch search;
  auto code = [&](const std::vector<std::string>& ids, const std::vector<PolluxJob>& jobs,
                  const std::vector<int>& g) { return search.Optimize(ids, jobs, g).status().code(); };
  EXPECT_EQ(code({"a", "b"}, {job}, gpus), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"a", "a"}, {job, job}, gpus), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"a"}, {job}, {2, 2, 2}), absl::StatusCode::kInvalidArgument);  // current size
  EXPECT_EQ(code({"a"}, {job}, {2, 300}), absl::StatusCode::kInvalidArgument);
  PolluxJob bad = job;
  bad.current = {3, 0};
  EXPECT_EQ(code({"a"}, {bad}, gpus), absl::StatusCode::kInvalidArgument);
  bad = job;
  bad.min_replicas = 3;
  EXPECT_EQ(code({"a"}, {bad}, gpus), absl::StatusCode::kInvalidArgument);
  bad = job;
  bad.speedup = nullptr;
  EXPECT_EQ(code({"a"}, {bad}, gpus), absl::StatusCode::kInvalidArgument);
  bad = job;
  bad.speedup = [](int, int) { return std::nan(""); };
  EXPECT_EQ(code({"a"}, {bad}, gpus), absl::StatusCode::kInvalidArgument);
  PolluxJob pinned = job;
  pinned.preemptible = false;
  pinned.current = {2, 0};
  EXPECT_EQ(code({"a", "b"}, {pinned, pinned}, gpus), absl::StatusCode::kInvalidArgument);
  PolluxSearchOptions options;
  options.population = 0;
  PolluxSearch bad_options(options);
  EXPECT_EQ(bad_options.Optimize({"a"}, {job}, gpus).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A good call after the failures still works.
  EXPECT_TRUE(search.Optimize({"a"}, {job}, gpus).ok());
}

}  // namespace
}  // namespace tandem::cluster
