#include "pipeline/generators.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"
#include "tests/pipeline/test_util.h"

namespace tandem::pipeline {
namespace {

using testing::Spec;

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
      if (p % 2 == 0 && m % 2 == 0 && m >= 2 * p) ExpectValid(Spec(ScheduleKind::kDualPipe, p, m));
      if (m >= 2 * p) ExpectValid(Spec(ScheduleKind::kDualPipeV, p, m));
    }
  }
}

// Makespan of a schedule with uniform costs of one stage (a chunk takes its share).
double Makespan(const Schedule& schedule, double forward, double backward, double weight) {
  auto result = Simulate(schedule, CostModel::Uniform(schedule.spec, forward, backward, weight));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->makespan_seconds : -1;
}

TEST(GeneratorsTest, DualPipeFollowsDeepSeeksSteps) {
  // p=4 (two rank pairs), m=8 (4 per direction): rank 0 is the first stage of the downward
  // pipeline (replica 0, micro-batches 0-3) and the last of the upward one (replica 1, 4-7).
  auto schedule = GenerateDualPipe(4, 8);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(schedule->placement, Placement::Bidirectional(4));
  // h=0: 2 warm-up F0, then F0 F1, step 3 once (B1 split, its W at once, F1), main step
  // 4-4+0+1 = 1 round (F0 B1 F1 B0), step 5 once (B1 F1 B0), step 6 once (B1 whole, then B0
  // split: h even), step 7 once (the deferred W, B0 split), step 8 (the last W).
  EXPECT_EQ(ComputeString(*schedule, 0),
            "F0.0 F0.1 F0.2 F3.4r1 Bi3.4r1 W3.4r1 F3.5r1 F0.3 B3.5r1 F3.6r1 B0.0 "
            "B3.6r1 F3.7r1 B0.1 B3.7r1 Bi0.2 W0.2 Bi0.3 W0.3");
}

TEST(GeneratorsTest, DualPipeConstraintsAreCheckedUpFront) {
  EXPECT_TRUE(absl::StrContains(GenerateDualPipe(3, 12).status().message(),
                                "even number of ranks, got 3"));
  EXPECT_TRUE(absl::StrContains(GenerateDualPipe(4, 6).status().message(), "at least"));
  EXPECT_TRUE(absl::StrContains(GenerateDualPipe(4, 9).status().message(), "even number"));
  EXPECT_TRUE(absl::StrContains(GenerateDualPipeV(4, 7).status().message(), "at least"));
  EXPECT_TRUE(GenerateDualPipeV(1, 2).ok());
}

// The DualPipe README's bubble, (PP/2 - 1)(F&B + B - 3W) with PP pipeline stages, F, B and W
// the times of one chunk and F&B = F + B here (tandem does not overlap the pair), on top of
// the work: DualPipe's PP ranks each run m/2 micro-batches through each of two full stages,
// DualPipeV's PP/2 ranks m micro-batches through two half stages. With F=1, Bi=2, W=1 (B=3)
// the makespan is exactly that; other costs let the simulated order do better than the
// formula (it counts the worst cell of a step for every step), never worse. Both are shorter
// than 1F1B on the same ranks.
TEST(GeneratorsTest, DualPipeMakespansAreTheReadmesBubble) {
  struct Costs {
    double forward, backward_input, weight;
    bool exact;
  };
  for (Costs c : {Costs{1, 2, 1, true}, Costs{2, 4, 2, true}, Costs{1, 1, 1, false},
                  Costs{2, 3, 1, false}, Costs{1, 1, 0.5, false}}) {
    const double full_backward = c.backward_input + c.weight;
    const double pair_bubble = c.forward + full_backward + full_backward - 3 * c.weight;
    for (int p : {2, 4, 6, 8, 16}) {
      for (int m : {2 * p, 2 * p + 2, 4 * p, 6 * p}) {
        SCOPED_TRACE(absl::StrCat("p=", p, " m=", m, " F=", c.forward, " B=", full_backward,
                                  " W=", c.weight));
        auto dual = GenerateDualPipe(p, m);
        ASSERT_TRUE(dual.ok()) << dual.status();
        const double dual_oracle = m * (c.forward + full_backward) + (p / 2.0 - 1) * pair_bubble;
        const double dual_makespan = Makespan(*dual, c.forward, c.backward_input, c.weight);
        // DualPipeV on p ranks: 2p stages of half a stage each, so the chunk costs given here
        // are the halves of the per-stage costs the cost model takes.
        auto v = GenerateDualPipeV(p, m);
        ASSERT_TRUE(v.ok()) << v.status();
        const double v_oracle = 2 * m * (c.forward + full_backward) + (p - 1.0) * pair_bubble;
        const double v_makespan =
            Makespan(*v, 2 * c.forward, 2 * c.backward_input, 2 * c.weight);
        if (c.exact) {
          EXPECT_DOUBLE_EQ(dual_makespan, dual_oracle);
          EXPECT_DOUBLE_EQ(v_makespan, v_oracle);
        } else {
          EXPECT_LE(dual_makespan, dual_oracle);
          EXPECT_LE(v_makespan, v_oracle);
        }
        auto one_f_one_b = Generate1F1B(p, m);
        ASSERT_TRUE(one_f_one_b.ok());
        EXPECT_LT(dual_makespan, Makespan(*one_f_one_b, c.forward, c.backward_input, c.weight));
      }
    }
  }
}

