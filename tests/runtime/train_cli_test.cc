// `tandem train` end to end: runs `mpirun -np 4 tandem train ...` (the path of the tandem
// program is the first argument) and checks its JSON log against the single-process reference
// trainer, its timeline, checkpoint/resume through the command line, and bad input (exit 2,
// one clear line).
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pipeline/plan.h"
#include "runtime/checkpoint.h"
#include "runtime/torch/data.h"
#include "runtime/torch/device_ops.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/reference.h"
#include "runtime/torch/token_data.h"
#include "tests/tokens/token_files.h"
#include "tests/support/train_cli.h"

namespace {

namespace libtorch = tandem::runtime::libtorch;

std::string g_tandem;  // path of the tandem program
constexpr double kRelativeTolerance = 1e-5;
constexpr uint64_t kSeed = 11;
constexpr int64_t kGlobalBatch = 16;

using tandem::testing::Outcome;
using tandem::testing::RunCommand;

std::string Mpirun(int ranks) {
  return absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np ",
                      ranks, " ", g_tandem, " train");
}

// The model of these tests: a 2-block GPT on the synthetic task.
constexpr const char* kModelFlags = tandem::testing::kSmallGptFlags;

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          absl::StrCat("tandem_train_cli_", ::getpid(), "_", name))
      .string();
}

// The iterations of a --log-json file (its events, e.g. checkpoints, left out).
std::vector<nlohmann::json> ReadLog(const std::string& path) {
  return tandem::testing::ReadLogIterations(path);
}

std::vector<double> ReferenceLosses(int steps) {
  return tandem::testing::SmallGptReferenceLosses(steps, kGlobalBatch, kSeed);
}

void ExpectLossesMatch(const std::vector<nlohmann::json>& log, const std::vector<double>& want,
                       int first_iteration) {
  ASSERT_FALSE(log.empty());
  for (const nlohmann::json& line : log) {
    const int it = line["iteration"].get<int>() - 1;  // the log counts from 1
    ASSERT_LT(it, static_cast<int>(want.size()));
    ASSERT_GE(it, first_iteration);
    const double loss = line["loss"].get<double>();
    EXPECT_LE(std::abs(loss - want[it]), kRelativeTolerance * std::abs(want[it]))
        << "iteration " << it << ": " << loss << " vs reference " << want[it];
    EXPECT_GT(line["tokens_per_second"].get<double>(), 0);
    EXPECT_GT(line["iteration_ms"].get<double>(), 0);
  }
}

TEST(TrainCliTest, FourRanksMatchTheReferenceAndWriteATimeline) {
  const std::string log = TempPath("log.jsonl");
  const std::string timeline = TempPath("timeline.json");
  Outcome o = RunCommand(absl::StrCat(Mpirun(4), kModelFlags, " --global-batch ", kGlobalBatch,
                               " --microbatches 4 --schedule 1f1b --stages 2 --data-parallel 2"
                               " --steps 10 --seed ", kSeed, " --log-json ", log, " --timeline ",
                               timeline));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("iter   10/10"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("trained 10 iteration(s) on 4 rank(s)"), std::string::npos)
      << o.output;
  const std::vector<nlohmann::json> lines = ReadLog(log);
  EXPECT_EQ(lines.size(), 10u);
  ExpectLossesMatch(lines, ReferenceLosses(10), 0);
  // The log says how the run ended.
  const std::vector<nlohmann::json> all = tandem::testing::ReadJsonLines(log);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back().value("event", ""), "finished") << all.back().dump();
  EXPECT_EQ(all.back().value("iterations", 0), 10);
  // The summary's mean leaves out the first iteration (warm-up) and the recorded last one.
  if (lines.size() == 10u) {
    double sum_ms = 0;
    for (int i = 1; i < 9; ++i) sum_ms += lines[i]["iteration_ms"].get<double>();
    EXPECT_NE(o.output.find(absl::StrFormat("%.1f ms per iteration", sum_ms / 8)),
              std::string::npos)
        << o.output;
  }

  auto text = tandem::ReadFile(timeline);
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json trace = nlohmann::json::parse(*text);
  std::set<int> measured, predicted;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const int pid = e["pid"].get<int>();
    (pid < 4 ? measured : predicted).insert(pid);
  }
  EXPECT_EQ(measured.size(), 4u);   // every rank
  EXPECT_EQ(predicted.size(), 2u);  // the simulator's pipeline of 2 positions
  std::filesystem::remove(log);
  std::filesystem::remove(timeline);
}

// --torch-trace: LibTorch's profiler trace of the last iteration, one file per rank (the
// operators of its forward and backward passes); before LibTorch 2, bad input.
TEST(TrainCliTest, TorchTraceRecordsTheLastIterationsOperatorsOnEveryRank) {
  const std::string trace = TempPath("torch_trace.json");
  Outcome o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --global-batch ", kGlobalBatch,
                                      " --microbatches 2 --schedule 1f1b --stages 2 --steps 2",
                                      " --seed ", kSeed, " --torch-trace ", trace));
  if (!tandem::runtime::libtorch::HasTorchTrace()) {
    EXPECT_NE(o.exit_status, 0) << o.output;
    EXPECT_NE(o.output.find("--torch-trace needs LibTorch 2 or later"), std::string::npos)
        << o.output;
    return;
  }
  ASSERT_EQ(o.exit_status, 0) << o.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = TempPath(absl::StrCat("torch_trace.rank", rank, ".json"));
    EXPECT_NE(o.output.find(absl::StrCat("LibTorch trace of iteration 2 (rank ", rank, "): ",
                                         path)),
              std::string::npos)
        << o.output;
    auto text = tandem::ReadFile(path);
    ASSERT_TRUE(text.ok()) << text.status();
    const nlohmann::json events = nlohmann::json::parse(*text)["traceEvents"];
    int forward = 0, backward = 0;
    for (const auto& e : events) {
      if (e.value("cat", "") != "cpu_op") continue;
      const std::string name = e["name"].get<std::string>();
      forward += name == "aten::layer_norm";
      backward += name.rfind("autograd::engine::evaluate_function", 0) == 0;
    }
    // Each rank's stage holds a layer norm (a block's or the final one) and runs 2
    // micro-batches.
    EXPECT_GE(forward, 2) << "rank " << rank << ": " << path;
    EXPECT_GT(backward, 0) << "rank " << rank << ": no backward in " << path;
    std::filesystem::remove(path);
  }
}

TEST(TrainCliTest, ResumeOnAnotherWorldSizeRepartitionsTheCheckpoint) {
  // Saved by 4 ranks (2 stages x 2 pipelines, 1F1B), resumed by 3 ranks as 3 stages (GPipe):
  // the stages read their layers from whichever saved stages hold them.
  const std::string checkpoint = TempPath("checkpoint_repartition");
  const std::string log = TempPath("repartition.jsonl");
  const std::string model = absl::StrCat(kModelFlags, " --global-batch ", kGlobalBatch,
                                         " --seed ", kSeed);
  Outcome first = RunCommand(absl::StrCat(Mpirun(4), model,
                                          " --microbatches 4 --schedule 1f1b --stages 2"
                                          " --data-parallel 2 --steps 4 --checkpoint-dir ",
                                          checkpoint));
  ASSERT_EQ(first.exit_status, 0) << first.output;
  Outcome second = RunCommand(absl::StrCat(Mpirun(3), model,
                                           " --microbatches 8 --schedule gpipe --stages 3"
                                           " --steps 8 --resume ", checkpoint, " --log-json ",
                                           log));
  ASSERT_EQ(second.exit_status, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  const std::vector<nlohmann::json> lines = ReadLog(log);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines.front()["iteration"].get<int>(), 5);
  ExpectLossesMatch(lines, ReferenceLosses(8), 4);
  tandem::RemoveAll(checkpoint).IgnoreError();
  std::filesystem::remove(log);
}

