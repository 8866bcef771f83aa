// Auxiliary losses a layer adds inside its forward pass, such as a mixture of experts'
// load-balancing loss: the layer's output carries them to the backward pass, where their
// gradients join the main loss's (Megatron-LM's MoEAuxLossAutoScaler does the same). They do
// not change the layer's output or the reported loss.
//
// A pipeline stage scales its loss before the backward pass (by 1 / (micro-batches x
// replicas): gradients are summed over both); an auxiliary loss needs the same scale, which
// the stage sets for the forward passes it runs (AuxiliaryLossScale). Outside a stage the
// scale is 1.
#pragma once

#include <torch/types.h>

namespace tandem::runtime::libtorch {

// `output` unchanged; its backward also passes gradient 1 to `loss` (a scalar), so the
// backward pass computes the gradient of the main loss plus `loss`.
torch::Tensor AddAuxiliaryLoss(const torch::Tensor& output, const torch::Tensor& loss);

// The scale of the loss of the forward pass running on this thread (1 outside a stage).
double CurrentAuxiliaryLossScale();

// Sets CurrentAuxiliaryLossScale() on this thread while it lives.
class AuxiliaryLossScale {
 public:
  explicit AuxiliaryLossScale(double scale);
  ~AuxiliaryLossScale();
  AuxiliaryLossScale(const AuxiliaryLossScale&) = delete;
  AuxiliaryLossScale& operator=(const AuxiliaryLossScale&) = delete;

 private:
  double previous_;
};

}  // namespace tandem::runtime::libtorch