// Memory as the README's table says: DualPipe holds two stages' parameters per rank (both
// replicas) and at most PP + 1 stashed micro-batches of a stage's activations; DualPipeV
// the same counted in its stages (2p chunks of half a stage: PP + 1 chunks = p + 1/2 stages).
TEST(GeneratorsTest, DualPipeHoldsTwoCopiesAndPPPlusOneActivations) {
  for (int p : {2, 4, 8, 16}) {
    SCOPED_TRACE(absl::StrCat("p=", p));
    auto dual = GenerateDualPipe(p, 4 * p);
    ASSERT_TRUE(dual.ok()) << dual.status();
    auto v = GenerateDualPipeV(p, 4 * p);
    ASSERT_TRUE(v.ok()) << v.status();
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(dual->placement.StagesOf(r).size(), 2u);  // a stage of each replica: 2x
      EXPECT_EQ(v->placement.StagesOf(r).size(), 2u);     // two half stages: 1x
    }
    auto dual_run = Simulate(*dual, CostModel::Uniform(dual->spec, 1, 1, 1));
    auto v_run = Simulate(*v, CostModel::Uniform(v->spec, 1, 1, 1));
    ASSERT_TRUE(dual_run.ok() && v_run.ok());
    double dual_peak = 0, v_peak = 0;
    for (double a : dual_run->peak_activations) dual_peak = std::max(dual_peak, a);
    for (double a : v_run->peak_activations) v_peak = std::max(v_peak, a);
    EXPECT_EQ(dual_peak, p + 1);
    // In stage units (a chunk counts 1/2): (2p + 1) chunks at most.
    EXPECT_LE(v_peak, (2 * p + 1) / 2.0);
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
      {Spec(ScheduleKind::kGPipe, 4, 0), "microbatches must be in [1, 32768], got 0"},
      {Spec(ScheduleKind::kInterleaved, 4, 8, 0), "chunks must be in [1, 64], got 0"},
      {Spec(ScheduleKind::kHanayo, 4, 8, 1, 0), "waves must be in [1, 64], got 0"},
      {Spec(ScheduleKind::k1F1B, 4, 8, 2), "1f1b: chunks apply only to interleaved"},
      {Spec(ScheduleKind::kInterleaved, 4, 8, 2, 2), "waves apply only to hanayo"},
      {Spec(ScheduleKind::kZBV, 4, 8, 3), "zb-v always uses 2 chunks per rank"},
      {Spec(ScheduleKind::k1F1B, 16384, 32768), "schedule too large"},
      {Spec(ScheduleKind::kInterleaved, 16384, 4, 4),
       "16384 ranks x 4 chunks per rank is 65536 stages (at most 32768)"},
  };
  for (const Case& c : cases) {
    auto s = GenerateSchedule(c.spec);
    ASSERT_FALSE(s.ok()) << c.message;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.status().message(), c.message))
        << s.status() << " expected " << c.message;
  }
}

