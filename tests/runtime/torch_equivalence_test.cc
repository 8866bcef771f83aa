// Numerical equivalence of pipelined, data-parallel training with single-process training:
// the engine with TorchStages (a tiny GPT) under mpirun gives per-iteration losses and final
// parameters equal to runtime/torch's reference trainer (plain LibTorch, torch::optim) within
// 1e-5 relative, over 10 steps, for every schedule, pipeline-only and 2 pipelines x 2 stages,
// SGD with momentum and AdamW, plain all-reduce and DeAR, with and without recomputation and
// clipping. Every rank runs the (cheap) reference itself and checks the stages it holds:
// losses per iteration and every parameter tensor elementwise (max |a - b| <= 1e-5 max |b|),
// and all of the rank's parameters as one vector (relative L2 <= 1e-5). The same runs with the
// gradient passes and optimizer as LibTorch tensor operations (the GPU code path) hold the
// same bound; bf16 autocast runs are compared with a bf16 reference within a looser one.
// The Cuda suite runs the stages on GPUs, every rank's device buffers over NCCL (a GPU per
// rank, or ranks sharing one in NCCL >= 2.30's multi-rank mode), against the single-process run
// on the same GPU; it skips with the reason where NCCL cannot carry them (no GPU, or an older
// NCCL with fewer GPUs than ranks). CTest runs it apart (runtime_torch_equivalence_cuda_np*).
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/cuda.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "pipeline/plan.h"
#include "pipeline/torch_csv.h"
#include "runtime/control.h"
#include "runtime/engine.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/reference.h"
#include "runtime/torch/stage_factory.h"
#include "runtime/torch/torch_stage.h"

