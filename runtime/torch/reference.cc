#include "runtime/torch/reference.h"

#include "runtime/torch/precision.h"

#include <cmath>
#include <memory>

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::runtime::libtorch {
namespace {

absl::Status CheckOptions(const ReferenceOptions& options) {
  if (options.global_batch < 1 || options.steps < 0 || options.accumulation_slices < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reference trainer: global batch (", options.global_batch, ") and accumulation slices (",
        options.accumulation_slices, ") must be positive and steps (", options.steps,
        ") not negative"));
  }
  if (options.global_batch % options.accumulation_slices != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference trainer: global batch ", options.global_batch,
                     " is not divisible by ", options.accumulation_slices, " slices"));
  }
  if (!(options.lr.base_lr >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference trainer: learning rate ", options.lr.base_lr, " is negative"));
  }
  return absl::OkStatus();
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const ReferenceOptimizer& config,
                                                       std::vector<torch::Tensor> parameters,
                                                       double lr) {
  if (config.kind == OptimizerKind::kAdamW) {
    return std::make_unique<torch::optim::AdamW>(
        std::move(parameters), torch::optim::AdamWOptions(lr)
                                   .betas(std::make_tuple(config.beta1, config.beta2))
                                   .eps(config.eps)
                                   .weight_decay(config.weight_decay));
  }
  return std::make_unique<torch::optim::SGD>(
      std::move(parameters),
      torch::optim::SGDOptions(lr).momentum(config.momentum).weight_decay(config.weight_decay));
}

double GlobalGradNorm(const std::vector<torch::Tensor>& parameters) {
  double squares = 0;
  for (const auto& parameter : parameters) {
    if (!parameter.grad().defined()) continue;
    const double norm = parameter.grad().norm().item<double>();
    squares += norm * norm;
  }
  return std::sqrt(squares);
}

}  // namespace

absl::StatusOr<ReferenceResult> TrainReference(const LayeredModel& model, const Dataset& data,
                                               const ReferenceOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckOptions(options));
  LayeredModel copy = model;
  TANDEM_ASSIGN_OR_RETURN(copy.layers,
                          model.CloneLayers(0, model.num_layers(), options.device));
  TANDEM_RETURN_IF_ERROR(ShareTiedWeights(model, 0, model.num_layers(), copy.layers));
  std::vector<torch::Tensor> parameters;
  for (auto& named : copy.NamedParameters(0, copy.num_layers())) {
    parameters.push_back(named.second);
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      MakeOptimizer(options.optimizer, parameters, LearningRateAt(options.lr, 0));

  ReferenceResult result;
  const int64_t slice = options.global_batch / options.accumulation_slices;
  for (int64_t iteration = 0; iteration < options.steps; ++iteration) {
    TANDEM_ASSIGN_OR_RETURN(const Batch batch, data.Samples(iteration, 0, options.global_batch));
    const double lr = LearningRateAt(options.lr, iteration);
    TANDEM_RETURN_IF_ERROR(
        CatchTorchErrors(absl::StrCat("reference trainer iteration ", iteration), [&] {
          optimizer->zero_grad();
          double loss_sum = 0;
          for (int s = 0; s < options.accumulation_slices; ++s) {
            const auto inputs = batch.inputs.narrow(0, s * slice, slice).to(options.device);
            const auto targets = batch.targets.narrow(0, s * slice, slice).to(options.device);
            torch::Tensor logits;
            {
              AutocastGuard autocast(options.device, options.precision);
              logits = copy.Forward(inputs, 0, copy.num_layers());
            }
            torch::Tensor loss = copy.loss(logits.to(torch::kFloat32), targets);
            if (options.accumulation_slices > 1) loss = loss / options.accumulation_slices;
            loss.backward();
            loss_sum += loss.item<double>();
          }
          const double norm =
              options.clip_norm > 0
                  ? torch::nn::utils::clip_grad_norm_(parameters, options.clip_norm)
                  : GlobalGradNorm(parameters);
          for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
          optimizer->step();
          result.losses.push_back(loss_sum);
          result.grad_norms.push_back(norm);
          result.learning_rates.push_back(lr);
        }));
  }
  for (auto& [name, parameter] : copy.NamedParameters(0, copy.num_layers())) {
    result.parameters.emplace_back(name, parameter.detach().to(torch::kCPU).clone());
  }
  return result;
}

}  // namespace tandem::runtime::libtorch
