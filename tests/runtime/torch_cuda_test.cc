// The engine's GPU path with LibTorch stages on a CUDA device: one rank holding two
// interleaved chunks (the NCCL communicators of one rank, pinned host mirrors of the
// parameters, the CPU synchroniser) must train like the single-process reference on the same
// device. Skips, saying why, where no CUDA device is present (as on CPU-only CI machines).
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include <torch/cuda.h>

#include "comm/backend.h"
#include "gtest/gtest.h"
#include "pipeline/plan.h"
#include "runtime/engine.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/reference.h"
#include "runtime/torch/torch_stage.h"

namespace tandem::runtime {
namespace {

constexpr int kSteps = 5;
constexpr int64_t kGlobalBatch = 8;
constexpr int kMicrobatches = 4;
// Two CUDA runs differ by kernel choices more than two CPU runs do.
constexpr double kRelativeTolerance = 1e-4;

TEST(TorchCudaTest, InterleavedChunksOnOneDeviceMatchTheReference) {
  std::string why;
  if (comm::CudaDeviceCount(&why) == 0 || !torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: " << (why.empty() ? "LibTorch sees none" : why);
  }
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const torch::Device device(torch::kCUDA, 0);

  libtorch::GptConfig gpt;
  gpt.vocab = 16;
  gpt.layers = 2;
  gpt.hidden = 32;
  gpt.heads = 2;
  gpt.seq_len = 8;
  auto model = libtorch::GptModelSpec(gpt).Build(/*seed=*/3);
  ASSERT_TRUE(model.ok()) << model.status();
  libtorch::SyntheticTaskOptions task;
  task.seed = 3;
  task.seq_len = gpt.seq_len;
  auto data = libtorch::MakeSyntheticDataset(task);
  ASSERT_TRUE(data.ok()) << data.status();

  libtorch::ReferenceOptions reference;
  reference.global_batch = kGlobalBatch;
  reference.steps = kSteps;
  reference.optimizer.kind = libtorch::OptimizerKind::kSgd;
  reference.optimizer.momentum = 0.9;
  reference.lr.base_lr = 0.05;
  reference.accumulation_slices = kMicrobatches;
  reference.device = device;
  auto expected = libtorch::TrainReference(*model, **data, reference);
  ASSERT_TRUE(expected.ok()) << expected.status();

  pipeline::ScheduleSpec spec;
  spec.kind = pipeline::ScheduleKind::kInterleaved;
  spec.num_ranks = 1;
  spec.chunks = 2;
  spec.num_microbatches = kMicrobatches;
  auto plan = pipeline::MakeUniformPlan(model->num_layers(), spec, 1,
                                        kGlobalBatch / kMicrobatches);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::shared_ptr<const libtorch::Dataset> dataset = *data;
  StageFactory factory = [&](const StageSpec& s) -> absl::StatusOr<std::unique_ptr<Stage>> {
    libtorch::TorchStageOptions o;
    o.first_layer = s.first_layer;
    o.end_layer = s.end_layer;
    o.microbatches = s.num_microbatches;
    o.microbatch_size = s.microbatch_size;
    o.device = device;
    auto stage = libtorch::TorchStage::Create(*model, dataset, o);
    if (!stage.ok()) return stage.status();
    return std::unique_ptr<Stage>(std::move(stage).value());
  };
  EngineOptions options;
  options.optimizer = runtime::OptimizerConfig::Sgd(0.9);
  options.lr_schedule.base_lr = 0.05;
  auto engine = Engine::Create(*plan, world->get(), factory, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int it = 0; it < kSteps; ++it) {
    auto r = (*engine)->RunIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LE(std::abs(r->loss - expected->losses[it]),
              kRelativeTolerance * std::abs(expected->losses[it]))
        << "iteration " << it;
  }
  ASSERT_TRUE((*engine)->Flush().ok());
  std::map<std::string, torch::Tensor> want(expected->parameters.begin(),
                                            expected->parameters.end());
  for (const LocalStageId& id : (*engine)->local_stages()) {
    auto* stage = static_cast<libtorch::TorchStage*>((*engine)->stage(id.replica, id.stage));
    for (const auto& [name, tensor] : stage->named_parameters()) {
      ASSERT_TRUE(tensor.is_cuda()) << name;
      const torch::Tensor& w = want.at(name);
      const double scale = std::max(w.abs().max().item<double>(), 1e-12);
      EXPECT_LE((tensor.cpu() - w).abs().max().item<double>(), kRelativeTolerance * scale)
          << name;
    }
  }
}

}  // namespace
}  // namespace tandem::runtime
