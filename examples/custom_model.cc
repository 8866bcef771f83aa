// A custom model on tandem: an MLP regressor (LibTorch layers + a loss) with data that is a pure
// function of (seed, iteration, sample), trained by the engine (1F1B, a stage per rank: run it
// under mpirun -np 1..4) and checked against the single-process reference trainer: exit code 1
// if the losses differ by more than 1e-5 relative or do not halve.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include "comm/backend.h"
#include "pipeline/plan.h"
#include "runtime/engine.h"
#include "runtime/torch/reference.h"
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

// y = sin(3 x0) + x1 x2 for x uniform in [-1, 1]^4. Sample j of iteration i comes from a
// generator seeded by MixSeed(seed, i, j), so every rank can make any micro-batch on its own.
class CurveData final : public Dataset {
 public:
  std::string name() const override { return "curve"; }
  absl::StatusOr<Batch> Samples(int64_t iteration, int64_t first, int64_t count) const override {
    Batch batch{torch::empty({count, kInputs}), torch::empty({count, 1})};
    for (int64_t i = 0; i < count; ++i) {
      std::mt19937_64 random(MixSeed(/*seed=*/42, iteration, first + i));
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      float* x = batch.inputs[i].data_ptr<float>();
      for (int k = 0; k < kInputs; ++k) x[k] = uniform(random);
      batch.targets.data_ptr<float>()[i] = std::sin(3 * x[0]) + x[1] * x[2];
    }
    return batch;
  }
  static constexpr int kInputs = 4;
};

template <typename T>  // example-level error handling: print the status and exit
T OrExit(absl::StatusOr<T> value) {
  if (!value.ok()) std::fprintf(stderr, "%s\n", value.status().ToString().c_str()), std::exit(1);
  return *std::move(value);
}

int main() {
  constexpr int kSteps = 100, kMicrobatches = 4, kMicrobatchSize = 16;
  auto world = OrExit(comm::CreateWorldCommunicator(comm::BackendKind::kMpi));
  // The model, built from the same seed on every rank: 4 layers, cut by the plan.
  ModelSpec spec{"mlp", [] {
    return FromSequential("mlp",
                          torch::nn::Sequential(Dense(CurveData::kInputs, 64), Dense(64, 64),
                                                Dense(64, 64), torch::nn::Linear(64, 1)),
                          [](const torch::Tensor& y, const torch::Tensor& target) {
                            return torch::nn::functional::mse_loss(y, target);
                          });
  }};
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
  // The oracle: the same model, data and optimizer in one process with torch::optim.
  ReferenceOptions reference_options;
  reference_options.global_batch = plan.GlobalBatchSize();
  reference_options.steps = kSteps;
  reference_options.optimizer.kind = OptimizerKind::kAdamW;
  reference_options.lr = options.lr_schedule;
  auto reference = OrExit(TrainReference(*model, *data, reference_options));

  double worst = 0;  // largest relative loss difference from the reference
  for (int step = 0; step < kSteps; ++step) {
    auto result = OrExit(engine->RunIteration());
    worst = std::max(worst, std::abs(result.loss / reference.losses[step] - 1));
    if (world->rank() == 0 && (step % 20 == 0 || step == kSteps - 1)) {
      std::printf("step %3d  loss %.6f  reference %.6f  (%d stage(s))\n", step, result.loss,
                  reference.losses[step], world->size());
    }
  }
  if (world->rank() == 0) std::printf("largest relative difference: %.2e\n", worst);
  return worst < 1e-5 && reference.losses.back() < 0.5 * reference.losses.front() ? 0 : 1;
}