namespace tandem::runtime {
namespace {

using libtorch::LayeredModel;

constexpr int kSteps = 10;
constexpr int64_t kGlobalBatch = 16;
constexpr uint64_t kSeed = 7;
constexpr double kRelativeTolerance = 1e-5;
// Each float32 parameter elementwise, relative to its tensor's largest value, after 10 steps.
// AdamW divides each step by the root of its second moment, so last-bit differences in the
// gradients of near-zero elements become differences of whole steps; how large depends on the
// processor's BLAS kernels (a GPT's MLP output weight under DualPipe and Hanayo: within 1e-5 on
// one machine, 1.13e-5 on another, the same build). Losses and the parameters' L2 distance keep
// 1e-5; a lost or doubled step is off by about the learning rate in every element.
constexpr double kParameterTolerance = 3e-5;

comm::Communicator* World() {
  static comm::Communicator* world = [] {
    auto w = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
    if (!w.ok()) {
      ADD_FAILURE() << w.status();
      return static_cast<comm::Communicator*>(nullptr);
    }
    (*w)->set_timeout(absl::Seconds(120));
    return w.value().release();
  }();
  return world;
}

// A tiny GPT: 6 blocks, so 8 pipeline layers (enough for 8 virtual stages).
libtorch::GptConfig TinyGpt() {
  libtorch::GptConfig gpt;
  gpt.vocab = 16;
  gpt.layers = 6;
  gpt.hidden = 16;
  gpt.heads = 2;
  gpt.seq_len = 8;
  return gpt;
}

struct Case {
  pipeline::ScheduleKind kind;
  int data_parallel = 1;
  bool adamw = false;
  bool dear = false;
  bool recompute = false;
  double clip_norm = 0;
  int chunks = 1;  // interleaved
  bool libtorch_ops = false;  // TorchDeviceOps instead of the CPU loops
  bool bf16 = false;          // autocast in the stages and the reference
  bool cuda = false;          // stages and reference on a GPU, device buffers over NCCL
  bool bf16_gradients = false;  // data-parallel gradients communicated as bfloat16
  // A schedule written by torch.distributed.pipelining (tests/data/torch_schedules/), run as
  // explicit programs instead of `kind`'s generator.
  const char* torch_csv = nullptr;
};

// bf16 autocast: both runs compute each micro-batch's forward with the same bfloat16 kernels,
// but the pipeline's stage boundaries change where autocast's weight-cast cache is dropped and
// the stages' activations are summed in another grouping; AdamW turns these last-bit
// differences into parameter differences of this order over 10 steps.
constexpr double kBf16Tolerance = 2e-3;
// The global gradient norm sums squares of bfloat16-computed gradients: its relative error is
// of the order of bfloat16's precision (2^-8 = 3.9e-3); LibTorch 2.x's CPU kernels reach 3e-3.
constexpr double kBf16GradNormTolerance = 1e-2;
// Two CUDA runs differ by kernel choices (reduction orders of cuBLAS and NCCL) more than two
// CPU runs do.
constexpr double kCudaTolerance = 1e-4;
// Gradients rounded to bfloat16 for the all-reduce (with SGD): losses and parameters follow the
// float32 reference within bfloat16's precision.
constexpr double kBf16GradientTolerance = 1e-2;
std::string Name(const Case& c) {
  return absl::StrCat(pipeline::ScheduleKindName(c.kind), " D=", c.data_parallel,
                      c.adamw ? " adamw" : " sgd", c.dear ? " dear" : " allreduce",
                      c.recompute ? " recompute" : "", c.clip_norm > 0 ? " clip" : "",
                      c.libtorch_ops ? " libtorch-ops" : "", c.bf16 ? " bf16" : "",
                      c.cuda ? " cuda" : "", c.bf16_gradients ? " bf16-gradients" : "",
                      c.torch_csv != nullptr ? absl::StrCat(" torch csv ", c.torch_csv) : "");
}

void PrintTo(const Case& c, std::ostream* os) { *os << Name(c); }

LrSchedule Lr(const Case& c) {
  LrSchedule lr;
  lr.base_lr = c.adamw ? 3e-3 : 0.05;
  lr.warmup_steps = 2;
  lr.decay_end_step = kSteps;
  lr.min_lr = lr.base_lr / 10;
  return lr;
}

// Largest elementwise difference relative to the tensor's scale: max |a - b| / max |b|.
double MaxRelative(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-12);
  return (got - want).abs().max().item<double>() / scale;
}

// Why the CUDA cases cannot run here ("" when they can): agreed by every rank.
std::string CudaSkipReason(comm::Communicator& world) {
  std::string why;
  double torch_sees_one = torch::cuda::is_available() ? 1 : 0;
  if (!world.AllReduce(DoubleBuffer(&torch_sees_one, 1), comm::ReduceOp::kMin)->Wait().ok() ||
      torch_sees_one == 0) {
    return "no CUDA device LibTorch can use";
  }
  auto options = comm::CommOptions::FromEnvironment();
  if (!options.ok()) return options.status().ToString();
  return comm::NcclCanRun(world, options->shared_gpu, &why) ? "" : why;
}

void RunCase(const Case& c) {
  SCOPED_TRACE(Name(c));
  comm::Communicator* world = World();
  ASSERT_NE(world, nullptr);
  torch::Device device = torch::kCPU;
  if (c.cuda) {
    static const std::string skip = CudaSkipReason(*world);
    if (!skip.empty()) GTEST_SKIP() << skip;
    const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    device = torch::Device(torch::kCUDA, (local_rank != nullptr ? std::atoi(local_rank) : 0) %
                                             comm::CudaDeviceCount());
  }
  const libtorch::GptConfig gpt = TinyGpt();
  auto model = libtorch::GptModelSpec(gpt).Build(kSeed);
  ASSERT_TRUE(model.ok()) << model.status();
  libtorch::SyntheticTaskOptions task;
  task.vocab = gpt.vocab;
  task.seq_len = gpt.seq_len;
  task.seed = kSeed;
  auto data = libtorch::MakeSyntheticDataset(task);
  ASSERT_TRUE(data.ok()) << data.status();

  // The oracle.
  libtorch::ReferenceOptions reference;
  reference.global_batch = kGlobalBatch;
  reference.steps = kSteps;
  reference.lr = Lr(c);
  reference.clip_norm = c.clip_norm;
  reference.optimizer.kind = c.adamw ? libtorch::OptimizerKind::kAdamW
                                     : libtorch::OptimizerKind::kSgd;
  reference.optimizer.momentum = c.adamw ? 0 : 0.9;
  reference.optimizer.weight_decay = c.adamw ? 0.01 : 1e-4;
  // The single-process run accumulates gradients over the same micro-batches (in order), as a
  // single-process trainer with this micro-batch size would, so the sums associate alike.
  reference.accumulation_slices = kGlobalBatch / 2;
  if (c.bf16) reference.precision = libtorch::Precision::kBFloat16;
  reference.device = device;
  const double tolerance = c.bf16             ? kBf16Tolerance
                           : c.bf16_gradients ? kBf16GradientTolerance
                           : c.cuda           ? kCudaTolerance
                                              : kRelativeTolerance;
  auto expected = libtorch::TrainReference(*model, **data, reference);
  ASSERT_TRUE(expected.ok()) << expected.status();
  // The engine.
  pipeline::ScheduleSpec spec;
  spec.kind = c.kind;
  spec.num_ranks = world->size() / c.data_parallel;
  spec.num_microbatches = 8 / c.data_parallel;
  spec.chunks = c.chunks;
  std::shared_ptr<const pipeline::Schedule> torch_schedule;
  if (c.torch_csv != nullptr) {
    const std::string here = __FILE__;
    auto read = pipeline::ReadTorchCsvSchedule(here.substr(0, here.rfind('/')) +
                                               "/../data/torch_schedules/" + c.torch_csv);
    ASSERT_TRUE(read.ok()) << read.status();
    if (read->spec.num_ranks != spec.num_ranks ||
        read->spec.num_microbatches != spec.num_microbatches) {
      GTEST_SKIP() << c.torch_csv << " is a schedule for other ranks or micro-batches";
    }
    spec = read->spec;
    torch_schedule = std::make_shared<const pipeline::Schedule>(*std::move(read));
  }
  const int64_t microbatch_size = kGlobalBatch / (spec.num_microbatches * c.data_parallel);
  auto plan = pipeline::MakeUniformPlan(model->num_layers(), spec, c.data_parallel,
                                        microbatch_size);
  ASSERT_TRUE(plan.ok()) << plan.status();
  if (c.recompute) {
    // Recompute every other layer, so stages mix recomputed and stashed segments.
    for (auto& stage : plan->stages) {
      for (int l = stage.first_layer; l < stage.end_layer; ++l) {
        if (l % 2 == 1) stage.recompute_layers.push_back(l);
      }
    }
  }
  std::shared_ptr<const libtorch::Dataset> dataset = *data;
  const LayeredModel& layered = *model;
  StageFactory factory = [&](const StageSpec& s) -> absl::StatusOr<std::unique_ptr<Stage>> {
    libtorch::TorchStageOptions o = libtorch::TorchStageOptionsFor(s, device);
    o.libtorch_device_ops = c.libtorch_ops;
    o.precision = c.bf16 ? libtorch::Precision::kBFloat16 : libtorch::Precision::kFloat32;
    auto stage = libtorch::TorchStage::Create(layered, dataset, o);
    if (!stage.ok()) return stage.status();
    return std::unique_ptr<Stage>(std::move(stage).value());
  };
  EngineOptions options;
  options.optimizer = c.adamw ? runtime::OptimizerConfig::AdamW(0.01)
                              : runtime::OptimizerConfig::Sgd(0.9, 1e-4);
  options.grad_sync = c.dear ? runtime::GradSyncStrategy::kDeAR : runtime::GradSyncStrategy::kAllReduce;
  options.lr_schedule = Lr(c);
  options.clip_norm = c.clip_norm;
  options.timeout = absl::Seconds(120);
  options.schedule = torch_schedule;
  if (c.bf16_gradients) options.gradient_communication = comm::DataType::kBFloat16;
  auto engine = Engine::Create(*plan, world, factory, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  if (c.cuda) EXPECT_EQ((*engine)->device_backend(), "nccl");
  for (int it = 0; it < kSteps; ++it) {
    auto r = (*engine)->RunIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    const double want = expected->losses[it];
    EXPECT_LE(std::abs(r->loss - want), tolerance * std::abs(want))
        << "iteration " << it << ": loss " << r->loss << " vs reference " << want;
    EXPECT_NEAR(r->learning_rate, expected->learning_rates[it], 1e-12);
    const double norm = expected->grad_norms[it];
    EXPECT_LE(std::abs(r->grad_norm - norm),
              (c.bf16 || c.bf16_gradients ? kBf16GradNormTolerance : 1e-4) * norm)
        << "iteration " << it;
  }
  ASSERT_TRUE((*engine)->Flush().ok());

  std::map<std::string, torch::Tensor> want;
  for (const auto& [name, tensor] : expected->parameters) want[name] = tensor;
  // Every tensor elementwise, and everything this rank holds as one vector (relative L2).
  double squared_error = 0, squared_norm = 0;
  int compared = 0;
  for (const LocalStageId& id : (*engine)->local_stages()) {
    auto* stage = static_cast<libtorch::TorchStage*>((*engine)->stage(id.replica, id.stage));
    for (const auto& [name, tensor] : stage->named_parameters()) {
      auto it = want.find(name);
      ASSERT_NE(it, want.end()) << name;
      const torch::Tensor got = tensor.cpu();
      const torch::Tensor& reference_value = it->second;
      squared_error += (got - reference_value).pow(2).sum().item<double>();
      squared_norm += reference_value.pow(2).sum().item<double>();
      ++compared;
      const std::string what =
          absl::StrCat(name, " (stage ", id.stage, " replica ", id.replica, ")");
      if (absl::EndsWith(name, ".qkv.bias")) {
        // The key bias [H, 2H) has an exactly zero gradient (softmax ignores a constant
        // shift of the scores), so in both runs its values are float32 rounding noise of
        // order 1e-6 that AdamW normalises into steps: it is covered by the L2 check below,
        // not elementwise. The query and value biases are checked like every tensor.
        const int64_t h = got.size(0) / 3;
        EXPECT_LE(MaxRelative(got.narrow(0, 0, h), reference_value.narrow(0, 0, h)),
                  tolerance) << what << " query bias";
        EXPECT_LE(MaxRelative(got.narrow(0, 2 * h, h), reference_value.narrow(0, 2 * h, h)),
                  tolerance) << what << " value bias";
        continue;
      }
      // bf16: elementwise bound on the scale of the tensor, as float32 but looser (with bf16
      // gradients a layer norm's bias, whose scale is small, is 1.9% apart).
      EXPECT_LE(MaxRelative(got, reference_value), c.bf16 ? 10 * tolerance
                                                   : c.bf16_gradients
                                                       ? 5 * tolerance
                                                       : std::max(tolerance, kParameterTolerance))
          << what;
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_LE(std::sqrt(squared_error / squared_norm), tolerance)
      << "relative L2 difference of this rank's parameters";
}

class EquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(EquivalenceTest, LossesAndParametersEqualSingleProcess) { RunCase(GetParam()); }

using K = pipeline::ScheduleKind;

// Pipeline only (p = world size): every schedule, alternating the other options.
INSTANTIATE_TEST_SUITE_P(
    PipelineOnly, EquivalenceTest,
    ::testing::Values(Case{K::kGPipe, 1, false, false, false},
                      Case{K::k1F1B, 1, true, false, true},
                      Case{K::kInterleaved, 1, false, false, false, 0, /*chunks=*/2},
                      Case{K::kChimera, 1, true, false, false, /*clip=*/0.5},
                      Case{K::kHanayo, 1, false, false, true},
                      Case{K::kZBH1, 1, true, false, false},
                      Case{K::k1F1B, 1, false, false, false, /*clip=*/0.1},
                      Case{K::kDualPipe, 1, true, false, false},
                      Case{K::kDualPipeV, 1, false, false, true}),
    [](const auto& info) { return absl::StrCat("case", info.index); });

// Schedules written by torch.distributed.pipelining for 4 ranks and 8 micro-batches, read
// from its CSV format (both forms) and run as explicit programs.
Case FromTorchCsv(const char* file, bool adamw) {
  Case c{K::kCustom, 1, adamw};
  c.torch_csv = file;
  return c;
}
INSTANTIATE_TEST_SUITE_P(
    TorchCsv, EquivalenceTest,
    ::testing::Values(FromTorchCsv("interleaved1f1b_p4_m8.csv", false),
                      FromTorchCsv("zbv_p4_m8_comms.csv", true),
                      FromTorchCsv("dualpipev_p4_m8.csv", false),
                      FromTorchCsv("interleavedzb_p4_m8_comms.csv", true)),
    [](const auto& info) { return absl::StrCat("case", info.index); });

// Two pipelines of world/2 stages: data parallelism with plain all-reduce and DeAR.
INSTANTIATE_TEST_SUITE_P(
    DataParallel, EquivalenceTest,
    ::testing::Values(Case{K::k1F1B, 2, false, true, false},
                      Case{K::k1F1B, 2, true, false, false},
                      Case{K::kChimera, 2, false, true, true},
                      Case{K::kInterleaved, 2, true, true, false, 0, /*chunks=*/2},
                      Case{K::kZBH1, 2, true, true, true, /*clip=*/0.5},
                      Case{K::kGPipe, 2, false, false, true},
                      Case{K::kHanayo, 2, true, true, false}),
    [](const auto& info) { return absl::StrCat("case", info.index); });

// The GPU code path on the CPU: gradient averaging, norms and the optimizer as LibTorch tensor
// operations on the stages' arenas (fused AdamW where LibTorch has it).
INSTANTIATE_TEST_SUITE_P(
    LibTorchDeviceOps, EquivalenceTest,
    ::testing::Values(Case{K::k1F1B, 2, true, true, false, /*clip=*/0.5, 1, true},
                      Case{K::kGPipe, 2, false, false, true, 0, 1, true},
                      Case{K::kZBH1, 1, true, false, false, 0, 1, true},
                      // two stages a rank, each with its own norm on its way to the host
                      Case{K::kInterleaved, 1, true, false, false, 0, /*chunks=*/2, true}),
    [](const auto& info) { return absl::StrCat("case", info.index); });

// bf16 autocast (CPU autocast here; CUDA on a GPU) against a bf16 single-process reference.
INSTANTIATE_TEST_SUITE_P(
    Bf16, EquivalenceTest,
    ::testing::Values(Case{K::k1F1B, 2, true, true, false, 0, 1, false, true},
                      Case{K::kGPipe, 1, true, false, true, /*clip=*/0.5, 1, true, true}),
    [](const auto& info) { return absl::StrCat("case", info.index); });

// On GPUs over NCCL (2 or 4 ranks; pipelines of world/D stages): every schedule, all-reduce and
// DeAR, recomputation, clipping, bf16 autocast and bf16 gradient communication. Run by its own
// CTest entries; elsewhere it skips with the reason.
Case OnCuda(Case c) {
  c.cuda = true;
  c.libtorch_ops = true;
  return c;
}
Case Bf16Gradients(Case c) {
  c.bf16_gradients = true;
  return c;
}
INSTANTIATE_TEST_SUITE_P(
    Cuda, EquivalenceTest,
    ::testing::Values(OnCuda(Case{K::kGPipe, 1, false, false, false}),
                      OnCuda(Case{K::k1F1B, 1, true, false, true}),
                      OnCuda(Case{K::kInterleaved, 1, false, false, false, 0, /*chunks=*/2}),
                      OnCuda(Case{K::kChimera, 1, true, false, false, /*clip=*/0.5}),
                      OnCuda(Case{K::kHanayo, 1, false, false, true}),
                      OnCuda(Case{K::kZBH1, 1, true, false, false}),
                      OnCuda(Case{K::k1F1B, 2, false, true, false}),
                      OnCuda(Case{K::k1F1B, 2, true, false, false}),
                      OnCuda(Case{K::kZBH1, 2, true, true, true, /*clip=*/0.5}),
                      OnCuda(Case{K::kGPipe, 2, false, false, true}),
                      OnCuda(Case{K::k1F1B, 2, true, true, false, 0, 1, false, /*bf16=*/true}),
                      // SGD: its step is linear in the gradient, so the rounding stays
                      // bfloat16's (AdamW normalises the rounding of small gradients into
                      // whole steps: 11% of a bias's scale apart after 10 steps)
                      OnCuda(Bf16Gradients(Case{K::k1F1B, 2, false, false, false})),
                      OnCuda(Bf16Gradients(Case{K::k1F1B, 2, false, true, false}))),
    [](const auto& info) { return absl::StrCat("case", info.index); });

}  // namespace
}  // namespace tandem::runtime
