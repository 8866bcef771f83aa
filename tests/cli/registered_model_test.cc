// A model registered by a program of its own (examples/consumer/cnn_trainer.cc: a CNN with its
// own flag and data set) runs through the whole training front end as `tandem train`'s GPT
// does: a 2-stage 1F1B pipeline and data parallelism equal to one process, profiling and
// planning, profile, checkpoint and resume, --elastic with a rank killed, bad input. The path
// of the program is the first argument. The registry itself is tested in process.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/torch/model_registry.h"
#include "common/config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/train_cli.h"

namespace {

using tandem::testing::Outcome;
using tandem::testing::RunCommand;

std::string g_program;
constexpr double kRelativeTolerance = 1e-5;
constexpr char kModel[] =
    " --model cnn --global-batch 16 --microbatch-size 2 --lr 3e-3 --seed 7";

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          absl::StrCat("tandem_registered_model_", ::getpid(), "_", name))
      .string();
}

std::string Mpirun(int ranks, bool recovery = false) {
  return absl::StrCat("OMP_NUM_THREADS=1 timeout 180 ", TANDEM_MPIEXEC,
                      " --allow-run-as-root --oversubscribe --bind-to none",
                      recovery ? " --enable-recovery" : "", " -np ", ranks, " ");
}

// Losses by iteration from a --log-json file (training lines only, each iteration once).
std::map<int, double> Losses(const std::string& log) {
  std::map<int, double> losses;
  for (const nlohmann::json& line : tandem::testing::ReadJsonLines(log)) {
    if (line.contains("event")) continue;
    const bool inserted =
        losses.emplace(line["iteration"].get<int>(), line["loss"].get<double>()).second;
    EXPECT_TRUE(inserted) << "iteration " << line["iteration"] << " logged twice";
  }
  return losses;
}

// One process, 1 stage: what every other layout must reproduce.
const std::map<int, double>& OneProcess() {
  static const std::map<int, double> losses = [] {
    const std::string log = TempPath("one.jsonl");
    Outcome o = RunCommand(absl::StrCat("OMP_NUM_THREADS=1 ", g_program, kModel,
                                        " --steps 10 --schedule 1f1b --stages 1 --log-json ",
                                        log));
    EXPECT_EQ(o.exit_status, 0) << o.output;
    return Losses(log);
  }();
  return losses;
}

void ExpectOneProcessLosses(const std::map<int, double>& got, int first, int end,
                            const std::string& output) {
  const std::map<int, double>& want = OneProcess();
  ASSERT_EQ(want.size(), 10u);
  ASSERT_EQ(got.size(), static_cast<size_t>(end - first)) << output;
  for (const auto& [it, loss] : got) {
    ASSERT_GT(it, first);  // iterations (first, end], counted from 1
    ASSERT_LE(it, end);
    EXPECT_LE(std::abs(loss - want.at(it)), kRelativeTolerance * std::abs(want.at(it)))
        << "iteration " << it << ": " << loss << " vs one process " << want.at(it) << "\n"
        << output;
  }
}

