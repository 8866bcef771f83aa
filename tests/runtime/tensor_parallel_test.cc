// Tensor parallelism end to end: `mpirun ... tandem train --tensor-parallel T` (Megatron-style
// shards of the GPT: heads, MLP units and vocabulary split over T ranks per pipeline position)
// trains to the single-process reference's losses within 1e-5 relative in float32, for every
// schedule with 1 x 2 x 2 (DP x TP x PP) on 4 ranks, 1 x 4 x 1 on 4, and 2 x 2 x 2 on 8; the
// gradient norm (clipping) counts the parameters the group holds whole once, with all-reduce
// and with DeAR gradient synchronisation; checkpoints hold whole parameters and resume on any
// layout; inputs that cannot run give a clear error and exit status 2. The same with sequence
// parallelism.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pipeline/plan.h"
#include "pipeline/profile.h"
#include "tests/support/train_cli.h"

namespace {

std::string g_tandem;  // path of the tandem program
constexpr double kRelativeTolerance = 1e-5;
// Checkpoints of a sharded run against one rank's, relative to each tensor's largest value:
// a sharded product sums its partial results in another order, and AdamW's step, about the
// learning rate for any gradient well above its epsilon, turns last-bit differences of the
// near-zero gradients into parameter differences of a tensor's largest value over 6 steps that
// depend on the processor's BLAS kernels (measured for an MLP output weight with DeAR: 6.3e-5
// on one machine, 4.8e-4 on another, the same build). Losses and gradient norms keep 1e-5; a
// wrong shard is off by the parameters' own size, and one lost AdamW step (about the learning
// rate, 3e-3, in every element) by several percent of a tensor's largest value.
constexpr char kCheckpointTolerance[] = " --tolerance 1e-3";
constexpr uint64_t kSeed = 11;
constexpr int64_t kGlobalBatch = 16;
constexpr int kSteps = 6;

using tandem::testing::Outcome;
using tandem::testing::RunCommand;

std::string Train(int ranks, int heads, const std::string& flags, const std::string& log) {
  return absl::StrCat(
      TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np ", ranks, " ",
      g_tandem, " train --model gpt --layers 2 --hidden 16 --heads ", heads,
      " --seq-len 8 --optimizer adamw --lr 3e-3 --warmup-steps 2 --weight-decay 0.01",
      " --global-batch ", kGlobalBatch, " --steps ", kSteps, " --seed ", kSeed, " --log-json ",
      log, " ", flags);
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          absl::StrCat("tandem_tensor_parallel_", ::getpid(), "_", name))
      .string();
}

struct Layout {
  const char* name;
  int ranks;
  int heads;
  const char* flags;  // schedule, stages, data and tensor parallelism
};

// `environment` goes before mpirun ("NAME=value "); `tolerance` is relative to each loss.
void ExpectReferenceLosses(const Layout& c, const std::string& environment = "",
                           double tolerance = kRelativeTolerance) {
  const std::string log = TempPath(absl::StrCat(c.name, ".jsonl"));
  Outcome o = RunCommand(environment + Train(c.ranks, c.heads, c.flags, log));
  if (o.output.find("multi-rank mode needs NCCL >= 2.30") != std::string::npos) {
    GTEST_SKIP() << "ranks share a GPU and the NCCL loaded cannot take them:\n" << o.output;
  }
  ASSERT_EQ(o.exit_status, 0) << o.output;
  const std::vector<double> want =
      tandem::testing::SmallGptReferenceLosses(kSteps, kGlobalBatch, kSeed, c.heads);
  const std::vector<nlohmann::json> lines = tandem::testing::ReadLogIterations(log);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps)) << o.output;
  for (const nlohmann::json& line : lines) {
    const int it = line["iteration"].get<int>() - 1;  // the log counts from 1
    ASSERT_LT(it, static_cast<int>(want.size()));
    const double loss = line["loss"].get<double>();
    EXPECT_LE(std::abs(loss - want[it]), tolerance * std::abs(want[it]))
        << c.name << " iteration " << it << ": " << loss << " vs reference " << want[it];
  }
  std::filesystem::remove(log);
}

class TensorParallelScheduleTest : public ::testing::TestWithParam<const char*> {};

// 1 x 2 x 2: two pipeline positions of two tensor-parallel ranks each, every schedule.
TEST_P(TensorParallelScheduleTest, OneByTwoByTwoMatchesTheReference) {
  const std::string schedule = GetParam();
  const std::string name = absl::StrCat("1x2x2_", schedule);
  const std::string flags = absl::StrCat("--schedule ", schedule,
                                         " --stages 2 --tensor-parallel 2 --microbatches 4");
  ExpectReferenceLosses({name.c_str(), 4, 2, flags.c_str()});
}

