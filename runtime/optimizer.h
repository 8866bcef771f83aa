// Optimizers on flat float32 spans, with exactly PyTorch's update formulas so that tandem's
// training matches single-process LibTorch training:
//
//   SGD   (torch.optim.SGD, dampening 0, nesterov false, coupled weight decay)
//           d = g + weight_decay * p
//           b = d on the first step, else momentum * b + d          (only if momentum != 0)
//           p = p - lr * b        (or p - lr * d without momentum)
//   AdamW (torch.optim.AdamW, decoupled weight decay)
//           t = t + 1
//           p = p * (1 - lr * weight_decay)
//           m = beta1 * m + (1 - beta1) * g
//           v = beta2 * v + (1 - beta2) * g * g
//           p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// The learning rate is passed at every step so schedules work. Elementwise arithmetic is in
// float32 in PyTorch's order; scalars (lr / bias correction) are computed in double, as
// PyTorch computes Python floats.
//
// An OptimizerState holds the state of one flat span (a parameter, or a shard of a bucket of
// parameters for DeAR). Not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::runtime {

enum class OptimizerKind : uint8_t { kSgd, kAdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  double momentum = 0.0;      // SGD
  double weight_decay = 0.0;  // SGD: coupled (added to the gradient); AdamW: decoupled
  double beta1 = 0.9;         // AdamW
  double beta2 = 0.999;       // AdamW
  double eps = 1e-8;          // AdamW

  static OptimizerConfig Sgd(double momentum, double weight_decay = 0.0);
  // PyTorch's AdamW default weight decay is 0.01.
  static OptimizerConfig AdamW(double weight_decay = 0.01, double beta1 = 0.9,
                               double beta2 = 0.999, double eps = 1e-8);
};

// "sgd", "adamw".
const char* OptimizerName(OptimizerKind kind);
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name);
// Ranges: momentum, betas in [0, 1); weight decay, eps >= 0. InvalidArgument names the field.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

// State of one flat span of `count` parameters.
class OptimizerState {
 public:
  OptimizerState(const OptimizerConfig& config, int64_t count);

  // One update of `params` from `grads` (both `count` long). Gradients are multiplied by
  // `grad_scale` first (gradient clipping's coefficient; 1 leaves them as they are). `grads`
  // is not modified.
  absl::Status Step(absl::Span<float> params, absl::Span<const float> grads, double lr,
                    double grad_scale = 1.0);

  int64_t count() const { return count_; }
  int64_t steps() const { return steps_; }
  const OptimizerConfig& config() const { return config_; }

  // Named state buffers, for checkpoints and state transfer: SGD "momentum_buffer" (empty
  // until the first step), AdamW "exp_avg", "exp_avg_sq". The step count is steps().
  struct NamedBuffer {
    std::string name;
    std::vector<float>* values;
  };
  std::vector<NamedBuffer> Buffers();
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  void SgdStep(float* params, const float* grads, double lr, float scale, bool scaled, bool first);
  void AdamWStep(float* params, const float* grads, double lr, float scale, bool scaled);

  OptimizerConfig config_;
  int64_t count_;
  int64_t steps_ = 0;
  std::vector<float> momentum_;  // SGD momentum buffer, AdamW exp_avg
  std::vector<float> second_moment_;  // AdamW exp_avg_sq
};

}  // namespace tandem::runtime
