#include "pipeline/schedule.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "pipeline/generators.h"

namespace tandem::pipeline {
namespace {

TEST(ActionTest, ToStringAndParseRoundTrip) {
  const std::vector<std::pair<Action, std::string>> cases = {
      {{ActionType::kForward, 3, 1, 0, -1}, "F3.1"},
      {{ActionType::kForward, 3, 1, 1, -1}, "F3.1r1"},
      {{ActionType::kBackwardInput, 0, 7, 0, -1}, "Bi0.7"},
      {{ActionType::kBackwardWeight, 2, 5, 0, -1}, "W2.5"},
      {{ActionType::kSendActivation, 3, 1, 0, 2}, "sA3.1>2"},
      {{ActionType::kRecvGradient, 2, 0, 0, 3}, "rG2.0<3"},
      {{ActionType::kRecvActivation, 1, 4, 1, 0}, "rA1.4r1<0"},
      {{ActionType::kGradientSync, 3, -1, 0, -1}, "sync3"},
      {{ActionType::kGradientSync, 3, -1, 1, -1}, "sync3r1"},
      {{ActionType::kOptimizerStep, -1, -1, 0, -1}, "step"},
      {{ActionType::kForward, 32767, 32767, 0, -1}, "F32767.32767"},  // the largest
  };
  for (const auto& [action, text] : cases) {
    EXPECT_EQ(ToString(action), text);
    auto parsed = ParseAction(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, action) << text;
  }
}

TEST(ActionTest, ParseRejectsMalformed) {
  for (const char* text : {"", "X1.2", "F", "F1", "F1.", "F1.2x", "sA1.2", "sA1.2<3", "step2",
                           "rG1.2>0", "sync", "F-1.2", "F1.2r256", "sA1.2r1>16384",
                           "rA1.2<-3", "F32768.0", "F0.32768", "sync32768"}) {
    auto parsed = ParseAction(text);
    EXPECT_FALSE(parsed.ok()) << text;
    if (!parsed.ok()) {
      EXPECT_TRUE(absl::StrContains(parsed.status().message(), "bad action")) << text;
    }
  }
}

TEST(ScheduleKindTest, NamesRoundTrip) {
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
        ScheduleKind::kChimera, ScheduleKind::kHanayo, ScheduleKind::kZBH1, ScheduleKind::kZBV}) {
    auto parsed = ParseScheduleKind(ScheduleKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  auto bad = ParseScheduleKind("zigzag");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "unknown schedule 'zigzag'"));
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "interleaved"));
}

TEST(ScheduleSpecTest, StagesReplicasAndSplit) {
  ScheduleSpec spec;
  spec.num_ranks = 4;
  spec.kind = ScheduleKind::k1F1B;
  EXPECT_EQ(spec.NumStages(), 4);
  spec.kind = ScheduleKind::kInterleaved;
  spec.chunks = 3;
  EXPECT_EQ(spec.NumStages(), 12);
  spec.kind = ScheduleKind::kHanayo;
  spec.waves = 2;
  EXPECT_EQ(spec.NumStages(), 16);
  spec.kind = ScheduleKind::kZBV;
  EXPECT_EQ(spec.NumStages(), 8);
  EXPECT_TRUE(spec.SplitsBackward());
  spec.kind = ScheduleKind::kChimera;
  EXPECT_EQ(spec.NumStages(), 4);
  EXPECT_EQ(spec.NumReplicas(), 2);
  EXPECT_FALSE(spec.SplitsBackward());
}

TEST(ScheduleSpecTest, RangeChecksNameTheField) {
  ScheduleSpec spec;
  spec.num_ranks = 0;
  auto status = CheckScheduleSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "stages")) << status;
  spec.num_ranks = 4;
  spec.num_microbatches = 0;
  EXPECT_TRUE(absl::StrContains(CheckScheduleSpec(spec).message(), "microbatches"));
  spec.num_microbatches = 8;
  EXPECT_TRUE(CheckScheduleSpec(spec).ok());
  spec.num_ranks = kMaxRanks;
  spec.num_microbatches = kMaxMicrobatches;
  EXPECT_TRUE(absl::StrContains(CheckScheduleSpec(spec).message(), "too large"));
}

TEST(PlacementTest, Factories) {
  Placement looped = Placement::Looped(4, 2);
  EXPECT_EQ(looped.num_stages, 8);
  EXPECT_EQ(looped.RankOf(0, 5), 1);
  auto stages = looped.StagesOf(1);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0], std::make_pair(0, 1));
  EXPECT_EQ(stages[1], std::make_pair(0, 5));

  // Wave: 0 1 2 3 | 3 2 1 0 | 0 1 2 3 | 3 2 1 0
  Placement wave = Placement::Wave(4, 2);
  EXPECT_EQ(wave.num_stages, 16);
  const std::vector<int> expected = {0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3, 3, 2, 1, 0};
  EXPECT_EQ(wave.stage_to_rank[0], expected);
  auto rank3 = wave.StagesOf(3);
  ASSERT_EQ(rank3.size(), 4u);
  EXPECT_EQ(rank3[1].second, 4);  // V turn: stages 3 and 4 are neighbours on rank 3

  Placement bi = Placement::Bidirectional(4);
  EXPECT_EQ(bi.NumReplicas(), 2);
  EXPECT_EQ(bi.RankOf(1, 0), 3);
  EXPECT_EQ(bi.RankOf(1, 3), 0);
  auto rank0 = bi.StagesOf(0);
  ASSERT_EQ(rank0.size(), 2u);
  EXPECT_EQ(rank0[0], std::make_pair(0, 0));
  EXPECT_EQ(rank0[1], std::make_pair(1, 3));
}