INSTANTIATE_TEST_SUITE_P(EverySchedule, TensorParallelScheduleTest,
                         ::testing::Values("gpipe", "1f1b", "interleaved", "chimera", "hanayo",
                                           "zb-h1", "zb-v"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// On GPUs, the tensor-parallel groups' collectives and the gradient all-reduce over NCCL
// (TANDEM_COMM_SHARED_GPU=nccl: ranks that share a GPU use NCCL >= 2.30's multi-rank mode, or
// the run fails saying so, and the test skips with that): 1 x 2 x 1 on 2 ranks, 2 x 2 x 1 on 4
// and 1 x 2 x 2 with sequence parallelism on 4, against the CPU reference within CUDA's kernel
// differences.
TEST(TensorParallelTest, CudaOverNcclMatchesTheReference) {
  const Outcome gpus = RunCommand("nvidia-smi -L 2>&1");
  if (gpus.exit_status != 0 || gpus.output.find("GPU 0") == std::string::npos) {
    GTEST_SKIP() << "no CUDA device (nvidia-smi -L: " << gpus.output << ")";
  }
  constexpr double kCudaTolerance = 1e-4;
  const std::string nccl = "TANDEM_COMM_SHARED_GPU=nccl ";
  ExpectReferenceLosses({"cuda_1x2x1", 2, 2,
                         "--schedule 1f1b --stages 1 --tensor-parallel 2 --microbatches 4 "
                         "--device cuda --precision fp32"},
                        nccl, kCudaTolerance);
  if (::testing::Test::IsSkipped()) return;
  ExpectReferenceLosses({"cuda_2x2x1", 4, 2,
                         "--schedule 1f1b --stages 1 --data-parallel 2 --tensor-parallel 2 "
                         "--microbatches 2 --device cuda --precision fp32"},
                        nccl, kCudaTolerance);
  // Sequence parallelism: the products gather this rank's tokens over NCCL, forward and again
  // in the backward.
  ExpectReferenceLosses({"cuda_1x2x2_sp", 4, 2,
                         "--schedule 1f1b --stages 2 --tensor-parallel 2 --microbatches 4 "
                         "--sequence-parallel --device cuda --precision fp32"},
                        nccl, kCudaTolerance);
}

// 1 x 4 x 1: one stage split over four ranks (the model's 4 heads and 16-token vocabulary).
TEST(TensorParallelTest, OneByFourByOneMatchesTheReference) {
  ExpectReferenceLosses(
      {"1x4x1", 4, 4, "--schedule 1f1b --stages 1 --tensor-parallel 4 --microbatches 4"});
}

// 2 x 2 x 2 on 8 ranks: gradients are summed over the data-parallel copies of each shard.
TEST(TensorParallelTest, TwoByTwoByTwoMatchesTheReference) {
  ExpectReferenceLosses({"2x2x2_1f1b", 8, 2,
                         "--schedule 1f1b --stages 2 --data-parallel 2 --tensor-parallel 2 "
                         "--microbatches 2"});
  ExpectReferenceLosses({"2x2x2_interleaved", 8, 2,
                         "--schedule interleaved --stages 2 --data-parallel 2 "
                         "--tensor-parallel 2 --microbatches 2"});
}

// With clipping, the norm over the shards equals the norm of the whole model: the layer norms
// and biases that every rank of a group holds are counted once.
// With `checkpoints`, the two runs' checkpoints are also equal.
void ExpectNormAndLossesOfOneRank(int ranks, int heads, const std::string& flags,
                                  bool checkpoints = false) {
  const std::string one = TempPath("norm_one.jsonl");
  const std::string sharded = TempPath("norm_tp.jsonl");
  const std::string one_dir = TempPath("norm_one_ckpt"), sharded_dir = TempPath("norm_tp_ckpt");
  const auto save = [&](const std::string& dir) {
    return checkpoints ? " --checkpoint-dir " + dir : std::string();
  };
  Outcome a = RunCommand(Train(
      1, heads, "--schedule 1f1b --stages 1 --microbatches 4 --clip-norm 0.5" + save(one_dir),
      one));
  ASSERT_EQ(a.exit_status, 0) << a.output;
  Outcome b =
      RunCommand(Train(ranks, heads, flags + " --clip-norm 0.5" + save(sharded_dir), sharded));
  ASSERT_EQ(b.exit_status, 0) << b.output;
  if (checkpoints) {
    Outcome diff = RunCommand(absl::StrCat(g_tandem, " checkpoint diff ", sharded_dir, " ",
                                           one_dir, kCheckpointTolerance));
    EXPECT_EQ(diff.exit_status, 0) << diff.output;
    tandem::RemoveAll(one_dir).IgnoreError();
    tandem::RemoveAll(sharded_dir).IgnoreError();
  }
  const auto x = tandem::testing::ReadLogIterations(one);
  const auto y = tandem::testing::ReadLogIterations(sharded);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = x[i]["grad_norm"].get<double>();
    EXPECT_LE(std::abs(y[i]["grad_norm"].get<double>() - want), kRelativeTolerance * want)
        << flags << " iteration " << i;
    const double loss = x[i]["loss"].get<double>();
    EXPECT_LE(std::abs(y[i]["loss"].get<double>() - loss), kRelativeTolerance * loss)
        << flags << " iteration " << i;
  }
  std::filesystem::remove(one);
  std::filesystem::remove(sharded);
}

TEST(TensorParallelTest, GradientNormAndClippingMatchOneRank) {
  ExpectNormAndLossesOfOneRank(
      4, 4, "--schedule 1f1b --stages 2 --tensor-parallel 2 --microbatches 4");
}

// DeAR (reduce-scatter in backward, all-gather before the next forward) over the
// data-parallel copies of each shard: each rank's norm share leaves out the whole parameters
// of lanes other than the first where its shard of a bucket overlaps them. Its checkpoint (the
// optimizer state gathered over the data-parallel copies, then over the group) is one rank's.
TEST(TensorParallelTest, DeARMatchesOneRank) {
  ExpectNormAndLossesOfOneRank(8, 2,
                               "--schedule 1f1b --stages 2 --data-parallel 2 "
                               "--tensor-parallel 2 --microbatches 2 --grad-sync dear",
                               /*checkpoints=*/true);
}

// Checkpoints hold whole parameters (the shards gathered over each group): equal to those of
// the same training without tensor parallelism, and a resume continues with the reference
// losses on the same layout or on another one.
TEST(TensorParallelTest, CheckpointsAreWholeAndResumeOnAnyLayout) {
  const std::string sharded = TempPath("ckpt_tp");
  const std::string plain = TempPath("ckpt_plain");
  const std::string log = TempPath("ckpt.jsonl");
  const std::string tp_flags = "--schedule 1f1b --stages 2 --tensor-parallel 2 --microbatches 4";
  const std::string pp_flags = "--schedule 1f1b --stages 2 --microbatches 4";
  Outcome a = RunCommand(Train(4, 2, absl::StrCat(tp_flags, " --checkpoint-dir ", sharded), log));
  ASSERT_EQ(a.exit_status, 0) << a.output;
  Outcome b = RunCommand(Train(2, 2, absl::StrCat(pp_flags, " --checkpoint-dir ", plain), log));
  ASSERT_EQ(b.exit_status, 0) << b.output;
  Outcome diff = RunCommand(
      absl::StrCat(g_tandem, " checkpoint diff ", sharded, " ", plain, kCheckpointTolerance));
  EXPECT_EQ(diff.exit_status, 0) << diff.output;

  // Steps 6..11 from the sharded checkpoint: on the same layout, and with 1 x 1 x 2 and with
  // tensor parallelism of 2 on a single stage.
  const std::vector<double> want =
      tandem::testing::SmallGptReferenceLosses(2 * kSteps, kGlobalBatch, kSeed);
  const std::pair<int, std::string> layouts[] = {
      {4, tp_flags}, {2, pp_flags}, {2, "--schedule gpipe --stages 1 --tensor-parallel 2"}};
  for (const auto& [ranks, flags] : layouts) {
    std::filesystem::remove(log);
    // --steps is the run's last iteration (the later flag wins).
    Outcome r = RunCommand(
        Train(ranks, 2, absl::StrCat(flags, " --resume ", sharded, " --steps ", 2 * kSteps), log));
    ASSERT_EQ(r.exit_status, 0) << flags << "\n" << r.output;
    const auto lines = tandem::testing::ReadLogIterations(log);
    ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps)) << r.output;
    for (const nlohmann::json& line : lines) {
      const int it = line["iteration"].get<int>() - 1;  // the log counts from 1
      ASSERT_GE(it, kSteps);
      ASSERT_LT(it, 2 * kSteps);
      EXPECT_LE(std::abs(line["loss"].get<double>() - want[it]),
                kRelativeTolerance * std::abs(want[it]))
          << flags << " iteration " << it;
    }
  }
  tandem::RemoveAll(sharded).IgnoreError();
  tandem::RemoveAll(plain).IgnoreError();
  std::filesystem::remove(log);
}