TEST(GeneratorsTest, CompleteScheduleNamesOrdersThatCannotRun) {
  // Two ranks, stages 0 and 1, one micro-batch. Rank 1 runs its backward before its forward:
  // that backward waits for the forward behind it on its own rank, and rank 0's backward for
  // its gradient. The first rank that cannot go on is named.
  ScheduleSpec spec = Spec(ScheduleKind::k1F1B, 2, 1);
  auto compute = [](ActionType type, int stage) { return Action(type, stage, 0); };
  std::vector<std::vector<Action>> orders = {
      {compute(ActionType::kForward, 0), compute(ActionType::kBackward, 0)},
      {compute(ActionType::kBackward, 1), compute(ActionType::kForward, 1)}};
  auto s = CompleteSchedule(spec, Placement::Linear(2), orders);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.status().message(),
                                "compute orders cannot run: rank 0 step 1 (B0.0) waits for an input"))
      << s.status();
  // In the right order the same computes complete into a valid schedule.
  std::swap(orders[1][0], orders[1][1]);
  auto good = CompleteSchedule(spec, Placement::Linear(2), orders);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(ValidateSchedule(*good).ok());
}

TEST(GeneratorsTest, GeneratedSchedulesRoundTripThroughJson) {
  for (const ScheduleSpec& spec :
       {Spec(ScheduleKind::kGPipe, 3, 4), Spec(ScheduleKind::kInterleaved, 4, 8, 2),
        Spec(ScheduleKind::kChimera, 4, 8), Spec(ScheduleKind::kHanayo, 4, 8, 1, 2),
        Spec(ScheduleKind::kZBH1, 4, 8), Spec(ScheduleKind::kZBV, 4, 8),
        [] {
          ScheduleSpec planned = Spec(ScheduleKind::kZBV, 4, 8);
          planned.planning_costs = {10, 12, 8};
          return planned;
        }()}) {
    auto s = GenerateSchedule(spec);
    ASSERT_TRUE(s.ok());
    auto back = ScheduleFromJson(nlohmann::json::parse(ToJson(*s).dump()));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, *s) << ScheduleKindName(spec.kind);
    EXPECT_TRUE(ValidateSchedule(*back).ok());
  }
}

// ZB-V planned with the costs it runs with: where a weight gradient is cheaper than an input
// gradient (as measured on CPUs: F 1, Bi 1.15, W 0.8), the nominal order leaves waits that a
// planned order avoids; with equal costs the planned order is the nominal one.
TEST(GeneratorsTest, ZeroBubbleVPlannedWithItsCostsIsShorter) {
  for (int p : {2, 4, 8}) {
    ScheduleSpec nominal = Spec(ScheduleKind::kZBV, p, 4 * p);
    ScheduleSpec planned = nominal;
    planned.planning_costs = {100, 115, 80};
    auto a = GenerateSchedule(nominal);
    auto b = GenerateSchedule(planned);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status();
    ASSERT_TRUE(ValidateSchedule(*b).ok());
    EXPECT_EQ(b->spec.planning_costs, planned.planning_costs);
    const CostModel costs = CostModel::Uniform(nominal, 1.0, 1.15, 0.8);
    auto ta = Simulate(*a, costs);
    auto tb = Simulate(*b, costs);
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_LT(tb->makespan_seconds, ta->makespan_seconds * 0.99) << "p=" << p;
    std::printf("zb-v p=%d m=%d: nominal order %.3f, planned %.3f (%.1f%% shorter)\n", p, 4 * p,
                ta->makespan_seconds, tb->makespan_seconds,
                100.0 * (1.0 - tb->makespan_seconds / ta->makespan_seconds));
    // Equal planning costs: the same programs as the nominal ones.
    ScheduleSpec equal = nominal;
    equal.planning_costs = {7, 7, 7};
    auto c = GenerateSchedule(equal);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->programs, a->programs) << "p=" << p;
  }
  // Bad costs, and costs for a schedule with a fixed order.
  ScheduleSpec bad = Spec(ScheduleKind::kZBV, 2, 4);
  bad.planning_costs = {1, 0, 1};
  EXPECT_FALSE(GenerateSchedule(bad).ok());
  bad.planning_costs = {1, 1, kMaxPlanningCost + 1};
  EXPECT_FALSE(GenerateSchedule(bad).ok());
  ScheduleSpec fixed = Spec(ScheduleKind::kZBH1, 2, 4);
  fixed.planning_costs = {1, 1, 1};
  auto refused = GenerateSchedule(fixed);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "zb-v only")) << refused.status();
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