Schedule TinySchedule() {
  Schedule s;
  s.spec.kind = ScheduleKind::kGPipe;
  s.spec.num_ranks = 2;
  s.spec.num_microbatches = 1;
  s.placement = Placement::Linear(2);
  s.programs = {
      {{ActionType::kForward, 0, 0, 0, -1},
       {ActionType::kSendActivation, 0, 0, 0, 1},
       {ActionType::kRecvGradient, 1, 0, 0, 1},
       {ActionType::kBackward, 0, 0, 0, -1},
       {ActionType::kGradientSync, 0, -1, 0, -1},
       {ActionType::kOptimizerStep, -1, -1, 0, -1}},
      {{ActionType::kRecvActivation, 0, 0, 0, 0},
       {ActionType::kForward, 1, 0, 0, -1},
       {ActionType::kBackward, 1, 0, 0, -1},
       {ActionType::kSendGradient, 1, 0, 0, 0},
       {ActionType::kGradientSync, 1, -1, 0, -1},
       {ActionType::kOptimizerStep, -1, -1, 0, -1}},
  };
  return s;
}

TEST(ScheduleTest, GridShowsComputeOrEverything) {
  Schedule s = TinySchedule();
  EXPECT_EQ(s.NumActions(), 12);
  EXPECT_EQ(FormatGrid(s), "rank 0 | F0.0 B0.0\nrank 1 | F1.0 B1.0\n");
  std::string full = FormatGrid(s, /*with_transfers=*/true);
  EXPECT_TRUE(absl::StrContains(full, "rA0.0<0")) << full;
  EXPECT_TRUE(absl::StrContains(full, "sync0")) << full;
  GridOptions truncated;
  truncated.max_ranks = 1;
  truncated.max_columns = 1;
  EXPECT_EQ(FormatGrid(s, truncated), "rank 0 | F0.0 ... (+1)\n... 1 more ranks not shown\n");
  // Cells beyond the programs given (a grid drawn from the start of each program) count too.
  truncated.cells_not_given = {5};
  EXPECT_EQ(FormatGrid(s, truncated), "rank 0 | F0.0 ... (+6)\n... 1 more ranks not shown\n");
}

TEST(ScheduleTest, JsonRoundTrip) {
  Schedule s = TinySchedule();
  nlohmann::json j = ToJson(s);
  auto back = ScheduleFromJson(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
}

// tandem schedule --output streams the JSON (at p=1024, m=4096: 0.9 GB, and 5 GB of memory
// as an nlohmann::json): byte for byte what ToJson(...).dump() writes.
TEST(ScheduleTest, StreamedJsonIsTheDump) {
  std::vector<Schedule> schedules = {TinySchedule()};
  ScheduleSpec dualpipe;
  dualpipe.kind = ScheduleKind::kDualPipe;
  dualpipe.num_ranks = 4;
  dualpipe.num_microbatches = 8;
  ScheduleSpec zbv = dualpipe;
  zbv.kind = ScheduleKind::kZBV;
  zbv.planning_costs = {4, 5, 3};
  for (const ScheduleSpec& spec : {dualpipe, zbv}) {
    auto generated = GenerateSchedule(spec);
    ASSERT_TRUE(generated.ok()) << generated.status();
    schedules.push_back(*std::move(generated));
  }
  const std::string path = ::testing::TempDir() + "/streamed_schedule.json";
  for (const Schedule& s : schedules) {
    auto file = AtomicFileWriter::Open(path);
    ASSERT_TRUE(file.ok());
    WriteScheduleJson(s, *file);
    ASSERT_TRUE(file->Commit().ok());
    EXPECT_EQ(ReadFile(path).value_or(""), ToJson(s).dump()) << ScheduleKindName(s.spec.kind);
  }
  std::remove(path.c_str());
}

TEST(ScheduleTest, JsonErrorsNameTheField) {
  nlohmann::json j = ToJson(TinySchedule());
  {
    nlohmann::json bad = j;
    bad["spec"]["name"] = "nope";
    auto r = ScheduleFromJson(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "schedule.spec.name")) << r.status();
  }
  {
    nlohmann::json bad = j;
    bad["programs"][1][2] = "F7.0";  // stage out of range
    auto r = ScheduleFromJson(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "programs[1][2]")) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "stage")) << r.status();
  }
  {
    nlohmann::json bad = j;
    bad["placement"]["stage_to_rank"][0][1] = 5;
    auto r = ScheduleFromJson(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "stage_to_rank[0][1]")) << r.status();
  }
  {
    nlohmann::json bad = j;
    bad["programs"].erase(1);
    auto r = ScheduleFromJson(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "expected 2 programs")) << r.status();
  }
  {
    nlohmann::json bad = j;
    bad["spec"]["num_microbatches"] = 0;
    auto r = ScheduleFromJson(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "microbatches")) << r.status();
  }
}

}  // namespace
}  // namespace tandem::pipeline
