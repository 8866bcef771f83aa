// Gavel's max-min fairness LP: hand-solved cases, a brute-force grid search over all time shares
// of two jobs on two device types, the constraints and the sharing-incentive bound on random
// clusters, water-filling handing out capacity the basic LP leaves idle, the round-based
// mechanism converging to the time shares, and bad input.
#include "cluster/gavel_lp.h"

#include <glpk.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>

#include "gtest/gtest.h"

namespace tandem::cluster {
namespace {

constexpr double kTolerance = 1e-6;

GavelSolution SolveOrDie(const GavelProblem& problem, bool water_filling = true) {
  GavelOptions options;
  options.water_filling = water_filling;
  absl::StatusOr<GavelSolution> solution = SolveMaxMinFairness(problem, options);
  EXPECT_TRUE(solution.ok()) << solution.status();
  return solution.ok() ? *solution : GavelSolution{};
}

double Weight(const GavelProblem& problem, int job) {
  return problem.priority_weight.empty() ? 1.0 : problem.priority_weight[job];
}

// Every constraint of the LP, and normalized_throughput consistent with the time shares.
void ExpectFeasible(const GavelProblem& problem, const GavelSolution& solution) {
  const int jobs = static_cast<int>(problem.throughput.size());
  const int types = static_cast<int>(problem.devices_per_type.size());
  ASSERT_EQ(solution.time_share.size(), jobs);
  ASSERT_EQ(solution.normalized_throughput.size(), jobs);
  std::vector<double> used(types, 0.0);
  for (int j = 0; j < jobs; ++j) {
    ASSERT_EQ(solution.time_share[j].size(), types);
    double time = 0, throughput = 0;
    for (int k = 0; k < types; ++k) {
      const double x = solution.time_share[j][k];
      EXPECT_GE(x, 0.0);
      EXPECT_LE(x, 1.0);
      if (problem.throughput[j][k] == 0 ||
          problem.scale_factor[j] > problem.devices_per_type[k]) {
        EXPECT_EQ(x, 0.0) << "job " << j << " placed on type " << k << " where it cannot run";
      }
      time += x;
      throughput += problem.throughput[j][k] * x;
      used[k] += problem.scale_factor[j] * x;
    }
    EXPECT_LE(time, 1 + kTolerance) << "job " << j;
    EXPECT_NEAR(solution.normalized_throughput[j],
                throughput / solution.equal_share_throughput[j], kTolerance);
    EXPECT_GE(solution.normalized_throughput[j] / Weight(problem, j),
              solution.objective * (1 - kTolerance))
        << "job " << j;
  }
  for (int k = 0; k < types; ++k) {
    EXPECT_LE(used[k], problem.devices_per_type[k] + kTolerance) << "type " << k;
  }
}

TEST(GavelLpTest, SingleTypeGivesEqualShares) {
  GavelProblem problem;
  problem.throughput = {{1.0}, {2.0}, {5.0}, {0.5}};  // speeds do not matter with one type
  problem.scale_factor = {1, 1, 1, 1};
  problem.devices_per_type = {2};
  for (bool water_filling : {false, true}) {
    GavelSolution solution = SolveOrDie(problem, water_filling);
    ExpectFeasible(problem, solution);
    EXPECT_NEAR(solution.objective, 1.0, kTolerance);
    for (int j = 0; j < 4; ++j) {
      EXPECT_NEAR(solution.time_share[j][0], 0.5, kTolerance) << "job " << j;
      EXPECT_NEAR(solution.normalized_throughput[j], 1.0, kTolerance);
      EXPECT_NEAR(solution.equal_share_throughput[j], 0.5 * problem.throughput[j][0], kTolerance);
    }
  }
}

TEST(GavelLpTest, SingleTypeSharesDeviceTimeEquallyAcrossScaleFactors) {
  // Two devices, jobs on 1, 1 and 2 devices: each should hold 2/3 of a device on average, so
  // the 2-device job runs half as often.
  GavelProblem problem;
  problem.throughput = {{1.0}, {3.0}, {10.0}};
  problem.scale_factor = {1, 1, 2};
  problem.devices_per_type = {2};
  GavelSolution solution = SolveOrDie(problem);
  ExpectFeasible(problem, solution);
  EXPECT_NEAR(solution.objective, 1.0, kTolerance);
  EXPECT_NEAR(solution.time_share[0][0], 2.0 / 3, kTolerance);
  EXPECT_NEAR(solution.time_share[1][0], 2.0 / 3, kTolerance);
  EXPECT_NEAR(solution.time_share[2][0], 1.0 / 3, kTolerance);
}

TEST(GavelLpTest, PriorityWeightsScaleTheShares) {
  GavelProblem problem;
  problem.throughput = {{1.0}, {1.0}};
  problem.scale_factor = {1, 1};
  problem.priority_weight = {1.0, 2.0};
  problem.devices_per_type = {1};
  GavelSolution solution = SolveOrDie(problem);
  ExpectFeasible(problem, solution);
  EXPECT_NEAR(solution.time_share[0][0], 1.0 / 3, kTolerance);
  EXPECT_NEAR(solution.time_share[1][0], 2.0 / 3, kTolerance);
  EXPECT_NEAR(solution.objective, 2.0 / 3, kTolerance);
}

// The best min_j normalized/weight over all time shares of two jobs on two types in steps of
// `step`, each satisfying every constraint.
double BruteForceTwoByTwo(const GavelProblem& problem, const std::vector<double>& equal_share,
                          double step) {
  const int steps = static_cast<int>(std::lround(1 / step));
  std::vector<std::pair<double, double>> rows;  // (x0, x1) with x0 + x1 <= 1
  for (int a = 0; a <= steps; ++a) {
    for (int b = 0; a + b <= steps; ++b) rows.push_back({a * step, b * step});
  }
  auto usable = [&](int j, int k) {
    return problem.throughput[j][k] > 0 && problem.scale_factor[j] <= problem.devices_per_type[k];
  };
  auto level = [&](int j, const std::pair<double, double>& x) {
    double throughput = (usable(j, 0) ? problem.throughput[j][0] * x.first : 0) +
                        (usable(j, 1) ? problem.throughput[j][1] * x.second : 0);
    return throughput / (Weight(problem, j) * equal_share[j]);
  };
  const double slack = 1e-12;
  double best = -1;
  for (const auto& x0 : rows) {
    const double level0 = level(0, x0);
    if (level0 <= best) continue;
    for (const auto& x1 : rows) {
      if (problem.scale_factor[0] * x0.first + problem.scale_factor[1] * x1.first >
              problem.devices_per_type[0] + slack ||
          problem.scale_factor[0] * x0.second + problem.scale_factor[1] * x1.second >
              problem.devices_per_type[1] + slack) {
        continue;
      }
      best = std::max(best, std::min(level0, level(1, x1)));
    }
  }
  return best;
}

TEST(GavelLpTest, ComplementarySpeedupsGiveEachJobItsFastType) {
  // Job 0 is 3x faster on type 1, job 1 is 3x faster on type 0.
  GavelProblem problem;
  problem.throughput = {{1.0, 3.0}, {3.0, 1.0}};
  problem.scale_factor = {1, 1};
  problem.devices_per_type = {1, 1};
  GavelSolution solution = SolveOrDie(problem);
  ExpectFeasible(problem, solution);
  EXPECT_NEAR(solution.time_share[0][1], 1.0, kTolerance);
  EXPECT_NEAR(solution.time_share[1][0], 1.0, kTolerance);
  // Equal share: half of each device, throughput (1 + 3) / 2 = 2; alone on its fast type: 3.
  EXPECT_NEAR(solution.objective, 1.5, kTolerance);

  const double brute = BruteForceTwoByTwo(problem, solution.equal_share_throughput, 0.01);
  EXPECT_GE(solution.objective, brute - kTolerance);
  EXPECT_LE(solution.objective - brute, 1e-2);
}

TEST(GavelLpTest, MatchesBruteForceOnTwoJobsTwoTypes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> speed(0.2, 5.0);
  std::uniform_int_distribution<int> devices(1, 3);
  std::uniform_int_distribution<int> scale(1, 2);
  std::uniform_real_distribution<double> weight(0.5, 2.0);
  for (int trial = 0; trial < 12; ++trial) {
    GavelProblem problem;
    problem.throughput = {{speed(rng), speed(rng)}, {speed(rng), speed(rng)}};
    if (trial % 4 == 3) problem.throughput[trial % 2][trial % 3 == 0 ? 0 : 1] = 0;
    problem.scale_factor = {scale(rng), scale(rng)};
    problem.priority_weight = {weight(rng), weight(rng)};
    problem.devices_per_type = {devices(rng), devices(rng)};
    // Keep each job runnable somewhere.
    for (int j = 0; j < 2; ++j) {
      bool runs = false;
      for (int k = 0; k < 2; ++k) {
        runs = runs || (problem.throughput[j][k] > 0 &&
                        problem.scale_factor[j] <= problem.devices_per_type[k]);
      }
      if (!runs) problem.scale_factor[j] = 1;
    }
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    GavelSolution solution = SolveOrDie(problem, /*water_filling=*/false);
    ExpectFeasible(problem, solution);
    const double brute = BruteForceTwoByTwo(problem, solution.equal_share_throughput, 0.01);
    EXPECT_GE(solution.objective, brute - kTolerance);
    EXPECT_LE(solution.objective - brute, 1e-2);
    // Water-filling keeps the first level.
    GavelSolution filled = SolveOrDie(problem, /*water_filling=*/true);
    ExpectFeasible(problem, filled);
    EXPECT_NEAR(filled.objective, solution.objective, kTolerance);
  }
}

GavelProblem RandomCluster(std::mt19937& rng, int jobs, bool weighted,
                           bool multi_device = true) {
  std::uniform_real_distribution<double> speed(0.1, 10.0);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_real_distribution<double> weight(0.5, 4.0);
  const int scale_factors[] = {1, 1, 1, 2, 4};
  GavelProblem problem;
  problem.devices_per_type = {8, 4, 2};
  for (int j = 0; j < jobs; ++j) {
    std::vector<double> row;
    for (int k = 0; k < 3; ++k) row.push_back(coin(rng) < 0.2 ? 0.0 : speed(rng));
    if (row[0] == 0) row[0] = speed(rng);  // type 0 fits every scale factor
    problem.throughput.push_back(row);
    const int scale_factor = scale_factors[rng() % 5];
    problem.scale_factor.push_back(multi_device ? scale_factor : 1);
    if (weighted) problem.priority_weight.push_back(weight(rng));
  }
  return problem;
}

TEST(GavelLpTest, RandomClustersRespectCapacityAndSharingIncentive) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    const int jobs = 2 + trial;
    GavelProblem problem = RandomCluster(rng, jobs, /*weighted=*/trial % 2 == 1);
    GavelSolution basic = SolveOrDie(problem, /*water_filling=*/false);
    ExpectFeasible(problem, basic);
    GavelSolution filled = SolveOrDie(problem, /*water_filling=*/true);
    ExpectFeasible(problem, filled);
    EXPECT_NEAR(filled.objective, basic.objective, kTolerance * basic.objective);
    if (problem.priority_weight.empty()) {
      // The equal share is feasible, so nobody does worse than in it.
      EXPECT_GE(basic.objective, 1 - kTolerance);
    }
    // Water-filling uses at least as much of the cluster's weighted throughput.
    double basic_sum = 0, filled_sum = 0;
    for (int j = 0; j < jobs; ++j) {
      basic_sum += basic.normalized_throughput[j] / Weight(problem, j);
      filled_sum += filled.normalized_throughput[j] / Weight(problem, j);
    }
    EXPECT_GE(filled_sum, basic.objective * jobs * (1 - kTolerance));
  }
}

