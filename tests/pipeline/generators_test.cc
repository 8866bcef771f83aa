#include "pipeline/generators.h"

#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"

namespace tandem::pipeline {
namespace {

ScheduleSpec Spec(ScheduleKind kind, int p, int m, int chunks = 1, int waves = 1) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.num_ranks = p;
  spec.num_microbatches = m;
  spec.chunks = chunks;
  spec.waves = waves;
  return spec;
}

// Compute actions of a rank, as a compact string ("F0.0 F0.1 B0.0 ...").
std::string ComputeString(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.programs[rank]) {
    if (!IsCompute(a.type)) continue;
    if (!out.empty()) out += " ";
    out += ToString(a);
  }
  return out;
}

void ExpectValid(const ScheduleSpec& spec) {
  SCOPED_TRACE(absl::StrCat(ScheduleKindName(spec.kind), " p=", spec.num_ranks,
                            " m=", spec.num_microbatches, " v=", spec.chunks,
                            " W=", spec.waves));
  auto schedule = GenerateSchedule(spec);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(schedule->placement.num_stages, schedule->spec.NumStages());
  absl::Status plain = ValidateSchedule(*schedule);
  EXPECT_TRUE(plain.ok()) << plain;
  ValidationOptions strict;
  strict.grouped_rendezvous = true;
  absl::Status grouped = ValidateSchedule(*schedule, strict);
  EXPECT_TRUE(grouped.ok()) << grouped;
}

TEST(GeneratorsTest, EveryGeneratorPassesTheValidatorOverAGrid) {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (int m : {1, 2, 3, 4, 5, 7, 8, 12, 16}) {
      ExpectValid(Spec(ScheduleKind::kGPipe, p, m));
      ExpectValid(Spec(ScheduleKind::k1F1B, p, m));
      ExpectValid(Spec(ScheduleKind::kZBH1, p, m));
      ExpectValid(Spec(ScheduleKind::kZBV, p, m));
      for (int v : {1, 2, 3, 4}) ExpectValid(Spec(ScheduleKind::kInterleaved, p, m, v));
      for (int w : {1, 2, 3}) ExpectValid(Spec(ScheduleKind::kHanayo, p, m, 1, w));
      if (p % 2 == 0 && m % p == 0) ExpectValid(Spec(ScheduleKind::kChimera, p, m));
    }
  }
}

TEST(GeneratorsTest, OneFOneBWarmUp) {
  // Rank r runs p - r - 1 forwards before its first backward, then alternates.
  auto s = Generate1F1B(4, 6);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(ComputeString(*s, 0), "F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 B0.3 B0.4 B0.5");
  EXPECT_EQ(ComputeString(*s, 2), "F2.0 F2.1 B2.0 F2.2 B2.1 F2.3 B2.2 F2.4 B2.3 F2.5 B2.4 B2.5");
  EXPECT_EQ(ComputeString(*s, 3), "F3.0 B3.0 F3.1 B3.1 F3.2 B3.2 F3.3 B3.3 F3.4 B3.4 F3.5 B3.5");
  // Every program ends with its stage's sync and the optimizer step.
  for (int r = 0; r < 4; ++r) {
    const auto& program = s->programs[r];
    EXPECT_EQ(ToString(program.back()), "step");
  }
}

