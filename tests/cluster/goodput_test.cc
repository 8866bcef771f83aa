// The goodput model: the fit recovers known parameters from synthetic measurements, statistical
// efficiency is 1 at the initial batch size and falls with larger batches, the batch-size
// optimiser agrees with a brute-force search over its own candidates, speedup is relative to
// one GPU.
#include "cluster/goodput.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tandem::cluster {
namespace {

std::vector<ThroughputSample> Synthetic(const PerfParams& p) {
  std::vector<ThroughputSample> samples;
  for (int nodes : {1, 2, 4}) {
    for (int per_node : {1, 2, 4}) {
      for (double bsz : {16.0, 32.0, 64.0, 128.0}) {
        const int replicas = nodes * per_node;
        const double accum = PredictAccumSeconds(p, bsz);
        const double network = PredictNetworkSeconds(p, nodes, replicas);
        samples.push_back({nodes, replicas, bsz, accum, PredictOptimSeconds(p, accum, network)});
      }
    }
  }
  return samples;
}

TEST(PerfFit, RecoversKnownParameters) {
  const PerfParams truth{0.02, 0.004, 0.15, 0.01, 0.05, 0.002, 2.5};
  const std::vector<ThroughputSample> samples = Synthetic(truth);
  const PerfParams fit = FitPerfParams(samples);
  EXPECT_LT(PerfFitLoss(fit, samples), PerfFitLoss(truth, samples) + 1e-3);
  EXPECT_NEAR(fit.alpha_c, truth.alpha_c, 0.1 * truth.alpha_c);
  EXPECT_NEAR(fit.beta_c, truth.beta_c, 0.1 * truth.beta_c);
  EXPECT_NEAR(fit.alpha_n, truth.alpha_n, 0.15 * truth.alpha_n);
  EXPECT_NEAR(fit.alpha_r, truth.alpha_r, 0.15 * truth.alpha_r);
  EXPECT_NEAR(fit.gamma, truth.gamma, 0.5);
  // Every prediction within 3% of the measurement.
  for (const ThroughputSample& s : samples) {
    const double accum = PredictAccumSeconds(fit, s.atomic_bsz);
    const double optim =
        PredictOptimSeconds(fit, accum, PredictNetworkSeconds(fit, s.num_nodes, s.num_replicas));
    EXPECT_NEAR(optim / s.optim_step_seconds, 1.0, 0.03)
        << s.num_nodes << "x" << s.num_replicas << " bsz " << s.atomic_bsz;
  }
}

TEST(PerfFit, WarmRefitsAsSamplesArriveMatchTheColdFit) {
  // The samples arrive one at a time (as a job meets new configurations in the simulator), each
  // refit warm from the fit before; every warm fit's loss stays within 1e-3 of the cold fit's on
  // the same samples, and the last one predicts every step within 3%.
  const PerfParams truth{0.02, 0.004, 0.15, 0.01, 0.05, 0.002, 2.5};
  const std::vector<ThroughputSample> all = Synthetic(truth);
  std::vector<ThroughputSample> samples;
  PerfParams warm;
  for (size_t i = 0; i < all.size(); ++i) {
    samples.push_back(all[(i * 7) % all.size()]);  // 7 is prime to the 36 samples: all of them
    const PerfParams cold = FitPerfParams(samples);
    warm = i == 0 ? cold : FitPerfParams(samples, &warm);
    EXPECT_LT(PerfFitLoss(warm, samples), PerfFitLoss(cold, samples) + 1e-3) << i + 1;
  }
  for (const ThroughputSample& s : all) {
    const double accum = PredictAccumSeconds(warm, s.atomic_bsz);
    const double optim = PredictOptimSeconds(
        warm, accum, PredictNetworkSeconds(warm, s.num_nodes, s.num_replicas));
    EXPECT_NEAR(optim / s.optim_step_seconds, 1.0, 0.03)
        << s.num_nodes << "x" << s.num_replicas << " bsz " << s.atomic_bsz;
  }
}

TEST(PerfFit, PinsWhatOneConfigurationCannotIdentify) {
  // One GPU, one batch size: alpha_c is half the mean accumulation time, networks pinned.
  const std::vector<ThroughputSample> samples = {{1, 1, 32, 0.2, 0.2}};
  const PerfParams fit = FitPerfParams(samples);
  EXPECT_DOUBLE_EQ(fit.alpha_c, 0.1);
  EXPECT_NEAR(PredictAccumSeconds(fit, 32), 0.2, 1e-3);
  EXPECT_DOUBLE_EQ(fit.alpha_r, 1e-8);
  EXPECT_GE(fit.alpha_n, fit.alpha_r * 1.1);
}

TEST(Goodput, EfficiencyIsOneAtInitialBatchAndDecreases) {
  const GoodputFunction goodput({0.02, 0.004, 0.15, 0.01, 0.05, 0.002, 2}, {1.0, 4.0}, 128);
  EXPECT_DOUBLE_EQ(goodput.Efficiency(128), 1.0);
  double previous = 1.0;
  for (double batch : {256.0, 512.0, 1024.0, 4096.0}) {
    const double e = goodput.Efficiency(batch);
    EXPECT_LT(e, previous);
    EXPECT_GT(e, 0.0);
    previous = e;
  }
  // With noise scale var/sqr = 4 at the initial batch: (4 + 1) / (4 / 2 + 1) / 2 at twice it.
  EXPECT_NEAR(goodput.Efficiency(256), 5.0 / 3.0 / 2.0, 1e-12);
  // No gradient signal: efficiency of plain large-batch scaling, 1 / scale.
  const GoodputFunction flat({0.02, 0.004, 0.15, 0.01, 0.05, 0.002, 2}, {0.0, 0.0}, 128);
  EXPECT_DOUBLE_EQ(flat.Efficiency(512), 0.25);
}

TEST(Goodput, OptimizeMatchesBruteForceOverValidConfigurations) {
  const GoodputFunction goodput({0.02, 0.004, 0.15, 0.01, 0.05, 0.002, 2}, {1.0, 30.0}, 128);
  for (int replicas : {1, 2, 4, 8}) {
    const int nodes = replicas >= 4 ? 2 : 1;
    const BatchConfig best = goodput.Optimize(nodes, replicas, 4096, 32, 256, true);
    ASSERT_GT(best.goodput, 0);
    EXPECT_GE(best.atomic_bsz, 32);
    EXPECT_LE(best.atomic_bsz, 256);
    EXPECT_DOUBLE_EQ(best.goodput,
                     goodput.Evaluate(nodes, replicas, best.atomic_bsz, best.accum_steps));
    // No valid (atomic, accumulation) with a batch in range does much better: the optimiser
    // samples 50 batch sizes, so allow the step between neighbouring candidates.
    double brute = 0;
    for (int atomic = 32; atomic <= 256; ++atomic) {
      for (int accum = 0; accum <= 16; ++accum) {
        const double batch = static_cast<double>(replicas) * atomic * (accum + 1);
        if (batch < 128 || batch > 4096) continue;
        brute = std::max(brute, goodput.Evaluate(nodes, replicas, atomic, accum));
      }
    }
    EXPECT_GE(best.goodput, 0.95 * brute) << replicas;
    EXPECT_LE(best.goodput, brute * (1 + 1e-12)) << replicas;
  }
}

TEST(Speedup, RelativeToOneGpu) {
  const GoodputFunction goodput({0.02, 0.004, 0.15, 0.01, 0.05, 0.002, 2}, {1.0, 30.0}, 128);
  const SpeedupFunction speedup(goodput, 4096, 32, 256, true);
  EXPECT_DOUBLE_EQ(speedup(1, 1), 1.0);
  EXPECT_DOUBLE_EQ(speedup(0, 0), 0.0);
  EXPECT_GT(speedup(1, 4), 1.0);
  EXPECT_LT(speedup(1, 4), 4.0);
  // Crossing nodes costs more than staying on one.
  EXPECT_LT(speedup(2, 4), speedup(1, 4));
}

}  // namespace
}  // namespace tandem::cluster
