// The residual add and the normalisation of a pre-LN transformer block in one pass:
//
//   sum    = x + delta                      (x's type: the residual stream, float32 or bf16)
//   normed = Norm(sum) in float32 arithmetic, converted to `output_type`
//
// On CUDA tensors, where this build has the fused kernels and they are switched on
// (FusedKernelsEnabled() in fused_ops.h), one kernel reads x and delta once and writes both,
// and one backward kernel gives every gradient (kernels/layer_norm.h), through a custom
// autograd function: x's gradient in x's type, delta's in delta's, weight's and bias's in
// float32. Elsewhere (the CPU, other types, hidden sizes over kernels::kMaxNormHidden, a
// weight that is not a float32 vector of hidden elements, a delta of another shape) the
// LibTorch composition: (x + delta) in x's type, layer_norm (or RMSNorm) of it in float32,
// .to(output_type). Neither casts through autocast: the results have the types asked for.
#pragma once

#include <torch/types.h>

namespace tandem::runtime::libtorch {

struct ResidualNorm {
  torch::Tensor sum;     // x + delta in x's type; x itself where delta is undefined
  torch::Tensor normed;  // in the output type asked for
};

// sum = x + delta (delta may be undefined: sum is x), normed = LayerNorm(sum) * weight + bias
// over the last dimension (bias may be undefined: none).
ResidualNorm ResidualLayerNorm(const torch::Tensor& x, const torch::Tensor& delta,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               double eps, torch::ScalarType output_type);

// The same with Llama's RMSNorm: normed = sum * rsqrt(mean(sum^2) + eps) * weight.
ResidualNorm ResidualRmsNorm(const torch::Tensor& x, const torch::Tensor& delta,
                             const torch::Tensor& weight, double eps,
                             torch::ScalarType output_type);

}  // namespace tandem::runtime::libtorch