// Sequence parallelism (--sequence-parallel): between the split products each rank holds S/T
// of the tokens (layer norms, residuals and pipeline transfers on them), the products see the
// whole sequence through all-gathers and reduce-scatters, and the layer norms', biases' and
// position embedding's gradients are summed over the group. Same losses as one rank.
class SequenceParallelScheduleTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SequenceParallelScheduleTest, OneByTwoByTwoMatchesTheReference) {
  const std::string schedule = GetParam();
  const std::string name = absl::StrCat("sp_1x2x2_", schedule);
  const std::string flags =
      absl::StrCat("--schedule ", schedule,
                   " --stages 2 --tensor-parallel 2 --microbatches 4 --sequence-parallel");
  ExpectReferenceLosses({name.c_str(), 4, 2, flags.c_str()});
}

INSTANTIATE_TEST_SUITE_P(Schedules, SequenceParallelScheduleTest,
                         ::testing::Values("gpipe", "1f1b", "interleaved", "zb-v"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// Llama's products that share an input (q, k, v; gate, up) gather it once each way and, under
// ZB-V, defer their weight gradients to W together: 1 x 2 x 2 with sequence parallelism
// trains to the losses of one process.
TEST(TensorParallelTest, LlamaSequenceParallelZeroBubbleMatchesOneRank) {
  const std::string llama = absl::StrCat(
      " train --model llama --layers 4 --hidden 32 --heads 4 --kv-heads 2 --intermediate 64"
      " --seq-len 8 --global-batch 8 --microbatches 4 --steps 4 --seed ",
      kSeed, " --log-json ");
  const std::string one_log = TempPath("llama_one.jsonl"), split_log = TempPath("llama_sp.jsonl");
  Outcome one = RunCommand(absl::StrCat(g_tandem, llama, one_log, " --schedule 1f1b --stages 1"));
  ASSERT_EQ(one.exit_status, 0) << one.output;
  Outcome split = RunCommand(absl::StrCat(
      TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 4 ", g_tandem, llama,
      split_log, " --schedule zb-v --stages 2 --tensor-parallel 2 --sequence-parallel"));
  ASSERT_EQ(split.exit_status, 0) << split.output;
  const std::vector<nlohmann::json> want = tandem::testing::ReadLogIterations(one_log);
  const std::vector<nlohmann::json> got = tandem::testing::ReadLogIterations(split_log);
  ASSERT_EQ(want.size(), 4u) << one.output;
  ASSERT_EQ(got.size(), want.size()) << split.output;
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = got[i]["loss"].get<double>(), b = want[i]["loss"].get<double>();
    EXPECT_LE(std::abs(a - b), kRelativeTolerance * std::abs(b)) << "iteration " << i + 1;
  }
  std::filesystem::remove(one_log);
  std::filesystem::remove(split_log);
}

// Multi-query attention (one key/value head for 4 query heads) on 2 tensor-parallel ranks, whose
// k_proj and v_proj every rank holds whole with their gradients summed over the group, trains to
// the losses of one process under SGD with the gradient norm clipped (the whole weights counted
// once, which the clipped steps would show):
// 2 stages under ZB-V with sequence parallelism, and 2 replicas of one stage.
TEST(TensorParallelTest, LlamaMultiQueryTrainsAsOneProcessWithWholeKeyValueHeads) {
  const std::string llama = absl::StrCat(
      " train --model llama --layers 4 --hidden 32 --heads 4 --kv-heads 1 --intermediate 64"
      " --seq-len 8 --global-batch 8 --microbatches 4 --steps 4 --optimizer sgd --lr 0.5"
      " --clip-norm 0.5"
      " --seed ",
      kSeed, " --log-json ");
  const std::string one_log = TempPath("mqa_one.jsonl");
  Outcome one = RunCommand(absl::StrCat(g_tandem, llama, one_log, " --schedule 1f1b --stages 1"));
  ASSERT_EQ(one.exit_status, 0) << one.output;
  const std::vector<nlohmann::json> want = tandem::testing::ReadLogIterations(one_log);
  ASSERT_EQ(want.size(), 4u) << one.output;
  for (const char* layout : {" --schedule zb-v --stages 2 --tensor-parallel 2 --sequence-parallel",
                             " --schedule 1f1b --stages 1 --tensor-parallel 2 --data-parallel 2"}) {
    SCOPED_TRACE(layout);
    const std::string split_log = TempPath("mqa_split.jsonl");
    Outcome split = RunCommand(absl::StrCat(TANDEM_MPIEXEC,
                                            " --allow-run-as-root --oversubscribe --bind-to none"
                                            " -np 4 ",
                                            g_tandem, llama, split_log, layout));
    ASSERT_EQ(split.exit_status, 0) << split.output;
    const std::vector<nlohmann::json> got = tandem::testing::ReadLogIterations(split_log);
    ASSERT_EQ(got.size(), want.size()) << split.output;
    for (size_t i = 0; i < want.size(); ++i) {
      const double a = got[i]["loss"].get<double>(), b = want[i]["loss"].get<double>();
      EXPECT_LE(std::abs(a - b), kRelativeTolerance * std::abs(b)) << "iteration " << i + 1;
    }
    std::filesystem::remove(split_log);
  }
  std::filesystem::remove(one_log);
}

// A Mixtral (--experts) with its load-balancing loss trains to the losses of one process on 4
// ranks laid out two ways: 2 stages x 2 replicas with DeAR's gradient sync, and 2 stages x 2
// tensor-parallel ranks with sequence parallelism under ZB-V (each expert's weight gradients
// deferred to W, the router's scores gathered). The balancing loss is scaled as the loss is
// over micro-batches and replicas, and counted once over the tensor-parallel group. It is a
// function of each micro-batch's tokens together (shares times mean probabilities), so each
// layout is compared with the one process that takes the same micro-batches: of 2 samples
// without replicas, of 1 with 2 replicas of 4.
TEST(TensorParallelTest, MixtralTrainsAsOneProcessOnPipelineDataAndTensorParallelRanks) {
  const std::string mixtral = absl::StrCat(
      " train --model llama --experts 4 --experts-per-token 2 --layers 4 --hidden 32 --heads 4"
      " --kv-heads 2 --intermediate 32 --seq-len 8 --global-batch 8 --steps 4 --seed ",
      kSeed, " --log-json ");
  const std::string balanced = " --moe-aux-loss-coef 0.5";
  // The one-process run of `microbatches` micro-batches: its iterations' logs.
  const auto one_process = [&](int microbatches, const std::string& flags) {
    const std::string log = TempPath("mixtral_one.jsonl");
    const Outcome one = RunCommand(absl::StrCat(g_tandem, mixtral, log, flags, " --microbatches ",
                                                microbatches, " --schedule 1f1b --stages 1"));
    EXPECT_EQ(one.exit_status, 0) << one.output;
    std::vector<nlohmann::json> iterations = tandem::testing::ReadLogIterations(log);
    EXPECT_EQ(iterations.size(), 4u) << one.output;
    std::filesystem::remove(log);
    return iterations;
  };
  const std::pair<const char*, int> layouts[] = {
      {" --schedule 1f1b --stages 2 --data-parallel 2 --grad-sync dear --microbatches 4", 8},
      {" --schedule zb-v --stages 2 --tensor-parallel 2 --sequence-parallel --microbatches 4", 4},
      // Each expert whole on one rank of the pair: the other rank's empty experts take no part
      // in the deferred weight gradients.
      {" --schedule zb-v --stages 2 --tensor-parallel 2 --sequence-parallel --expert-parallel 2"
       " --microbatches 4",
       4}};
  for (const auto& [layout, microbatches] : layouts) {
    SCOPED_TRACE(layout);
    const std::vector<nlohmann::json> want = one_process(microbatches, balanced);
    ASSERT_EQ(want.size(), 4u);
    const std::string log = TempPath("mixtral_split.jsonl");
    Outcome split = RunCommand(
        absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 4 ",
                     g_tandem, mixtral, log, balanced, layout));
    ASSERT_EQ(split.exit_status, 0) << split.output;
    const std::vector<nlohmann::json> got = tandem::testing::ReadLogIterations(log);
    ASSERT_EQ(got.size(), want.size()) << split.output;
    for (size_t i = 0; i < want.size(); ++i) {
      const double a = got[i]["loss"].get<double>(), b = want[i]["loss"].get<double>();
      EXPECT_LE(std::abs(a - b), kRelativeTolerance * std::abs(b)) << "iteration " << i + 1;
    }
    std::filesystem::remove(log);
  }
  // The losses move: the run trains; and without the balancing loss it trains elsewhere (the
  // first loss, before any update, is the same).
  const std::vector<nlohmann::json> want = one_process(4, balanced);
  const std::vector<nlohmann::json> unbalanced = one_process(4, "");
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(unbalanced.size(), 4u);
  EXPECT_NE(want.front()["loss"].get<double>(), want.back()["loss"].get<double>());
  EXPECT_EQ(unbalanced[0]["loss"].get<double>(), want[0]["loss"].get<double>());
  EXPECT_GT(std::abs(unbalanced[3]["loss"].get<double>() - want[3]["loss"].get<double>()),
            100 * kRelativeTolerance * std::abs(want[3]["loss"].get<double>()));
}

