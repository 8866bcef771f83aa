#include "runtime/torch/parallel_linear.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/init.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "runtime/torch/deferred_linear.h"

namespace tandem::runtime::libtorch {
namespace {

// Registers "weight" [out, in] and (if `has_bias`) "bias" [out] on `module` with
// torch::nn::Linear's initialisation: weight Kaiming-uniform with a = sqrt(5), bias uniform in
// +-1/sqrt(in).
void RegisterLinearParameters(torch::nn::Module& module, int64_t in, int64_t out, bool has_bias,
                              torch::Tensor& weight, torch::Tensor& bias) {
  weight = module.register_parameter("weight", torch::empty({out, in}));
  bias = has_bias ? module.register_parameter("bias", torch::empty({out})) : torch::Tensor();
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

}  // namespace

void KeepSlice(torch::Tensor& parameter, int64_t dim, int64_t begin, int64_t length) {
  torch::NoGradGuard no_grad;
  parameter.set_data(parameter.narrow(dim, begin, length).clone());
}

namespace {

struct GatherFunction : public torch::autograd::Function<GatherFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               int64_t address) {
    const TensorParallel& tp = *reinterpret_cast<const TensorParallel*>(address);
    ctx->saved_data["rank"] = static_cast<int64_t>(tp.rank);
    ctx->saved_data["width"] = x.size(-1);
    const torch::Tensor local = x.contiguous();
    // A CUDA tensor over a host group gathers host copies (GroupTakes).
    const bool direct = GroupTakes(tp, local);
    const torch::Tensor sent = direct ? local : local.to(torch::kCPU).contiguous();
    torch::Tensor all = torch::empty({tp.size * sent.numel()}, sent.options());
    const comm::Buffer in = CommBufferOf(sent);
    const comm::Buffer out = CommBufferOf(all);
    AwaitCollective(tp.group->AllGather(in, out), all, "tensor-parallel all-gather");
    if (!direct) all = all.to(local.device());
    // [t, ..., n] -> [..., t, n] -> [..., t * n]
    std::vector<int64_t> shape = {tp.size};
    for (int64_t d : local.sizes()) shape.push_back(d);
    std::vector<int64_t> whole = local.sizes().vec();
    whole.back() *= tp.size;
    return all.view(shape).movedim(0, -2).reshape(whole);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t rank = ctx->saved_data["rank"].toInt();
    const int64_t width = ctx->saved_data["width"].toInt();
    return {grads[0].narrow(-1, rank * width, width).contiguous(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor GatherFromTensorParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled()) return x;
  return GatherFunction::apply(x, reinterpret_cast<int64_t>(&tp));
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, bool bias,
                                                   bool gather_output)
    : in_(in), out_(out), has_bias_(bias), gather_output_(gather_output) {
  reset();
}

void ColumnParallelLinearImpl::reset() {
  RegisterLinearParameters(*this, in_, out_, has_bias_, weight, bias);
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  if (!tp_.enabled()) return DeferrableLinear(x, weight, bias);
  const torch::Tensor local = DeferrableLinear(CopyToTensorParallel(x, tp_), weight, bias);
  return gather_output_ ? GatherFromTensorParallel(local, tp_) : local;
}

absl::Status ColumnParallelLinearImpl::ShardForTensorParallel(const TensorParallel& tp) {
  TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(out_, "a column-parallel layer's output features"));
  KeepSlice(weight, 0, tp.ShardBegin(out_), tp.ShardSize(out_));
  if (bias.defined()) KeepSlice(bias, 0, tp.ShardBegin(out_), tp.ShardSize(out_));
  tp_ = tp;
  return absl::OkStatus();
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, bool bias)
    : in_(in), out_(out), has_bias_(bias) {
  reset();
}

void RowParallelLinearImpl::reset() {
  RegisterLinearParameters(*this, in_, out_, has_bias_, weight, bias);
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  if (!tp_.enabled()) return DeferrableLinear(x, weight, bias);
  const torch::Tensor summed =
      ReduceFromTensorParallel(DeferrableLinear(x, weight, torch::Tensor()), tp_);
  return bias.defined() ? summed + bias : summed;
}

absl::Status RowParallelLinearImpl::ShardForTensorParallel(const TensorParallel& tp) {
  TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(in_, "a row-parallel layer's input features"));
  KeepSlice(weight, 1, tp.ShardBegin(in_), tp.ShardSize(in_));
  tp_ = tp;
  return absl::OkStatus();
}

absl::Status ShardMarkedLayers(std::vector<torch::nn::AnyModule>& layers, int first,
                               const TensorParallel& tp) {
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const auto& module : layers[i].ptr()->modules(/*include_self=*/true)) {
      absl::Status status = absl::OkStatus();
      if (auto column = std::dynamic_pointer_cast<ColumnParallelLinearImpl>(module)) {
        status = column->ShardForTensorParallel(tp);
      } else if (auto row = std::dynamic_pointer_cast<RowParallelLinearImpl>(module)) {
        status = row->ShardForTensorParallel(tp);
      }
      if (!status.ok()) {
        return Annotate(status, absl::StrCat("layer ", first + static_cast<int>(i)));
      }
    }
  }
  return absl::OkStatus();
}

void EnableTensorParallelism(LayeredModel& model) {
  model.shard_for_tensor_parallel = ShardMarkedLayers;
  model.tensor_parallel_loss = [loss = model.loss](const torch::Tensor& output,
                                                   const torch::Tensor& targets,
                                                   const TensorParallel&) {
    return loss(output, targets);
  };
}

}  // namespace tandem::runtime::libtorch