// Chimera against the paper (Li & Hoefler, SC'21): with equal forward and backward costs
// the bidirectional schedule of N micro-batches on D stages (N a multiple of D, basic units
// concatenated) takes 2N + D - 2 slots, D - 2 of them bubbles; with F = 1 and B = 2 the same
// D - 2 bubbles of one backward each give 3N + 2(D - 2).
TEST(GeneratorsTest, ChimeraIsNeverLongerThanThePapersSchedule) {
  for (int d : {4, 8, 16, 32}) {
    for (int n : {d, 2 * d, 4 * d}) {
      SCOPED_TRACE(absl::StrCat("chimera D=", d, " N=", n));
      auto schedule = GenerateChimera(d, n);
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      EXPECT_TRUE(ValidateSchedule(*schedule).ok());
      ValidationOptions strict;
      strict.grouped_rendezvous = true;
      EXPECT_TRUE(ValidateSchedule(*schedule, strict).ok());
      auto equal = Simulate(*schedule, CostModel::Uniform(schedule->spec, 1.0, 1.0));
      auto double_backward = Simulate(*schedule, CostModel::Uniform(schedule->spec, 1.0, 2.0));
      ASSERT_TRUE(equal.ok() && double_backward.ok());
      std::printf("chimera D=%d N=%d: F=B=1 %.0f (paper %d), F=1 B=2 %.0f (paper %d)\n", d, n,
                  equal->makespan_seconds, 2 * n + d - 2, double_backward->makespan_seconds,
                  3 * n + 2 * (d - 2));
      EXPECT_LE(equal->makespan_seconds, 2 * n + d - 2);
      EXPECT_LE(double_backward->makespan_seconds, 3 * n + 2 * (d - 2));
    }
  }
}

// ---- Golden digests ------------------------------------------------------------------------
//
// Pins the generators' output: a digest of every program (and the placement) for a grid of
// specs, captured from the implementation before its speed-ups. A change in any action of any
// rank changes the digest; a generator whose schedules change on purpose updates its rows here
// and says why in its commit.


struct Golden {
  const char* kind;
  int p, m, extra;  // extra: chunks (interleaved) or waves (hanayo)
  uint64_t digest;
};

ScheduleSpec SpecOf(const Golden& g) {
  ScheduleSpec spec;
  spec.kind = *ParseScheduleKind(g.kind);
  spec.num_ranks = g.p;
  spec.num_microbatches = g.m;
  if (spec.kind == ScheduleKind::kInterleaved) spec.chunks = g.extra;
  if (spec.kind == ScheduleKind::kHanayo) spec.waves = g.extra;
  return spec;
}