TEST(TrainCliTest, ResumeGivesTheSameLossesAsAnUninterruptedRun) {
  const std::string checkpoint = TempPath("checkpoint");
  const std::string log = TempPath("resume.jsonl");
  const std::string common = absl::StrCat(Mpirun(2), kModelFlags, " --global-batch ",
                                          kGlobalBatch, " --microbatches 4 --schedule zb-h1"
                                          " --stages 2 --seed ", kSeed, " --grad-sync dear");
  Outcome first = RunCommand(absl::StrCat(common, " --steps 4 --checkpoint-dir ", checkpoint));
  ASSERT_EQ(first.exit_status, 0) << first.output;
  Outcome second =
      RunCommand(absl::StrCat(common, " --steps 8 --resume ", checkpoint, " --log-json ", log));
  ASSERT_EQ(second.exit_status, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  const std::vector<nlohmann::json> lines = ReadLog(log);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines.front()["iteration"].get<int>(), 5);
  ExpectLossesMatch(lines, ReferenceLosses(8), 4);

  // Damaged checkpoints are bad input on every rank: exit 2 from each process.
  const std::string latest = (std::filesystem::path(checkpoint) / "step-00000004").string();
  ASSERT_TRUE(std::filesystem::exists(latest + "/manifest.json"));
  const std::string every_rank = absl::StrCat(
      TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 2 sh -c '",
      g_tandem, " train", kModelFlags, " --global-batch ", kGlobalBatch,
      " --microbatches 4 --schedule zb-h1 --stages 2 --seed ", kSeed,
      " --grad-sync dear --steps 1 --resume ", checkpoint,
      "; echo \"[exit $OMPI_COMM_WORLD_RANK] $?\"'");
  auto expect_exit_two_everywhere = [&](const std::string& what) {
    Outcome o = RunCommand(every_rank);
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(o.output.find(absl::StrCat("[exit ", r, "] 2")), std::string::npos)
          << what << ", rank " << r << ":\n" << o.output;
    }
    return o;
  };
  const std::string shard = latest + "/stage-001.part-0-of-1.bin";
  auto shard_bytes = tandem::ReadFile(shard);
  ASSERT_TRUE(shard_bytes.ok());
  ASSERT_TRUE(tandem::WriteFileAtomically(shard, shard_bytes->substr(0, 100)).ok());
  Outcome truncated = expect_exit_two_everywhere("truncated shard");
  EXPECT_NE(truncated.output.find("truncated"), std::string::npos) << truncated.output;
  ASSERT_TRUE(tandem::WriteFileAtomically(shard, *shard_bytes).ok());
  auto manifest_text = tandem::ReadFile(latest + "/manifest.json");
  ASSERT_TRUE(manifest_text.ok());
  nlohmann::json manifest = nlohmann::json::parse(*manifest_text);
  manifest["step"] = int64_t{9223372036854775807};
  ASSERT_TRUE(tandem::WriteFileAtomically(latest + "/manifest.json", manifest.dump()).ok());
  Outcome huge_step = expect_exit_two_everywhere("step 2^63-1");
  EXPECT_NE(huge_step.output.find("step"), std::string::npos) << huge_step.output;
  tandem::RemoveAll(checkpoint).IgnoreError();
  std::filesystem::remove(log);
}

// `mpirun --enable-recovery` with rank `victim` killed (SIGKILL) `delay` seconds after it
// starts; every other process must be gone soon after. Returns the output and the seconds.
Outcome TrainWithKill(const std::string& flags, int victim, double delay) {
  return RunCommand(absl::StrCat(
      TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none --enable-recovery",
      " -np 2 sh -c 'if [ $OMPI_COMM_WORLD_RANK = ", victim, " ]; then (sleep ", delay,
      "; kill -9 $$) & fi; exec ", g_tandem, " train", kModelFlags, flags, "'"));
}

// A rank killed at start-up (inside MPI's start-up or building the model) or mid-run ends the
// job within seconds, not at --timeout (300 s here); a run that had started its log ends it
// with the failure.
TEST(TrainCliTest, KilledRankEndsTheJobWithinSeconds) {
  for (double delay : {0.2, 1.5, 4.0}) {
    const std::string log = TempPath("killed.jsonl");
    std::filesystem::remove(log);
    const auto start = std::chrono::steady_clock::now();
    Outcome o = TrainWithKill(" --global-batch 16 --microbatches 4 --schedule 1f1b --stages 2"
                              " --steps 100000 --timeout 300 --startup-timeout 10 --log-json " +
                                  log,
                              1, delay);
    if (std::filesystem::exists(log)) {
      const std::vector<nlohmann::json> lines = tandem::testing::ReadJsonLines(log);
      ASSERT_FALSE(lines.empty());
      EXPECT_EQ(lines.back().value("event", ""), "failed") << lines.back().dump();
      EXPECT_EQ(lines.back().value("rank", -1), 0);
    }
    EXPECT_TRUE(delay < 4.0 || std::filesystem::exists(log)) << "training had started";
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Killed inside MPI_Init: the start-up bound (10 s); after it: heartbeats (2 s).
    EXPECT_LT(seconds, delay + 10 + 8) << "kill at " << delay << " s:\n" << o.output;
    const bool startup = o.output.find("MPI start-up did not finish") != std::string::npos;
    const bool silent = o.output.find("rank 1 stopped responding") != std::string::npos;
    EXPECT_TRUE(startup || silent) << "kill at " << delay << " s:\n" << o.output;
  }
}

// --microbatch-size with --global-batch sets the number of micro-batches where --microbatches
// is not given; all three given and inconsistent are refused (they were: the size silently
// lost to the default count).
TEST(TrainCliTest, MicrobatchSizeAndGlobalBatchSetTheMicrobatches) {
  Outcome o = RunCommand(absl::StrCat(Mpirun(4), kModelFlags,
                                      " --global-batch 16 --microbatch-size 2 --schedule 1f1b"
                                      " --stages 2 --data-parallel 2 --steps 2 --seed ", kSeed));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("4 micro-batches of 2, global batch 16"), std::string::npos)
      << o.output;
  o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags,
                              " --global-batch 16 --microbatch-size 4 --microbatches 8"
                              " --schedule 1f1b --stages 2 --steps 2"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("give two of the three"), std::string::npos) << o.output;
}