TEST(GavelLpTest, WaterFillingGivesLeftoverCapacityAway) {
  // One device of each type. Job 0 runs only on type 0; job 1 on either. Job 1 can never beat
  // its equal share (it runs at the same speed everywhere and gets at most all of its time), so
  // the max-min level is 1; job 0 can then have all of type 0: twice its equal share.
  GavelProblem problem;
  problem.throughput = {{1.0, 0.0}, {1.0, 1.0}};
  problem.scale_factor = {1, 1};
  problem.devices_per_type = {1, 1};

  GavelSolution basic = SolveOrDie(problem, /*water_filling=*/false);
  ExpectFeasible(problem, basic);
  EXPECT_NEAR(basic.objective, 1.0, kTolerance);

  GavelSolution filled = SolveOrDie(problem, /*water_filling=*/true);
  ExpectFeasible(problem, filled);
  EXPECT_NEAR(filled.objective, 1.0, kTolerance);
  EXPECT_NEAR(filled.time_share[0][0], 1.0, kTolerance);
  EXPECT_NEAR(filled.normalized_throughput[0], 2.0, kTolerance);
  EXPECT_NEAR(filled.normalized_throughput[1], 1.0, kTolerance);
  EXPECT_NEAR(filled.time_share[1][1], 1.0, kTolerance);
}