TEST(GeneratorsTest, GPipeRunsAllForwardsFirst) {
  auto s = GenerateGPipe(2, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(ComputeString(*s, 1), "F1.0 F1.1 F1.2 B1.0 B1.1 B1.2");
}

TEST(GeneratorsTest, InterleavedFollowsMegatronsTable) {
  // p=2, v=2, m=4: groups of 2 micro-batches, chunk by chunk; rank 0 warms up with
  // (p-1)*2 + (v-1)*p = 4 forwards, rank 1 with 2.
  auto s = GenerateInterleaved(2, 4, 2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->placement.stage_to_rank[0], (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(ComputeString(*s, 0),
            "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3");
  EXPECT_EQ(ComputeString(*s, 1),
            "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3");
}

TEST(GeneratorsTest, InterleavedWithAShortLastGroupStillBeats1F1B) {
  // m = 5 with p = 4: Megatron's strict alternation would wait on itself here.
  for (int m : {5, 6, 7}) {
    auto s = GenerateInterleaved(4, m, 3);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(ValidateSchedule(*s).ok());
    auto interleaved = Simulate(*s, CostModel::Uniform(s->spec, 1, 2));
    auto onef1b = Generate1F1B(4, m);
    auto baseline = Simulate(*onef1b, CostModel::Uniform(onef1b->spec, 1, 2));
    ASSERT_TRUE(interleaved.ok() && baseline.ok());
    EXPECT_NEAR(baseline->makespan_seconds, (m + 3) * 3.0, 1e-9);
    EXPECT_LT(interleaved->makespan_seconds, baseline->makespan_seconds - 1) << "m=" << m;
  }
}

TEST(GeneratorsTest, PlacementsAndReplicas) {
  auto hanayo = GenerateHanayo(3, 6, 2);
  ASSERT_TRUE(hanayo.ok());
  EXPECT_EQ(hanayo->placement.stage_to_rank[0],
            (std::vector<int>{0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0}));
  // The V turn (stages 2 and 3 on rank 2) needs no transfer.
  for (const Action& a : hanayo->programs[2]) {
    if (IsTransfer(a.type)) EXPECT_NE(a.peer, 2);
    if (a.type == ActionType::kSendActivation) EXPECT_NE(a.stage, 2);
  }
  auto zbv = GenerateZBV(3, 6);
  ASSERT_TRUE(zbv.ok());
  EXPECT_EQ(zbv->placement.stage_to_rank[0], (std::vector<int>{0, 1, 2, 2, 1, 0}));
  EXPECT_EQ(zbv->spec.chunks, 2);
  auto chimera = GenerateChimera(4, 8);
  ASSERT_TRUE(chimera.ok());
  EXPECT_EQ(chimera->placement.NumReplicas(), 2);
  // Micro-batches 0,1 and 4,5 go down (replica 0), 2,3 and 6,7 up (replica 1).
  for (const Action& a : chimera->programs[0]) {
    if (a.type != ActionType::kForward) continue;
    EXPECT_EQ(a.replica, (a.microbatch % 4) < 2 ? 0 : 1) << ToString(a);
    EXPECT_EQ(a.stage, a.replica == 0 ? 0 : 3) << ToString(a);
  }
  // Rank 0 synchronises both of its stages: stage 0 of replica 0 and stage 3 of replica 1.
  int syncs = 0;
  for (const Action& a : chimera->programs[0]) syncs += a.type == ActionType::kGradientSync;
  EXPECT_EQ(syncs, 2);
}

TEST(GeneratorsTest, ZeroBubbleH1DelaysWeightGradients) {
  auto s = GenerateZBH1(3, 4);
  ASSERT_TRUE(s.ok());
  // The last rank (r = 2) runs W of micro-batch i after Bi of i + 2.
  EXPECT_EQ(ComputeString(*s, 2),
            "F2.0 Bi2.0 F2.1 Bi2.1 F2.2 Bi2.2 W2.0 F2.3 Bi2.3 W2.1 W2.2 W2.3");
  EXPECT_EQ(ComputeString(*s, 0),
            "F0.0 F0.1 F0.2 Bi0.0 W0.0 F0.3 Bi0.1 W0.1 Bi0.2 W0.2 Bi0.3 W0.3");
}

TEST(GeneratorsTest, ConstraintsAreCheckedUpFront) {
  struct Case {
    ScheduleSpec spec;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Spec(ScheduleKind::kChimera, 3, 6), "chimera: needs an even number of ranks, got 3"},
      {Spec(ScheduleKind::kChimera, 4, 6),
       "chimera: needs micro-batches a multiple of the ranks (4), got 6"},
      {Spec(ScheduleKind::k1F1B, 0, 4), "stages (ranks) must be in [1, 16384], got 0"},
      {Spec(ScheduleKind::kGPipe, 4, 0), "microbatches must be in [1, 65536], got 0"},
      {Spec(ScheduleKind::kInterleaved, 4, 8, 0), "chunks must be in [1, 64], got 0"},
      {Spec(ScheduleKind::kHanayo, 4, 8, 1, 0), "waves must be in [1, 64], got 0"},
      {Spec(ScheduleKind::k1F1B, 4, 8, 2), "1f1b: chunks apply only to interleaved"},
      {Spec(ScheduleKind::kInterleaved, 4, 8, 2, 2), "waves apply only to hanayo"},
      {Spec(ScheduleKind::kZBV, 4, 8, 3), "zb-v always uses 2 chunks per rank"},
      {Spec(ScheduleKind::k1F1B, 16384, 65536), "schedule too large"},
  };
  for (const Case& c : cases) {
    auto s = GenerateSchedule(c.spec);
    ASSERT_FALSE(s.ok()) << c.message;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.status().message(), c.message))
        << s.status() << " expected " << c.message;
  }
}

TEST(GeneratorsTest, GeneratedSchedulesRoundTripThroughJson) {
  for (const ScheduleSpec& spec :
       {Spec(ScheduleKind::kGPipe, 3, 4), Spec(ScheduleKind::kInterleaved, 4, 8, 2),
        Spec(ScheduleKind::kChimera, 4, 8), Spec(ScheduleKind::kHanayo, 4, 8, 1, 2),
        Spec(ScheduleKind::kZBH1, 4, 8), Spec(ScheduleKind::kZBV, 4, 8)}) {
    auto s = GenerateSchedule(spec);
    ASSERT_TRUE(s.ok());
    auto back = ScheduleFromJson(nlohmann::json::parse(ToJson(*s).dump()));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, *s) << ScheduleKindName(spec.kind);
    EXPECT_TRUE(ValidateSchedule(*back).ok());
  }
}

TEST(GeneratorsTest, LargeSchedulesStayValid) {
  // One size well past the grid, to catch quadratic behaviour and index overflows early.
  for (const ScheduleSpec& spec :
       {Spec(ScheduleKind::k1F1B, 64, 256), Spec(ScheduleKind::kInterleaved, 32, 100, 3),
        Spec(ScheduleKind::kZBV, 32, 128), Spec(ScheduleKind::kHanayo, 16, 64, 1, 2),
        Spec(ScheduleKind::kChimera, 32, 128)}) {
    ExpectValid(spec);
  }
}

}  // namespace
}  // namespace tandem::pipeline
