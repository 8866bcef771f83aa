#include "runtime/torch/deferred_linear.h"

#include <atomic>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>
#include <ATen/ATen.h>

#include "runtime/torch/fused_ops.h"
#include "runtime/torch/precision.h"

namespace tandem::runtime::libtorch {
namespace {

std::atomic<const LinearGradScope*> g_scope{nullptr};  // the live scope, if any

// [..., n] -> [rows, n]
torch::Tensor Rows(const torch::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// weight.grad (+)= g^T x for rows g (output gradients) and x (inputs) of the compute type:
// straight into .grad where the types agree (one GEMM, beta 0 for the first gradient and 1
// after), else the product converted on its way in (bfloat16 products, float32 gradients).
// A padded product's g has more columns than the weight has rows (PaddedProduct): the
// product over all of them, cut to the weight's rows.
void AccumulateWeightGradient(GradientWriter* writer, const torch::Tensor& weight,
                              const torch::Tensor& g, const torch::Tensor& x) {
  torch::Tensor grad = weight.grad();
  const bool first = writer != nullptr && writer->TakeFirst(weight);
  const bool padded = g.size(1) != grad.size(0);
  if (grad.scalar_type() == g.scalar_type() && !padded) {
    if (first) {
      at::mm_out(grad, g.t(), x);
    } else {
      grad.addmm_(g.t(), x);
    }
    return;
  }
  const torch::Tensor product = g.t().mm(x).narrow(0, 0, grad.size(0));
  if (first) {
    grad.copy_(product);
  } else {
    grad.add_(product.to(grad.scalar_type()));
  }
}

// The bias gradient: the rows' sum (of the bias's columns, where g is padded), accumulated in
// the bias's type.
torch::Tensor BiasGradient(const torch::Tensor& g, const torch::Tensor& bias) {
  return g.narrow(1, 0, bias.size(0)).sum(0, /*keepdim=*/false, bias.scalar_type());
}

// bias.grad (+)= the rows' sum: the first gradient summed straight into .grad (no temporary
// and no copy of it, one fewer kernel per layer).
void AccumulateBiasGradient(GradientWriter* writer, const torch::Tensor& bias,
                            const torch::Tensor& whole) {
  const torch::Tensor g = whole.narrow(1, 0, bias.size(0));  // a padded product's columns
  torch::Tensor grad = bias.grad();
  if (writer != nullptr && writer->TakeFirst(bias)) {
    at::sum_out(grad, g, {0}, /*keepdim=*/false, grad.scalar_type());
  } else {
    grad.add_(g.sum(0, /*keepdim=*/false, grad.scalar_type()));
  }
}

// `t` in autocast's compute type `type` where autocast would cast it (floating point, not
// double), unchanged otherwise.
torch::Tensor Lower(const torch::Tensor& t, torch::ScalarType type) {
  if (!t.defined() || !t.is_floating_point() || t.scalar_type() == torch::kFloat64) return t;
  return t.to(type);
}

// `t` [n, ...] with zeros appended along dimension 0 up to `padded`, in t's type.
torch::Tensor PadRows(const torch::Tensor& t, int64_t padded) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = padded;
  torch::Tensor result = torch::empty(shape, t.options());
  result.narrow(0, 0, t.size(0)).copy_(t);
  result.narrow(0, t.size(0), padded - t.size(0)).zero_();
  return result;
}

// x W^T (+ b) over `padded` output columns: the weight (and bias) as computed with, zero rows
// appended, so that every dimension of the product and of its two backward products is a
// multiple of the padding. cuBLAS keeps a product with an odd dimension on a slow kernel
// whatever its strides: GPT-2's LM head over 50,257 words stepped in 56 ms on an H200 with
// only the rows padded, against 36 ms at 50,304 words. Returns the first `columns` columns, a
// view whose rows lie `padded` elements apart. Saves the padded weight in place of the weight
// as computed with, and `padded`.
torch::Tensor PaddedProduct(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                            const torch::Tensor& weight_compute, const torch::Tensor& weight,
                            const torch::Tensor& bias, const torch::Tensor& bias_compute,
                            int64_t padded) {
  const int64_t columns = weight.size(0);
  const torch::Tensor rows = Rows(x);
  const torch::Tensor padded_weight = PadRows(weight_compute, padded);
  torch::Tensor full;
  if (bias.defined()) {
    ctx->save_for_backward({x, padded_weight, weight, bias});
    full = at::addmm(PadRows(bias_compute.to(rows.scalar_type()), padded), rows,
                     padded_weight.t());
  } else {
    ctx->save_for_backward({x, padded_weight, weight});
    full = at::mm(rows, padded_weight.t());
  }
  ctx->saved_data["padded"] = padded;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = columns;
  return full.narrow(1, 0, columns).view(shape);
}

// The output gradient g [rows, columns] of a padded product as [rows, padded] with zeros beyond
// `columns`: g itself widened where its rows already lie `padded` elements apart in a buffer
// that holds them whole (TokenCrossEntropyLoss writes its gradient so; the columns beyond are
// the buffer's own padding, zeroed here), else a padded copy.
torch::Tensor PaddedGradient(const torch::Tensor& g, int64_t padded) {
  const int64_t rows = g.size(0), columns = g.size(1);
  const bool widens =
      rows > 0 && g.stride(1) == 1 && g.stride(0) == padded &&
      (g.storage_offset() + rows * padded) * static_cast<int64_t>(g.element_size()) <=
          static_cast<int64_t>(g.storage().nbytes());
  if (!widens) return at::constant_pad_nd(g, {0, padded - columns}, 0);
  torch::Tensor full = g.as_strided({rows, padded}, {padded, 1});
  full.narrow(1, columns, padded - columns).zero_();
  return full;
}

// y = x W^T (+ b). Under autocast the layer casts its operands itself, as autocast would, and
// keeps the cast copies for the backward: autograd's own linear keeps autocast's bfloat16
// copies of the input and weight, where keeping the float32 originals made every backward
// cast both again (about 1.4 ms of a 85 ms GPT-2 small step on an H200) and held a float32
// input (twice the bytes) between forward and backward. Casting here rather than inside
// at::linear also keeps the parameters out of autocast's cast cache, which would otherwise
// hold copies made with autograd off (a custom function's forward) for other uses of the same
// weight. Saved: the input and weight as computed with, the weight itself (whose gradient W
// adds to) and the bias.
torch::Tensor LinearForward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                            const torch::Tensor& weight, const torch::Tensor& bias,
                            int64_t pad_columns) {
  torch::Tensor x_compute = x, weight_compute = weight, bias_compute = bias;
  if (const std::optional<torch::ScalarType> type = AutocastMatmulType(x.device())) {
    x_compute = Lower(x, *type);
    weight_compute = Lower(weight, *type);
    bias_compute = Lower(bias, *type);
  }
  ctx->saved_data["input_type"] = static_cast<int64_t>(x.scalar_type());
  const int64_t columns = weight.size(0);
  if (pad_columns > 1 && columns % pad_columns != 0 && x.numel() > 0) {
    return PaddedProduct(ctx, x_compute, weight_compute, weight, bias, bias_compute,
                         (columns + pad_columns - 1) / pad_columns * pad_columns);
  }
  if (bias.defined()) {
    ctx->save_for_backward({x_compute, weight_compute, weight, bias});
    // at::linear, not torch::nn::functional::linear: the latter is a matmul and a separate
    // `+= bias` (an unvectorised mixed-type kernel under autocast: 3.9 ms of an 85 ms GPT-2
    // small step on an H200); at::linear folds the bias into the GEMM's epilogue.
    return at::linear(x_compute, weight_compute, bias_compute);
  }
  ctx->save_for_backward({x_compute, weight_compute, weight});
  return at::linear(x_compute, weight_compute);
}

// The weight's and bias's gradients of y = x W^T (+ b) from the output gradient's rows and
// the input x as computed with (bias undefined: none). Inside a LinearGradScope they go into
// .grad (or are deferred to W) and come back undefined; outside one, or for a weight computed
// from others (not a leaf with a .grad), they come back for autograd.
std::pair<torch::Tensor, torch::Tensor> ParameterGradients(const torch::Tensor& rows,
                                                           const torch::Tensor& x,
                                                           const torch::Tensor& weight,
                                                           const torch::Tensor& bias,
                                                           bool needs_weight, bool needs_bias) {
  const auto dtype = rows.scalar_type();
  const bool has_bias = bias.defined();
  auto has_grad = [](const torch::Tensor& t) { return t.is_leaf() && t.grad().defined(); };
  const LinearGradScope* scope = has_grad(weight) && (!has_bias || has_grad(bias))
                                     ? g_scope.load(std::memory_order_acquire)
                                     : nullptr;
  torch::Tensor grad_weight, grad_bias;
  if (scope != nullptr && scope->deferred() != nullptr) {
    scope->deferred()->Add({x, rows, weight, bias});  // W computes them
  } else if (scope != nullptr) {
    // Written where they belong, not handed to autograd (which would add a converted copy).
    torch::NoGradGuard no_grad;
    if (needs_weight) AccumulateWeightGradient(scope->writer(), weight, rows, Rows(x.to(dtype)));
    if (needs_bias) AccumulateBiasGradient(scope->writer(), bias, rows);
  } else {
    if (needs_weight) {
      grad_weight =
          rows.t().mm(Rows(x.to(dtype))).narrow(0, 0, weight.size(0)).to(weight.scalar_type());
    }
    if (needs_bias) grad_bias = BiasGradient(rows, bias);
  }
  return {grad_weight, grad_bias};
}

// The gradients of y = x W^T (+ b) from dL/dy. Inside a LinearGradScope the weight and bias
// gradients go into .grad (or are deferred to W) instead of back to autograd. LibTorch 1.13's
// custom functions take no undefined tensors, so the layers with and without a bias are two
// functions sharing this. A padded product (PaddedProduct) runs its products over the padded
// width, its output gradient widened to it; the weight's and bias's gradients are then cut
// to their rows (AccumulateWeightGradient, BiasGradient, AccumulateBiasGradient).
torch::autograd::variable_list LinearBackward(torch::autograd::AutogradContext* ctx,
                                              const torch::Tensor& g, bool has_bias) {
  const auto found = ctx->saved_data.find("padded");
  const int64_t padded = found == ctx->saved_data.end() ? 0 : found->second.toInt();
  const auto saved = ctx->get_saved_variables();
  const torch::Tensor& x = saved[0];  // as the forward computed with (bfloat16 under autocast)
  const torch::Tensor& weight_compute = saved[1];
  const torch::Tensor& weight = saved[2];
  const torch::Tensor bias = has_bias ? saved[3] : torch::Tensor();
  const auto input_type = static_cast<torch::ScalarType>(ctx->saved_data["input_type"].toInt());
  // The arithmetic of the forward, results in each input's type (the conversions to `dtype`
  // do nothing: the output's gradient has the output's type).
  const auto dtype = g.scalar_type();
  // The output gradient's rows as the products take them (over the padded width, if padded).
  const torch::Tensor rows = padded > 0 ? PaddedGradient(Rows(g), padded) : Rows(g);
  torch::Tensor grad_x, grad_weight, grad_bias;
  if (ctx->needs_input_grad(0)) {
    grad_x = padded > 0 ? rows.mm(weight_compute.to(dtype)).view(x.sizes())
                        : g.matmul(weight_compute.to(dtype));
    grad_x = grad_x.to(input_type);
  }
  std::tie(grad_weight, grad_bias) = ParameterGradients(
      rows, x, weight, bias, ctx->needs_input_grad(1), has_bias && ctx->needs_input_grad(2));
  if (!has_bias) return {grad_x, grad_weight};
  return {grad_x, grad_weight, grad_bias};
}

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               torch::Tensor weight, torch::Tensor bias, int64_t pad_columns) {
    return LinearForward(ctx, x, weight, bias, pad_columns);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list result = LinearBackward(ctx, grads[0], /*has_bias=*/true);
    result.emplace_back();  // pad_columns
    return result;
  }
};

