// Piper's planner: the reference figure on Piper's own BERT profile, and brute force on small
// random instances.
#include "planner/piper.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "planner/importers.h"
#include "tests/planner/test_util.h"

namespace tandem::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

PiperInstance Bert(int devices) {
  auto instance = ReadPiperFile(testing::DataPath("piper/bert32a100.json"));
  EXPECT_TRUE(instance.ok()) << instance.status();
  instance->max_devices = devices;
  instance->memory_per_device_bytes = 8 * kGiB;
  instance->microbatches_per_batch = 1920;
  instance->bandwidth_bytes_per_second = 25 * kGiB;
  return *instance;
}

// Piper's reference implementation (algo.cpp, single()) reports "max load = 0.00256113 using
// 510 out of 512 devices" for this instance.
TEST(Piper, MatchesReferenceOnBert32) {
  for (KnapsackMode mode : {KnapsackMode::kGreedy, KnapsackMode::kExact}) {
    PiperOptions options;
    options.knapsack = mode;
    auto result = RunPiper(Bert(512), options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_NEAR(result->time_per_sample, 0.00256113, 0.00256113 * 1e-3);
    EXPECT_EQ(result->devices_used, 510);
    int devices = 0;
    for (const PiperStage& stage : result->stages) {
      devices += stage.data_parallel * stage.tensor_parallel;
      EXPECT_EQ(1920 % stage.data_parallel, 0);
      EXPECT_LE(stage.memory_bytes, 8 * kGiB);
      EXPECT_LE(stage.load, result->time_per_sample);
    }
    EXPECT_EQ(devices, result->devices_used);
  }
}

// Piper's algo.cpp (msr-fiddle/piper @ d7fc8cf, runDP() through a command-line driver, see
// bench/planner/piper_compare.py) on the same input at several device counts: its optimal
// maximum load and the devices it uses. Greedy knapsack, as algo.cpp.
TEST(Piper, MatchesReferenceOnBert32AtSeveralDeviceCounts) {
  struct Case {
    int devices;
    double memory_bytes, bandwidth;  // the file's own: 80e9 bytes, 25e9 bytes/s
    double time_per_sample;
    int devices_used;
  };
  const Case cases[] = {
      {1, 80e9, 25e9, 0.972864, 1},
      {2, 80e9, 25e9, 0.4866769784, 2},
      {4, 80e9, 25e9, 0.2435834676, 4},
      {8, 80e9, 25e9, 0.1220367122, 8},
      {16, 80e9, 25e9, 0.0612633345, 16},
      {32, 80e9, 25e9, 0.03087664565, 32},
      {64, 80e9, 25e9, 0.015683301225, 64},
      {8, 8 * kGiB, 25 * kGiB, 0.16585575, 8},
      {32, 8 * kGiB, 25 * kGiB, 0.0415154504417, 32},
      {64, 8 * kGiB, 25 * kGiB, 0.0202005502945, 64},
      {128, 8 * kGiB, 25 * kGiB, 0.0101208803239, 128},
  };
  for (const Case& c : cases) {
    PiperInstance instance = Bert(c.devices);
    instance.memory_per_device_bytes = c.memory_bytes;
    instance.bandwidth_bytes_per_second = c.bandwidth;
    PiperOptions options;
    options.knapsack = KnapsackMode::kGreedy;
    auto result = RunPiper(instance, options);
    ASSERT_TRUE(result.ok()) << c.devices << " devices: " << result.status();
    EXPECT_NEAR(result->time_per_sample, c.time_per_sample, c.time_per_sample * 1e-9)
        << c.devices << " devices, " << c.memory_bytes << " bytes";
    EXPECT_EQ(result->devices_used, c.devices_used) << c.devices << " devices";
  }
}

// ---- Brute force ---------------------------------------------------------------------------

PiperInstance RandomInstance(int nodes, std::mt19937* rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  PiperInstance instance;
  for (int v = 0; v < nodes; ++v) {
    PiperNode node;
    node.name = "n" + std::to_string(v);
    for (int t : {1, 2}) {
      if (t == 2 && v % 3 == 2) continue;  // some layers cannot be split
      PiperConfig vanilla;
      vanilla.id = "vanilla";
      vanilla.time_per_sample = (0.5 + unit(*rng)) / (t == 2 ? 1.6 : 1.0);
      vanilla.parameter_bytes = 1e8 * unit(*rng) / t;
      vanilla.memory_per_microbatch_bytes = 2 + 4 * unit(*rng);
      vanilla.memory_fixed_bytes = 4 * unit(*rng) / t;
      PiperConfig recompute = vanilla;
      recompute.id = "activation recomp";
      recompute.time_per_sample *= 1.2 + 0.3 * unit(*rng);
      recompute.memory_per_microbatch_bytes *= 0.2;
      node.configs[t] = {vanilla, recompute};
    }
    instance.nodes.push_back(node);
    if (v > 0) instance.edges.push_back({v - 1, v, 1e7 * unit(*rng)});
    if (v > 1 && v % 2 == 0) instance.edges.push_back({v - 2, v, 1e7 * unit(*rng)});
  }
  instance.bandwidth_bytes_per_second = 1e9;
  return instance;
}

// Every split into stages, every (t, d) per stage and every configuration per node.
double BruteForce(const PiperInstance& instance) {
  const int n = static_cast<int>(instance.nodes.size());
  const int mbs = instance.microbatches_per_batch;
  const int budget = std::min(mbs, instance.max_devices);
  struct StageChoice {
    int first, end, t, d;
  };
  double best = kInf;
  std::vector<StageChoice> stages;
  std::function<void(int, int, int)> extend = [&](int first, int devices, int degree_sum) {
    if (first == n) {
      // Loads with exact suffix sums, best configurations per stage.
      double worst = 0;
      int suffix = degree_sum;
      for (const StageChoice& st : stages) {
        const int y = (suffix + st.d - 1) / st.d;
        suffix -= st.d;
        double stage_best = kInf;
        const int size = st.end - st.first;
        for (int mask = 0; mask < (1 << size); ++mask) {
          std::vector<int> configs(size);
          for (int i = 0; i < size; ++i) configs[i] = (mask >> i) & 1;
          auto cost = EvaluatePiperStage(instance, st.first, st.end, st.t, st.d, y, configs);
          if (!cost.ok()) break;
          if (cost->memory_bytes <= instance.memory_per_device_bytes) {
            stage_best = std::min(stage_best, cost->load);
          }
        }
        worst = std::max(worst, stage_best);
      }
      best = std::min(best, worst);
      return;
    }
    for (int end = first + 1; end <= n; ++end) {
      for (int t : {1, 2}) {
        for (int d = 1; d <= budget; ++d) {
          if (mbs % d != 0 || devices + t * d > instance.max_devices ||
              degree_sum + d > budget) {
            continue;
          }
          stages.push_back({first, end, t, d});
          extend(end, devices + t * d, degree_sum + d);
          stages.pop_back();
        }
      }
    }
  };
  extend(0, 0, 0);
  return best;
}

TEST(Piper, ExactMatchesBruteForceOnRandomInstances) {
  std::mt19937 rng(3);
  int feasible = 0;
  for (int trial = 0; trial < 40; ++trial) {
    PiperInstance instance = RandomInstance(2 + trial % 3, &rng);
    instance.max_devices = 2 + trial % 4;
    instance.microbatches_per_batch = trial % 2 == 0 ? 4 : 6;
    instance.memory_per_device_bytes = 6 + 10 * (trial % 4);
    const double expected = BruteForce(instance);
    PiperOptions options;
    options.knapsack = KnapsackMode::kExact;
    auto result = RunPiper(instance, options);
    if (!std::isfinite(expected)) {
      ASSERT_FALSE(result.ok()) << "trial " << trial;
      EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
      continue;
    }
    ASSERT_TRUE(result.ok()) << "trial " << trial << ": " << result.status();
    EXPECT_NEAR(result->time_per_sample, expected, 1e-8 * expected) << "trial " << trial;
    ++feasible;
  }
  EXPECT_GT(feasible, 20);
}

// More devices and degree sums: exercises the search's jumps and the degree-sum ranges.
TEST(Piper, ExactMatchesBruteForceWithMoreDevices) {
  std::mt19937 rng(11);
  int feasible = 0;
  for (int trial = 0; trial < 24; ++trial) {
    PiperInstance instance = RandomInstance(3 + trial % 2, &rng);
    instance.max_devices = 6 + trial % 4;
    instance.microbatches_per_batch = trial % 2 == 0 ? 8 : 12;
    instance.memory_per_device_bytes = 8 + 6 * (trial % 5);
    const double expected = BruteForce(instance);
    auto result = RunPiper(instance);
    if (!std::isfinite(expected)) {
      EXPECT_FALSE(result.ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(result.ok()) << "trial " << trial << ": " << result.status();
    EXPECT_NEAR(result->time_per_sample, expected, 1e-8 * expected) << "trial " << trial;
    ++feasible;
  }
  EXPECT_GT(feasible, 12);
}

TEST(Piper, WithoutRecomputationNeedsMoreMemory) {
  // Dropping the lean configurations can only make the plan slower or infeasible.
  PiperInstance instance = Bert(64);
  auto with = RunPiper(instance);
  ASSERT_TRUE(with.ok()) << with.status();
  for (PiperNode& node : instance.nodes) {
    for (auto& [t, configs] : node.configs) configs.resize(1);
  }
  auto without = RunPiper(instance);
  if (without.ok()) {
    EXPECT_GE(without->time_per_sample, with->time_per_sample * (1 - 1e-12));
  } else {
    EXPECT_EQ(without.status().code(), absl::StatusCode::kResourceExhausted);
  }
}

TEST(Piper, TooLittleMemoryIsResourceExhausted) {
  PiperInstance instance = Bert(8);
  instance.memory_per_device_bytes = 1e6;
  auto result = RunPiper(instance);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tandem::planner