TEST(GavelLpTest, WaterFillingLevelsAreLexicographic) {
  // Three levels. Job 0 runs only on type 1 (1 device), jobs 1 and 2 only on type 0 (2
  // devices), job 3 on type 0 or type 2 (1 device) at the same speed. Equal share: a quarter
  // of each type's devices. Job 3 can reach at most 1 / 0.75 of its equal share (all its time),
  // which sets the first level; it must do so on type 2 so that jobs 1 and 2 can have type 0 to
  // themselves (level 2), and job 0 has type 1 to itself (level 4).
  GavelProblem problem;
  problem.throughput = {{0.0, 1.0, 0.0}, {1.0, 0.0, 0.0}, {1.0, 0.0, 0.0}, {1.0, 0.0, 1.0}};
  problem.scale_factor = {1, 1, 1, 1};
  problem.devices_per_type = {2, 1, 1};
  GavelSolution filled = SolveOrDie(problem);
  ExpectFeasible(problem, filled);
  EXPECT_NEAR(filled.equal_share_throughput[0], 0.25, kTolerance);
  EXPECT_NEAR(filled.equal_share_throughput[1], 0.5, kTolerance);
  EXPECT_NEAR(filled.equal_share_throughput[3], 0.75, kTolerance);
  EXPECT_NEAR(filled.objective, 4.0 / 3, kTolerance);
  EXPECT_NEAR(filled.normalized_throughput[0], 4.0, kTolerance);
  EXPECT_NEAR(filled.normalized_throughput[1], 2.0, kTolerance);
  EXPECT_NEAR(filled.normalized_throughput[2], 2.0, kTolerance);
  EXPECT_NEAR(filled.normalized_throughput[3], 4.0 / 3, kTolerance);
  EXPECT_NEAR(filled.time_share[3][2], 1.0, kTolerance);
  EXPECT_NEAR(filled.time_share[3][0], 0.0, kTolerance);

  GavelSolution basic = SolveOrDie(problem, /*water_filling=*/false);
  ExpectFeasible(problem, basic);
  EXPECT_NEAR(basic.objective, 4.0 / 3, kTolerance);
}

