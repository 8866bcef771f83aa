#include "pipeline/validator.h"

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/validator_internal.h"
#include "tests/pipeline/test_util.h"

namespace tandem::pipeline {
namespace {

using testing::ForEditedSchedules;
using testing::Parse;

Schedule TwoStages(const std::vector<std::string>& lines, int m = 1) {
  return Parse(ScheduleKind::kGPipe, m, Placement::Linear(2), lines);
}

void ExpectError(const Schedule& s, const std::string& expected,
                 const ValidationOptions& options = {}) {
  absl::Status status = ValidateSchedule(s, options);
  ASSERT_FALSE(status.ok()) << "expected: " << expected;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), expected))
      << "got: " << status.message() << "\nexpected to contain: " << expected;
}

TEST(ValidatorTest, AcceptsAHandWrittenPipeline) {
  Schedule s = TwoStages({"F0.0 sA0.0>1 rG1.0<1 B0.0 sync0 step",
                          "rA0.0<0 F1.0 B1.0 sync1 sG1.0>0 step"});
  EXPECT_TRUE(ValidateSchedule(s).ok()) << ValidateSchedule(s);
}

TEST(ValidatorTest, MissingBackward) {
  ExpectError(TwoStages({"F0.0 sA0.0>1 rG1.0<1 sync0 step",
                         "rA0.0<0 F1.0 B1.0 sync1 sG1.0>0 step"}),
              "rank 0 step 3 (sync0): gradient sync before B0.0");
  // Without the sync the optimizer step is the first to notice.
  ExpectError(TwoStages({"F0.0 sA0.0>1 rG1.0<1 step", "rA0.0<0 F1.0 B1.0 sync1 sG1.0>0 step"}),
              "rank 0 step 3 (step): optimizer step before the gradient sync of stage 0");
}

TEST(ValidatorTest, CrossedSends) {
  ExpectError(TwoStages({"F0.0 sA0.0>1 F0.1 sA0.1>1 rG1.0<1 B0.0 rG1.1<1 B0.1 sync0 step",
                         "rA0.1<0 rA0.0<0 F1.0 B1.0 sG1.0>0 F1.1 B1.1 sG1.1>0 sync1 step"},
                        /*m=*/2),
              "rank 1 step 0 (rA0.1<0): does not match the peer's next send sA0.0>1 (rank 0 "
              "step 1)");
}

TEST(ValidatorTest, Deadlock) {
  // Rank 0 waits for a gradient before sending the activation rank 1 waits for.
  ExpectError(TwoStages({"F0.0 rG1.0<1 sA0.0>1 B0.0 sync0 step",
                         "rA0.0<0 F1.0 B1.0 sG1.0>0 sync1 step"}),
              "rank 0 step 1 (rG1.0<1): deadlock: waiting for a send that never comes; rank 1 "
              "waits at step 0 (rA0.0<0)");
}

TEST(ValidatorTest, DependencyAndPlacementErrors) {
  ExpectError(TwoStages({"F0.0 sA0.0>1 rG1.0<1 B0.0 sync0 step",
                         "F1.0 rA0.0<0 B1.0 sync1 sG1.0>0 step"}),
              "rank 1 step 0 (F1.0): needs the activation of stage 0 for micro-batch 0, not "
              "received yet");
  ExpectError(TwoStages({"F1.0 step", "step"}), "rank 0 step 0 (F1.0): stage 1 (replica 0) is "
                                                "placed on rank 1");
  ExpectError(TwoStages({"F0.0 sA0.0>0 step", "step"}),
              "rank 0 step 1 (sA0.0>0): peer should be rank 1");
  ExpectError(TwoStages({"F0.0 sA0.0>1 F0.0 step", "step"}), "forward runs twice");
  ExpectError(TwoStages({"F0.0 sA0.0>1 rG1.0<1 B0.0 sync0 step sync0",
                         "rA0.0<0 F1.0 B1.0 sync1 sG1.0>0 step"}),
              "optimizer step must be the last action");
}

