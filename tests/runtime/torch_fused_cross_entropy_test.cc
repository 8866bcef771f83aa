// The fused token cross-entropy (runtime/torch/kernels/cross_entropy.cu) and the LM head's
// padded output rows (DeferrableLinearPadded) against LibTorch's composition: the loss and the
// gradients of the logits, the head's input and its weight, in float32 and bf16, with rows
// padded or not and ignored targets. The CUDA cases skip, saying why, without a device or
// without the kernels in the build; the CPU case checks the fallback every build runs.
#include <cmath>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "runtime/torch/deferred_linear.h"
#include "runtime/torch/fused_ops.h"
#include "runtime/torch/precision.h"

namespace tandem::runtime::libtorch {
namespace {

torch::Tensor Reference(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

// max |a - b| / max(max |b|, tiny)
double RelativeMaxError(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor fa = a.to(torch::kFloat64).cpu(), fb = b.to(torch::kFloat64).cpu();
  const double scale = std::max(fb.abs().max().item<double>(), 1e-30);
  return (fa - fb).abs().max().item<double>() / scale;
}

// Targets in [0, vocab), every seventh ignored (-100).
torch::Tensor Targets(int64_t rows, int64_t vocab, torch::Device device) {
  torch::Tensor targets = torch::randint(0, vocab, {rows}, torch::kLong);
  for (int64_t r = 3; r < rows; r += 7) targets[r] = -100;
  return targets.to(device);
}

struct Case {
  int64_t rows, vocab, stride;  // stride > vocab: padded rows
  torch::ScalarType type;
};

// Loss and logits' gradient (for a loss scaled by 0.25, as a micro-batch's is) of the fused
// path and of the composition on the same logits.
void ExpectSameAsComposition(const Case& c, torch::Device device, double loss_tolerance,
                             double grad_tolerance) {
  SCOPED_TRACE("rows " + std::to_string(c.rows) + " vocab " + std::to_string(c.vocab) +
               " stride " + std::to_string(c.stride) + " " + c10::toString(c.type));
  torch::manual_seed(c.rows * 131 + c.vocab);
  const torch::Tensor values = (torch::randn({c.rows, c.vocab}) * 4.0).to(c.type);
  torch::Tensor storage = torch::zeros({c.rows, c.stride}, torch::TensorOptions().dtype(c.type));
  storage.narrow(1, 0, c.vocab).copy_(values);
  const torch::Tensor base = storage.to(device).requires_grad_(true);
  const torch::Tensor logits = base.narrow(1, 0, c.vocab);
  const torch::Tensor targets = Targets(c.rows, c.vocab, device);

  const torch::Tensor loss = TokenCrossEntropyLoss(logits, targets);
  (loss * 0.25).backward();
  const torch::Tensor expected_input = values.to(device).requires_grad_(true);
  const torch::Tensor expected = Reference(expected_input, targets);
  (expected * 0.25).backward();

  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  EXPECT_LE(RelativeMaxError(loss, expected), loss_tolerance)
      << loss.item<double>() << " vs " << expected.item<double>();
  const torch::Tensor grad = base.grad().narrow(1, 0, c.vocab);
  EXPECT_LE(RelativeMaxError(grad, expected_input.grad()), grad_tolerance);
  // Ignored rows (the fourth, every seventh after) get no gradient.
  if (c.rows > 3) EXPECT_EQ(grad.select(0, 3).abs().max().item<double>(), 0.0);
}

TEST(FusedCrossEntropyTest, CpuRunsTheComposition) {
  for (const Case& c : {Case{33, 17, 17, torch::kFloat32}, Case{20, 50, 64, torch::kFloat32}}) {
    ExpectSameAsComposition(c, torch::kCPU, 1e-6, 1e-6);
  }
}

bool SkipWithoutKernels(std::string* why) {
  if (!torch::cuda::is_available()) {
    *why = "no CUDA device";
    return true;
  }
  if (!FusedKernelsBuilt()) {
    *why = "this build has no fused kernels (LibTorch without CUDA, or no nvcc)";
    return true;
  }
  return false;
}

TEST(FusedCrossEntropyTest, CudaEqualsTheCompositionInFloat32AndBf16) {
  std::string why;
  if (SkipWithoutKernels(&why)) GTEST_SKIP() << why;
  SetFusedKernelsEnabled(true);
  const torch::Device cuda(torch::kCUDA, 0);
  for (const Case& c : {Case{1, 16, 16, torch::kFloat32}, Case{257, 1001, 1001, torch::kFloat32},
                        Case{64, 50257, 50257, torch::kFloat32},
                        Case{64, 50257, 50304, torch::kFloat32},
                        Case{100, 1001, 1024, torch::kFloat32}}) {
    ExpectSameAsComposition(c, cuda, 1e-5, 1e-5);
  }
  // bf16 logits: the same inputs, the composition converts them exactly; the gradient is
  // rounded to bf16 (8 bits) in both.
  for (const Case& c : {Case{64, 50257, 50257, torch::kBFloat16},
                        Case{64, 50257, 50304, torch::kBFloat16},
                        Case{129, 1000, 1000, torch::kBFloat16},
                        Case{7, 33, 40, torch::kBFloat16}}) {
    ExpectSameAsComposition(c, cuda, 1e-5, 1.0 / 128);
  }
}

TEST(FusedCrossEntropyTest, SwitchedOffItRunsTheComposition) {
  std::string why;
  if (SkipWithoutKernels(&why)) GTEST_SKIP() << why;
  SetFusedKernelsEnabled(false);
  ExpectSameAsComposition(Case{64, 1001, 1001, torch::kBFloat16}, torch::Device(torch::kCUDA, 0),
                          1e-6, 1e-6);
  SetFusedKernelsEnabled(true);
}

// The LM head with padded output rows, then the fused loss, against at::linear and the
// composition: the loss and the gradients of the head's input and weight, under bf16
// autocast as training runs it, and in float32.
TEST(FusedCrossEntropyTest, PaddedHeadAndLossEqualTheComposition) {
  std::string why;
  if (SkipWithoutKernels(&why)) GTEST_SKIP() << why;
  SetFusedKernelsEnabled(true);
  const torch::Device cuda(torch::kCUDA, 0);
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "float32");
    torch::manual_seed(7);
    const int64_t batch = 4, length = 64, hidden = 256, vocab = 50257;
    const torch::Tensor x0 = torch::randn({batch, length, hidden}, cuda);
    const torch::Tensor w0 = torch::randn({vocab, hidden}, cuda) * 0.05;
    const torch::Tensor targets = Targets(batch * length, vocab, cuda).view({batch, length});

    torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      torch::Tensor logits;
      {
        AutocastGuard autocast(cuda, bf16 ? Precision::kBFloat16 : Precision::kFloat32);
        logits = DeferrableLinearPadded(x, w, torch::Tensor());
      }
      EXPECT_EQ(logits.stride(1), 50304) << "rows not padded";
      EXPECT_EQ(logits.scalar_type(), bf16 ? torch::kBFloat16 : torch::kFloat32);
      loss = TokenCrossEntropyLoss(logits, targets);
    }
    loss.backward();

    torch::Tensor rx = x0.clone().requires_grad_(true), rw = w0.clone().requires_grad_(true);
    const auto type = bf16 ? torch::kBFloat16 : torch::kFloat32;
    const torch::Tensor reference_logits = at::linear(rx.to(type), rw.to(type));
    const torch::Tensor expected = Reference(reference_logits, targets);
    expected.backward();

    const double tolerance = bf16 ? 2e-2 : 1e-4;
    EXPECT_LE(RelativeMaxError(loss, expected), bf16 ? 1e-3 : 1e-5);
    EXPECT_LE(RelativeMaxError(x.grad(), rx.grad()), tolerance);
    EXPECT_LE(RelativeMaxError(w.grad(), rw.grad()), tolerance);
  }
}

}  // namespace
}  // namespace tandem::runtime::libtorch
