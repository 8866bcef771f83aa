// Tensor-parallel shards of the GPT (runtime/torch/tensor_parallel.h) under mpirun: each rank
// of a group holds exactly its slice of every split matrix (heads of q/k/v, rows or columns of
// the MLP, vocabulary rows of the embedding and LM head) and the whole layer norms and
// post-reduction biases; a whole-model TorchStage sharded over the world gives the loss of the
// unsharded stage, and every shard's gradient is the matching slice of the whole gradient.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/cuda.h>

#include "comm/backend.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/profiler.h"
#include "runtime/torch/torch_stage.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr double kRelativeTolerance = 1e-5;

GptConfig SmallGpt() {
  GptConfig config;
  config.vocab = 16;
  config.layers = 2;
  config.hidden = 16;
  config.heads = 4;
  config.seq_len = 8;
  config.attention = GptAttention::kExplicit;
  return config;
}

// The small GPT (seed 7) and its synthetic data (seed 5), the same on every rank.
struct GptAndData {
  LayeredModel model;
  std::shared_ptr<const Dataset> data;
};

absl::StatusOr<GptAndData> SmallGptAndData() {
  TANDEM_ASSIGN_OR_RETURN(LayeredModel model, GptModelSpec(SmallGpt()).Build(7));
  SyntheticTaskOptions task;
  task.vocab = SmallGpt().vocab;
  task.seq_len = SmallGpt().seq_len;
  task.seed = 5;
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<const Dataset> data, MakeSyntheticDataset(task));
  return GptAndData{std::move(model), std::move(data)};
}

struct StageRun {
  std::unique_ptr<TorchStage> stage;
  double loss = 0;
};

// One iteration of 2 micro-batches of 2 samples through a whole-model stage.
StageRun RunStage(const LayeredModel& model, std::shared_ptr<const Dataset> data,
                  const TensorParallel& tp, torch::Device device = torch::kCPU) {
  TorchStageOptions options;
  options.device = device;
  options.first_layer = 0;
  options.end_layer = model.num_layers();
  options.microbatches = 2;
  options.microbatch_size = 2;
  options.tensor_parallel = tp;
  auto stage = TorchStage::Create(model, data, options);
  EXPECT_TRUE(stage.ok()) << stage.status();
  StageRun run;
  if (!stage.ok()) return run;
  run.stage = *std::move(stage);
  EXPECT_TRUE(run.stage->BeginIteration(1).ok());
  for (int m = 0; m < 2; ++m) {
    auto out = run.stage->Forward(m, {});
    EXPECT_TRUE(out.ok()) << out.status();
    auto in = run.stage->Backward(m, {});
    EXPECT_TRUE(in.ok()) << in.status();
  }
  run.loss = run.stage->IterationLoss();
  return run;
}

double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected) {
  const double scale = std::max(expected.abs().max().item<double>(), 1e-12);
  return (actual - expected).abs().max().item<double>() / scale;
}

void ExpectShardsAreSlicesWithTheWholeLossAndGradients(bool sequence_parallel) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int t = (*world)->size();
  if (SmallGpt().heads % t != 0 || SmallGpt().vocab % t != 0) GTEST_SKIP() << t << " ranks";
  const int me = (*world)->rank();
  auto gpt = SmallGptAndData();
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const LayeredModel* model = &gpt->model;
  const std::shared_ptr<const Dataset>* data = &gpt->data;

  const StageRun whole = RunStage(*model, *data, TensorParallel{});
  TensorParallel tp{t, me, world->get()};
  tp.sequence_parallel = sequence_parallel;
  const StageRun shard = RunStage(*model, *data, tp);
  ASSERT_NE(whole.stage, nullptr);
  ASSERT_NE(shard.stage, nullptr);
  EXPECT_NEAR(shard.loss, whole.loss, kRelativeTolerance * std::abs(whole.loss));

  std::map<std::string, torch::Tensor> full_value, full_grad;
  for (const auto& [name, p] : whole.stage->named_parameters()) {
    full_value[name] = p.detach().clone();
    full_grad[name] = p.grad().clone();
  }
  const int64_t hidden = SmallGpt().hidden, local = hidden / t, units = 4 * hidden / t;
  // The slice of the whole tensor this rank must hold, by parameter name.
  auto slice = [&](const std::string& name, const torch::Tensor& full) -> torch::Tensor {
    auto ends_with = [&](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with("qkv.weight")) {
      return torch::cat({full.narrow(0, me * local, local),
                         full.narrow(0, hidden + me * local, local),
                         full.narrow(0, 2 * hidden + me * local, local)});
    }
    if (ends_with("attention_out.weight")) return full.narrow(1, me * local, local);
    if (ends_with("mlp_in.weight") || ends_with("mlp_in.bias")) {
      return full.narrow(0, me * units, units);
    }
    if (ends_with("mlp_out.weight")) return full.narrow(1, me * units, units);
    if (ends_with("token.weight") || ends_with("lm_head.weight")) {
      const int64_t rows = SmallGpt().vocab / t;
      return full.narrow(0, me * rows, rows);
    }
    return full;  // layer norms, position embedding, post-reduction biases
  };
  std::map<std::string, bool> replicated;
  std::map<std::string, const std::vector<int64_t>*> index;
  for (const ParameterView& v : shard.stage->Parameters()) {
    replicated[v.name] = v.tensor_parallel_replicated;
    index[v.name] = v.tensor_parallel_index;
    if (v.tensor_parallel_index != nullptr) EXPECT_EQ(v.whole_count, full_value[v.name].numel());
  }
  ASSERT_EQ(shard.stage->named_parameters().size(), full_value.size());
  for (const auto& [name, p] : shard.stage->named_parameters()) {
    ASSERT_EQ(full_value.count(name), 1u) << name;
    const torch::Tensor want = slice(name, full_value[name]);
    ASSERT_EQ(p.sizes(), want.sizes()) << name;
    EXPECT_TRUE(torch::equal(p.detach(), want)) << name;
    EXPECT_EQ(replicated[name], t > 1 && p.sizes() == full_value[name].sizes()) << name;
    EXPECT_LT(RelativeError(p.grad(), slice(name, full_grad[name])), kRelativeTolerance)
        << name << " on rank " << me;
    // The index map (what checkpoints cut and gather with) picks the same elements.
    ASSERT_EQ(index[name] == nullptr, replicated[name] || t == 1) << name;
    if (index[name] != nullptr) {
      const torch::Tensor picked =
          full_value[name].reshape({-1}).index_select(0, torch::tensor(*index[name]));
      EXPECT_TRUE(torch::equal(picked, p.detach().reshape({-1}))) << name;
    }
  }
  if (t > 1) {
    EXPECT_FALSE(replicated.at("layers.1.qkv.weight"));
    EXPECT_TRUE(replicated.at("layers.1.attention_norm.weight"));
  }
}