TEST(GavelLpTest, WaterFillingSplitsLeftoverCapacityByWeight) {
  // Job 0 (weight 10) alone on type 1 sets the first level at 0.3. Jobs 1 and 2 share type 0;
  // job 2 has weight 2. Lifting the sum of levels would give type 0 to job 1 (its level rises
  // twice as fast per unit of time); max-min over what is left gives job 2 twice job 1's time.
  GavelProblem problem;
  problem.throughput = {{0.0, 1.0}, {1.0, 0.0}, {1.0, 0.0}};
  problem.scale_factor = {1, 1, 1};
  problem.priority_weight = {10.0, 1.0, 2.0};
  problem.devices_per_type = {1, 1};
  GavelSolution filled = SolveOrDie(problem);
  ExpectFeasible(problem, filled);
  EXPECT_NEAR(filled.objective, 0.3, kTolerance);
  EXPECT_NEAR(filled.time_share[0][1], 1.0, kTolerance);
  EXPECT_NEAR(filled.time_share[1][0], 1.0 / 3, kTolerance);
  EXPECT_NEAR(filled.time_share[2][0], 2.0 / 3, kTolerance);
  EXPECT_NEAR(filled.normalized_throughput[1], 1.0, kTolerance);
  EXPECT_NEAR(filled.normalized_throughput[2], 2.0, kTolerance);
}