// Resumes `dir` for iterations 5 and 6 with each run (a command and the log it writes):
// every run continues from iteration 5 with the first run's losses.
void ExpectResumesAlike(const std::string& dir,
                        const std::vector<std::pair<std::string, std::string>>& runs) {
  std::vector<std::vector<nlohmann::json>> resumed;
  for (const auto& [run, log] : runs) {
    std::filesystem::remove(log);
    Outcome r = RunCommand(absl::StrCat(run, " --resume ", dir, " --steps 6"));
    ASSERT_EQ(r.exit_status, 0) << run << "\n" << r.output;
    resumed.push_back(tandem::testing::ReadLogIterations(log));
    ASSERT_EQ(resumed.back().size(), 2u) << r.output;
    EXPECT_EQ(resumed.back()[0]["iteration"].get<int>(), 5);
  }
  for (size_t run = 1; run < resumed.size(); ++run) {
    for (size_t i = 0; i < 2; ++i) {
      const double a = resumed[run][i]["loss"].get<double>();
      const double b = resumed[0][i]["loss"].get<double>();
      EXPECT_LE(std::abs(a - b), kRelativeTolerance * std::abs(b)) << "iteration " << i + 5;
    }
  }
}

// One step of a small Llama on 2 ranks laid out by `layout` (one pipeline stage), logging to
// `log`: the command the refusals below add their flags to.
std::string SmallLlamaOnTwoRanks(const std::string& layout, const std::string& log) {
  return absl::StrCat(
      TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 2 ", g_tandem,
      " train --model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --intermediate 32"
      " --seq-len 8 --global-batch 4 --steps 1 --schedule 1f1b --stages 1 --microbatches 2 ",
      layout, " --log-json ", log);
}

// `command` with each case's flags added exits with status 2 and prints its message.
void ExpectEachIsBadInput(const std::string& command,
                          const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [flags, message] : cases) {
    Outcome o = RunCommand(command + flags);
    EXPECT_EQ(o.exit_status, 2) << flags << "\n" << o.output;
    EXPECT_NE(o.output.find(message), std::string::npos) << flags << "\n" << o.output;
  }
}

// Expert parallelism (--expert-parallel): a Mixtral's experts whole on one rank of each
// tensor-parallel pair, on 2 replicas with DeAR and clipping: the losses and gradient norms
// of one process (the norm counts each expert once, on the rank that holds it), and the same
// checkpoint (each expert gathered from its rank). A resume from it continues alike on that
// layout and on one process.
TEST(TensorParallelTest, MixtralWithExpertParallelismTrainsAndCheckpointsAsOneProcess) {
  const std::string mixtral = absl::StrCat(
      " train --model llama --experts 4 --experts-per-token 2 --layers 2 --hidden 32 --heads 4"
      " --kv-heads 2 --intermediate 32 --seq-len 8 --global-batch 8 --moe-aux-loss-coef 0.5"
      " --clip-norm 0.5 --seed ",
      kSeed, " --log-json ");
  const std::string mpirun =
      absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np ");
  const std::string one_log = TempPath("ep_one.jsonl"), ep_log = TempPath("ep_split.jsonl");
  const std::string one_dir = TempPath("ep_one_ckpt"), ep_dir = TempPath("ep_split_ckpt");
  const std::string ep_layout =
      " --schedule 1f1b --stages 1 --tensor-parallel 2 --expert-parallel 2 --microbatches 4";
  // 2 replicas of 4 micro-batches of 1 sample: one process of 8 micro-batches of 1.
  Outcome one = RunCommand(absl::StrCat(g_tandem, mixtral, one_log,
                                        " --steps 4 --schedule 1f1b --stages 1 --microbatches 8",
                                        " --checkpoint-dir ", one_dir));
  ASSERT_EQ(one.exit_status, 0) << one.output;
  Outcome split =
      RunCommand(absl::StrCat(mpirun, 4, " ", g_tandem, mixtral, ep_log, " --steps 4", ep_layout,
                              " --data-parallel 2 --grad-sync dear", " --checkpoint-dir ", ep_dir));
  ASSERT_EQ(split.exit_status, 0) << split.output;
  EXPECT_NE(split.output.find("experts: whole on 2 parts of each tensor-parallel group, split "
                              "over 1 rank(s) within a part (--expert-parallel 2)"),
            std::string::npos)
      << split.output;
  const auto want = tandem::testing::ReadLogIterations(one_log);
  const auto got = tandem::testing::ReadLogIterations(ep_log);
  ASSERT_EQ(want.size(), 4u) << one.output;
  ASSERT_EQ(got.size(), want.size()) << split.output;
  for (size_t i = 0; i < want.size(); ++i) {
    for (const char* field : {"loss", "grad_norm"}) {
      const double a = got[i][field].get<double>(), b = want[i][field].get<double>();
      EXPECT_LE(std::abs(a - b), kRelativeTolerance * std::abs(b))
          << field << " iteration " << i + 1;
    }
  }
  EXPECT_NE(want.front()["loss"].get<double>(), want.back()["loss"].get<double>());
  Outcome diff = RunCommand(
      absl::StrCat(g_tandem, " checkpoint diff ", ep_dir, " ", one_dir, kCheckpointTolerance));
  EXPECT_EQ(diff.exit_status, 0) << diff.output;

  // Iterations 5 and 6 from the experts' checkpoint: on 2 ranks with expert parallelism (each
  // rank takes its experts of the whole ones), and on one process.
  ExpectResumesAlike(
      ep_dir,
      {{absl::StrCat(mpirun, 2, " ", g_tandem, mixtral, ep_log, ep_layout), ep_log},
       {absl::StrCat(g_tandem, mixtral, one_log, " --schedule 1f1b --stages 1 --microbatches 4"),
        one_log}});
  tandem::RemoveAll(one_dir).IgnoreError();
  tandem::RemoveAll(ep_dir).IgnoreError();
  std::filesystem::remove(one_log);
  std::filesystem::remove(ep_log);
}

