// A custom model with tensor parallelism: the MLP regressor of custom_model.cc with
// Megatron-style blocks whose linear layers are marked (ColumnParallelLinear, then
// RowParallelLinear), run with tensor parallelism of 2 over pairs of ranks and the pairs as
// pipeline stages (mpirun -np 2: one stage; -np 4: two), and checked against the
// single-process reference trainer on the unsharded model: exit code 1 if the losses differ
// by more than 1e-5 relative or do not halve.
#include <cstdio>
#include <cstdlib>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "examples/example_support.h"
#include "pipeline/plan.h"
#include "runtime/engine.h"
#include "runtime/torch/parallel_linear.h"
#include "runtime/torch/stage_factory.h"

using namespace tandem;
using namespace tandem::runtime::libtorch;

constexpr int64_t kInputs = CurveData::kInputs, kWidth = 64, kHidden = 256, kOutputs = 4;

// The input layer: whole on every rank of a group.
struct EmbedImpl : torch::nn::Cloneable<EmbedImpl> {
  EmbedImpl() { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(kInputs, kWidth)); }
  torch::Tensor forward(torch::Tensor x) { return torch::tanh(linear(x)); }
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(Embed);

// x + W2 tanh(W1 x): W1 split by output features, W2 by input features.
struct BlockImpl : torch::nn::Cloneable<BlockImpl> {
  BlockImpl() { reset(); }
  void reset() override {
    up = register_module("up", ColumnParallelLinear(kWidth, kHidden));
    down = register_module("down", RowParallelLinear(kHidden, kWidth));
  }
  torch::Tensor forward(torch::Tensor x) { return x + down(torch::tanh(up(x))); }
  ColumnParallelLinear up{nullptr};
  RowParallelLinear down{nullptr};
};
TORCH_MODULE(Block);

int main() {
  constexpr int kSteps = 60, kMicrobatches = 4, kMicrobatchSize = 16;
  auto world = OrExit(comm::CreateWorldCommunicator(comm::BackendKind::kMpi));
  const int tensor_parallel = world->size() % 2 == 0 ? 2 : 1;
  ModelSpec spec;
  spec.name = "tp-mlp";
  spec.build = [] {
    // The head's outputs are split too; gather_output hands the loss all of them.
    LayeredModel model = FromSequential(
        "tp-mlp",
        torch::nn::Sequential(Embed(), Block(), Block(),
                              ColumnParallelLinear(kWidth, kOutputs, /*bias=*/true,
                                                   /*gather_output=*/true)),
        [](const torch::Tensor& y, const torch::Tensor& target) {
          return torch::nn::functional::mse_loss(y.mean(-1, /*keepdim=*/true), target);
        });
    EnableTensorParallelism(model);
    return model;
  };
  auto model = std::make_shared<const LayeredModel>(OrExit(spec.Build(/*seed=*/1)));
  auto data = std::make_shared<const CurveData>();
  pipeline::ScheduleSpec schedule{pipeline::ScheduleKind::k1F1B,
                                  world->size() / tensor_parallel, kMicrobatches};
  auto plan = OrExit(pipeline::WithTensorParallel(
      OrExit(pipeline::MakeUniformPlan(model->num_layers(), schedule, /*data_parallel=*/1,
                                       kMicrobatchSize)),
      tensor_parallel));
  runtime::EngineOptions options;
  options.optimizer = runtime::OptimizerConfig::AdamW(/*weight_decay=*/0.0);
  options.lr_schedule.base_lr = 3e-3;
  auto engine = OrExit(
      runtime::Engine::Create(plan, world.get(), MakeTorchStageFactory(model, data), options));
  // Each rank holds its shards: with a group of 2, a stage's marked layers are half here.
  int64_t held = 0, whole = 0;
  for (const runtime::ParameterView& v : engine->LocalParameters()) {
    held += v.value.count;
    whole += v.tensor_parallel_index != nullptr ? v.whole_count : v.value.count;
  }
  std::printf("rank %d holds %lld of its stage's %lld parameter values\n", world->rank(),
              static_cast<long long>(held), static_cast<long long>(whole));
  if (tensor_parallel > 1 && held >= whole) return 1;  // nothing was split
  const std::string label = absl::StrCat("tensor parallel ", tensor_parallel, " x ",
                                         world->size() / tensor_parallel, " stage(s)");
  return TrainBesideTheReference(*engine, *model, *data, plan.GlobalBatchSize(), options,
                                 kSteps, world->rank(), label);
}