struct LinearNoBiasFunction : public torch::autograd::Function<LinearNoBiasFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               torch::Tensor weight, int64_t pad_columns) {
    return LinearForward(ctx, x, weight, torch::Tensor(), pad_columns);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list result = LinearBackward(ctx, grads[0], /*has_bias=*/false);
    result.emplace_back();  // pad_columns
    return result;
  }
};

// LinearsOverWhole: the input x (this rank's part), then the parameters (each product's
// weight, and its bias where `biases` has its bit), then the makers as integers. Saved: x as
// computed with, then per product the weight as computed with, the weight and (if any) the
// bias.
struct LinearsOverWholeFunction : public torch::autograd::Function<LinearsOverWholeFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                torch::Tensor x, at::TensorList parameters,
                                                int64_t products, int64_t biases, int64_t whole,
                                                int64_t part_of_gradient, int64_t context) {
    const InputMakers makers{reinterpret_cast<InputMaker>(whole),
                             reinterpret_cast<InputMaker>(part_of_gradient), context};
    const std::optional<torch::ScalarType> type = AutocastMatmulType(x.device());
    auto lower = [&](const torch::Tensor& t) { return type ? Lower(t, *type) : t; };
    const torch::Tensor x_compute = lower(x);
    const torch::Tensor input = makers.whole(x_compute, makers.context);
    torch::autograd::variable_list saved = {x_compute}, outputs;
    size_t next = 0;
    for (int64_t i = 0; i < products; ++i) {
      const torch::Tensor& weight = parameters[next++];
      const torch::Tensor weight_compute = lower(weight);
      saved.push_back(weight_compute);
      saved.push_back(weight);
      if ((biases >> i) & 1) {
        const torch::Tensor& bias = parameters[next++];
        saved.push_back(bias);
        outputs.push_back(at::linear(input, weight_compute, lower(bias)));
      } else {
        outputs.push_back(at::linear(input, weight_compute));
      }
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["input_type"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["products"] = products;
    ctx->saved_data["biases"] = biases;
    ctx->saved_data["whole"] = whole;
    ctx->saved_data["part_of_gradient"] = part_of_gradient;
    ctx->saved_data["context"] = context;
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t products = ctx->saved_data["products"].toInt();
    const int64_t biases = ctx->saved_data["biases"].toInt();
    const InputMakers makers{
        reinterpret_cast<InputMaker>(ctx->saved_data["whole"].toInt()),
        reinterpret_cast<InputMaker>(ctx->saved_data["part_of_gradient"].toInt()),
        ctx->saved_data["context"].toInt()};
    const auto input_type = static_cast<torch::ScalarType>(ctx->saved_data["input_type"].toInt());
    const auto saved = ctx->get_saved_variables();
    // Made whole again, on every rank of the group whatever needs it (the collectives match).
    const torch::Tensor x = makers.whole(saved[0], makers.context);
    torch::autograd::variable_list result = {torch::Tensor()};
    torch::Tensor grad_whole;
    size_t at = 1;
    int parameter = 1;  // the flattened input index of the next parameter
    for (int64_t i = 0; i < products; ++i) {
      const torch::Tensor& weight_compute = saved[at++];
      const torch::Tensor& weight = saved[at++];
      const bool has_bias = (biases >> i) & 1;
      const torch::Tensor bias = has_bias ? saved[at++] : torch::Tensor();
      const torch::Tensor& g = grads[i];
      const bool needs_weight = ctx->needs_input_grad(parameter);
      const bool needs_bias = has_bias && ctx->needs_input_grad(parameter + 1);
      torch::Tensor grad_weight, grad_bias;
      if (g.defined()) {
        const torch::Tensor product = g.matmul(weight_compute.to(g.scalar_type()));
        grad_whole = grad_whole.defined() ? grad_whole.add_(product) : product;
        std::tie(grad_weight, grad_bias) =
            ParameterGradients(Rows(g), x, weight, bias, needs_weight, needs_bias);
      }
      result.push_back(grad_weight);
      if (has_bias) result.push_back(grad_bias);
      parameter += has_bias ? 2 : 1;
    }
    if (!grad_whole.defined()) grad_whole = torch::zeros_like(x, x.options().dtype(input_type));
    result[0] = makers.part_of_gradient(grad_whole.to(input_type), makers.context);
    for (int i = 0; i < 5; ++i) result.emplace_back();  // products, biases and the makers
    return result;
  }
};

}  // namespace