// The most job `target` can reach (normalised and divided by its weight) while every job i keeps
// at least min(level[i], level[target]): an LP of its own, independent of the solver's.
double BestLevelFor(const GavelProblem& problem, const GavelSolution& solution,
                    const std::vector<double>& level, int target) {
  const int jobs = static_cast<int>(problem.throughput.size());
  const int types = static_cast<int>(problem.devices_per_type.size());
  std::unique_ptr<glp_prob, void (*)(glp_prob*)> lp(glp_create_prob(), glp_delete_prob);
  glp_set_obj_dir(lp.get(), GLP_MAX);
  glp_add_cols(lp.get(), jobs * types);
  glp_add_rows(lp.get(), 2 * jobs + types);
  std::vector<int> rows(1), columns(1);
  std::vector<double> values(1);
  for (int j = 0; j < jobs; ++j) {
    glp_set_row_bnds(lp.get(), 1 + j, GLP_LO, std::min(level[j], level[target]) * (1 - 1e-9), 0);
    glp_set_row_bnds(lp.get(), 1 + jobs + j, GLP_UP, 0, 1);
    for (int k = 0; k < types; ++k) {
      const int column = 1 + j * types + k;
      const bool runs = problem.throughput[j][k] > 0 &&
                        problem.scale_factor[j] <= problem.devices_per_type[k];
      glp_set_col_bnds(lp.get(), column, runs ? GLP_DB : GLP_FX, 0, runs ? 1 : 0);
      const double coefficient =
          problem.throughput[j][k] / (solution.equal_share_throughput[j] * Weight(problem, j));
      if (j == target) glp_set_obj_coef(lp.get(), column, coefficient);
      for (auto [row, value] : {std::pair<int, double>{1 + j, coefficient},
                                {1 + jobs + j, 1.0},
                                {1 + 2 * jobs + k, static_cast<double>(problem.scale_factor[j])}}) {
        rows.push_back(row);
        columns.push_back(column);
        values.push_back(value);
      }
    }
  }
  for (int k = 0; k < types; ++k) {
    glp_set_row_bnds(lp.get(), 1 + 2 * jobs + k, GLP_UP, 0, problem.devices_per_type[k]);
  }
  glp_load_matrix(lp.get(), static_cast<int>(rows.size()) - 1, rows.data(), columns.data(),
                  values.data());
  glp_smcp parameters;
  glp_init_smcp(&parameters);
  parameters.msg_lev = GLP_MSG_OFF;
  parameters.presolve = GLP_ON;
  EXPECT_EQ(glp_simplex(lp.get(), &parameters), 0);
  EXPECT_EQ(glp_get_status(lp.get()), GLP_OPT);
  return glp_get_obj_val(lp.get());
}

// Water-filling's result is the lexicographic max-min: no job can be raised without lowering a
// job at or below its level (raising j while jobs above it stay above its level would improve
// the sorted vector of levels).
TEST(GavelLpTest, WaterFillingIsLexicographicMaxMinOnRandomClusters) {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 12; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    const int jobs = 3 + trial;
    GavelProblem problem = RandomCluster(rng, jobs, /*weighted=*/trial % 3 == 2);
    GavelSolution solution = SolveOrDie(problem);
    ExpectFeasible(problem, solution);
    std::vector<double> level(jobs);
    for (int j = 0; j < jobs; ++j) {
      level[j] = solution.normalized_throughput[j] / Weight(problem, j);
    }
    for (int j = 0; j < jobs; ++j) {
      EXPECT_LE(BestLevelFor(problem, solution, level, j), level[j] * (1 + 1e-5)) << "job " << j;
    }
  }
}

