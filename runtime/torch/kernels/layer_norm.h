// Fused residual add and normalisation for pre-LN transformer blocks, as CUDA kernels behind a
// plain C++ interface (no CUDA or LibTorch headers: fused_layer_norm.cc calls them, the models
// never do). One forward kernel reads the residual stream x and the block's output delta once
// and writes
//
//   sum    = x + delta                                     (x's type; rounded to it first)
//   normed = LayerNorm(sum) * weight + bias                (normed_type)
//        or  sum * rsqrt(mean(sum^2) + eps) * weight       (RMSNorm, Llama)
//
// plus each row's mean (LayerNorm) and reciprocal standard deviation, all in float32
// arithmetic. One backward kernel computes, in one pass over the rows,
//
//   grad_input = grad_sum + NormBackward(grad_normed)
//
// and per-block column sums of grad_normed * xhat (and grad_normed) for the weight (and bias)
// gradients, which a second small kernel adds up in a fixed order: no floating-point atomics,
// so the gradients are the same bits on every run.
//
// Layout: `rows` rows of `hidden` contiguous elements (row stride == hidden), 1 <= hidden <=
// kMaxNormHidden. Elements are float32 or bfloat16; weight, bias, mean, rstd and the weight and
// bias gradients are float32. Where hidden % 4 == 0 and every pointer is aligned to four of its
// elements the kernels load and store four elements at a time; otherwise one.
//
// Each launcher enqueues its kernels on `stream` (a cudaStream_t; null: the legacy default
// stream) of the current device and returns a cudaError_t value: 0 (cudaSuccess), 1
// (cudaErrorInvalidValue) for arguments outside this contract, else cudaGetLastError() after
// the launches. rows == 0 launches nothing.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::runtime::kernels {

enum class NormElementType : int { kFloat32 = 0, kBFloat16 = 1 };

// The largest `hidden` the kernels take (each thread keeps its part of a row in registers).
inline constexpr int64_t kMaxNormHidden = 16384;

// The forward of the residual add and the normalisation.
struct NormForwardArgs {
  int64_t rows = 0;
  int64_t hidden = 0;
  float epsilon = 0.0f;
  const void* x = nullptr;  // [rows, hidden], required
  NormElementType x_type = NormElementType::kFloat32;
  // [rows, hidden]; null: the kernels normalise x itself and write no sum.
  const void* delta = nullptr;
  NormElementType delta_type = NormElementType::kFloat32;
  const float* weight = nullptr;  // [hidden], required
  const float* bias = nullptr;    // [hidden]; LayerNorm only, null: none
  // [rows, hidden] in x_type: x + delta where delta is given (null: not written).
  void* sum = nullptr;
  void* normed = nullptr;  // [rows, hidden], required
  NormElementType normed_type = NormElementType::kFloat32;
  float* mean = nullptr;  // [rows]; required by LayerNorm, unused by RMSNorm
  float* rstd = nullptr;  // [rows], required: 1 / sqrt(variance (or mean square) + epsilon)
};

int LayerNormForward(const NormForwardArgs& args, void* stream);
int RmsNormForward(const NormForwardArgs& args, void* stream);

// The backward: gradients of the forward's inputs from those of its outputs.
struct NormBackwardArgs {
  int64_t rows = 0;
  int64_t hidden = 0;
  // What the forward normalised ([rows, hidden]): its sum where it had a delta, else x.
  const void* input = nullptr;
  NormElementType input_type = NormElementType::kFloat32;
  const float* mean = nullptr;    // the forward's (LayerNorm; unused by RMSNorm)
  const float* rstd = nullptr;    // the forward's, required
  const float* weight = nullptr;  // [hidden], required
  const void* grad_normed = nullptr;  // [rows, hidden], required
  NormElementType grad_normed_type = NormElementType::kFloat32;
  const void* grad_sum = nullptr;  // [rows, hidden]; null: zero (the sum had no other use)
  NormElementType grad_sum_type = NormElementType::kFloat32;
  void* grad_input = nullptr;  // [rows, hidden], required: grad_sum + the norm's gradient
  NormElementType grad_input_type = NormElementType::kFloat32;
  // [rows, hidden]; null: not written. The same values as grad_input in another type (delta's
  // gradient where delta's type differs from x's), written by the same pass.
  void* grad_delta = nullptr;
  NormElementType grad_delta_type = NormElementType::kFloat32;
  float* grad_weight = nullptr;  // [hidden]; null: not computed
  float* grad_bias = nullptr;    // [hidden]; LayerNorm only, null: not computed
  // Per-block partial column sums: at least NormBackwardScratchBytes(rows, hidden) bytes,
  // aligned to 16, on the device (needed only where grad_weight or grad_bias is given).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

// The scratch the backward of (rows, hidden) needs, for LayerNorm and RMSNorm alike.
size_t NormBackwardScratchBytes(int64_t rows, int64_t hidden);

int LayerNormBackward(const NormBackwardArgs& args, void* stream);
int RmsNormBackward(const NormBackwardArgs& args, void* stream);

// cudaGetErrorString of a launcher's result.
const char* NormKernelErrorString(int code);

}  // namespace tandem::runtime::kernels
