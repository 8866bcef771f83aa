#include "runtime/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::runtime {

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
  const float scale = static_cast<float>(grad_scale);
  ++steps_;
  if (config_.kind == OptimizerKind::kSgd) {
    const bool first = momentum_.empty();
    if (config_.momentum != 0.0 && first) momentum_.resize(count_);
    SgdStep(params.data(), grads.data(), lr, scale, grad_scale != 1.0, first);
  } else {
    AdamWStep(params.data(), grads.data(), lr, scale, grad_scale != 1.0);
  }
  return absl::OkStatus();
}

namespace {

// The loops are specialised on the options so that the compiler vectorises them; the float
// operations and their order are PyTorch's in every variant.
template <bool kScaled, bool kDecay, bool kMomentum, bool kFirst>
void SgdLoop(float* p, const float* g, float* buffer, int64_t count, float scale, float decay,
             float momentum, float neg_lr) {
  for (int64_t i = 0; i < count; ++i) {
    float d = kScaled ? g[i] * scale : g[i];
    if (kDecay) d = d + p[i] * decay;  // d_p.add(param, alpha=weight_decay)
    if (kMomentum) {
      if (!kFirst) d = buffer[i] * momentum + d;  // buf.mul_(momentum).add_(d_p)
      buffer[i] = d;
    }
    p[i] = p[i] + neg_lr * d;  // param.add_(d_p, alpha=-lr)
  }
}

template <bool kScaled>
void AdamWLoop(float* p, const float* g, float* m, float* v, int64_t count, float scale,
               float decay, float beta1, float one_minus_beta1, float beta2,
               float one_minus_beta2, float neg_step_size, float bias_correction2_sqrt,
               float eps) {
  for (int64_t i = 0; i < count; ++i) {
    const float grad = kScaled ? g[i] * scale : g[i];
    p[i] = p[i] * decay;                                    // param.mul_(1 - lr * wd)
    m[i] = m[i] * beta1 + one_minus_beta1 * grad;           // exp_avg.mul_(b1).add_(g, 1-b1)
    v[i] = v[i] * beta2 + (one_minus_beta2 * grad) * grad;  // addcmul_ order
    const float denom = std::sqrt(v[i]) / bias_correction2_sqrt + eps;
    p[i] = p[i] + (neg_step_size * m[i]) / denom;           // addcdiv_ order
  }
}

}  // namespace

void OptimizerState::SgdStep(float* p, const float* g, double lr, float scale, bool scaled,
                             bool first) {
  const float decay = static_cast<float>(config_.weight_decay);
  const float momentum = static_cast<float>(config_.momentum);
  const float neg_lr = static_cast<float>(-lr);
  float* buffer = momentum_.data();
  const bool has_decay = config_.weight_decay != 0.0;
  const bool has_momentum = config_.momentum != 0.0;
  // 16 variants: pick the one for these flags.
  using Loop = void (*)(float*, const float*, float*, int64_t, float, float, float, float);
  static constexpr Loop kLoops[16] = {
      SgdLoop<false, false, false, false>, SgdLoop<false, false, false, true>,
      SgdLoop<false, false, true, false>,  SgdLoop<false, false, true, true>,
      SgdLoop<false, true, false, false>,  SgdLoop<false, true, false, true>,
      SgdLoop<false, true, true, false>,   SgdLoop<false, true, true, true>,
      SgdLoop<true, false, false, false>,  SgdLoop<true, false, false, true>,
      SgdLoop<true, false, true, false>,   SgdLoop<true, false, true, true>,
      SgdLoop<true, true, false, false>,   SgdLoop<true, true, false, true>,
      SgdLoop<true, true, true, false>,    SgdLoop<true, true, true, true>};
  const int index = (scaled ? 8 : 0) + (has_decay ? 4 : 0) + (has_momentum ? 2 : 0) +
                    (first ? 1 : 0);
  kLoops[index](p, g, buffer, count_, scale, decay, momentum, neg_lr);
}

void OptimizerState::AdamWStep(float* p, const float* g, double lr, float scale, bool scaled) {
  const double step = static_cast<double>(steps_);
  const float decay = static_cast<float>(1.0 - lr * config_.weight_decay);
  const double bias_correction1 = 1.0 - std::pow(config_.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(config_.beta2, step);
  const float neg_step_size = static_cast<float>(-(lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  auto loop = scaled ? AdamWLoop<true> : AdamWLoop<false>;
  loop(p, g, momentum_.data(), second_moment_.data(), count_, scale, decay,
       static_cast<float>(config_.beta1), static_cast<float>(1.0 - config_.beta1),
       static_cast<float>(config_.beta2), static_cast<float>(1.0 - config_.beta2),
       neg_step_size, bias_correction2_sqrt, static_cast<float>(config_.eps));
}

std::vector<OptimizerState::NamedBuffer> OptimizerState::Buffers() {
  if (config_.kind == OptimizerKind::kSgd) return {{"momentum_buffer", &momentum_}};
  return {{"exp_avg", &momentum_}, {"exp_avg_sq", &second_moment_}};
}

}  // namespace tandem::runtime
