#include "runtime/torch/fused_layer_norm.h"

#include <cstdint>

#include <torch/csrc/autograd/custom_function.h>
#include <ATen/ATen.h>

#include "runtime/torch/fused_ops.h"

#if TANDEM_FUSED_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "runtime/torch/kernels/layer_norm.h"
#endif

namespace tandem::runtime::libtorch {
namespace {

enum class NormKind : int64_t { kLayerNorm = 0, kRmsNorm = 1 };

// LibTorch's composition: the fallback, and what the kernels are tested against. The sum in
// x's type, the norm in float32 (float64 for float64 inputs).
ResidualNorm ComposedResidualNorm(NormKind kind, const torch::Tensor& x,
                                  const torch::Tensor& delta, const torch::Tensor& weight,
                                  const torch::Tensor& bias, double eps,
                                  torch::ScalarType output_type) {
  ResidualNorm result;
  result.sum = delta.defined() ? (x + delta).to(x.scalar_type()) : x;
  const torch::ScalarType compute = at::promote_types(result.sum.scalar_type(), torch::kFloat);
  const torch::Tensor h = result.sum.to(compute);
  const torch::Tensor w = weight.defined() ? weight.to(compute) : weight;
  torch::Tensor normed;
  if (kind == NormKind::kLayerNorm) {
    normed = at::layer_norm(h, {h.size(-1)}, w, bias.defined() ? bias.to(compute) : bias, eps);
  } else {
    normed = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
    if (w.defined()) normed = normed * w;
  }
  result.normed = normed.to(output_type);
  return result;
}

#if TANDEM_FUSED_KERNELS
bool KernelType(torch::ScalarType type) {
  return type == torch::kFloat || type == torch::kBFloat16;
}

kernels::NormElementType ElementType(torch::ScalarType type) {
  return type == torch::kBFloat16 ? kernels::NormElementType::kBFloat16
                                  : kernels::NormElementType::kFloat32;
}

// A float32 vector of `hidden` elements on `device`.
bool NormParameter(const torch::Tensor& t, int64_t hidden, const torch::Device& device) {
  return t.scalar_type() == torch::kFloat && t.dim() == 1 && t.size(0) == hidden &&
         t.device() == device;
}

// Whether the kernels take these arguments (else the composition runs).
bool FusedApplies(const torch::Tensor& x, const torch::Tensor& delta,
                  const torch::Tensor& weight, const torch::Tensor& bias,
                  torch::ScalarType output_type) {
  if (!FusedKernelsEnabled() || !x.defined() || !x.is_cuda() || x.dim() < 1) return false;
  const int64_t hidden = x.size(-1);
  if (hidden < 1 || hidden > kernels::kMaxNormHidden || !KernelType(x.scalar_type()) ||
      !KernelType(output_type)) {
    return false;
  }
  if (!weight.defined() || !NormParameter(weight, hidden, x.device())) return false;
  if (bias.defined() && !NormParameter(bias, hidden, x.device())) return false;
  return !delta.defined() || (KernelType(delta.scalar_type()) && delta.sizes() == x.sizes() &&
                              delta.device() == x.device());
}

void CheckLaunch(int code, const char* what) {
  TORCH_CHECK(code == 0, what, ": ", kernels::NormKernelErrorString(code));
}

// What the function computes; the tensors' presence (LibTorch 1.13's custom functions take
// no undefined tensors, so absent ones are passed as empty stand-ins).
struct NormSettings {
  NormKind kind;
  bool has_delta;
  bool has_bias;
  double eps;
  torch::ScalarType output_type;
};

// Inputs x, delta, weight, bias (delta and bias empty stand-ins where absent); outputs the sum
// (an empty stand-in without delta) and the normalised rows. Saves what the forward normalised
// (the sum, or x), the weight and each row's mean and rstd.
struct ResidualNormFunction : public torch::autograd::Function<ResidualNormFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                torch::Tensor x, torch::Tensor delta,
                                                torch::Tensor weight, torch::Tensor bias,
                                                NormSettings settings) {
    const c10::cuda::CUDAGuard device_guard(x.device());
    const bool layer_norm = settings.kind == NormKind::kLayerNorm;
    const int64_t hidden = x.size(-1);
    const int64_t rows = x.numel() / hidden;
    const torch::Tensor x_rows = x.contiguous();
    const torch::Tensor delta_rows = settings.has_delta ? delta.contiguous() : delta;
    const torch::Tensor weight_vector = weight.contiguous();
    const torch::Tensor bias_vector = settings.has_bias ? bias.contiguous() : bias;
    const torch::Tensor sum = settings.has_delta ? torch::empty(x.sizes(), x.options())
                                                 : torch::empty({0}, x.options());
    torch::Tensor normed = torch::empty(x.sizes(), x.options().dtype(settings.output_type));
    const auto stats = x.options().dtype(torch::kFloat);
    const torch::Tensor mean = torch::empty({layer_norm ? rows : 0}, stats);
    const torch::Tensor rstd = torch::empty({rows}, stats);

    kernels::NormForwardArgs args;
    args.rows = rows;
    args.hidden = hidden;
    args.epsilon = static_cast<float>(settings.eps);
    args.x = x_rows.data_ptr();
    args.x_type = ElementType(x.scalar_type());
    if (settings.has_delta) {
      args.delta = delta_rows.data_ptr();
      args.delta_type = ElementType(delta.scalar_type());
      args.sum = sum.data_ptr();
    }
    args.weight = weight_vector.data_ptr<float>();
    args.bias = settings.has_bias ? bias_vector.data_ptr<float>() : nullptr;
    args.normed = normed.data_ptr();
    args.normed_type = ElementType(settings.output_type);
    args.mean = layer_norm ? mean.data_ptr<float>() : nullptr;
    args.rstd = rstd.data_ptr<float>();
    void* stream = at::cuda::getCurrentCUDAStream(x.device().index()).stream();
    CheckLaunch(layer_norm ? kernels::LayerNormForward(args, stream)
                           : kernels::RmsNormForward(args, stream),
                layer_norm ? "residual layer norm forward" : "residual RMS norm forward");

    // A sum or normed output the loss does not use has no gradient: the kernels read no zeros.
    ctx->set_materialize_grads(false);
    if (!settings.has_delta) ctx->mark_non_differentiable({sum});
    ctx->save_for_backward({settings.has_delta ? sum : x_rows, weight_vector, mean, rstd});
    ctx->saved_data["kind"] = static_cast<int64_t>(settings.kind);
    ctx->saved_data["has_delta"] = settings.has_delta;
    ctx->saved_data["has_bias"] = settings.has_bias;
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["delta_type"] = static_cast<int64_t>(delta.scalar_type());
    ctx->saved_data["output_type"] = static_cast<int64_t>(settings.output_type);
    return {sum, normed};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];  // what the forward normalised, in x's type
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& mean = saved[2];
    const torch::Tensor& rstd = saved[3];
    const bool layer_norm =
        static_cast<NormKind>(ctx->saved_data["kind"].toInt()) == NormKind::kLayerNorm;
    const bool has_delta = ctx->saved_data["has_delta"].toBool();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const auto x_type = static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt());
    const auto delta_type = static_cast<torch::ScalarType>(ctx->saved_data["delta_type"].toInt());
    const auto output_type =
        static_cast<torch::ScalarType>(ctx->saved_data["output_type"].toInt());
    const bool need_x = ctx->needs_input_grad(0);
    const bool need_delta = has_delta && ctx->needs_input_grad(1);
    const bool need_weight = ctx->needs_input_grad(2);
    const bool need_bias = has_bias && ctx->needs_input_grad(3);
    const c10::cuda::CUDAGuard device_guard(input.device());

    // Gradients arrive in the outputs' types, possibly expanded (the gradient of a sum()).
    const torch::Tensor grad_sum =
        has_delta && grads[0].defined() ? grads[0].to(x_type).contiguous() : torch::Tensor();
    const torch::Tensor grad_normed =
        grads[1].defined() ? grads[1].to(output_type).contiguous() : torch::Tensor();
    torch::Tensor grad_x, grad_delta, grad_weight, grad_bias;
    if (!grad_normed.defined()) {
      // Only the sum was used: its gradient passes to x and delta.
      if (grad_sum.defined()) {
        if (need_x) grad_x = grad_sum;
        if (need_delta) grad_delta = grad_sum.to(delta_type);
      }
      return {grad_x, grad_delta, grad_weight, grad_bias, torch::Tensor()};
    }
    if (!need_x && !need_delta && !need_weight && !need_bias) {
      return {grad_x, grad_delta, grad_weight, grad_bias, torch::Tensor()};
    }

    const int64_t hidden = input.size(-1);
    const int64_t rows = input.numel() / hidden;
    const torch::Tensor grad_input = torch::empty(input.sizes(), input.options());
    // Delta's gradient has the same values; a second output of the kernel where its type
    // differs (a bf16 block output added to a float32 stream).
    const bool separate_delta = need_delta && delta_type != x_type;
    if (separate_delta) grad_delta = torch::empty(input.sizes(), input.options().dtype(delta_type));
    if (need_weight) grad_weight = torch::empty({hidden}, weight.options());
    if (need_bias) grad_bias = torch::empty({hidden}, weight.options());
    const size_t scratch_bytes =
        need_weight || need_bias ? kernels::NormBackwardScratchBytes(rows, hidden) : 0;
    const torch::Tensor scratch = torch::empty({static_cast<int64_t>(scratch_bytes)},
                                               input.options().dtype(torch::kByte));

    kernels::NormBackwardArgs args;
    args.rows = rows;
    args.hidden = hidden;
    args.input = input.data_ptr();
    args.input_type = ElementType(x_type);
    args.mean = layer_norm ? mean.data_ptr<float>() : nullptr;
    args.rstd = rstd.data_ptr<float>();
    args.weight = weight.data_ptr<float>();
    args.grad_normed = grad_normed.data_ptr();
    args.grad_normed_type = ElementType(output_type);
    if (grad_sum.defined()) {
      args.grad_sum = grad_sum.data_ptr();
      args.grad_sum_type = ElementType(x_type);
    }
    args.grad_input = grad_input.data_ptr();
    args.grad_input_type = ElementType(x_type);
    if (separate_delta) {
      args.grad_delta = grad_delta.data_ptr();
      args.grad_delta_type = ElementType(delta_type);
    }
    args.grad_weight = need_weight ? grad_weight.data_ptr<float>() : nullptr;
    args.grad_bias = need_bias ? grad_bias.data_ptr<float>() : nullptr;
    args.scratch = scratch_bytes > 0 ? scratch.data_ptr() : nullptr;
    args.scratch_bytes = scratch_bytes;
    void* stream = at::cuda::getCurrentCUDAStream(input.device().index()).stream();
    CheckLaunch(layer_norm ? kernels::LayerNormBackward(args, stream)
                           : kernels::RmsNormBackward(args, stream),
                layer_norm ? "residual layer norm backward" : "residual RMS norm backward");

    if (need_x) grad_x = grad_input;
    if (need_delta && !separate_delta) grad_delta = grad_input;
    return {grad_x, grad_delta, grad_weight, grad_bias, torch::Tensor()};
  }
};