// One row per class of identical jobs (job_count) gives every job the normalised throughput it
// gets with one row each (the lexicographic max-min throughputs are unique).
TEST(GavelLpTest, GroupedIdenticalJobsMatchOneRowEach) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 10; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    GavelProblem grouped = RandomCluster(rng, 2 + trial % 4, /*weighted=*/false);
    GavelProblem expanded;
    expanded.devices_per_type = grouped.devices_per_type;
    std::vector<int> row_of_job;
    for (size_t c = 0; c < grouped.throughput.size(); ++c) {
      const int count = 1 + static_cast<int>(rng() % 4);
      grouped.job_count.push_back(count);
      for (int i = 0; i < count; ++i) {
        expanded.throughput.push_back(grouped.throughput[c]);
        expanded.scale_factor.push_back(grouped.scale_factor[c]);
        row_of_job.push_back(static_cast<int>(c));
      }
    }
    const GavelSolution by_class = SolveOrDie(grouped);
    const GavelSolution by_job = SolveOrDie(expanded);
    ExpectFeasible(expanded, by_job);
    EXPECT_NEAR(by_class.objective, by_job.objective, 1e-6 * by_job.objective);
    std::vector<double> used(grouped.devices_per_type.size(), 0.0);
    for (size_t j = 0; j < row_of_job.size(); ++j) {
      const int c = row_of_job[j];
      EXPECT_NEAR(by_class.normalized_throughput[c], by_job.normalized_throughput[j],
                  1e-5 * by_job.normalized_throughput[j])
          << "job " << j << " of class " << c;
      for (size_t k = 0; k < used.size(); ++k) {
        used[k] += grouped.scale_factor[c] * by_class.time_share[c][k];
      }
    }
    for (size_t k = 0; k < used.size(); ++k) {
      EXPECT_LE(used[k], grouped.devices_per_type[k] + kTolerance) << "type " << k;
    }
  }
  GavelProblem bad;
  bad.throughput = {{1.0}};
  bad.scale_factor = {1};
  bad.devices_per_type = {2};
  bad.job_count = {0};
  EXPECT_EQ(SolveMaxMinFairness(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.job_count = {2};
  auto solution = SolveMaxMinFairness(bad);
  ASSERT_TRUE(solution.ok()) << solution.status();
  EXPECT_NEAR(solution->time_share[0][0], 1.0, kTolerance);  // two jobs, two devices
  EXPECT_EQ(AssignRound(bad, *solution, {{0.0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GavelLpTest, NoJobsIsAnEmptySolution) {
  GavelProblem problem;
  problem.devices_per_type = {4};
  absl::StatusOr<GavelSolution> solution = SolveMaxMinFairness(problem);
  ASSERT_TRUE(solution.ok()) << solution.status();
  EXPECT_TRUE(solution->time_share.empty());
  EXPECT_EQ(solution->objective, 0.0);
}

void ExpectInvalid(const GavelProblem& problem, const std::string& needle) {
  absl::StatusOr<GavelSolution> solution = SolveMaxMinFairness(problem);
  ASSERT_FALSE(solution.ok());
  EXPECT_EQ(solution.status().code(), absl::StatusCode::kInvalidArgument) << solution.status();
  EXPECT_NE(solution.status().message().find(needle), std::string::npos) << solution.status();
}

TEST(GavelLpTest, BadInputIsInvalidArgumentNamingTheJob) {
  GavelProblem good;
  good.throughput = {{1.0, 2.0}, {1.0, 1.0}, {3.0, 0.0}};
  good.scale_factor = {1, 2, 1};
  good.devices_per_type = {2, 2};
  ASSERT_TRUE(SolveMaxMinFairness(good).ok());

  GavelProblem ragged = good;
  ragged.throughput[1] = {1.0};
  ExpectInvalid(ragged, "job 1: throughput row has 1 entries, expected 2");

  GavelProblem negative = good;
  negative.throughput[2][0] = -1;
  ExpectInvalid(negative, "job 2: throughput on device type 0");

  GavelProblem not_a_number = good;
  not_a_number.throughput[0][1] = std::numeric_limits<double>::quiet_NaN();
  ExpectInvalid(not_a_number, "job 0: throughput on device type 1");

  GavelProblem nowhere = good;
  nowhere.throughput[2] = {0.0, 0.0};
  ExpectInvalid(nowhere, "job 2 can run on no device type");

  GavelProblem too_wide = good;
  too_wide.scale_factor[2] = 3;  // no type has 3 devices
  ExpectInvalid(too_wide, "job 2 can run on no device type");

  GavelProblem scale_count = good;
  scale_count.scale_factor.pop_back();
  ExpectInvalid(scale_count, "scale_factor has 2 entries for 3 jobs");

  GavelProblem zero_scale = good;
  zero_scale.scale_factor[1] = 0;
  ExpectInvalid(zero_scale, "job 1: scale_factor is 0");

  GavelProblem weights = good;
  weights.priority_weight = {1.0, 1.0};
  ExpectInvalid(weights, "priority_weight has 2 entries for 3 jobs");

  GavelProblem zero_weight = good;
  zero_weight.priority_weight = {1.0, 0.0, 1.0};
  ExpectInvalid(zero_weight, "job 1: priority_weight is 0");

  GavelProblem negative_devices = good;
  negative_devices.devices_per_type[1] = -1;
  ExpectInvalid(negative_devices, "device type 1: devices_per_type is -1");

  GavelProblem no_types = good;
  no_types.devices_per_type.clear();
  ExpectInvalid(no_types, "no device types");
}

// Runs `rounds` rounds of AssignRound and returns the rounds each job received on each type,
// checking every round's capacity.
std::vector<std::vector<double>> SimulateRounds(const GavelProblem& problem,
                                                const GavelSolution& solution, int rounds) {
  const int jobs = static_cast<int>(problem.throughput.size());
  const int types = static_cast<int>(problem.devices_per_type.size());
  std::vector<std::vector<double>> received(jobs, std::vector<double>(types, 0.0));
  for (int round = 0; round < rounds; ++round) {
    absl::StatusOr<std::vector<int>> placement = AssignRound(problem, solution, received);
    EXPECT_TRUE(placement.ok()) << placement.status();
    if (!placement.ok()) return received;
    EXPECT_EQ(placement->size(), jobs);
    std::vector<int> used(types, 0);
    for (int j = 0; j < jobs; ++j) {
      const int type = (*placement)[j];
      if (type == -1) continue;
      EXPECT_GE(type, 0);
      EXPECT_LT(type, types);
      EXPECT_GT(problem.throughput[j][type], 0) << "job " << j << " placed where it cannot run";
      used[type] += problem.scale_factor[j];
      received[j][type] += 1;
    }
    for (int k = 0; k < types; ++k) {
      EXPECT_LE(used[k], problem.devices_per_type[k]) << "round " << round << " type " << k;
    }
  }
  return received;
}

TEST(GavelRoundTest, SingleTypeRoundsFollowEqualShares) {
  GavelProblem problem;
  problem.throughput = {{1.0}, {2.0}, {5.0}, {0.5}};
  problem.scale_factor = {1, 1, 1, 1};
  problem.devices_per_type = {2};
  GavelSolution solution = SolveOrDie(problem);
  std::vector<std::vector<double>> received = SimulateRounds(problem, solution, 100);
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(received[j][0], 50, 1) << "job " << j;
}

// With single-device jobs any feasible time shares can be delivered by rounds (a fractional
// bipartite assignment is a mix of whole ones), so the rounds must follow them.
TEST(GavelRoundTest, RoundsConvergeToTimeSharesOnAHeterogeneousCluster) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 6; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    GavelProblem problem = RandomCluster(rng, /*jobs=*/6 + 4 * trial, /*weighted=*/trial % 2 == 1,
                                         /*multi_device=*/false);
    GavelSolution solution = SolveOrDie(problem);
    const int rounds = 400;
    std::vector<std::vector<double>> received = SimulateRounds(problem, solution, rounds);
    for (size_t j = 0; j < received.size(); ++j) {
      double total = 0, share = 0;
      for (size_t k = 0; k < received[j].size(); ++k) {
        total += received[j][k];
        share += solution.time_share[j][k];
        // Allocated time is delivered; leftover rounds may come on top.
        EXPECT_GE(received[j][k] / rounds, solution.time_share[j][k] - 0.05)
            << "job " << j << " type " << k;
      }
      EXPECT_GE(total / rounds, share - 0.05) << "job " << j;
    }
  }
}

// Multi-device jobs: the LP ignores packing, so its shares need not be deliverable exactly (a
// job on 1 of 8 devices all the time leaves room for one 4-device job, however the shares say
// two should often run). What each round must still be: within capacity, and work-conserving
// (no job left out that would fit in the devices left idle).
TEST(GavelRoundTest, RoundsWithMultiDeviceJobsAreWorkConserving) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    GavelProblem problem = RandomCluster(rng, /*jobs=*/10 + 4 * trial, /*weighted=*/false);
    GavelSolution solution = SolveOrDie(problem);
    const int jobs = static_cast<int>(problem.throughput.size());
    std::vector<std::vector<double>> received(jobs, std::vector<double>(3, 0.0));
    for (int round = 0; round < 200; ++round) {
      absl::StatusOr<std::vector<int>> placement = AssignRound(problem, solution, received);
      ASSERT_TRUE(placement.ok()) << placement.status();
      std::vector<int> free_devices = problem.devices_per_type;
      for (int j = 0; j < jobs; ++j) {
        if ((*placement)[j] == -1) continue;
        free_devices[(*placement)[j]] -= problem.scale_factor[j];
        received[j][(*placement)[j]] += 1;
      }
      for (int k = 0; k < 3; ++k) ASSERT_GE(free_devices[k], 0) << "round " << round;
      for (int j = 0; j < jobs; ++j) {
        if ((*placement)[j] != -1) continue;
        for (int k = 0; k < 3; ++k) {
          if (problem.throughput[j][k] > 0) {
            EXPECT_LT(free_devices[k], problem.scale_factor[j])
                << "round " << round << ": job " << j << " left out but fits on type " << k;
          }
        }
      }
    }
  }
}

TEST(GavelRoundTest, IdleDevicesGoToJobsWithoutTimeShare) {
  GavelProblem problem;
  problem.throughput = {{1.0, 4.0}, {1.0, 2.0}, {2.0, 0.0}};
  problem.scale_factor = {1, 1, 1};
  problem.devices_per_type = {1, 2};
  GavelSolution solution;
  solution.time_share = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};
  std::vector<std::vector<double>> received(3, std::vector<double>(2, 0.0));
  absl::StatusOr<std::vector<int>> placement = AssignRound(problem, solution, received);
  ASSERT_TRUE(placement.ok()) << placement.status();
  // Each job is offered its fastest type first: job 0 and job 1 on type 1, job 2 on type 0.
  EXPECT_EQ(*placement, (std::vector<int>{1, 1, 0}));
}

