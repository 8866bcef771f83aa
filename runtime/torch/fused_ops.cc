#include "runtime/torch/fused_ops.h"

#include <atomic>
#include <stdexcept>
#include <string>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/loss.h>
#include <ATen/ATen.h>

#if TANDEM_FUSED_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>

#include "runtime/torch/kernels/cross_entropy.h"
#endif

namespace tandem::runtime::libtorch {
namespace {

constexpr int64_t kIgnoreIndex = -100;  // torch's cross_entropy default

std::atomic<bool> g_enabled{true};

// LibTorch's composition, the reference.
torch::Tensor ComposedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t vocab = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.to(torch::kFloat32).reshape({-1, vocab}),
                                              targets.reshape({-1}));
}

#if TANDEM_FUSED_KERNELS
void Check(int error, const char* what) {
  if (error != 0) {
    throw std::runtime_error(std::string(what) + ": " +
                             cudaGetErrorString(static_cast<cudaError_t>(error)));
  }
}

// [rows, vocab] with unit column stride, row stride >= vocab: the logits as they are, or a
// contiguous copy where they are laid out otherwise.
torch::Tensor AsRows(const torch::Tensor& logits) {
  const int64_t vocab = logits.size(-1);
  torch::Tensor rows = logits.dim() == 2 ? logits : logits.reshape({-1, vocab});
  if (rows.stride(1) != 1 || rows.stride(0) < vocab) rows = rows.contiguous();
  return rows;
}

kernels::LogitType TypeOf(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? kernels::LogitType::kBFloat16
                                             : kernels::LogitType::kFloat32;
}

// Forward: each row's log-sum-exp and loss; backward: the gradient in one pass, scaled by the
// loss's gradient over the number of targets (device tensors: nothing waits for the host).
struct CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor logits,
                               torch::Tensor targets) {
    const torch::Tensor rows = AsRows(logits);
    const torch::Tensor flat_targets = targets.reshape({-1}).to(torch::kLong).contiguous();
    const int64_t count = rows.size(0);
    if (flat_targets.size(0) != count) {
      throw std::invalid_argument("cross-entropy: " + std::to_string(flat_targets.size(0)) +
                                  " targets for " + std::to_string(count) + " rows of logits");
    }
    const auto stats = rows.options().dtype(torch::kFloat32);
    torch::Tensor lse = torch::empty({count}, stats);
    torch::Tensor loss = torch::empty({count}, stats);
    Check(kernels::CrossEntropyForward(rows.data_ptr(), TypeOf(rows), count, rows.size(1),
                                       rows.stride(0), flat_targets.data_ptr<int64_t>(),
                                       kIgnoreIndex, lse.data_ptr<float>(),
                                       loss.data_ptr<float>(),
                                       at::cuda::getCurrentCUDAStream().stream()),
          "cross-entropy forward");
    // The mean over the targets that count (a division by zero gives NaN, as torch's does).
    const torch::Tensor counted = flat_targets.ne(kIgnoreIndex).sum().to(torch::kFloat32);
    ctx->save_for_backward({rows, flat_targets, lse, counted});
    ctx->saved_data["shape"] = logits.sizes().vec();
    return loss.sum() / counted;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& rows = saved[0];
    const torch::Tensor& targets = saved[1];
    const torch::Tensor& lse = saved[2];
    const torch::Tensor& counted = saved[3];
    const torch::Tensor scale = (grads[0].to(torch::kFloat32) / counted).contiguous();
    // The gradient with the logits' row stride, so the LM head's products read it aligned.
    const int64_t count = rows.size(0), vocab = rows.size(1), stride = rows.stride(0);
    torch::Tensor grad = torch::empty({count, stride}, rows.options()).narrow(1, 0, vocab);
    Check(kernels::CrossEntropyBackward(rows.data_ptr(), TypeOf(rows), count, vocab, stride,
                                        targets.data_ptr<int64_t>(), kIgnoreIndex,
                                        lse.data_ptr<float>(), scale.data_ptr<float>(),
                                        grad.data_ptr(), at::cuda::getCurrentCUDAStream().stream()),
          "cross-entropy backward");
    const auto shape = ctx->saved_data["shape"].toIntVector();
    return {grad.view(shape), torch::Tensor()};
  }
};
#endif

}  // namespace

bool FusedKernelsBuilt() {
#if TANDEM_FUSED_KERNELS
  return true;
#else
  return false;
#endif
}

bool FusedKernelsEnabled() { return FusedKernelsBuilt() && g_enabled.load(); }

void SetFusedKernelsEnabled(bool enabled) { g_enabled.store(enabled); }

torch::Tensor TokenCrossEntropyLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
#if TANDEM_FUSED_KERNELS
  if (FusedKernelsEnabled() && logits.is_cuda() &&
      (logits.scalar_type() == torch::kBFloat16 || logits.scalar_type() == torch::kFloat32)) {
    return CrossEntropyFunction::apply(logits, targets);
  }
#endif
  return ComposedCrossEntropy(logits, targets);
}

}  // namespace tandem::runtime::libtorch