TEST(TorchTensorParallelTest, ShardsAreSlicesAndGiveTheWholeLossAndGradients) {
  ExpectShardsAreSlicesWithTheWholeLossAndGradients(/*sequence_parallel=*/false);
}

// With the sequence split between the products, the whole parameters' gradients (layer
// norms, biases, position embedding) are still the whole gradients: summed over the group.
TEST(TorchTensorParallelTest, SequenceParallelShardsGiveTheWholeLossAndGradients) {
  ExpectShardsAreSlicesWithTheWholeLossAndGradients(/*sequence_parallel=*/true);
}

// The split is real: between layers each rank holds its S/t tokens, and they are the whole
// model's activations at those positions.
TEST(TorchTensorParallelTest, SequenceParallelLayersPassOnThisRanksTokens) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int t = (*world)->size();
  if (t < 2 || SmallGpt().heads % t != 0 || SmallGpt().seq_len % t != 0) {
    GTEST_SKIP() << t << " ranks";
  }
  const int me = (*world)->rank();
  auto model = GptModelSpec(SmallGpt()).Build(7);
  ASSERT_TRUE(model.ok()) << model.status();
  auto whole = model->CloneLayers(0, 2, torch::kCPU);
  auto split = model->CloneLayers(0, 2, torch::kCPU);
  ASSERT_TRUE(whole.ok() && split.ok());
  TensorParallel tp{t, me, world->get()};
  tp.sequence_parallel = true;
  ASSERT_TRUE(model->shard_for_tensor_parallel(*split, 0, tp).ok());
  const torch::Tensor ids = torch::randint(SmallGpt().vocab, {2, SmallGpt().seq_len},
                                           torch::TensorOptions().dtype(torch::kLong));
  // The same ids on every rank (rank 0's).
  ASSERT_TRUE((*world)->Broadcast(CommBufferOf(ids), 0)->Wait().ok());
  torch::NoGradGuard no_grad;
  torch::Tensor want = ids, got = ids;
  for (auto& layer : *whole) want = layer.forward(want);
  for (auto& layer : *split) got = layer.forward(got);
  const int64_t length = SmallGpt().seq_len / t;
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, length, SmallGpt().hidden}));
  EXPECT_LT(RelativeError(got, want.narrow(1, me * length, length)), kRelativeTolerance);
}

// Under sequence parallelism a block's column-parallel products (q/k/v and the MLP's first)
// keep this rank's S/t tokens of their inputs for the backward and gather them again there,
// as Megatron-LM does, instead of the whole sequence: measured by the profiler, each block of
// the sequence-parallel shard stashes at least 2 (S - S/t) b h floats less than the shard
// without it (the inputs of those two products), on top of the layer norms' smaller inputs.
// The losses and gradients stay the whole model's (SequenceParallelShards... above).
TEST(TorchTensorParallelTest, SequenceParallelProductsKeepOnlyThisRanksTokens) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int t = (*world)->size();
  if (t < 2 || SmallGpt().heads % t != 0 || SmallGpt().seq_len % t != 0) {
    GTEST_SKIP() << t << " ranks";
  }
  auto gpt = SmallGptAndData();
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  ProfilerOptions options;
  options.microbatch_size = 4;
  options.warmup = 1;
  options.repeats = 1;
  options.tensor_parallel = TensorParallel{t, (*world)->rank(), world->get()};
  auto plain = ProfileModel(gpt->model, *gpt->data, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  options.tensor_parallel.sequence_parallel = true;
  auto split = ProfileModel(gpt->model, *gpt->data, options);
  ASSERT_TRUE(split.ok()) << split.status();
  const double s = SmallGpt().seq_len, b = 4, h = SmallGpt().hidden;
  const double products = 2 * (s - s / t) * b * h * sizeof(float);
  for (int l = 1; l <= SmallGpt().layers; ++l) {
    EXPECT_LE(split->layers[l].stashed_activation_bytes,
              plain->layers[l].stashed_activation_bytes - products)
        << "block " << l << ": sequence parallel " << split->layers[l].stashed_activation_bytes
        << " B, without " << plain->layers[l].stashed_activation_bytes << " B";
  }
}