// clang-format off
const Golden kGolden[] = {
    {"gpipe", 1, 1, 1, 0xc16f204bef421927ull},
    {"1f1b", 1, 1, 1, 0xc16f204bef421927ull},
    {"zb-h1", 1, 1, 1, 0xaaaa884702f1ccfeull},
    {"zb-v", 1, 1, 1, 0xcb39d0a856266a03ull},
    {"interleaved", 1, 1, 2, 0xdc92b17b8e2e3dacull},
    {"interleaved", 1, 1, 3, 0x200a63c0fa402b0aull},
    {"hanayo", 1, 1, 1, 0xdc92b17b8e2e3dacull},
    {"hanayo", 1, 1, 2, 0xc1e4b7e80b980387ull},
    {"gpipe", 2, 3, 1, 0x9d34db8d3881fc7bull},
    {"1f1b", 2, 3, 1, 0x6075aa651fff61dbull},
    {"zb-h1", 2, 3, 1, 0x674b9754be740f9aull},
    {"zb-v", 2, 3, 1, 0x0c93cbfa1a540c8bull},
    {"interleaved", 2, 3, 2, 0x529dc752a51c461bull},
    {"interleaved", 2, 3, 3, 0x1bc459314b524febull},
    {"hanayo", 2, 3, 1, 0xb15c6e965a7da16bull},
    {"hanayo", 2, 3, 2, 0x0dc63857559f65fbull},
    {"gpipe", 4, 8, 1, 0xefe44c3c6cb7ed9bull},
    {"1f1b", 4, 8, 1, 0x61f836386bd2c57bull},
    {"zb-h1", 4, 8, 1, 0x0188be8477409b7bull},
    {"zb-v", 4, 8, 1, 0xfdbd93fb4afa619bull},
    {"interleaved", 4, 8, 2, 0x508f89c47f06379bull},
    {"interleaved", 4, 8, 3, 0x5b2479a09eb2c4cbull},
    {"hanayo", 4, 8, 1, 0xedf1b6760b4a559bull},
    {"hanayo", 4, 8, 2, 0x6d8f0a478f69967bull},
    {"chimera", 4, 8, 1, 0x6e4d90c931ebf233ull},
    {"gpipe", 5, 7, 1, 0xd9a6dc55a6b507dfull},
    {"1f1b", 5, 7, 1, 0xca51c8e422cd805full},
    {"zb-h1", 5, 7, 1, 0xeae826fa59e495dbull},
    {"zb-v", 5, 7, 1, 0x268a70771bc17e9full},
    {"interleaved", 5, 7, 2, 0x9cbdb8cf60d4ea3cull},
    {"interleaved", 5, 7, 3, 0xc3b74fe3a69515daull},
    {"hanayo", 5, 7, 1, 0x25ec07881a08b9ccull},
    {"hanayo", 5, 7, 2, 0xf8eab812327e1737ull},
    {"gpipe", 6, 12, 1, 0x5a2375ceb66eb26bull},
    {"1f1b", 6, 12, 1, 0x979c43bfdc514debull},
    {"zb-h1", 6, 12, 1, 0x5400adf56a186bfbull},
    {"zb-v", 6, 12, 1, 0x4b57a0ddad2a20dbull},
    {"interleaved", 6, 12, 2, 0x36763b866346168bull},
    {"interleaved", 6, 12, 3, 0xb744e9ef0972004bull},
    {"hanayo", 6, 12, 1, 0x6f4bfe18460cfa7bull},
    {"hanayo", 6, 12, 2, 0x06ac71202b36120bull},
    {"chimera", 6, 12, 1, 0x6e2d43fc49847fd3ull},
    {"gpipe", 8, 32, 1, 0x8209aa17fd3edffbull},
    {"1f1b", 8, 32, 1, 0xd25a6de3873f185bull},
    {"zb-h1", 8, 32, 1, 0x7b9b9adcf252bd9bull},
    {"zb-v", 8, 32, 1, 0xaf9352354b32a44bull},
    {"interleaved", 8, 32, 2, 0x96a30de1d3964febull},
    {"interleaved", 8, 32, 3, 0xcb3ab515cfe3f253ull},
    {"hanayo", 8, 32, 1, 0x2201bab27786db6bull},
    {"hanayo", 8, 32, 2, 0x93198a24a4423373ull},
    {"chimera", 8, 32, 1, 0xedf06f735cb138f3ull},
    {"gpipe", 16, 48, 1, 0x247feadf4e841893ull},
    {"1f1b", 16, 48, 1, 0x19f82e6bdd8af2d3ull},
    {"zb-h1", 16, 48, 1, 0x24b579d7c7628bd3ull},
    {"zb-v", 16, 48, 1, 0xed36172de83458cbull},
    {"interleaved", 16, 48, 2, 0x924f673f308f4177ull},
    {"interleaved", 16, 48, 3, 0xa0cb30e3606a6cbbull},
    {"hanayo", 16, 48, 1, 0x3716ecba400bc74bull},
    {"hanayo", 16, 48, 2, 0x726ef2506f97f6a3ull},
    {"chimera", 16, 48, 1, 0xd82c33836148db13ull},
    {"gpipe", 32, 128, 1, 0x2e001ab3969c4b43ull},
    {"1f1b", 32, 128, 1, 0xae08126e14edcd63ull},
    {"zb-h1", 32, 128, 1, 0xcc058b86fe10ca83ull},
    {"zb-v", 32, 128, 1, 0xc2506592f1913757ull},
    {"interleaved", 32, 128, 2, 0x100d719b93a11a17ull},
    {"interleaved", 32, 128, 3, 0xb0386db48dfe1d67ull},
    {"hanayo", 32, 128, 1, 0x9c499aa9ae290ec7ull},
    {"hanayo", 32, 128, 2, 0x1446e59ed4a30d5bull},
    {"chimera", 32, 128, 1, 0x123af29a002bbe93ull},
    {"gpipe", 64, 256, 1, 0x04087bd736d2ee6bull},
    {"1f1b", 64, 256, 1, 0xc98d5abd68eac04bull},
    {"zb-h1", 64, 256, 1, 0x83dbe907628a9b2bull},
    {"zb-v", 64, 256, 1, 0x35095c6e2a57026bull},
    {"interleaved", 64, 256, 2, 0xe473b998bbb6b87bull},
    {"interleaved", 64, 256, 3, 0x4d8571dd99d1753bull},
    {"hanayo", 64, 256, 1, 0xe959e5df090d87bbull},
    {"hanayo", 64, 256, 2, 0xff2ef5cdd766c5cbull},
    {"chimera", 64, 256, 1, 0xe00fa362a71bd38bull},
    // DualPipe(V), as first generated.
    {"dualpipe", 4, 8, 1, 0xd7a235f308f125f6ull},
    {"dualpipev", 4, 8, 1, 0xfbcc702c5e17ab57ull},
    {"dualpipe", 6, 12, 1, 0xb552c069b878b03full},
    {"dualpipev", 6, 12, 1, 0x8f5b19aad8327265ull},
    {"dualpipe", 8, 32, 1, 0xc0b2547335c74f83ull},
    {"dualpipev", 8, 32, 1, 0xc5a706cf8e265483ull},
    {"dualpipe", 16, 48, 1, 0xe476374377c86dd7ull},
    {"dualpipev", 16, 48, 1, 0xea8eb1d5d8a39e4bull},
    {"dualpipe", 32, 128, 1, 0xb681046a139f31dfull},
    {"dualpipev", 32, 128, 1, 0xed9a5ddafbab16bbull},
    {"dualpipe", 64, 256, 1, 0x3fffd926e56721efull},
    {"dualpipev", 64, 256, 1, 0x920517ef63a52eebull},
};
// clang-format on