TEST(ValidatorTest, UnreceivedSend) {
  ExpectError(TwoStages({"F0.0 sA0.0>1 sA0.0>1 rG1.0<1 B0.0 sync0 step",
                         "rA0.0<0 F1.0 B1.0 sync1 sG1.0>0 step"}),
              "activation sent twice");
  ExpectError(TwoStages({"F0.0 sA0.0>1 B0.0 sync0 step", "step"}),
              "needs the gradient from stage 1 for micro-batch 0, not received yet");
}

TEST(ValidatorTest, SplitBackwardNeedsBiAndWOrAWholeB) {
  Schedule s = Parse(ScheduleKind::kZBH1, 1, Placement::Linear(1), {"F0.0 Bi0.0 sync0 step"});
  ExpectError(s, "gradient sync before W0.0");
  s = Parse(ScheduleKind::kZBH1, 1, Placement::Linear(1), {"F0.0 Bi0.0 W0.0 sync0 step"});
  EXPECT_TRUE(ValidateSchedule(s).ok());
  // A whole B (DualPipe runs some so) is its Bi and W at once: valid, and no W may follow.
  s = Parse(ScheduleKind::kZBH1, 1, Placement::Linear(1), {"F0.0 B0.0 sync0 step"});
  EXPECT_TRUE(ValidateSchedule(s).ok());
  s = Parse(ScheduleKind::kZBH1, 1, Placement::Linear(1), {"F0.0 B0.0 W0.0 sync0 step"});
  ExpectError(s, "weight gradient runs twice");
  // A schedule that does not split backward still refuses Bi and W.
  s = Parse(ScheduleKind::k1F1B, 1, Placement::Linear(1), {"F0.0 Bi0.0 W0.0 sync0 step"});
  ExpectError(s, "this schedule does not split backward");
}

TEST(ValidatorTest, ChimeraMicroBatchOnOneReplica) {
  Schedule s = Parse(ScheduleKind::kChimera, 1, Placement::Bidirectional(2),
                     {"F0.0 sA0.0>1 F1.0r1 step", "step"});
  ExpectError(s, "micro-batch 0 is run by replicas 0 and 1");
}

TEST(ValidatorTest, GroupedRendezvousIsStricter) {
  // Rank 0 sends activation 1 and computes before receiving gradient 0; rank 1 sends gradient
  // 0 and computes before receiving activation 1. Fine with buffered sends; with sends that
  // wait for their receive, each waits for the other.
  Schedule s = Parse(
      ScheduleKind::kZBH1, 3, Placement::Linear(2),
      {"F0.0 sA0.0>1 F0.1 sA0.1>1 F0.2 sA0.2>1 rG1.0<1 Bi0.0 W0.0 rG1.1<1 Bi0.1 W0.1 rG1.2<1 "
       "Bi0.2 W0.2 sync0 step",
       "rA0.0<0 F1.0 Bi1.0 sG1.0>0 W1.0 rA0.1<0 F1.1 Bi1.1 sG1.1>0 W1.1 rA0.2<0 F1.2 Bi1.2 "
       "sG1.2>0 W1.2 sync1 step"});
  EXPECT_TRUE(ValidateSchedule(s).ok()) << ValidateSchedule(s);
  ValidationOptions strict;
  strict.grouped_rendezvous = true;
  ExpectError(s,
              "rank 0 step 3 (sA0.1>1): deadlock: waiting for a receive that never comes; rank "
              "1 waits at step 3 (sG1.0>0)",
              strict);
}

TEST(ValidatorTest, GroupedRunsMatchTogether) {
  // Rank 0 posts its send and the receive for its next compute as one group.
  Schedule s = TwoStages({"F0.0 sA0.0>1 rG1.0<1 B0.0 sync0 step",
                          "rA0.0<0 F1.0 B1.0 sync1 sG1.0>0 step"});
  ValidationOptions strict;
  strict.grouped_rendezvous = true;
  EXPECT_TRUE(ValidateSchedule(s, strict).ok()) << ValidateSchedule(s, strict);
}