std::vector<torch::Tensor> LinearsOverWhole(const torch::Tensor& x,
                                            const std::vector<torch::Tensor>& weights,
                                            const std::vector<torch::Tensor>& biases,
                                            const InputMakers& makers) {
  if (weights.empty() || weights.size() > 62 || biases.size() != weights.size()) {
    throw std::invalid_argument("LinearsOverWhole: 1 to 62 weights, a bias (or none) each");
  }
  std::vector<torch::Tensor> parameters;
  int64_t with_bias = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    parameters.push_back(weights[i]);
    if (biases[i].defined()) {
      parameters.push_back(biases[i]);
      with_bias |= int64_t{1} << i;
    }
  }
  return LinearsOverWholeFunction::apply(
      x, at::TensorList(parameters), static_cast<int64_t>(weights.size()), with_bias,
      reinterpret_cast<int64_t>(makers.whole), reinterpret_cast<int64_t>(makers.part_of_gradient),
      makers.context);
}

torch::Tensor LinearOverWhole(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& bias, const InputMakers& makers) {
  return LinearsOverWhole(x, {weight}, {bias}, makers)[0];
}

torch::Tensor DeferrableLinear(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
  if (!bias.defined()) return LinearNoBiasFunction::apply(x, weight, int64_t{0});
  return LinearFunction::apply(x, weight, bias, int64_t{0});
}