// A rank stopped (SIGSTOP: alive and silent) at start-up, inside MPI's start-up or building
// the model, or mid-run: under `mpirun --enable-recovery`, which ends no rank by itself, the
// others kill it and the job ends within seconds (a stopped process would keep mpirun waiting
// for ever; `timeout` ends such a hang with 124). The stop waits until the rank's process
// runs the program that trains (`tandem train` execs `tandem-torch` beside it): the ranks end
// only stopped processes of their own program, and a stop that landed on the shell or on
// `tandem` before its exec (a race that hung this test now and then) stopped neither.
TEST(TrainCliTest, StoppedRankIsKilledAndTheJobEndsWithinSeconds) {
  const std::filesystem::path tandem = std::filesystem::canonical(g_tandem);
  const std::filesystem::path torch_program = tandem.parent_path() / "tandem-torch";
  const std::string program =
      std::filesystem::exists(torch_program) ? torch_program.string() : tandem.string();
  for (double delay : {0.0, 1.5, 4.0}) {
    const auto start = std::chrono::steady_clock::now();
    Outcome o = RunCommand(absl::StrCat(
        "timeout -s KILL 60 ", TANDEM_MPIEXEC,
        " --allow-run-as-root --oversubscribe --bind-to none --enable-recovery",
        " -np 2 sh -c 'if [ $OMPI_COMM_WORLD_RANK = 1 ]; then (until [ \"$(readlink /proc/$$/exe)\"",
        " = ", program, " ]; do sleep 0.01; done; sleep ", delay,
        "; kill -STOP $$) & fi; exec ", g_tandem, " train", kModelFlags,
        " --global-batch 16 --microbatches 4 --schedule 1f1b --stages 2 --steps 100000"
        " --timeout 300 --startup-timeout 10'"));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, delay + 10 + 8) << "stop at " << delay << " s:\n" << o.output;
    EXPECT_NE(o.exit_status, 128 + 9) << "mpirun hung: stop at " << delay << " s:\n" << o.output;
    EXPECT_NE(o.output.find("killed"), std::string::npos)
        << "stop at " << delay << " s: the stopped rank was not killed:\n" << o.output;
  }
}

// Killed at any moment of a run that checkpoints every step (rank 0 writes the manifest and
// `latest`; both ranks write shards), the checkpoint folder always resumes.
TEST(TrainCliTest, CheckpointFolderResumesAfterAKillAtAnyMoment) {
  const std::string checkpoint = TempPath("kill_checkpoint");
  const std::string flags = absl::StrCat(
      " --global-batch 16 --microbatches 4 --schedule 1f1b --stages 2 --seed ", kSeed,
      " --checkpoint-dir ", checkpoint, " --checkpoint-every 1 --keep-checkpoints 2");
  // A first run leaves a checkpoint; later runs resume from it and are killed mid-way.
  Outcome first = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, flags, " --steps 2"));
  ASSERT_EQ(first.exit_status, 0) << first.output;
  for (const auto& [victim, delay] : std::vector<std::pair<int, double>>{
           {0, 2.6}, {1, 2.9}, {0, 3.3}, {0, 3.7}}) {
    TrainWithKill(absl::StrCat(flags, " --resume ", checkpoint, " --steps 100000"), victim,
                  delay);
    // One iteration past the latest save (--steps is the run's last iteration).
    auto latest = tandem::ReadFile(checkpoint + "/latest");
    ASSERT_TRUE(latest.ok()) << latest.status();
    int step = 0;
    ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(latest->substr(5)), &step)) << *latest;
    Outcome resumed = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, flags, " --resume ",
                                              checkpoint, " --steps ", step + 1));
    EXPECT_EQ(resumed.exit_status, 0) << "after killing rank " << victim << " at " << delay
                                      << " s:\n" << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  }
  // Leftovers of interrupted saves are gone after the last clean run; at most the kept step
  // folders remain.
  int steps = 0;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoint)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
    EXPECT_NE(name.rfind(".step-", 0), 0u) << name;
    steps += name.rfind("step-", 0) == 0;
  }
  EXPECT_LE(steps, 2);
  tandem::RemoveAll(checkpoint).IgnoreError();
}

// A rank's CPU threads follow the cores it may run on: Open MPI's default binding (one core
// per rank when it starts one or two) is widened to the rank's share of the host; a binding
// the launch asked for is kept, with one thread per bound core and a hint.
TEST(TrainCliTest, CpuThreadsFollowTheCoresARankMayRunOn) {
  cpu_set_t own;
  CPU_ZERO(&own);
  ASSERT_EQ(sched_getaffinity(0, sizeof(own), &own), 0);
  const int cores = std::min<int>(static_cast<int>(std::thread::hardware_concurrency()),
                                  CPU_COUNT(&own));
  if (cores < 2) GTEST_SKIP() << "needs two cores (this test may use " << cores << ")";
  const std::string launch = absl::StrCat("env -u OMP_NUM_THREADS ", TANDEM_MPIEXEC,
                                          " --allow-run-as-root --oversubscribe -np 1 ");
  const std::string train = absl::StrCat(g_tandem, " train ", kModelFlags, " --steps 1");
  Outcome by_default = RunCommand(launch + train);
  ASSERT_EQ(by_default.exit_status, 0) << by_default.output;
  EXPECT_NE(by_default.output.find(absl::StrCat(cores, " CPU thread(s) per rank")),
            std::string::npos)
      << by_default.output;
  Outcome bound = RunCommand(launch + "--bind-to core " + train);
  ASSERT_EQ(bound.exit_status, 0) << bound.output;
  EXPECT_NE(bound.output.find("1 CPU thread(s) per rank"), std::string::npos) << bound.output;
  EXPECT_NE(bound.output.find("--bind-to none"), std::string::npos) << bound.output;
}

// Token shards (llm.c files in a folder, with the dataset.json that names the vocabulary):
// 4 ranks (2 stages x 2 replicas) train on them with the single-process reference trainer's
// losses over several epochs (each shard gives 11 windows, a global batch 16 of the 22: a new
// shuffled epoch every iteration). Their checkpoint records the data and the schedule: a resume
// on other shards or with another learning rate is refused naming the difference, unless
// --reset-data / --reset-schedule; a token outside the vocabulary is refused before training.
TEST(TrainCliTest, TokenShardsTrainAsTheReferenceAndResumesCheckTheirData) {
  namespace testing = tandem::data::testing;
  testing::TemporaryFolder folder;
  auto shard_tokens = [](int64_t stream) {
    std::vector<int64_t> tokens;
    for (int64_t k = 0; k < 90; ++k) tokens.push_back((stream + k * 3 + k / 7) % 16);
    return tokens;
  };
  std::filesystem::create_directories(folder.File("train"));
  std::filesystem::create_directories(folder.File("other"));
  for (int shard = 0; shard < 2; ++shard) {
    testing::WriteBytes(folder.File(absl::StrCat("train/train_00000", shard, ".bin")),
                        testing::LlmcBytes(shard_tokens(shard)));
    testing::WriteBytes(folder.File(absl::StrCat("other/train_00000", shard, ".bin")),
                        testing::LlmcBytes(shard_tokens(shard + 5)));
  }
  testing::WriteBytes(folder.File("train/dataset.json"), R"({"vocab_size": 16})");
  testing::WriteBytes(folder.File("other/dataset.json"), R"({"vocab_size": 16})");

  // The reference: the same data set, model and optimizer in one process.
  libtorch::TokenShardOptions shards;
  shards.sources = {folder.File("train")};
  shards.seq_len = 8;
  shards.vocab = 16;
  shards.seed = kSeed;
  auto data = libtorch::MakeTokenShardDataset(shards);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE((*data)->SetGlobalBatch(kGlobalBatch).ok());
  libtorch::GptConfig gpt;
  gpt.vocab = 16;
  gpt.layers = 2;
  gpt.hidden = 16;
  gpt.heads = 2;
  gpt.seq_len = 8;
  auto model = libtorch::GptModelSpec(gpt).Build(kSeed);
  ASSERT_TRUE(model.ok()) << model.status();
  auto want = libtorch::TrainReference(
      *model, **data, tandem::testing::SmallModelReferenceOptions(6, kGlobalBatch));
  ASSERT_TRUE(want.ok()) << want.status();

  const std::string checkpoint = TempPath("shards_checkpoint");
  const std::string log = TempPath("shards.jsonl");
  const std::string run = absl::StrCat(kModelFlags, " --global-batch ", kGlobalBatch,
                                       " --microbatches 4 --seed ", kSeed);
  Outcome o = RunCommand(absl::StrCat(Mpirun(4), run, " --data ", folder.File("train"),
                                      " --schedule 1f1b --stages 2 --data-parallel 2 --steps 6"
                                      " --checkpoint-dir ", checkpoint, " --log-json ", log));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  ExpectLossesMatch(ReadLog(log), want->losses, 0);

  auto resume = [&](const std::string& flags) {
    return RunCommand(absl::StrCat(g_tandem, " train", run, " --schedule 1f1b --stages 1"
                                   " --steps 7 --resume ", checkpoint, flags));
  };
  Outcome other = resume(absl::StrCat(" --data ", folder.File("other")));
  EXPECT_EQ(other.exit_status, 2) << other.output;
  EXPECT_TRUE(absl::StrContains(other.output, "checksum")) << other.output;
  EXPECT_TRUE(absl::StrContains(other.output, "--reset-data")) << other.output;
  Outcome lr = resume(absl::StrCat(" --data ", folder.File("train"), " --lr 1e-3"));
  EXPECT_EQ(lr.exit_status, 2) << lr.output;
  EXPECT_TRUE(absl::StrContains(lr.output, "--lr 0.003 (this run 0.001)")) << lr.output;
  Outcome accepted = resume(absl::StrCat(" --data ", folder.File("other"), " --lr 1e-3"
                                         " --reset-data --reset-schedule"));
  EXPECT_EQ(accepted.exit_status, 0) << accepted.output;
  Outcome same = resume(absl::StrCat(" --data ", folder.File("train")));
  EXPECT_EQ(same.exit_status, 0) << same.output;

  // A token the model's vocabulary does not hold: refused before the first step.
  testing::WriteBytes(folder.File("other/train_000001.bin"),
                      testing::LlmcBytes(std::vector<int64_t>(40, 20)));
  Outcome bad = RunCommand(absl::StrCat(g_tandem, " train", run, " --data ",
                                        folder.File("other"), " --steps 1"));
  EXPECT_EQ(bad.exit_status, 2) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "train_000001.bin")) << bad.output;
  EXPECT_FALSE(absl::StrContains(bad.output, "iter ")) << bad.output;
  std::filesystem::remove_all(checkpoint);
  std::filesystem::remove(log);
}