ResidualNorm FusedResidualNorm(NormKind kind, const torch::Tensor& x, const torch::Tensor& delta,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               double eps, torch::ScalarType output_type) {
  NormSettings settings;
  settings.kind = kind;
  settings.has_delta = delta.defined();
  settings.has_bias = bias.defined();
  settings.eps = eps;
  settings.output_type = output_type;
  const torch::Tensor absent = torch::empty({0}, x.options());
  const torch::autograd::variable_list outputs = ResidualNormFunction::apply(
      x, settings.has_delta ? delta : absent, weight, settings.has_bias ? bias : absent,
      settings);
  ResidualNorm result;
  result.sum = settings.has_delta ? outputs[0] : x;
  result.normed = outputs[1];
  return result;
}
#endif  // TANDEM_FUSED_KERNELS

}  // namespace

ResidualNorm ResidualLayerNorm(const torch::Tensor& x, const torch::Tensor& delta,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               double eps, torch::ScalarType output_type) {
#if TANDEM_FUSED_KERNELS
  if (FusedApplies(x, delta, weight, bias, output_type)) {
    return FusedResidualNorm(NormKind::kLayerNorm, x, delta, weight, bias, eps, output_type);
  }
#endif
  return ComposedResidualNorm(NormKind::kLayerNorm, x, delta, weight, bias, eps, output_type);
}

ResidualNorm ResidualRmsNorm(const torch::Tensor& x, const torch::Tensor& delta,
                             const torch::Tensor& weight, double eps,
                             torch::ScalarType output_type) {
#if TANDEM_FUSED_KERNELS
  if (FusedApplies(x, delta, weight, torch::Tensor(), output_type)) {
    return FusedResidualNorm(NormKind::kRmsNorm, x, delta, weight, torch::Tensor(), eps,
                             output_type);
  }
#endif
  return ComposedResidualNorm(NormKind::kRmsNorm, x, delta, weight, torch::Tensor(), eps,
                              output_type);
}

}  // namespace tandem::runtime::libtorch