torch::Tensor DeferrableLinearPadded(const torch::Tensor& x, const torch::Tensor& weight,
                                     const torch::Tensor& bias) {
  if (!x.is_cuda() || !FusedKernelsEnabled()) return DeferrableLinear(x, weight, bias);
  return DeferrableLinearPaddedTo(x, weight, bias, kPaddedColumns);
}

torch::Tensor DeferrableLinearPaddedTo(const torch::Tensor& x, const torch::Tensor& weight,
                                       const torch::Tensor& bias, int64_t multiple) {
  if (!bias.defined()) return LinearNoBiasFunction::apply(x, weight, multiple);
  return LinearFunction::apply(x, weight, bias, multiple);
}

void AccumulateGradient(GradientWriter* writer, const torch::Tensor& parameter,
                        const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& target = parameter.grad();
  if (writer != nullptr && writer->TakeFirst(parameter)) {
    target.copy_(grad);
  } else {
    target.add_(grad.to(target.scalar_type()));
  }
}

void DeferredWeightGrads::Apply(GradientWriter* writer) {
  torch::NoGradGuard no_grad;
  for (Record& r : records_) {
    // Straight into the gradient where the types agree: no temporary, no second pass over it,
    // which W, reading its inputs back from memory, otherwise pays on top of B's work.
    const torch::Tensor g = Rows(r.grad_output);
    AccumulateWeightGradient(writer, r.weight, g, Rows(r.input.to(g.scalar_type())));
    if (r.bias.defined()) AccumulateBiasGradient(writer, r.bias, g);
  }
  records_.clear();
}

LinearGradScope::LinearGradScope(GradientWriter* writer, DeferredWeightGrads* deferred)
    : writer_(writer), deferred_(deferred) {
  g_scope.store(this, std::memory_order_release);
}

LinearGradScope::~LinearGradScope() { g_scope.store(nullptr, std::memory_order_release); }

}  // namespace tandem::runtime::libtorch