// Validation losses (--eval-every, --eval-batches; held-out samples of the synthetic task)
// are the same under every layout as in one process: forward-only passes over the same fixed
// batches, summed over the pipelines and counted once per tensor-parallel group. They appear
// in the progress output, the JSON log (iterations counted from 1, as the progress line) and
// the summary.
TEST(TrainCliTest, ValidationLossIsTheSameOnEveryLayoutAsInOneProcess) {
  const std::string run = absl::StrCat(kModelFlags, " --global-batch ", kGlobalBatch,
                                       " --seed ", kSeed, " --steps 4 --eval-every 2"
                                       " --eval-batches 2");
  auto validation = [&](const std::string& launcher, const std::string& layout) {
    const std::string log = TempPath("validation.jsonl");
    Outcome o = RunCommand(absl::StrCat(launcher, run, " ", layout, " --log-json ", log));
    EXPECT_EQ(o.exit_status, 0) << layout << "\n" << o.output;
    EXPECT_TRUE(absl::StrContains(o.output, "validation after iteration 4: loss"))
        << layout << "\n" << o.output;
    std::map<int, double> by_iteration;
    int iterations = 0;
    for (const nlohmann::json& line : tandem::testing::ReadJsonLines(log)) {
      if (line.value("event", "") == "validation") {
        by_iteration[line["iteration"].get<int>()] = line["valid_loss"].get<double>();
        EXPECT_NEAR(line["valid_perplexity"].get<double>(),
                    std::exp(line["valid_loss"].get<double>()), 1e-9);
      } else if (!line.contains("event")) {
        EXPECT_EQ(line["iteration"].get<int>(), ++iterations) << "counted from 1";
      }
    }
    EXPECT_EQ(iterations, 4) << layout;
    std::filesystem::remove(log);
    return by_iteration;
  };
  const std::map<int, double> one =
      validation(absl::StrCat("OMP_NUM_THREADS=1 ", g_tandem, " train"),
                 "--microbatches 4 --schedule 1f1b --stages 1");
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(one.count(2) + one.count(4), 2u);
  EXPECT_LT(one.at(4), one.at(2)) << "the model learns the task";
  const struct {
    int ranks;
    const char* layout;
    double tolerance;
  } layouts[] = {
      {4, "--microbatches 4 --schedule 1f1b --stages 2 --data-parallel 2", 1e-5},
      {2, "--microbatches 4 --schedule zb-v --stages 2", 1e-5},
      {2, "--microbatches 4 --schedule interleaved --stages 2 --chunks 2", 1e-5},
      {4, "--microbatches 4 --schedule gpipe --stages 2 --tensor-parallel 2", 1e-4},
  };
  for (const auto& l : layouts) {
    const std::map<int, double> got = validation(Mpirun(l.ranks), l.layout);
    ASSERT_EQ(got.size(), 2u) << l.layout;
    for (const auto& [it, loss] : one) {
      EXPECT_LE(std::abs(got.at(it) - loss), l.tolerance * loss)
          << l.layout << " iteration " << it << ": " << got.at(it) << " vs one process " << loss;
    }
  }
  // Text read as bytes holds nothing out: validation needs --valid-data.
  const std::string text = TempPath("validation.txt");
  std::ofstream(text) << std::string(4096, 'a');
  Outcome none = RunCommand(absl::StrCat(g_tandem, " train", run, " --data ", text,
                                         " --schedule 1f1b --stages 1"));
  EXPECT_EQ(none.exit_status, 2) << none.output;
  EXPECT_TRUE(absl::StrContains(none.output, "--valid-data")) << none.output;
  Outcome given = RunCommand(absl::StrCat(g_tandem, " train", run, " --data ", text,
                                          " --valid-data ", text, " --schedule 1f1b --stages 1"));
  EXPECT_EQ(given.exit_status, 0) << given.output;
  EXPECT_TRUE(absl::StrContains(given.output, "validation loss")) << given.output;
  std::filesystem::remove(text);
}

// --steps is the run's last iteration: a resume goes on to it, and one at or past it trains
// nothing and says so.
TEST(TrainCliTest, StepsCountsTheWholeRunAcrossResumes) {
  const std::string checkpoint = TempPath("steps_checkpoint");
  const std::string run = absl::StrCat(g_tandem, " train", kModelFlags, " --global-batch ",
                                       kGlobalBatch, " --seed ", kSeed,
                                       " --schedule 1f1b --stages 1 --checkpoint-dir ", checkpoint);
  Outcome first = RunCommand(absl::StrCat(run, " --steps 3"));
  ASSERT_EQ(first.exit_status, 0) << first.output;
  EXPECT_TRUE(absl::StrContains(first.output, "iter    3/3")) << first.output;
  EXPECT_TRUE(absl::StrContains(first.output, "checkpoint: " + checkpoint + " (step 3)"))
      << first.output;
  Outcome second = RunCommand(absl::StrCat(run, " --steps 5 --resume ", checkpoint));
  ASSERT_EQ(second.exit_status, 0) << second.output;
  EXPECT_FALSE(absl::StrContains(second.output, "iter    3/")) << second.output;
  EXPECT_TRUE(absl::StrContains(second.output, "iter    4/5")) << second.output;
  EXPECT_TRUE(absl::StrContains(second.output, "iter    5/5")) << second.output;
  EXPECT_TRUE(absl::StrContains(second.output, "(step 5)")) << second.output;
  Outcome past = RunCommand(absl::StrCat(run, " --steps 2 --resume ", checkpoint));
  EXPECT_EQ(past.exit_status, 0) << past.output;
  EXPECT_TRUE(absl::StrContains(past.output, "nothing to train")) << past.output;
  EXPECT_FALSE(absl::StrContains(past.output, "iter ")) << past.output;
  tandem::RemoveAll(checkpoint).IgnoreError();
}

