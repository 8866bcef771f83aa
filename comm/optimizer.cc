#include "comm/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::comm {

OptimizerConfig OptimizerConfig::Sgd(double momentum, double weight_decay) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.momentum = momentum;
  config.weight_decay = weight_decay;
  return config;
}

OptimizerConfig OptimizerConfig::AdamW(double weight_decay, double beta1, double beta2,
                                       double eps) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  config.weight_decay = weight_decay;
  config.beta1 = beta1;
  config.beta2 = beta2;
  config.eps = eps;
  return config;
}

const char* OptimizerName(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? "sgd" : "adamw";
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adamw") return OptimizerKind::kAdamW;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", name, "' (known: sgd, adamw)"));
}

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config) {
  auto in_unit = [](double v) { return v >= 0.0 && v < 1.0; };
  if (!in_unit(config.momentum)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer momentum must be in [0, 1), got ",
                                                   config.momentum));
  }
  if (!(config.weight_decay >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer weight_decay must be >= 0, got ", config.weight_decay));
  }
  if (config.kind == OptimizerKind::kAdamW) {
    if (!in_unit(config.beta1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer beta1 must be in [0, 1), got ", config.beta1));
    }
    if (!in_unit(config.beta2)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer beta2 must be in [0, 1), got ", config.beta2));
    }
    if (!(config.eps >= 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer eps must be >= 0, got ", config.eps));
    }
  }
  return absl::OkStatus();
}

OptimizerState::OptimizerState(const OptimizerConfig& config, int64_t count)
    : config_(config), count_(count) {
  if (config_.kind == OptimizerKind::kAdamW) {
    momentum_.assign(count_, 0.0f);
    second_moment_.assign(count_, 0.0f);
  }
}

absl::Status OptimizerState::Step(absl::Span<float> params, absl::Span<const float> grads,
                                  double lr, double grad_scale) {
  if (static_cast<int64_t>(params.size()) != count_ ||
      static_cast<int64_t>(grads.size()) != count_) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer step: state has ", count_,
                                                   " elements, params ", params.size(),
                                                   ", grads ", grads.size()));
  }
  if (!std::isfinite(lr) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: non-finite lr ", lr, " or grad scale ", grad_scale));
  }
  const bool scaled = grad_scale != 1.0;
  const float scale = static_cast<float>(grad_scale);
  float* p = params.data();
  const float* g = grads.data();
  ++steps_;
  if (config_.kind == OptimizerKind::kSgd) {
    const float weight_decay = static_cast<float>(config_.weight_decay);
    const float momentum = static_cast<float>(config_.momentum);
    const float neg_lr = static_cast<float>(-lr);
    const bool first = momentum_.empty();
    if (config_.momentum != 0.0 && first) momentum_.resize(count_);
    for (int64_t i = 0; i < count_; ++i) {
      float d = scaled ? g[i] * scale : g[i];
      if (config_.weight_decay != 0.0) d = d + p[i] * weight_decay;
      if (config_.momentum != 0.0) {
        d = first ? d : momentum_[i] * momentum + d;  // buf.mul_(momentum).add_(d)
        momentum_[i] = d;
      }
      p[i] = p[i] + neg_lr * d;
    }
    return absl::OkStatus();
  }
  // AdamW.
  const double step = static_cast<double>(steps_);
  const float decay = static_cast<float>(1.0 - lr * config_.weight_decay);
  const float beta1 = static_cast<float>(config_.beta1);
  const float one_minus_beta1 = static_cast<float>(1.0 - config_.beta1);
  const float beta2 = static_cast<float>(config_.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - config_.beta2);
  const double bias_correction1 = 1.0 - std::pow(config_.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(config_.beta2, step);
  const float neg_step_size = static_cast<float>(-(lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float eps = static_cast<float>(config_.eps);
  float* m = momentum_.data();
  float* v = second_moment_.data();
  for (int64_t i = 0; i < count_; ++i) {
    const float grad = scaled ? g[i] * scale : g[i];
    p[i] = p[i] * decay;
    m[i] = m[i] * beta1 + one_minus_beta1 * grad;
    v[i] = v[i] * beta2 + (one_minus_beta2 * grad) * grad;  // addcmul_ order
    const float denom = std::sqrt(v[i]) / bias_correction2_sqrt + eps;
    p[i] = p[i] + (neg_step_size * m[i]) / denom;  // addcdiv_ order
  }
  return absl::OkStatus();
}

std::vector<OptimizerState::NamedBuffer> OptimizerState::Buffers() {
  if (config_.kind == OptimizerKind::kSgd) return {{"momentum_buffer", &momentum_}};
  return {{"exp_avg", &momentum_}, {"exp_avg_sq", &second_moment_}};
}

}  // namespace tandem::comm
