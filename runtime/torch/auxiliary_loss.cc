#include "runtime/torch/auxiliary_loss.h"

#include <torch/autograd.h>

namespace tandem::runtime::libtorch {
namespace {

thread_local double current_scale = 1.0;

struct AuxiliaryLossFunction : public torch::autograd::Function<AuxiliaryLossFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor output,
                               torch::Tensor loss) {
    ctx->saved_data["loss"] = loss;  // for the gradient's type and device
    return output;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor loss = ctx->saved_data["loss"].toTensor();
    return {grads[0], torch::ones({}, loss.options())};
  }
};

}  // namespace

torch::Tensor AddAuxiliaryLoss(const torch::Tensor& output, const torch::Tensor& loss) {
  return AuxiliaryLossFunction::apply(output, loss);
}

double CurrentAuxiliaryLossScale() { return current_scale; }

AuxiliaryLossScale::AuxiliaryLossScale(double scale) : previous_(current_scale) {
  current_scale = scale;
}

AuxiliaryLossScale::~AuxiliaryLossScale() { current_scale = previous_; }

}  // namespace tandem::runtime::libtorch