TEST(TorchTensorParallelTest, ModelsWithoutAShardedFormAreRefused) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  if ((*world)->size() < 2) GTEST_SKIP() << "needs a group of 2";
  auto model = GptModelSpec(SmallGpt()).Build(7);
  ASSERT_TRUE(model.ok());
  model->shard_for_tensor_parallel = nullptr;
  TorchStageOptions options;
  options.first_layer = 1;
  options.end_layer = 2;
  options.tensor_parallel = TensorParallel{(*world)->size(), (*world)->rank(), world->get()};
  auto stage = TorchStage::Create(*model, nullptr, options);
  EXPECT_EQ(stage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stage.status().message().find("no tensor-parallel form"), std::string::npos)
      << stage.status();
}

// The whole-model stage on `device` with `group` gives the CPU stage's loss (over the MPI
// `world`) and every shard's gradient.
void ExpectCudaShardsEqualTheCpuShards(comm::Communicator* world, comm::Communicator* group,
                                       torch::Device device) {
  const int t = world->size();
  const int me = world->rank();
  auto gpt = SmallGptAndData();
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const StageRun cpu = RunStage(gpt->model, gpt->data, TensorParallel{t, me, world});
  const StageRun cuda = RunStage(gpt->model, gpt->data, TensorParallel{t, me, group}, device);
  ASSERT_NE(cpu.stage, nullptr);
  ASSERT_NE(cuda.stage, nullptr);
  EXPECT_NEAR(cuda.loss, cpu.loss, kRelativeTolerance * std::abs(cpu.loss));
  std::map<std::string, torch::Tensor> want;
  for (const auto& [name, p] : cpu.stage->named_parameters()) want[name] = p.grad().clone();
  for (const auto& [name, p] : cuda.stage->named_parameters()) {
    ASSERT_TRUE(p.is_cuda()) << name;
    EXPECT_LT(RelativeError(p.grad().cpu(), want.at(name)), 1e-4) << name << " on rank " << me;
  }
}

// CUDA stages over the MPI group (ranks sharing a GPU): the collectives reduce host copies;
// the loss and the gradients are the CPU reference's. Skipped without a CUDA device.
TEST(TorchTensorParallelTest, CudaShardsOverAnMpiGroupGiveTheWholeLossAndGradients) {
  std::string why;
  if (comm::CudaDeviceCount(&why) == 0 || !torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: " << (why.empty() ? "LibTorch sees none" : why);
  }
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int t = (*world)->size();
  if (SmallGpt().heads % t != 0 || SmallGpt().vocab % t != 0) GTEST_SKIP() << t << " ranks";
  ExpectCudaShardsEqualTheCpuShards(world->get(), world->get(), torch::Device(torch::kCUDA, 0));
}

// NCCL's group, with a GPU per rank or ranks sharing one in NCCL >= 2.30's multi-rank mode: its
// collectives run on NCCL's stream and the compute stream waits for them on the device
// (AwaitCollective); the loss and the gradients are the CPU reference's. Skipped, with the
// reason, where NCCL cannot take the ranks.
TEST(TorchTensorParallelTest, CudaShardsOverAnNcclGroupGiveTheWholeLossAndGradients) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int t = (*world)->size();
  auto environment = comm::CommOptions::FromEnvironment();
  ASSERT_TRUE(environment.ok()) << environment.status();
  std::string why;
  if (!comm::NcclCanRun(**world, environment->shared_gpu, &why) ||
      !torch::cuda::is_available()) {
    GTEST_SKIP() << (why.empty() ? "no CUDA device LibTorch can use" : why);
  }
  const int devices = comm::CudaDeviceCount();
  if (SmallGpt().heads % t != 0 || SmallGpt().vocab % t != 0) GTEST_SKIP() << t << " ranks";
  comm::CommOptions options = *environment;
  options.cuda_device = (*world)->rank() % devices;
  auto nccl = comm::CreateNcclCommunicator(**world, options);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  ASSERT_EQ((*nccl)->backend(), "nccl");
  ExpectCudaShardsEqualTheCpuShards(world->get(), nccl->get(),
                                    torch::Device(torch::kCUDA, options.cuda_device));
}

}  // namespace
}  // namespace tandem::runtime::libtorch
