// A custom model on tandem: an MLP regressor (LibTorch layers + a loss) with data that is a pure
// function of (seed, iteration, sample), trained by the engine (1F1B, a stage per rank: run it
// under mpirun -np 1..4) and checked against the single-process reference trainer: exit code 1
// if the losses differ by more than 1e-5 relative or do not halve.
#include <cstdio>
#include <cstdlib>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "examples/example_support.h"
#include "pipeline/plan.h"
#include "runtime/engine.h"
#include "runtime/torch/stage_factory.h"

using namespace tandem;
using namespace tandem::runtime::libtorch;

// One layer: a linear map followed by tanh. Cloneable, so each stage gets its own copy.
struct DenseImpl : torch::nn::Cloneable<DenseImpl> {
  DenseImpl(int64_t in, int64_t out) : in(in), out(out) { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(in, out)); }
  torch::Tensor forward(torch::Tensor x) { return torch::tanh(linear(x)); }
  int64_t in, out;  // reset() rebuilds the layer from these
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(Dense);

int main() {
  constexpr int kSteps = 100, kMicrobatches = 4, kMicrobatchSize = 16;
  auto world = OrExit(comm::CreateWorldCommunicator(comm::BackendKind::kMpi));
  // The model, built from the same seed on every rank: 4 layers, cut by the plan.
  ModelSpec spec;
  spec.name = "mlp";
  spec.build = [] {
    return FromSequential("mlp",
                          torch::nn::Sequential(Dense(CurveData::kInputs, 64), Dense(64, 64),
                                                Dense(64, 64), torch::nn::Linear(64, 1)),
                          [](const torch::Tensor& y, const torch::Tensor& target) {
                            return torch::nn::functional::mse_loss(y, target);
                          });
  };
  auto model = std::make_shared<const LayeredModel>(OrExit(spec.Build(/*seed=*/1)));
  auto data = std::make_shared<const CurveData>();
  pipeline::ScheduleSpec schedule{pipeline::ScheduleKind::k1F1B, world->size(), kMicrobatches};
  auto plan = OrExit(pipeline::MakeUniformPlan(model->num_layers(), schedule,
                                               /*data_parallel=*/1, kMicrobatchSize));
  runtime::EngineOptions options;
  options.optimizer = runtime::OptimizerConfig::AdamW(/*weight_decay=*/0.0);
  options.lr_schedule.base_lr = 3e-3;
  auto engine = OrExit(
      runtime::Engine::Create(plan, world.get(), MakeTorchStageFactory(model, data), options));
  return TrainBesideTheReference(*engine, *model, *data, plan.GlobalBatchSize(), options,
                                 kSteps, world->rank(), absl::StrCat(world->size(), " stage(s)"));
}
