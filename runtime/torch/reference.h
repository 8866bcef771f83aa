// The single-process reference trainer: plain LibTorch training of a whole LayeredModel with
// torch::optim (SGD with momentum or AdamW), optional global-norm gradient clipping
// (torch::nn::utils::clip_grad_norm_), the shared learning-rate schedule (runtime/lr_schedule.h)
// and the batch rule of runtime/torch/data.h (iteration i trains on samples [0, G) of i).
// It is the oracle of the equivalence tests: a pipelined, data-parallel run with the same seed,
// model, data and optimizer settings must give the same per-iteration losses and final
// parameters. The engine applies its optimizer with its own code on flat buffers; this trainer
// deliberately uses torch::optim so the comparison is between independent implementations.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/lr_schedule.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"
#include "runtime/torch/precision.h"

namespace tandem::runtime::libtorch {

enum class OptimizerKind { kSgd, kAdamW };

// PyTorch's parameters and formulas (torch.optim.SGD, torch.optim.AdamW). The learning rate
// comes from the LrSchedule.
struct ReferenceOptimizer {
  OptimizerKind kind = OptimizerKind::kSgd;
  double momentum = 0;      // SGD
  double weight_decay = 0;  // SGD: added to the gradient (L2); AdamW: decoupled
  double beta1 = 0.9;       // AdamW
  double beta2 = 0.999;
  double eps = 1e-8;
};

struct ReferenceOptions {
  int64_t global_batch = 8;  // G samples per iteration
  int64_t steps = 10;
  ReferenceOptimizer optimizer;
  LrSchedule lr;
  double clip_norm = 0;  // > 0: clip the global gradient norm to this
  // Gradient accumulation: the global batch is processed in this many equal slices (each
  // loss scaled by 1 / slices). 1: one forward of the whole batch.
  int accumulation_slices = 1;
  torch::Device device = torch::kCPU;
  // bf16: the forward under autocast, the loss in float32 (runtime/torch/precision.h).
  Precision precision = Precision::kFloat32;
};

struct ReferenceResult {
  std::vector<double> losses;          // mean loss of the global batch, per iteration
  std::vector<double> grad_norms;      // global gradient norm before clipping, per iteration
  std::vector<double> learning_rates;  // rate applied at each iteration
  // Final parameters on the CPU, named as LayeredModel::NamedParameters names them.
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
};

// Trains a deep copy of `model` (the argument is not modified). InvalidArgument for bad
// options; LibTorch errors name the iteration.
absl::StatusOr<ReferenceResult> TrainReference(const LayeredModel& model, const Dataset& data,
                                               const ReferenceOptions& options);

}  // namespace tandem::runtime::libtorch