// Schedules written by torch.distributed.pipelining (its CSV format, compute-only and lowered
// with its communication actions) run through `tandem train --schedule-file` with the
// reference's losses, with data parallelism beside them; a file with another shape than the
// flags, or a damaged one, is bad input.
TEST(TrainCliTest, TorchCsvScheduleFilesTrainAsTheReference) {
  const std::vector<double> want = ReferenceLosses(4);
  const std::string data = TANDEM_TEST_DATA_DIR "/torch_schedules/";
  const struct {
    int ranks;
    const char* file;
    const char* flags;
  } cases[] = {
      {2, "zbv_p2_m4.csv", ""},
      {2, "zbv_p2_m4_comms.csv", ""},
      {4, "interleaved1f1b_p2_m6.csv", " --data-parallel 2 --global-batch 12"},
      {2, "loopedbfs_p2_m4_comms.csv", ""},
  };
  for (const auto& c : cases) {
    const std::string log = TempPath("csv.jsonl");
    Outcome o = RunCommand(absl::StrCat(Mpirun(c.ranks), kModelFlags, " --global-batch ",
                                        kGlobalBatch, " --seed ", kSeed, " --steps 4",
                                        " --schedule-file ", data, c.file, c.flags,
                                        " --log-json ", log));
    ASSERT_EQ(o.exit_status, 0) << c.file << "\n" << o.output;
    EXPECT_TRUE(absl::StrContains(o.output, "plan: custom")) << o.output;
    if (absl::StrContains(c.flags, "--global-batch 12")) {
      // Another global batch: against the reference of that batch.
      const std::vector<nlohmann::json> lines = ReadLog(log);
      ASSERT_EQ(lines.size(), 4u);
      const std::vector<double> twelve = tandem::testing::SmallGptReferenceLosses(4, 12, kSeed);
      for (const nlohmann::json& line : lines) {
        const int it = line["iteration"].get<int>() - 1;
        EXPECT_LE(std::abs(line["loss"].get<double>() - twelve[it]),
                  kRelativeTolerance * twelve[it])
            << c.file << " iteration " << it;
      }
    } else {
      ExpectLossesMatch(ReadLog(log), want, 0);
    }
    std::filesystem::remove(log);
  }
  Outcome shape = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --steps 1 --schedule-file ",
                                          data, "zbv_p2_m4.csv --microbatches 8"));
  EXPECT_EQ(shape.exit_status, 2) << shape.output;
  EXPECT_TRUE(absl::StrContains(shape.output, "--microbatches 8 differs")) << shape.output;
  const std::string damaged = TempPath("damaged.csv");
  std::ofstream(damaged) << "0F0,0F1\n1Q9\n";
  Outcome bad = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --steps 1 --schedule-file ",
                                        damaged));
  EXPECT_EQ(bad.exit_status, 2) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "--schedule-file")) << bad.output;
  std::filesystem::remove(damaged);
}

// GPT-2 ties its LM head to the token embedding. On one stage they are one tensor, and the
// losses are the reference trainer's (which shares them as transformers does). Stages that
// split the pair hold one end each, the head's copy starting as the embedding, and the two
// gradients are summed every step: 2 and 4 stages, data parallelism 2, interleaved chunks and
// ZB-V (both ends on one rank) give the single process's losses and gradient norms (the copy
// counted once) within 1e-5 relative and a final checkpoint equal to its own within 1e-3, which
// exports to a Hugging Face folder. (Parameters agree within 1e-6 relative but for the key
// biases of attention: their gradient is zero in exact arithmetic, rounding noise in practice,
// which Adam scales up to whole steps, so the order in which the two ends' gradients are added
// shows there: 1e-4 relative measured.) The single process's checkpoint (the embedding alone) resumes on 2
// stages with the reference losses.
TEST(TrainCliTest, TiedGpt2OnStagesThatSplitItEqualsOneProcess) {
  // The iterations' lines of a log (not its checkpoint events).
  auto iterations = [](const std::string& path) {
    std::vector<nlohmann::json> lines;
    for (nlohmann::json& line : ReadLog(path)) {
      if (line.contains("loss")) lines.push_back(std::move(line));
    }
    return lines;
  };
  const std::string sizes = " --model gpt2 --layers 2 --hidden 16 --heads 2 --seq-len 8";
  const std::string training = absl::StrCat(
      sizes, " --optimizer adamw --lr 3e-3 --warmup-steps 2 --weight-decay 0.01 --global-batch ",
      kGlobalBatch, " --seed ", kSeed, " --steps 4");
  const std::string one_log = TempPath("gpt2.jsonl"), one_dir = TempPath("gpt2_one_ckpt");
  Outcome one = RunCommand(absl::StrCat(g_tandem, " train", training,
                                        " --microbatches 4 --schedule 1f1b --stages 1"
                                        " --log-json ", one_log, " --checkpoint-dir ", one_dir));
  ASSERT_EQ(one.exit_status, 0) << one.output;
  libtorch::Gpt2Config gpt2;
  gpt2.layers = 2;
  gpt2.hidden = 16;
  gpt2.heads = 2;
  gpt2.seq_len = 8;
  gpt2.positions = 8;
  auto model = libtorch::Gpt2ModelSpec(gpt2).Build(kSeed);
  ASSERT_TRUE(model.ok()) << model.status();
  libtorch::SyntheticTaskOptions task;
  task.seed = kSeed;
  task.seq_len = 8;
  auto data = libtorch::MakeSyntheticDataset(task);
  ASSERT_TRUE(data.ok()) << data.status();
  auto want = libtorch::TrainReference(
      *model, **data, tandem::testing::SmallModelReferenceOptions(6, kGlobalBatch));
  ASSERT_TRUE(want.ok()) << want.status();
  const std::vector<nlohmann::json> reference = iterations(one_log);
  ExpectLossesMatch(reference, want->losses, 0);
  ASSERT_EQ(reference.size(), 4u);

  const struct {
    int ranks;
    std::string flags;
  } layouts[] = {
      {2, "--schedule 1f1b --stages 2 --microbatches 4"},
      {4, "--schedule 1f1b --stages 4 --microbatches 4"},
      {4, "--schedule 1f1b --stages 2 --data-parallel 2 --microbatches 2"},
      {2, "--schedule interleaved --stages 2 --chunks 2 --microbatches 4"},
      {2, "--schedule zb-v --stages 2 --microbatches 4"},
      // Tensor-parallel halves of both ends: each rank sums its vocabulary rows' copies.
      {4, "--schedule 1f1b --stages 2 --tensor-parallel 2 --microbatches 4"},
      {4, "--schedule 1f1b --stages 2 --tensor-parallel 2 --sequence-parallel --microbatches 4"},
  };
  for (const auto& layout : layouts) {
    SCOPED_TRACE(layout.flags);
    const std::string log = TempPath("gpt2_split.jsonl"), dir = TempPath("gpt2_split_ckpt");
    Outcome split = RunCommand(absl::StrCat(Mpirun(layout.ranks), training, " ", layout.flags,
                                            " --log-json ", log, " --checkpoint-dir ", dir));
    ASSERT_EQ(split.exit_status, 0) << split.output;
    const std::vector<nlohmann::json> lines = iterations(log);
    ASSERT_EQ(lines.size(), reference.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      for (const char* figure : {"loss", "grad_norm"}) {
        const double expected = reference[i][figure].get<double>();
        EXPECT_LE(std::abs(lines[i][figure].get<double>() - expected),
                  kRelativeTolerance * std::abs(expected))
            << figure << " of iteration " << i + 1;
      }
    }
    Outcome diff = RunCommand(
        absl::StrCat(g_tandem, " checkpoint diff ", dir, " ", one_dir, " --tolerance 1e-3"));
    EXPECT_EQ(diff.exit_status, 0) << diff.output;
    if (layout.ranks == 2 && absl::StrContains(layout.flags, "1f1b")) {
      const std::string folder = TempPath("gpt2_split_hf");
      Outcome exported = RunCommand(absl::StrCat(
          g_tandem, " checkpoint export --format safetensors ", dir, " ", folder));
      EXPECT_EQ(exported.exit_status, 0) << exported.output;
      EXPECT_TRUE(std::filesystem::exists(folder + "/model.safetensors")) << exported.output;
      tandem::RemoveAll(folder).IgnoreError();
    }
    std::filesystem::remove(log);
    tandem::RemoveAll(dir).IgnoreError();
  }

  // The head's copy loads the embedding's state from a checkpoint that holds only that.
  const std::string log = TempPath("gpt2_resumed.jsonl");
  Outcome resumed = RunCommand(absl::StrCat(Mpirun(2), training,
                                            " --schedule 1f1b --stages 2 --microbatches 4"
                                            " --steps 6 --resume ", one_dir, " --log-json ", log));
  ASSERT_EQ(resumed.exit_status, 0) << resumed.output;
  ExpectLossesMatch(iterations(log), want->losses, 4);
  EXPECT_EQ(iterations(log).size(), 2u);
  std::filesystem::remove(log);
  std::filesystem::remove(one_log);
  tandem::RemoveAll(one_dir).IgnoreError();
}