// Experts spread over data-parallel replicas (--expert-parallel-replicas): a Mixtral with its
// balancing loss and clipping, each expert on one replica of each pair, its tokens sent there
// by all-to-all, trains to the losses and gradient norms of one process (8 micro-batches of 1
// sample, as every layout below takes them) on 4 ranks laid out three ways: 2 stages x 2
// replicas with DeAR (the experts' gradients on no other replica), 4 replicas with all-reduce
// (each expert on 2 of them, summed there), and 2 replicas x tensor parallelism 2 (each lane
// exchanging its own tokens). The first run's checkpoint, each expert gathered from its
// replica, is one process's; a resume from it continues alike on its layout and on one
// process.
TEST(TensorParallelTest, MixtralWithExpertsOverReplicasTrainsAndCheckpointsAsOneProcess) {
  const std::string mixtral = absl::StrCat(
      " train --model llama --experts 4 --experts-per-token 2 --layers 2 --hidden 32 --heads 4"
      " --kv-heads 2 --intermediate 32 --seq-len 8 --global-batch 8 --moe-aux-loss-coef 0.5"
      " --clip-norm 0.5 --seed ",
      kSeed, " --log-json ");
  const std::string mpirun =
      absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np ");
  const std::string one_log = TempPath("epr_one.jsonl"), split_log = TempPath("epr_split.jsonl");
  const std::string one_dir = TempPath("epr_one_ckpt"), split_dir = TempPath("epr_split_ckpt");
  Outcome one = RunCommand(absl::StrCat(g_tandem, mixtral, one_log,
                                        " --steps 4 --schedule 1f1b --stages 1 --microbatches 8",
                                        " --checkpoint-dir ", one_dir));
  ASSERT_EQ(one.exit_status, 0) << one.output;
  const auto want = tandem::testing::ReadLogIterations(one_log);
  ASSERT_EQ(want.size(), 4u) << one.output;
  EXPECT_NE(want.front()["loss"].get<double>(), want.back()["loss"].get<double>());
  const std::string layouts[] = {
      " --schedule 1f1b --stages 2 --data-parallel 2 --microbatches 4 --grad-sync dear",
      " --schedule 1f1b --stages 1 --data-parallel 4 --microbatches 2 --grad-sync allreduce",
      " --schedule 1f1b --stages 1 --data-parallel 2 --tensor-parallel 2 --microbatches 4"};
  for (const std::string& layout : layouts) {
    SCOPED_TRACE(layout);
    std::filesystem::remove(split_log);
    const bool first = &layout == &layouts[0];
    Outcome split = RunCommand(absl::StrCat(mpirun, 4, " ", g_tandem, mixtral, split_log,
                                            " --steps 4", layout, " --expert-parallel-replicas 2",
                                            first ? " --checkpoint-dir " + split_dir : ""));
    ASSERT_EQ(split.exit_status, 0) << split.output;
    EXPECT_NE(split.output.find("experts: spread over 2 data-parallel replicas, 1/2 of them "
                                "each"),
              std::string::npos)
        << split.output;
    const auto got = tandem::testing::ReadLogIterations(split_log);
    ASSERT_EQ(got.size(), want.size()) << split.output;
    for (size_t i = 0; i < want.size(); ++i) {
      for (const char* field : {"loss", "grad_norm"}) {
        const double a = got[i][field].get<double>(), b = want[i][field].get<double>();
        EXPECT_LE(std::abs(a - b), kRelativeTolerance * std::abs(b))
            << field << " iteration " << i + 1;
      }
    }
  }
  Outcome diff = RunCommand(
      absl::StrCat(g_tandem, " checkpoint diff ", split_dir, " ", one_dir, kCheckpointTolerance));
  EXPECT_EQ(diff.exit_status, 0) << diff.output;

  // Iterations 5 and 6 from the spread experts' checkpoint: on their layout (each replica takes
  // its experts of the whole ones) and on one process.
  ExpectResumesAlike(
      split_dir,
      {{absl::StrCat(mpirun, 4, " ", g_tandem, mixtral, split_log, layouts[0],
                     " --expert-parallel-replicas 2"),
        split_log},
       {absl::StrCat(g_tandem, mixtral, one_log, " --schedule 1f1b --stages 1 --microbatches 8"),
        one_log}});
  tandem::RemoveAll(one_dir).IgnoreError();
  tandem::RemoveAll(split_dir).IgnoreError();
  std::filesystem::remove(one_log);
  std::filesystem::remove(split_log);
}

// --expert-parallel-replicas names what does not fit: replicas it does not divide, experts it
// does not divide, a model without experts.
TEST(TensorParallelTest, ExpertsOverReplicasThatDoNotFitAreBadInput) {
  const std::string log = TempPath("epr_bad.jsonl");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --experts 4 --expert-parallel-replicas 4",
       "experts spread over 4 data-parallel replicas need a data-parallel degree they divide; "
       "the plan has 2"},
      {" --experts 3 --expert-parallel-replicas 2",
       "--expert-parallel-replicas 2 does not divide the model's 3 experts"},
      {" --expert-parallel-replicas 2",
       "--expert-parallel-replicas spreads experts: it needs a model with experts"},
      {" --experts 4 --expert-parallel-replicas 0",
       "--expert-parallel-replicas must be at least 1, not 0"}};
  ExpectEachIsBadInput(SmallLlamaOnTwoRanks("--data-parallel 2", log), cases);
  Outcome gpt = RunCommand(Train(2, 2, "--data-parallel 2 --expert-parallel-replicas 2", log));
  EXPECT_EQ(gpt.exit_status, 2) << gpt.output;
  EXPECT_NE(gpt.output.find("--expert-parallel-replicas spreads experts: gpt has none"),
            std::string::npos)
      << gpt.output;
  std::filesystem::remove(log);
}