TEST(GavelRoundTest, HigherPriorityWinsTheLastDevice) {
  GavelProblem problem;
  problem.throughput = {{1.0}, {1.0}};
  problem.scale_factor = {1, 1};
  problem.devices_per_type = {1};
  GavelSolution solution;
  solution.time_share = {{0.5}, {0.5}};
  // Job 0 has had 3 rounds, job 1 only 1: job 1 is further behind its share.
  absl::StatusOr<std::vector<int>> placement = AssignRound(problem, solution, {{3.0}, {1.0}});
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(*placement, (std::vector<int>{-1, 0}));
  // A job that has not run yet comes first.
  placement = AssignRound(problem, solution, {{0.0}, {1.0}});
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(*placement, (std::vector<int>{0, -1}));
}

TEST(GavelRoundTest, BadRoundCountsAreInvalidArgument) {
  GavelProblem problem;
  problem.throughput = {{1.0, 1.0}, {1.0, 1.0}};
  problem.scale_factor = {1, 1};
  problem.devices_per_type = {1, 1};
  GavelSolution solution = SolveOrDie(problem);
  absl::StatusOr<std::vector<int>> placement = AssignRound(problem, solution, {{0.0, 0.0}});
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
  placement = AssignRound(problem, solution, {{0.0, 0.0}, {0.0}});
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(placement.status().message().find("job 1"), std::string::npos);
  placement = AssignRound(problem, solution, {{0.0, 0.0}, {0.0, -2.0}});
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(placement.status().message().find("job 1"), std::string::npos);
}

}  // namespace
}  // namespace tandem::cluster