// Each rank builds only the layers of its stages: rank 0 of a 4-stage GPT (the embedding and
// two of eight blocks) peaks at about a quarter of what one process holding the whole model
// does, above the memory of a run with a tiny model (LibTorch itself). Before, every rank built
// the whole model and then its stage's copies: half of the single process's figure.
TEST(TrainCliTest, EachRankAllocatesOnlyItsOwnLayers) {
  auto peak = [](const std::string& command) {
    const std::string log = TempPath("memory.jsonl");
    Outcome o = RunCommand(absl::StrCat(command, " --steps 2 --global-batch 4 --microbatches 4"
                                        " --optimizer adamw --log-json ", log));
    EXPECT_EQ(o.exit_status, 0) << o.output;
    const std::vector<nlohmann::json> lines = ReadLog(log);
    return lines.empty() ? 0.0 : lines.back()["peak_memory_bytes"].get<double>();
  };
  const std::string gpt = " --model gpt --layers 8 --hidden 512 --heads 8 --seq-len 8";
  const double base = peak(absl::StrCat(g_tandem, " train --model gpt --layers 1 --hidden 16"
                                        " --heads 2 --seq-len 8 --schedule 1f1b --stages 1"));
  const double one = peak(absl::StrCat(g_tandem, " train", gpt, " --schedule 1f1b --stages 1"));
  const double four = peak(absl::StrCat(Mpirun(4), gpt, " --schedule 1f1b --stages 4"));
  ASSERT_GT(base, 0);
  // Parameters, gradients and AdamW's two moments of 8 blocks of 12 x 512^2 floats: 400 MB.
  ASSERT_GT(one - base, 300e6) << "one process: " << one << " B, LibTorch alone " << base;
  EXPECT_LT(four - base, 0.4 * (one - base))
      << "rank 0 of 4 stages: " << four << " B; one process " << one << " B; LibTorch alone "
      << base << " B";
}

TEST(TrainCliTest, MicroBatchBeyondMemoryIsBadInput) {
  tandem::pipeline::ScheduleSpec spec;
  spec.kind = tandem::pipeline::ScheduleKind::k1F1B;
  spec.num_ranks = 2;
  spec.num_microbatches = 4;
  auto plan = tandem::pipeline::MakeUniformPlan(4, spec, 1, 4);
  ASSERT_TRUE(plan.ok());
  plan->microbatch_size = int64_t{1} << 31;
  const std::string path = TempPath("huge_microbatch.json");
  // Written as JSON directly: WritePlanFile refuses what it validates.
  ASSERT_TRUE(tandem::WriteFileAtomically(path, tandem::pipeline::ToJson(*plan).dump()).ok());
  Outcome o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --plan ", path, " --steps 1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;  // the format's bound (was bad_alloc)
  EXPECT_NE(o.output.find("microbatch_size"), std::string::npos) << o.output;
  plan->microbatch_size = int64_t{1} << 24;  // the format's largest, beyond any host's memory
  ASSERT_TRUE(tandem::pipeline::WritePlanFile(*plan, path).ok());
  const auto start = std::chrono::steady_clock::now();
  o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --plan ", path, " --steps 1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("lower microbatch_size"), std::string::npos) << o.output;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            60);  // refused up front, not after minutes of work
  std::filesystem::remove(path);
}

TEST(TrainCliTest, PlanForAnotherWorldSizeOrModelIsBadInput) {
  tandem::pipeline::ScheduleSpec spec;
  spec.kind = tandem::pipeline::ScheduleKind::k1F1B;
  spec.num_ranks = 4;
  spec.num_microbatches = 4;
  auto plan = tandem::pipeline::MakeUniformPlan(4, spec, 1, 4);
  ASSERT_TRUE(plan.ok());
  const std::string path = TempPath("plan4.json");
  ASSERT_TRUE(tandem::pipeline::WritePlanFile(*plan, path).ok());
  Outcome o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --plan ", path, " --steps 2"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("this run has 2"), std::string::npos) << o.output;

  // A plan for 2 ranks but a model of 6 layers (the GPT here has 2 blocks + 2 = 4).
  spec.num_ranks = 2;
  auto other_model = tandem::pipeline::MakeUniformPlan(6, spec, 1, 4);
  ASSERT_TRUE(other_model.ok());
  ASSERT_TRUE(tandem::pipeline::WritePlanFile(*other_model, path).ok());
  o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --plan ", path, " --steps 2"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("layers"), std::string::npos) << o.output;
  std::filesystem::remove(path);
}

TEST(TrainCliTest, BadFlagsAndMissingCheckpointAreBadInput) {
  Outcome o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags,
                               " --schedule 1f1b --stages 4 --data-parallel 1 --steps 1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("but this run has 2"), std::string::npos) << o.output;

  o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --schedule warp --stages 2 --steps 1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("warp"), std::string::npos) << o.output;

  o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --schedule 1f1b --stages 2 --steps 1",
                       " --resume ", TempPath("no_such_checkpoint")));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("manifest.json"), std::string::npos) << o.output;

  // ZB-V's planning costs: three positive numbers, and for zb-v only.
  o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags,
                              " --schedule zb-v --stages 2 --steps 1 --planning-costs 1,0,1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("three positive numbers"), std::string::npos) << o.output;
  o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags,
                              " --schedule 1f1b --stages 2 --steps 1 --planning-costs 1,1,1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("zb-v only"), std::string::npos) << o.output;
}

