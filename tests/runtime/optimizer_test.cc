// Optimizer formulas against an independent double-precision oracle written from the PyTorch
// documentation, plus closed-form first steps.
#include <cmath>
#include <random>
#include <vector>

#include "runtime/optimizer.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {


// Straight from the torch.optim.SGD / AdamW pseudo-code, in double.
struct Oracle {
  OptimizerConfig config;
  std::vector<double> p, buf, m, v;
  int64_t t = 0;

  void Step(const std::vector<double>& g, double lr) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      if (config.kind == OptimizerKind::kSgd) {
        double d = g[i] + config.weight_decay * p[i];
        if (config.momentum != 0) {
          buf[i] = t == 1 ? d : config.momentum * buf[i] + d;
          d = buf[i];
        }
        p[i] -= lr * d;
      } else {
        p[i] *= 1 - lr * config.weight_decay;
        m[i] = config.beta1 * m[i] + (1 - config.beta1) * g[i];
        v[i] = config.beta2 * v[i] + (1 - config.beta2) * g[i] * g[i];
        const double m_hat = m[i] / (1 - std::pow(config.beta1, t));
        const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(config.beta2, t)) + config.eps;
        p[i] -= lr * m_hat / denom;
      }
    }
  }
};

// float32 against a double oracle: relative error for values of magnitude above 1, absolute
// below (float32 rounding is absolute near zero), as torch.allclose with rtol = atol.
double MaxRelativeError(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0, std::fabs(b[i])));
  }
  return worst;
}

void RunAgainstOracle(const OptimizerConfig& config, double grad_scale, double tolerance) {
  constexpr int kCount = 257;
  constexpr int kSteps = 30;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> params(kCount);
  for (float& x : params) x = normal(rng);
  Oracle oracle{config, std::vector<double>(params.begin(), params.end()),
                std::vector<double>(kCount, 0), std::vector<double>(kCount, 0),
                std::vector<double>(kCount, 0)};
  OptimizerState state(config, kCount);
  for (int step = 0; step < kSteps; ++step) {
    const double lr = 0.01 * (1.0 - step / 60.0);  // a schedule: lr changes every step
    std::vector<float> grads(kCount);
    std::vector<double> scaled(kCount);
    for (int i = 0; i < kCount; ++i) {
      grads[i] = 0.5f * params[i] + normal(rng);  // depends on the parameters, as real ones do
      scaled[i] = static_cast<double>(static_cast<float>(grads[i] * static_cast<float>(grad_scale)));
    }
    ASSERT_TRUE(state.Step(absl::MakeSpan(params), grads, lr, grad_scale).ok());
    oracle.Step(scaled, lr);
  }
  EXPECT_EQ(state.steps(), kSteps);
  EXPECT_LT(MaxRelativeError(params, oracle.p), tolerance);
}

TEST(OptimizerTest, SgdWithMomentumAndWeightDecayMatchesOracle) {
  RunAgainstOracle(OptimizerConfig::Sgd(/*momentum=*/0.9, /*weight_decay=*/1e-2), 1.0, 1e-5);
}

TEST(OptimizerTest, PlainSgdMatchesOracle) {
  RunAgainstOracle(OptimizerConfig::Sgd(/*momentum=*/0.0), 1.0, 1e-5);
}

TEST(OptimizerTest, AdamWMatchesOracle) {
  RunAgainstOracle(OptimizerConfig::AdamW(/*weight_decay=*/0.1), 1.0, 1e-5);
}

TEST(OptimizerTest, GradScaleIsAppliedBeforeTheUpdate) {
  RunAgainstOracle(OptimizerConfig::Sgd(0.9), /*grad_scale=*/0.25, 1e-5);
  RunAgainstOracle(OptimizerConfig::AdamW(0.01), /*grad_scale=*/0.25, 1e-5);
}

TEST(OptimizerTest, AdamWFirstStepIsSignedLearningRate) {
  // Step 1: m_hat = g, v_hat = g^2, so p1 = p0 * (1 - lr * wd) - lr * g / (|g| + eps).
  OptimizerState state(OptimizerConfig::AdamW(/*weight_decay=*/0.5), 3);
  std::vector<float> p = {1.0f, -2.0f, 0.5f};
  const std::vector<float> g = {0.3f, -4.0f, 0.0f};
  const double lr = 0.1;
  ASSERT_TRUE(state.Step(absl::MakeSpan(p), g, lr).ok());
  EXPECT_NEAR(p[0], 1.0 * 0.95 - 0.1, 1e-6);
  EXPECT_NEAR(p[1], -2.0 * 0.95 + 0.1, 1e-6);
  EXPECT_NEAR(p[2], 0.5 * 0.95, 1e-6);  // zero gradient: only the decay
}

TEST(OptimizerTest, SgdMomentumFirstStepCopiesGradient) {
  OptimizerState state(OptimizerConfig::Sgd(/*momentum=*/0.9), 1);
  std::vector<float> p = {1.0f};
  const std::vector<float> g = {2.0f};
  ASSERT_TRUE(state.Step(absl::MakeSpan(p), g, 0.1).ok());
  EXPECT_FLOAT_EQ(p[0], 0.8f);  // buffer = g
  ASSERT_TRUE(state.Step(absl::MakeSpan(p), g, 0.1).ok());
  EXPECT_FLOAT_EQ(p[0], 0.8f - 0.1f * (0.9f * 2.0f + 2.0f));  // buffer = 0.9 b + g
  EXPECT_EQ((*state.Buffers()[0].values)[0], 0.9f * 2.0f + 2.0f);
}

TEST(OptimizerTest, RejectsBadInput) {
  OptimizerState state(OptimizerConfig::Sgd(0.0), 4);
  std::vector<float> p(3), g(4);
  EXPECT_EQ(state.Step(absl::MakeSpan(p), g, 0.1).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> p4(4);
  EXPECT_EQ(state.Step(absl::MakeSpan(p4), g, NAN).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateOptimizerConfig(OptimizerConfig::Sgd(1.5)).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status bad_beta = ValidateOptimizerConfig(OptimizerConfig::AdamW(0.01, 1.0));
  EXPECT_EQ(bad_beta.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_beta.message().find("beta1"), std::string::npos);
  EXPECT_EQ(ParseOptimizerKind("adam").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseOptimizerKind("adamw"), OptimizerKind::kAdamW);
}

}  // namespace
}  // namespace tandem::runtime