TEST(ValidatorTest, CompleteScheduleRejectsOrdersThatCannotRun) {
  ScheduleSpec spec;
  spec.kind = ScheduleKind::kGPipe;
  spec.num_ranks = 2;
  spec.num_microbatches = 2;
  // Rank 1 runs micro-batch 1 first; rank 0 does all backwards before its second forward.
  auto parse = [](const std::string& line) {
    std::vector<Action> out;
    for (absl::string_view t : absl::StrSplit(line, ' ')) out.push_back(*ParseAction(t));
    return out;
  };
  auto bad = CompleteSchedule(spec, Placement::Linear(2),
                              {parse("F0.0 B0.0 F0.1 B0.1"), parse("F1.1 B1.1 F1.0 B1.0")});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "rank 0 step 1 (B0.0)")) << bad.status();
  auto good = CompleteSchedule(spec, Placement::Linear(2),
                               {parse("F0.0 F0.1 B0.0 B0.1"), parse("F1.0 B1.0 F1.1 B1.1")});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(ValidateSchedule(*good).ok());
  // Receives are posted once the data exists in the nominal timeline (rA0.1 before B1.0),
  // sends follow their compute, syncs follow the stage's last backward.
  EXPECT_EQ(FormatGrid(*good, true),
            "rank 0 | F0.0    sA0.0>1 F0.1    sA0.1>1 rG1.0<1 B0.0    rG1.1<1 B0.1    sync0   "
            "step\n"
            "rank 1 | rA0.0<0 F1.0    rA0.1<0 B1.0    sG1.0>0 F1.1    B1.1    sync1   sG1.1>0 "
            "step\n");
}

// ValidateSchedule proves most schedules valid in two quick passes and runs the reference
// execution only when that fails, so on any schedule both must give the same status (and the
// proof must never accept what the reference rejects). Random edits of generated schedules
// of every kind, in both modes.
TEST(ValidatorTest, QuickProofAgreesWithTheReferenceExecution) {
  std::vector<ScheduleSpec> specs;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZBH1,
                            ScheduleKind::kZBV, ScheduleKind::kInterleaved,
                            ScheduleKind::kHanayo, ScheduleKind::kChimera}) {
    for (auto [p, m] : {std::pair{2, 4}, std::pair{3, 3}, std::pair{4, 8}}) {
      if (kind == ScheduleKind::kChimera && (p % 2 != 0 || m % p != 0)) continue;
      ScheduleSpec spec;
      spec.kind = kind;
      spec.num_ranks = p;
      spec.num_microbatches = m;
      if (kind == ScheduleKind::kInterleaved) spec.chunks = 2;
      specs.push_back(spec);
    }
  }
  std::mt19937 rng(20240611);
  int rejected = 0, checked = 0;
  ForEditedSchedules(specs, 3000, 10, &rng, [&](const ScheduleSpec& spec, const Schedule& s) {
    for (bool grouped : {false, true}) {
      ValidationOptions options;
      options.grouped_rendezvous = grouped;
      const absl::Status reference = internal::ValidateScheduleByExecution(s, options);
      EXPECT_EQ(ValidateSchedule(s, options), reference)
          << ScheduleKindName(spec.kind) << " p=" << spec.num_ranks
          << " m=" << spec.num_microbatches << " grouped=" << grouped << "\n"
          << FormatGrid(s, true);
      rejected += !reference.ok();
      ++checked;
    }
  });
  // Most edits break a schedule; unedited ones and some edits (independent actions swapped)
  // do not.
  EXPECT_GT(rejected, checked / 2);
  EXPECT_LT(rejected, checked);
}

}  // namespace
}  // namespace tandem::pipeline