std::vector<Golden> Grid() {
  std::vector<Golden> grid;
  const std::pair<int, int> sizes[] = {{1, 1}, {2, 3}, {4, 8}, {5, 7}, {6, 12}, {8, 32},
                                       {16, 48}, {32, 128}, {64, 256}};
  for (auto [p, m] : sizes) {
    for (const char* kind : {"gpipe", "1f1b", "zb-h1", "zb-v"}) grid.push_back({kind, p, m, 1, 0});
    for (int v : {2, 3}) grid.push_back({"interleaved", p, m, v, 0});
    for (int w : {1, 2}) grid.push_back({"hanayo", p, m, w, 0});
    if (p % 2 == 0 && m % p == 0) grid.push_back({"chimera", p, m, 1, 0});
    if (p % 2 == 0 && m % 2 == 0 && m >= 2 * p) grid.push_back({"dualpipe", p, m, 1, 0});
    if (m >= 2 * p) grid.push_back({"dualpipev", p, m, 1, 0});
  }
  return grid;
}

TEST(GeneratorsTest, ProgramsMatchTheirDigests) {
  for (const Golden& g : kGolden) {
    SCOPED_TRACE(absl::StrCat(g.kind, " p=", g.p, " m=", g.m, " extra=", g.extra));
    auto schedule = GenerateSchedule(SpecOf(g));
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    EXPECT_EQ(ScheduleDigest(*schedule), g.digest);
  }
}

// Prints the rows of kGolden: run with --gtest_also_run_disabled_tests.
TEST(GeneratorsTest, DISABLED_PrintDigests) {
  for (Golden g : Grid()) {
    auto schedule = GenerateSchedule(SpecOf(g));
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    std::printf("{\"%s\", %d, %d, %d, 0x%016" PRIx64 "ull},\n", g.kind, g.p, g.m, g.extra,
                ScheduleDigest(*schedule));
  }
}

}  // namespace
}  // namespace tandem::pipeline