// --expert-parallel names what does not fit: a degree that does not divide the group or the
// experts, a model without experts.
TEST(TensorParallelTest, ExpertParallelismThatDoesNotFitIsBadInput) {
  const std::string log = TempPath("ep_bad.jsonl");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --experts 4 --expert-parallel 4",
       "--expert-parallel 4 places the experts on parts of a "
       "tensor-parallel group: it must divide the group's 2"},
      {" --experts 3 --expert-parallel 2",
       "--expert-parallel 2 does not divide the model's 3 experts"},
      {" --expert-parallel 2", "--expert-parallel places experts: it needs a model with experts"},
      {" --expert-parallel 0", "--expert-parallel places experts: it needs a model with experts"},
      {" --experts 4 --expert-parallel -1",
       "--expert-parallel must be at least 1, or 0 for the planner's choice, not -1"},
      {" --experts 4 --expert-parallel 0",
       "--expert-parallel 0 (the planner's choice) does not go with --schedule: give N"}};
  ExpectEachIsBadInput(SmallLlamaOnTwoRanks("--tensor-parallel 2", log), cases);
  // The GPT has no experts either.
  Outcome gpt = RunCommand(Train(2, 2, "--tensor-parallel 2 --expert-parallel 0", log));
  EXPECT_EQ(gpt.exit_status, 2) << gpt.output;
  EXPECT_NE(gpt.output.find("--expert-parallel places experts: gpt has none"), std::string::npos)
      << gpt.output;
  std::filesystem::remove(log);
}

// A small Mixtral (4 experts, 2 a token) for the planner's choice of the experts' parts.
std::string SmallMixtral(const std::string& log) {
  return absl::StrCat(
      g_tandem,
      " train --model llama --experts 4 --experts-per-token 2 --layers 2 --hidden 32 --heads 4"
      " --kv-heads 2 --intermediate 32 --seq-len 8 --global-batch 8 --steps 3 --seed ",
      kSeed, " --log-json ", log);
}

// The losses of `got_log` against the one-process run's of 8 micro-batches of 1.
void ExpectMixtralOneProcessLosses(const std::string& got_log) {
  const std::string one_log = TempPath("experts_one.jsonl");
  const Outcome one = RunCommand(
      absl::StrCat(SmallMixtral(one_log), " --schedule 1f1b --stages 1 --microbatches 8"));
  ASSERT_EQ(one.exit_status, 0) << one.output;
  const auto want = tandem::testing::ReadLogIterations(one_log);
  const auto got = tandem::testing::ReadLogIterations(got_log);
  ASSERT_EQ(want.size(), 3u) << one.output;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = got[i]["loss"].get<double>(), b = want[i]["loss"].get<double>();
    EXPECT_LE(std::abs(a - b), kRelativeTolerance * std::abs(b)) << "iteration " << i + 1;
  }
  EXPECT_NE(want.front()["loss"].get<double>(), want.back()["loss"].get<double>());
  std::filesystem::remove(one_log);
}

// "NAME measured: forward + backward X ms ..." -> X, or -1 when the line is missing.
double MeasuredMilliseconds(const std::string& output, const std::string& name) {
  const std::string prefix = name + " measured: forward + backward ";
  const size_t at = output.find(prefix);
  if (at == std::string::npos) return -1;
  return std::strtod(output.c_str() + at + prefix.size(), nullptr);
}

// --expert-parallel 0 with a given degree: a Mixtral's shards are measured with the experts
// split over the pair and placed whole on each of its ranks, the planner takes the faster (the
// run says which), and the run trains to the one-process losses.
TEST(TensorParallelTest, PlannerChoosesWhereTheExpertsGoFromMeasuredShards) {
  const std::string log = TempPath("experts_chosen.jsonl");
  const Outcome o = RunCommand(
      absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 2 ",
                   SmallMixtral(log), " --tensor-parallel 2 --expert-parallel 0"));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  const double split = MeasuredMilliseconds(o.output, "tensor parallelism 2");
  const double placed = MeasuredMilliseconds(o.output, "tensor parallelism 2 (experts on 2 parts)");
  ASSERT_GT(split, 0) << o.output;
  ASSERT_GT(placed, 0) << o.output;
  EXPECT_NE(o.output.find("x 2 tensor-parallel (2 ranks), 8 micro-batches of 1"), std::string::npos)
      << o.output;
  // One stage of the pair: the plan's time is the measured one, so the faster way wins.
  const bool placed_chosen =
      o.output.find(
          "experts: whole on 2 parts of each tensor-parallel group, split over 1 "
          "rank(s) within a part (the plan's 2)") != std::string::npos;
  const bool split_chosen =
      o.output.find(
          "experts: each split over the 2 ranks of its "
          "tensor-parallel group (the planner's choice)") != std::string::npos;
  EXPECT_NE(placed_chosen, split_chosen) << o.output;
  if (placed != split) EXPECT_EQ(placed_chosen, placed < split) << o.output;
  ExpectMixtralOneProcessLosses(log);
  std::filesystem::remove(log);
}

// A plan file that places the experts (`expert_parallel: 2`, as the planner writes it) runs
// with them placed and trains to the one-process losses; a flag that says otherwise is refused.
TEST(TensorParallelTest, APlanThatPlacesTheExpertsRunsWithThem) {
  tandem::pipeline::ScheduleSpec spec;
  spec.kind = tandem::pipeline::ScheduleKind::k1F1B;
  spec.num_ranks = 1;
  spec.num_microbatches = 8;
  auto plain = tandem::pipeline::MakeUniformPlan(4, spec, 1, 1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto plan = tandem::pipeline::WithTensorParallel(*plain, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  plan->expert_parallel = 2;
  const std::string path = TempPath("experts_plan.json");
  ASSERT_TRUE(tandem::pipeline::WritePlanFile(*plan, path).ok());
  const std::string log = TempPath("experts_plan.jsonl");
  const std::string run =
      absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 2 ",
                   SmallMixtral(log), " --plan ", path);
  Outcome o = RunCommand(run);
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("experts: whole on 2 parts of each tensor-parallel group, split over "
                          "1 rank(s) within a part (the plan's 2)"),
            std::string::npos)
      << o.output;
  ExpectMixtralOneProcessLosses(log);
  std::filesystem::remove(log);
  o = RunCommand(run + " --expert-parallel 4");
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--expert-parallel 4 differs from the plan's expert_parallel 2"),
            std::string::npos)
      << o.output;
  EXPECT_EQ(o.output.find("iter "), std::string::npos) << o.output;
  std::filesystem::remove(log);
  std::filesystem::remove(path);
}

// Recomputed layers run their gathers and reduce-scatters again in the backward pass, in the
// same order on every rank of the group.
TEST(TensorParallelTest, SequenceParallelWithRecomputationMatchesTheReference) {
  ExpectReferenceLosses({"sp_recompute", 4, 2,
                         "--schedule 1f1b --stages 2 --tensor-parallel 2 --microbatches 4 "
                         "--sequence-parallel --recompute all"});
}

TEST(TensorParallelTest, SequenceParallelOneByFourByOneMatchesTheReference) {
  ExpectReferenceLosses({"sp_1x4x1", 4, 4,
                         "--schedule 1f1b --stages 1 --tensor-parallel 4 --microbatches 4 "
                         "--sequence-parallel"});
}