TEST(ModelRegistryTest, RefusesBadNamesMissingBuildersAndDuplicates) {
  auto make = [](const tandem::cli::ModelRequest&) -> absl::StatusOr<tandem::cli::ModelAndData> {
    return absl::UnimplementedError("not built in this test");
  };
  EXPECT_EQ(tandem::cli::RegisterModel({.name = "", .make = make}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tandem::cli::RegisterModel({.name = "two words", .make = make}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tandem::cli::RegisterModel({.name = "nobuilder"}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tandem::cli::RegisterModel(
                  {.name = "test-model", .flags = {"seq_len", "test_flag"}, .make = make})
                  .ok());
  EXPECT_EQ(tandem::cli::RegisterModel({.name = "test-model", .make = make}).code(),
            absl::StatusCode::kAlreadyExists);
  const std::vector<std::string> flags = tandem::cli::ModelFlagNames();
  EXPECT_EQ(flags.front(), "model");
  EXPECT_EQ(std::count(flags.begin(), flags.end(), "test_flag"), 1);
  EXPECT_TRUE(absl::StrContains(tandem::cli::ModelsHelp(), "test-model"));
}

TEST(RegisteredModelTest, PipelineAndDataParallelRunsEqualOneProcess) {
  const std::map<int, double>& one = OneProcess();
  ASSERT_EQ(one.size(), 10u);
  EXPECT_LT(one.at(10), one.at(1)) << "the CNN learns";  // iterations count from 1
  for (const std::string layout : {"--schedule 1f1b --stages 2", "--schedule gpipe --stages 2",
                                   "--schedule 1f1b --stages 1 --data-parallel 2"}) {
    const std::string log = TempPath("layout.jsonl");
    Outcome o = RunCommand(absl::StrCat(Mpirun(2), g_program, kModel, " --steps 10 ", layout,
                                        " --log-json ", log));
    ASSERT_EQ(o.exit_status, 0) << layout << "\n" << o.output;
    EXPECT_TRUE(absl::StrContains(o.output, "cnn channels=8 seed=7")) << o.output;
    ExpectOneProcessLosses(Losses(log), 0, 10, o.output);
  }
}

TEST(RegisteredModelTest, ProfiledAndPlannedWithoutASchedule) {
  Outcome o = RunCommand(absl::StrCat(Mpirun(2), g_program, kModel, " --steps 3"));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_TRUE(absl::StrContains(o.output, "profiling cnn")) << o.output;
  EXPECT_TRUE(absl::StrContains(o.output, "plan: ")) << o.output;
  EXPECT_TRUE(absl::StrContains(o.output, "trained 3 iteration(s) on 2 rank(s)")) << o.output;

  Outcome profile = RunCommand(absl::StrCat(g_program, " profile --model cnn --microbatch-size 4"
                                            " --warmup 1 --repeats 2"));
  ASSERT_EQ(profile.exit_status, 0) << profile.output;
  EXPECT_TRUE(absl::StrContains(profile.output, "profile of cnn")) << profile.output;
  for (const char* layer : {"conv1", "conv2", "dense", "classifier"}) {
    EXPECT_TRUE(absl::StrContains(profile.output, absl::StrCat("\n", layer, " ")))
        << "layer " << layer << " in the table:\n" << profile.output;
  }
}

TEST(RegisteredModelTest, ResumeContinuesAsAnUninterruptedRun) {
  const std::string checkpoint = TempPath("checkpoint");
  const std::string first_log = TempPath("first.jsonl"), second_log = TempPath("second.jsonl");
  Outcome first = RunCommand(absl::StrCat(Mpirun(2), g_program, kModel,
                                          " --steps 4 --schedule 1f1b --stages 2"
                                          " --checkpoint-dir ", checkpoint, " --log-json ",
                                          first_log));
  ASSERT_EQ(first.exit_status, 0) << first.output;
  // Resumed on one process: the checkpoint is repartitioned.
  Outcome second = RunCommand(absl::StrCat("OMP_NUM_THREADS=1 ", g_program, kModel,
                                           " --steps 10 --schedule 1f1b --stages 1 --resume ",
                                           checkpoint, " --log-json ", second_log));
  ASSERT_EQ(second.exit_status, 0) << second.output;
  EXPECT_TRUE(absl::StrContains(second.output, "after iteration 4")) << second.output;
  ExpectOneProcessLosses(Losses(first_log), 0, 4, first.output);
  ExpectOneProcessLosses(Losses(second_log), 4, 10, second.output);

  // Another model's flags: refused naming the difference.
  Outcome other = RunCommand(absl::StrCat(g_program, kModel, " --cnn-channels 4 --steps 1"
                                          " --schedule 1f1b --stages 1 --resume ", checkpoint));
  EXPECT_NE(other.exit_status, 0) << other.output;
  EXPECT_TRUE(absl::StrContains(other.output, "channels=4")) << other.output;
  std::filesystem::remove_all(checkpoint);
}

TEST(RegisteredModelTest, ElasticRunSurvivesAKilledRank) {
  // Four ranks, two pipelines of two stages (the memory limit keeps every rank from holding the
  // whole model); rank 1 kills itself in iteration 3's forward pass. The survivors re-form and
  // finish with the losses of one process.
  const std::string log = TempPath("elastic.jsonl");
  Outcome o = RunCommand(absl::StrCat(
      "TANDEM_ELASTIC_KILL=1:3:forward ", Mpirun(4, /*recovery=*/true),
      "-x TANDEM_ELASTIC_KILL ", g_program, " --elastic", kModel,
      " --steps 10 --device-memory-mb 0.045 --log-json ", log));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_TRUE(absl::StrContains(o.output, "2 pipeline(s): r0[0,2) > r1[2,4)")) << o.output;
  EXPECT_TRUE(absl::StrContains(o.output, "1 reconfiguration(s)")) << o.output;
  ExpectOneProcessLosses(Losses(log), 0, 10, o.output);
}

TEST(RegisteredModelTest, BadInputIsRefusedWithOneLine) {
  Outcome channels = RunCommand(absl::StrCat(g_program, " --model cnn --cnn-channels 0"));
  EXPECT_EQ(channels.exit_status, 2) << channels.output;
  EXPECT_TRUE(absl::StrContains(channels.output, "--cnn-channels must be positive"))
      << channels.output;
  Outcome unknown = RunCommand(absl::StrCat(g_program, " --model resnet"));
  EXPECT_EQ(unknown.exit_status, 2) << unknown.output;
  EXPECT_TRUE(absl::StrContains(unknown.output, "unknown model 'resnet' (known: cnn, gpt, gpt2, llama)"))
      << unknown.output;
  // Another model's flag would be ignored without a word: refused, naming the readers.
  Outcome foreign = RunCommand(absl::StrCat(g_program, " --model cnn --kv-heads 2 --seq-len 8"));
  EXPECT_EQ(foreign.exit_status, 2) << foreign.output;
  EXPECT_TRUE(absl::StrContains(foreign.output,
                                "model 'cnn' does not read --kv-heads (read by llama), "
                                "--seq-len (read by gpt, gpt2, llama): choose the model with "
                                "--model"))
      << foreign.output;
  Outcome config = RunCommand(absl::StrCat(g_program, " profile --hf-config /nonexistent.json"));
  EXPECT_EQ(config.exit_status, 2) << config.output;
  EXPECT_TRUE(absl::StrContains(config.output,
                                "model 'gpt' does not read --hf-config (read by gpt2, llama)"))
      << config.output;
  Outcome channels_on_gpt = RunCommand(absl::StrCat(g_program, " profile --cnn-channels 4"));
  EXPECT_EQ(channels_on_gpt.exit_status, 2) << channels_on_gpt.output;
  EXPECT_TRUE(absl::StrContains(channels_on_gpt.output, "--cnn-channels (read by cnn)"))
      << channels_on_gpt.output;
  Outcome help = RunCommand(absl::StrCat(g_program, " help train"));
  EXPECT_EQ(help.exit_status, 0) << help.output;
  EXPECT_TRUE(absl::StrContains(help.output, "--cnn-channels")) << help.output;
  EXPECT_TRUE(absl::StrContains(help.output, "  cnn: ")) << help.output;
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::testing::RunTestsWithProgramPath(argc, argv, "CNN_TRAINER", &g_program);
}