// A flag that only acts beside another setting, given without it, would change nothing and
// say nothing (no checkpoint written, no validation loss, no decay): one line naming both,
// exit 2, before anything runs. Given with it, the same flag is accepted (the last case).
TEST(TrainCliTest, FlagsWithoutWhatTheyApplyToAreBadInput) {
  const std::string run = absl::StrCat(g_tandem, " train", kModelFlags, " --steps 1");
  const std::pair<const char*, const char*> cases[] = {
      {" --checkpoint-every 1", "--checkpoint-every applies to --checkpoint-dir; there is none"},
      {" --keep-checkpoints 3", "--keep-checkpoints applies to --checkpoint-dir; there is none"},
      {" --eval-batches 2", "--eval-batches applies to --eval-every N; there is none"},
      {" --valid-data /dev/null", "--valid-data applies to --eval-every N, which evaluates it"},
      {" --momentum 0.5", "--momentum applies to --optimizer sgd (this run's is adamw)"},
      {" --min-lr 1e-4 --decay-steps 5 --warmup-steps 5",
       "--min-lr applies to a cosine decay (--decay-steps past --warmup-steps)"},
      {" --decay-steps 3 --warmup-steps 4", "--decay-steps 3 is the step at which the cosine"},
      {" --elastic-replace", "--elastic-replace applies to --elastic; this run is not elastic"},
      {" --device-memory-mb 64 --schedule gpipe --stages 1",
       "--device-memory-mb applies to a planned run (no --plan, --schedule or "
       "--schedule-file) or to --elastic: this run's plan is given"},
      {" --device-memory-mb -1", "--device-memory-mb must be a non-negative number of MiB"},
  };
  for (const auto& [flags, message] : cases) {
    Outcome o = RunCommand(absl::StrCat(run, flags));
    EXPECT_EQ(o.exit_status, 2) << flags << "\n" << o.output;
    EXPECT_TRUE(absl::StrContains(o.output, message)) << flags << "\n" << o.output;
    EXPECT_FALSE(absl::StrContains(o.output, "iter ")) << flags << "\n" << o.output;
  }
  Outcome sgd = RunCommand(absl::StrCat(run,
                                        " --optimizer sgd --momentum 0.5 --decay-steps 4"
                                        " --min-lr 1e-4 --schedule gpipe --stages 1"));
  EXPECT_EQ(sgd.exit_status, 0) << sgd.output;
}

// An output path that cannot be written is refused before the first step, on every rank
// (exit 2, the flag and the path named; no iteration ran): a log or timeline in a missing
// folder (plain and elastic runs), a checkpoint folder behind a file.
TEST(TrainCliTest, OutputPathsThatCannotBeWrittenAreRefusedBeforeTheFirstStep) {
  const std::string missing = TempPath("no_such_folder");
  const std::string file = TempPath("a_file");
  ASSERT_TRUE(tandem::WriteFileAtomically(file, "x").ok());
  const std::string run = absl::StrCat(Mpirun(2), kModelFlags,
                                       " --schedule 1f1b --stages 2 --steps 2 --global-batch 8");
  struct Case {
    std::string flags;
    std::string named;
  };
  for (const Case& c : std::vector<Case>{
           {absl::StrCat(" --log-json ", missing, "/log.jsonl"), "--log-json"},
           {absl::StrCat(" --timeline ", missing, "/trace.json"), "--timeline"},
           {absl::StrCat(" --checkpoint-dir ", file, "/checkpoints"), "--checkpoint-dir"},
           {absl::StrCat(" --elastic --log-json ", missing, "/log.jsonl"), "--log-json"}}) {
    SCOPED_TRACE(c.flags);
    const std::string command =
        absl::StrContains(c.flags, "--elastic")
            ? absl::StrCat(Mpirun(2), kModelFlags, " --steps 2 --global-batch 8", c.flags)
            : run + c.flags;
    Outcome o = RunCommand(command);
    EXPECT_EQ(o.exit_status, 2) << o.output;
    EXPECT_NE(o.output.find(c.named), std::string::npos) << o.output;
    for (const char* rank : {"(rank 0): error", "(rank 1): error"}) {
      EXPECT_NE(o.output.find(rank), std::string::npos) << "every rank stops:\n" << o.output;
    }
    EXPECT_EQ(o.output.find("iter "), std::string::npos) << "an iteration ran:\n" << o.output;
  }
  EXPECT_FALSE(std::filesystem::exists(missing));
  std::filesystem::remove(file);
}

// Rewrites stage 0's shard of the step folder `folder` through `edit`, with its size and
// checksum recomputed in the manifest: damage that checksums cannot see.
void RewriteShard(const std::string& folder,
                  const std::function<void(tandem::runtime::CheckpointShard&)>& edit) {
  namespace rt = tandem::runtime;
  auto manifest = rt::ReadManifest(folder);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  for (rt::ShardRecord& record : manifest->shards) {
    if (record.stage != 0) continue;
    auto shard = rt::ReadShard(folder, record);
    ASSERT_TRUE(shard.ok()) << shard.status();
    edit(*shard);
    auto written = rt::WriteShard(folder, *shard);
    ASSERT_TRUE(written.ok()) << written.status();
    record = *written;
  }
  ASSERT_TRUE(rt::WriteManifest(folder, *manifest).ok());
}