// 2 x 2 x 2 with DeAR and clipping: the norm counts the group's whole parameters once (their
// gradients, summed over the group, are the same on every rank) and the checkpoint is one
// rank's.
TEST(TensorParallelTest, SequenceParallelWithDeARMatchesOneRank) {
  ExpectNormAndLossesOfOneRank(8, 2,
                               "--schedule 1f1b --stages 2 --data-parallel 2 "
                               "--tensor-parallel 2 --microbatches 2 --grad-sync dear "
                               "--sequence-parallel",
                               /*checkpoints=*/true);
}

TEST(TensorParallelTest, SequenceParallelNeedsAGroupAndASequenceThatSplits) {
  const std::string log = TempPath("sp_bad.jsonl");
  Outcome o = RunCommand(Train(2, 2, "--schedule 1f1b --stages 2 --sequence-parallel", log));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("it needs --tensor-parallel 2 or more"), std::string::npos)
      << o.output;
  // 6 tokens over 4 ranks (the 4 heads and 16-token vocabulary split).
  o = RunCommand(Train(4, 4,
                       "--schedule 1f1b --stages 1 --tensor-parallel 4 --sequence-parallel "
                       "--seq-len 6",
                       log));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("sequence length (sequence parallelism) (6) divisible by 4"),
            std::string::npos)
      << o.output;
  std::filesystem::remove(log);
}

TEST(TensorParallelTest, ShapesThatDoNotSplitAreBadInput) {
  const std::string log = TempPath("bad.jsonl");
  // 4 ranks are not a multiple of 3.
  Outcome o = RunCommand(Train(4, 2, "--schedule 1f1b --stages 1 --tensor-parallel 3", log));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--tensor-parallel 3 does not divide"), std::string::npos) << o.output;
  // Two heads over four ranks.
  o = RunCommand(Train(4, 2, "--schedule 1f1b --stages 1 --tensor-parallel 4", log));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("heads (2) divisible by 4"), std::string::npos) << o.output;
  // A plan file carries its own degree.
  o = RunCommand(Train(2, 2, "--tensor-parallel 2 --plan no_such_plan.json", log));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--tensor-parallel does not go with --plan"), std::string::npos)
      << o.output;
  std::filesystem::remove(log);
}

// --tensor-parallel 0: the shards are profiled at every degree the model and the world split
// into (2 and 4 here), the planner weighs them against pipelines and replicas, and the run it
// chooses trains to the reference losses.
TEST(TensorParallelTest, PlannerChoosesTheDegreeFromMeasuredShards) {
  const std::string log = TempPath("choose_tp.jsonl");
  Outcome o = RunCommand(Train(4, 4, "--tensor-parallel 0", log));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("tensor parallelism 2 measured"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("tensor parallelism 4 measured"), std::string::npos) << o.output;
  std::filesystem::remove(log);
  ExpectReferenceLosses({"choose_tp", 4, 4, "--tensor-parallel 0"});
}

// A planned run fits --device-memory-mb per rank. The GPT here needs 131 KiB per rank as two
// replicas and 75 KiB and 65 KiB as two stages without recomputation; at 0.06 MiB (61 KiB) the
// only plan is two stages, each recomputing a layer, and it trains to the reference losses.
// Below what any plan needs, the error gives the smallest memory that fits, as this flag.
TEST(PlannedRunTest, FitsTheMemoryGivenByRecomputing) {
  const std::string log = TempPath("memory.jsonl");
  Outcome o = RunCommand(Train(2, 2, "--device-memory-mb 0.06", log));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("plan: 1f1b, 1 pipeline(s) x 2 stage(s) (2 ranks)"), std::string::npos)
      << o.output;
  for (const char* stage : {"stage 0: layers [0, 2), recompute 1 layer(s), ",
                            "stage 1: layers [2, 4), recompute 1 layer(s), "}) {
    const size_t at = o.output.find(stage);
    ASSERT_NE(at, std::string::npos) << stage << "\n" << o.output;
    // "..., 58.62 KiB per rank predicted"
    const double kib = std::strtod(o.output.c_str() + at + std::strlen(stage), nullptr);
    EXPECT_GT(kib, 0) << o.output;
    EXPECT_LE(kib, 0.06 * 1024) << stage << "\n" << o.output;
  }
  std::filesystem::remove(log);
  ExpectReferenceLosses({"memory", 2, 2, "--device-memory-mb 0.06"});
  o = RunCommand(Train(2, 2, "--device-memory-mb 0.01", log));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("fits 10.24 KiB per device, even with every layer recomputed"),
            std::string::npos)
      << o.output;
  EXPECT_NE(o.output.find("(--device-memory-mb 0.0"), std::string::npos) << o.output;
  EXPECT_EQ(o.output.find("iter "), std::string::npos) << o.output;
  std::filesystem::remove(log);
}

// Under a memory limit the shards are measured with sequence parallelism too, and the planner
// weighs both variants of each degree; the run it chooses trains to the reference losses.
TEST(TensorParallelTest, PlannerWeighsSequenceParallelismUnderAMemoryLimit) {
  const std::string log = TempPath("choose_sp.jsonl");
  Outcome o = RunCommand(Train(4, 4, "--tensor-parallel 0 --device-memory-mb 256", log));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("planning for 256.00 MiB per rank (--device-memory-mb)"),
            std::string::npos)
      << o.output;
  for (const char* measured :
       {"tensor parallelism 2 measured", "tensor parallelism 2 with sequence parallelism measured",
        "tensor parallelism 4 measured",
        "tensor parallelism 4 with sequence parallelism measured"}) {
    EXPECT_NE(o.output.find(measured), std::string::npos) << measured << "\n" << o.output;
  }
  std::filesystem::remove(log);
  ExpectReferenceLosses({"choose_sp", 4, 4, "--tensor-parallel 0 --device-memory-mb 256"});
}

// A plan that chose sequence parallelism (`sequence_parallel: true`, as the planner writes it)
// runs with it: the run says so, trains to the reference losses, and a sequence that does not
// split over the group is refused as with --sequence-parallel.
TEST(TensorParallelTest, APlanThatChoseSequenceParallelismRunsWithIt) {
  tandem::pipeline::ScheduleSpec spec;
  spec.kind = tandem::pipeline::ScheduleKind::k1F1B;
  spec.num_ranks = 2;
  spec.num_microbatches = 4;
  auto plain = tandem::pipeline::MakeUniformPlan(4, spec, 1, kGlobalBatch / 4);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto plan = tandem::pipeline::WithTensorParallel(*plain, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  plan->sequence_parallel = true;
  const std::string path = TempPath("sp_plan.json");
  ASSERT_TRUE(tandem::pipeline::WritePlanFile(*plan, path).ok());
  const std::string flags = absl::StrCat("--plan ", path);
  const std::string log = TempPath("sp_plan.jsonl");
  Outcome o = RunCommand(Train(4, 2, flags, log));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("1 pipeline(s) x 2 stage(s) x 2 tensor-parallel (sequence parallel)"),
            std::string::npos)
      << o.output;
  std::filesystem::remove(log);
  ExpectReferenceLosses({"sp_plan", 4, 2, flags.c_str()});
  o = RunCommand(Train(4, 2, flags + " --seq-len 7", log));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("sequence length (sequence parallelism) (7) divisible by 2"),
            std::string::npos)
      << o.output;
  std::filesystem::remove(log);
  std::filesystem::remove(path);
}

// `mpirun -np 2 tandem profile --tensor-parallel 2` writes each layer's measured shards as its
// tensor-parallel variants, without and with sequence parallelism; `tandem plan` reads them
// (here with the degree fixed at 2 on 2 devices) and its plan trains to the reference losses.
// Without the ranks to measure on, or with experts placed outside a group, the command refuses
// and writes nothing.
TEST(TensorParallelTest, ProfiledShardsArePlannedAndRun) {
  const std::string mpirun =
      absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 2 ");
  const std::string profile_gpt =
      " profile --model gpt --layers 2 --hidden 16 --heads 2 --seq-len 8 --microbatch-size 2"
      " --optimizer adamw --warmup 0 --repeats 1";
  const std::string profile = TempPath("shards_profile.json");
  Outcome o =
      RunCommand(absl::StrCat(mpirun, g_tandem, profile_gpt, " --tensor-parallel 2 -o ", profile));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  for (const char* line : {"tensor parallelism 2 measured: forward + backward ",
                           "tensor parallelism 2 with sequence parallelism measured: "}) {
    EXPECT_NE(o.output.find(line), std::string::npos) << line << "\n" << o.output;
  }
  auto read = tandem::pipeline::ReadProfileFile(profile);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->layers.size(), 4u);  // embedding, 2 blocks, head
  for (const tandem::pipeline::LayerProfile& layer : read->layers) {
    ASSERT_EQ(layer.tensor_parallel.size(), 2u) << layer.name;
    const tandem::pipeline::TensorParallelVariant& plain = layer.tensor_parallel[0];
    const tandem::pipeline::TensorParallelVariant& sequence = layer.tensor_parallel[1];
    EXPECT_EQ(plain.degree, 2);
    EXPECT_FALSE(plain.sequence_parallel);
    EXPECT_EQ(sequence.degree, 2);
    EXPECT_TRUE(sequence.sequence_parallel);
    EXPECT_GT(plain.forward_seconds, 0) << layer.name;
    EXPECT_GT(plain.backward_seconds, 0) << layer.name;
    if (layer.name.rfind("block", 0) == 0) {
      // Each rank holds half of the blocks' matrices; the norms and the output projection's
      // bias stay whole on both.
      EXPECT_GT(plain.parameter_bytes, 0.45 * layer.parameter_bytes) << layer.name;
      EXPECT_LT(plain.parameter_bytes, 0.6 * layer.parameter_bytes) << layer.name;
      // Sequence parallelism stashes half of the norms' and residuals' activations.
      EXPECT_LT(sequence.stashed_activation_bytes, plain.stashed_activation_bytes) << layer.name;
    }
  }
  const std::string plan = TempPath("shards_plan.json");
  o = RunCommand(absl::StrCat(g_tandem, " plan --profile ", profile,
                              " --algorithm adapipe --devices 2 --tensor-parallel 2",
                              " --microbatches ", kGlobalBatch / 2, " -o ", plan));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  auto planned = tandem::pipeline::ReadPlanFile(plan);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(planned->tensor_parallel, 2);
  const std::string flags = absl::StrCat("--plan ", plan);
  ExpectReferenceLosses({"profiled_tp2", 2, 2, flags.c_str()});

  const std::string refused = TempPath("shards_refused.json");
  const std::pair<std::string, std::string> cases[] = {
      {absl::StrCat(g_tandem, profile_gpt, " --tensor-parallel 2"),
       "--tensor-parallel 2 measures the shards on 2 ranks together: run under mpirun -np 2 "
       "(this job has 1 rank)"},
      {absl::StrCat(g_tandem, profile_gpt, " --tensor-parallel 0"),
       "--tensor-parallel 0 measures the shards at 2, 4 and 8 ranks that divide the job"},
      {absl::StrCat(mpirun, g_tandem, profile_gpt, " --tensor-parallel 2 --heads 1"),
       "splits into none of the shards asked for (--tensor-parallel 2)"},
      {absl::StrCat(g_tandem, profile_gpt, " --expert-parallel 2"),
       "--expert-parallel places the experts on parts of a tensor-parallel group: give "
       "--tensor-parallel T (or 0) too"}};
  for (const auto& [command, message] : cases) {
    o = RunCommand(absl::StrCat(command, " -o ", refused));
    EXPECT_EQ(o.exit_status, 2) << command << "\n" << o.output;
    EXPECT_NE(o.output.find(message), std::string::npos) << command << "\n" << o.output;
    EXPECT_FALSE(std::filesystem::exists(refused)) << command;
  }
  std::filesystem::remove(profile);
  std::filesystem::remove(plan);
}

// A mixture's shards with --expert-parallel 0: every layer gains a variant with the experts
// split over the pair and one with them placed whole on each rank, and `tandem plan
// --expert-parallel 2` takes the placed ones.
TEST(TensorParallelTest, ProfiledExpertPlacementsArePlanned) {
  const std::string profile = TempPath("experts_profile.json");
  Outcome o = RunCommand(absl::StrCat(
      TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 2 ", g_tandem,
      " profile --model llama --experts 4 --experts-per-token 2 --layers 2 --hidden 32 --heads 4"
      " --kv-heads 2 --intermediate 32 --seq-len 8 --microbatch-size 1 --warmup 0 --repeats 1"
      " --tensor-parallel 2 --expert-parallel 0 -o ",
      profile));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("tensor parallelism 2 (experts on 2 parts) measured"), std::string::npos)
      << o.output;
  auto read = tandem::pipeline::ReadProfileFile(profile);
  ASSERT_TRUE(read.ok()) << read.status();
  for (const tandem::pipeline::LayerProfile& layer : read->layers) {
    std::vector<std::pair<int, bool>> got;
    for (const auto& v : layer.tensor_parallel)
      got.emplace_back(v.expert_parallel, v.sequence_parallel);
    const std::vector<std::pair<int, bool>> want = {{1, false}, {1, true}, {2, false}, {2, true}};
    EXPECT_EQ(got, want) << layer.name;
  }
  const std::string plan = TempPath("experts_profile_plan.json");
  o = RunCommand(absl::StrCat(g_tandem, " plan --profile ", profile,
                              " --algorithm adapipe --devices 2 --tensor-parallel 2"
                              " --expert-parallel 2 --microbatches 8 -o ",
                              plan));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("experts on 2 parts"), std::string::npos) << o.output;
  auto planned = tandem::pipeline::ReadPlanFile(plan);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(planned->expert_parallel, 2);
  std::filesystem::remove(profile);
  std::filesystem::remove(plan);
}

// Without --schedule the planner (AdaPipe, from rank 0's profile) partitions the layers over
// the world / T groups: 4 ranks as 2 groups of 2.
TEST(TensorParallelTest, PlannedRunMatchesTheReference) {
  ExpectReferenceLosses({"planned_tp2", 4, 2, "--tensor-parallel 2"});
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::testing::RunTestsWithProgramPath(argc, argv, "PATH_TO_TANDEM", &g_tandem);
}