// What the checkpoint readers cannot trust is refused with one line and exit 2 on every rank,
// never trained on and never waited on: a parameter that is NaN and a shard without its
// optimizer state (both with valid checksums; --reset-optimizer accepts the latter), and
// `latest` or `manifest.json` as something other than a regular file (a link to /dev/zero, a
// FIFO), for `tandem train --resume` and `tandem checkpoint inspect`.
TEST(TrainCliTest, CheckpointsThatCannotBeTrustedAreRefused) {
  const std::string root = TempPath("untrusted_checkpoint");
  const std::string train = absl::StrCat(Mpirun(2), kModelFlags, " --global-batch 8",
                                         " --schedule 1f1b --stages 2 --optimizer adamw");
  Outcome first = RunCommand(absl::StrCat(train, " --steps 2 --checkpoint-dir ", root));
  ASSERT_EQ(first.exit_status, 0) << first.output;
  auto folder = tandem::runtime::ResolveCheckpoint(root);
  ASSERT_TRUE(folder.ok()) << folder.status();
  const std::string manifest_path = *folder + "/" + tandem::runtime::kManifestFileName;
  const std::string shard_path = *folder + "/" + tandem::runtime::ShardFileName(0, 0, 1);
  const std::string manifest_text = tandem::ReadFile(manifest_path).value_or("");
  const std::string shard_bytes = tandem::ReadFile(shard_path).value_or("");
  ASSERT_FALSE(manifest_text.empty());
  auto restore = [&] {
    ASSERT_TRUE(tandem::WriteFileAtomically(manifest_path, manifest_text).ok());
    ASSERT_TRUE(tandem::WriteFileAtomically(shard_path, shard_bytes).ok());
  };
  // Bounded: a reader that hangs shows as exit 124.
  auto resume = [&](const std::string& extra) {
    // One iteration past the checkpoint's step 2 (--steps is the run's last iteration).
    return RunCommand(absl::StrCat("timeout 60 ", train, " --steps 3 --resume ", root, extra));
  };
  auto expect_refused = [](const Outcome& o, const std::string& says) {
    EXPECT_EQ(o.exit_status, 2) << o.output;
    EXPECT_NE(o.output.find(says), std::string::npos) << o.output;
    EXPECT_NE(o.output.find("(rank 1): error"), std::string::npos) << o.output;
    EXPECT_EQ(o.output.find("iter "), std::string::npos) << "it trained:\n" << o.output;
  };

  RewriteShard(*folder, [](tandem::runtime::CheckpointShard& shard) {
    for (auto& t : shard.tensors) {
      if (t.name.rfind("param:", 0) != 0) continue;
      const float nan = std::nanf("");
      std::memcpy(t.bytes.data() + 4 * sizeof(float), &nan, sizeof(nan));
      break;
    }
  });
  expect_refused(resume(""), "non-finite value");
  restore();

  RewriteShard(*folder, [](tandem::runtime::CheckpointShard& shard) {
    auto& tensors = shard.tensors;
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const auto& t) { return t.name.rfind("optim:", 0) == 0; }),
                  tensors.end());
  });
  expect_refused(resume(""), "optimizer state tensor(s) of stepped parameters are missing");
  Outcome reset = resume(" --reset-optimizer");
  EXPECT_EQ(reset.exit_status, 0) << reset.output;
  EXPECT_NE(reset.output.find("iter "), std::string::npos) << reset.output;
  restore();
  Outcome whole = resume("");
  EXPECT_EQ(whole.exit_status, 0) << whole.output;  // the restored checkpoint still resumes

  // Special files: refused without being read.
  const std::string latest = root + "/" + tandem::runtime::kLatestFileName;
  const std::string latest_text = tandem::ReadFile(latest).value_or("");
  ASSERT_EQ(std::remove(latest.c_str()), 0);
  std::filesystem::create_symlink("/dev/zero", latest);
  expect_refused(resume(""), "character device");
  Outcome inspect = RunCommand(absl::StrCat("timeout 60 ", g_tandem, " checkpoint inspect ", root));
  EXPECT_EQ(inspect.exit_status, 2) << inspect.output;
  EXPECT_NE(inspect.output.find("not a regular file"), std::string::npos) << inspect.output;
  ASSERT_EQ(std::remove(latest.c_str()), 0);
  ASSERT_EQ(::mkfifo(latest.c_str(), 0600), 0);
  expect_refused(resume(""), "a FIFO");
  ASSERT_EQ(std::remove(latest.c_str()), 0);
  ASSERT_TRUE(tandem::WriteFileAtomically(latest, latest_text).ok());
  ASSERT_EQ(std::remove(manifest_path.c_str()), 0);
  ASSERT_EQ(::mkfifo(manifest_path.c_str(), 0600), 0);
  expect_refused(resume(""), "a FIFO");
  inspect = RunCommand(absl::StrCat("timeout 60 ", g_tandem, " checkpoint inspect ", root));
  EXPECT_EQ(inspect.exit_status, 2) << inspect.output;
  ASSERT_TRUE(tandem::RemoveAll(root).ok());
}

// A loss that turns NaN or infinite stops the run on every rank (exit 2) naming the
// iteration, before anything of it is logged or saved.
TEST(TrainCliTest, ANonFiniteLossStopsEveryRankNamingTheIteration) {
  const std::string log = TempPath("diverged.jsonl");
  const std::string checkpoint = TempPath("diverged_checkpoint");
  Outcome o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags,
                                      " --global-batch 8 --schedule 1f1b --stages 2 --steps 6",
                                      " --optimizer sgd --lr 1e30 --log-json ", log,
                                      " --checkpoint-dir ", checkpoint, " --checkpoint-every 1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  for (const char* rank : {"(rank 0): error: iteration 2: the loss is", "(rank 1): error"}) {
    EXPECT_NE(o.output.find(rank), std::string::npos) << o.output;
  }
  const std::vector<nlohmann::json> lines = ReadLog(log);
  ASSERT_EQ(lines.size(), 1u) << o.output;  // iteration 1 only
  auto saved = tandem::runtime::ResolveCheckpoint(checkpoint);
  ASSERT_TRUE(saved.ok());
  auto manifest = tandem::runtime::ReadManifest(*saved);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 1);  // the last finite step
  std::filesystem::remove(log);
  ASSERT_TRUE(tandem::RemoveAll(checkpoint).ok());
}

// Gradients communicated in bfloat16 between two data-parallel pipelines (both strategies):
// the losses follow the float32 run of the same configuration within bfloat16's rounding, and
// differ from it (the gradients did travel rounded; AdamW's normalisation keeps the effect on
// the loss small). A type other than fp32 and bf16 is bad input.
TEST(TrainCliTest, BFloat16GradientCommunicationFollowsFloat32) {
  auto losses = [](const std::string& strategy, const std::string& type) {
    const std::string log = TempPath(absl::StrCat("grad_comm_", strategy, "_", type, ".jsonl"));
    Outcome o = RunCommand(absl::StrCat(
        Mpirun(2), kModelFlags, " --global-batch ", kGlobalBatch,
        " --microbatches 4 --schedule 1f1b --stages 1 --data-parallel 2 --steps 6 --seed ",
        kSeed, " --grad-sync ", strategy, " --grad-comm ", type, " --log-json ", log));
    EXPECT_EQ(o.exit_status, 0) << o.output;
    std::map<int, double> by_iteration;
    for (const nlohmann::json& line : ReadLog(log)) {
      by_iteration[line["iteration"].get<int>()] = line["loss"].get<double>();
    }
    std::filesystem::remove(log);
    return by_iteration;
  };
  for (const char* strategy : {"allreduce", "dear"}) {
    const std::map<int, double> fp32 = losses(strategy, "fp32");
    const std::map<int, double> bf16 = losses(strategy, "bf16");
    ASSERT_EQ(fp32.size(), 6u);
    ASSERT_EQ(bf16.size(), 6u);
    double worst = 0;
    for (const auto& [it, loss] : fp32) {
      worst = std::max(worst, std::abs(bf16.at(it) - loss) / loss);
    }
    EXPECT_LE(worst, 1e-2) << strategy;
    EXPECT_GT(worst, 1e-7) << strategy << ": no sign of bfloat16 rounding";
  }
  Outcome bad = RunCommand(absl::StrCat(Mpirun(2), kModelFlags,
                                        " --schedule 1f1b --stages 2 --steps 1 --grad-comm fp8"));
  EXPECT_EQ(bad.exit_status, 2) << bad.output;
  EXPECT_NE(bad.output.find("--grad-comm"), std::string::npos) << bad.output;
}

// zb-v planned with given costs trains to the reference losses and says what it planned with.
TEST(TrainCliTest, ZeroBubbleVWithPlanningCostsMatchesTheReference) {
  const std::string log = TempPath("zbv.jsonl");
  Outcome o = RunCommand(absl::StrCat(Mpirun(2), kModelFlags, " --global-batch ", kGlobalBatch,
                                      " --microbatches 4 --schedule zb-v --stages 2 --steps 4",
                                      " --planning-costs 1,1.15,0.8 --seed ", kSeed,
                                      " --log-json ", log));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("weight gradient = 87 : 100 : 70"), std::string::npos) << o.output;
  ExpectLossesMatch(ReadLog(log), ReferenceLosses(4), 0);
  std::filesystem::remove(log);
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::testing::RunTestsWithProgramPath(argc, argv, "PATH_TO_TANDEM", &g_tandem);
}
