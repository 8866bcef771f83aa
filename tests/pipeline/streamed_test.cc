// Programs handed over in chunks (pipeline/streamed.h): the validator's proof and the
// simulator must give what they give on the whole programs, wherever the hand-overs fall, and
// `tandem schedule`'s streamed statistics must equal those of the generated schedule.
#include "pipeline/streamed.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/internal/program_chunks.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"
#include "pipeline/validator_internal.h"
#include "tests/pipeline/test_util.h"

namespace tandem::pipeline {
namespace {

using internal::ProgramChunks;

using testing::Edit;
using testing::Spec;

// The spec and placement of `s` with one empty program per rank: what the streamed readers
// know before any action.
Schedule ShapeOf(const Schedule& s) {
  Schedule shape;
  shape.spec = s.spec;
  shape.placement = s.placement;
  shape.programs.resize(s.programs.size());
  return shape;
}

// Hands `s`'s programs over in random pieces: each round gives every rank between 0 and
// `most` more actions, then calls `read`, which trims what it is done with. The last round
// has every action and is complete; its chunks are returned.
ProgramChunks HandOver(const Schedule& s, std::mt19937* rng, int most,
                       const std::function<void(ProgramChunks&)>& read) {
  const int num_ranks = s.NumRanks();
  ProgramChunks chunks(num_ranks);
  std::vector<size_t> given(num_ranks, 0);
  for (;;) {
    bool left = false;
    for (int r = 0; r < num_ranks; ++r) {
      const size_t n = std::min<size_t>((*rng)() % (most + 1), s.programs[r].size() - given[r]);
      for (size_t k = 0; k < n; ++k) chunks.actions[r].push_back(s.programs[r][given[r]++]);
      left = left || given[r] < s.programs[r].size();
    }
    if (!left) break;
    read(chunks);
  }
  chunks.complete = true;
  read(chunks);
  return chunks;
}

// Whether the streamed proof accepts `s`, handed over in pieces of at most `most` actions.
bool StreamedVerdict(const Schedule& s, const ValidationOptions& options, std::mt19937* rng,
                     int most) {
  const Schedule shape = ShapeOf(s);
  auto proof = internal::StreamedProof::Create(shape, options);
  EXPECT_TRUE(proof.ok()) << proof.status();
  bool scanned = true;
  const ProgramChunks last = HandOver(s, rng, most, [&](ProgramChunks& chunks) {
    scanned = (*proof)->Continue(chunks) && scanned;
    if (chunks.Complete()) return;
    for (int r = 0; r < chunks.num_ranks(); ++r) {
      chunks.Trim(r, std::min(chunks.Available(r), (*proof)->Needed(r)));
    }
  });
  return scanned && (*proof)->Finished(last);
}

// The streamed proof accepts exactly what ValidateSchedule accepts, in both modes, on
// generated schedules and random edits of them, for hand-overs of 1 to 7 actions per rank.
TEST(StreamedTest, ProofAgreesWithTheValidator) {
  std::vector<ScheduleSpec> specs = {
      Spec(ScheduleKind::kGPipe, 3, 4),      Spec(ScheduleKind::k1F1B, 4, 8),
      Spec(ScheduleKind::kZBH1, 3, 5),       Spec(ScheduleKind::kZBV, 4, 8),
      Spec(ScheduleKind::kInterleaved, 4, 6, 2), Spec(ScheduleKind::kHanayo, 3, 6, 1, 2),
      Spec(ScheduleKind::kChimera, 4, 8),    Spec(ScheduleKind::kDualPipeV, 4, 8)};
  std::mt19937 rng(20261129);
  int rejected = 0, checked = 0;
  for (int round = 0; round < 600; ++round) {
    const ScheduleSpec& spec = specs[rng() % specs.size()];
    auto generated = GenerateSchedule(spec);
    ASSERT_TRUE(generated.ok()) << generated.status();
    Schedule s = *std::move(generated);
    const int edits = round % 5 == 0 ? 0 : 1 + static_cast<int>(rng() % 2);
    for (int e = 0; e < edits; ++e) Edit(&s, &rng);
    for (bool grouped : {false, true}) {
      ValidationOptions options;
      options.grouped_rendezvous = grouped;
      const bool valid = ValidateSchedule(s, options).ok();
      const int most = 1 + static_cast<int>(rng() % 7);
      EXPECT_EQ(StreamedVerdict(s, options, &rng, most), valid)
          << ScheduleKindName(spec.kind) << " grouped=" << grouped << " hand-overs of at most "
          << most << "\n"
          << FormatGrid(s, true);
      rejected += !valid;
      ++checked;
    }
  }
  EXPECT_GT(rejected, checked / 3);
  EXPECT_LT(rejected, checked);
  // The verdict does not depend on the size of the hand-overs.
  auto zbv = GenerateSchedule(Spec(ScheduleKind::kZBV, 4, 8));
  ASSERT_TRUE(zbv.ok());
  ValidationOptions grouped;
  grouped.grouped_rendezvous = true;
  for (int most : {1, 2, 100}) {
    EXPECT_TRUE(StreamedVerdict(*zbv, grouped, &rng, most)) << most;
  }
}

void ExpectSameResult(const SimulationResult& streamed, const SimulationResult& whole,
                      const std::string& what) {
  // Equal, not near: each rank's clock and sums are taken in program order either way.
  EXPECT_EQ(streamed.makespan_seconds, whole.makespan_seconds) << what;
  EXPECT_EQ(streamed.busy_seconds, whole.busy_seconds) << what;
  EXPECT_EQ(streamed.idle_seconds, whole.idle_seconds) << what;
  EXPECT_EQ(streamed.bubble_ratio, whole.bubble_ratio) << what;
  EXPECT_EQ(streamed.peak_activations, whole.peak_activations) << what;
  EXPECT_EQ(streamed.simulated_actions, whole.simulated_actions) << what;
}

// Costs that make every part of the simulator count: uneven stages, fractions that round,
// transfers with latency and bandwidth, gradient syncs and an optimizer step.
CostModel UnevenCosts(const ScheduleSpec& spec) {
  const int n = spec.NumStages();
  std::vector<double> forward(n), backward(n), weight(n), bytes(n);
  for (int s = 0; s < n; ++s) {
    forward[s] = 0.1 + 0.013 * s;
    backward[s] = 0.2 + 0.007 * (n - s);
    weight[s] = s % 2 == 0 ? 0.0 : 0.05;
    bytes[s] = 1e6 * (1 + s % 3);
  }
  auto costs = CostModel::FromStageCosts(spec, forward, backward, weight, bytes);
  EXPECT_TRUE(costs.ok()) << costs.status();
  costs->p2p_latency_seconds = 0.003;
  costs->p2p_bandwidth_bytes_per_second = 1e8;
  costs->grad_sync_seconds.assign(n, 0.7);
  costs->optimizer_seconds = 0.25;
  return *costs;
}

// The simulator over chunks gives Run's result on the whole programs, bit for bit, and
// reports a deadlock as Run does.
TEST(StreamedTest, SimulatorOverChunksEqualsTheWholeRun) {
  std::mt19937 rng(7);
  for (const ScheduleSpec& spec :
       {Spec(ScheduleKind::k1F1B, 4, 8), Spec(ScheduleKind::kZBV, 4, 12),
        Spec(ScheduleKind::kHanayo, 4, 8, 1, 2), Spec(ScheduleKind::kChimera, 4, 8),
        Spec(ScheduleKind::kInterleaved, 3, 7, 2), Spec(ScheduleKind::kDualPipe, 4, 8)}) {
    auto schedule = GenerateSchedule(spec);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    for (const CostModel& costs :
         {CostModel::Uniform(schedule->spec, 1, 2, 1), UnevenCosts(schedule->spec)}) {
      auto whole = Simulate(*schedule, costs);
      ASSERT_TRUE(whole.ok()) << whole.status();
      for (int most : {1, 3, 50}) {
        const Schedule shape = ShapeOf(*schedule);
        auto simulator = ScheduleSimulator::Create(shape);
        ASSERT_TRUE(simulator.ok());
        ASSERT_TRUE(simulator->Start(costs).ok());
        absl::StatusOr<SimulationResult> streamed;
        HandOver(*schedule, &rng, most, [&](ProgramChunks& chunks) {
          ASSERT_TRUE(simulator->Continue(chunks).ok());
          if (chunks.Complete()) {
            streamed = simulator->Finish(chunks);
            return;
          }
          for (int r = 0; r < chunks.num_ranks(); ++r) chunks.Trim(r, simulator->Needed(r));
        });
        ASSERT_TRUE(streamed.ok()) << streamed.status();
        ExpectSameResult(*streamed, *whole,
                         absl::StrCat(ScheduleKindName(spec.kind), " most=", most));
      }
    }
  }
  // A receive that never gets its send: the same deadlock message as Run's.
  auto schedule = GenerateSchedule(Spec(ScheduleKind::k1F1B, 2, 2));
  ASSERT_TRUE(schedule.ok());
  auto& program = schedule->programs[0];
  program.erase(std::find_if(program.begin(), program.end(), [](const Action& a) {
    return a.type == ActionType::kSendActivation;
  }));
  const CostModel costs = CostModel::Uniform(schedule->spec, 1, 2);
  auto whole = Simulate(*schedule, costs);
  ASSERT_FALSE(whole.ok());
  const Schedule shape = ShapeOf(*schedule);
  auto simulator = ScheduleSimulator::Create(shape);
  ASSERT_TRUE(simulator.ok());
  ASSERT_TRUE(simulator->Start(costs).ok());
  absl::Status finished;
  HandOver(*schedule, &rng, 2, [&](ProgramChunks& chunks) {
    ASSERT_TRUE(simulator->Continue(chunks).ok());
    if (chunks.Complete()) finished = simulator->Finish(chunks).status();
  });
  EXPECT_EQ(finished, whole.status());
}

// What `tandem schedule --format json` prints for the list-scheduled kinds: the streamed
// figures equal the whole schedule's, with the readers handed 1 to 100,000 computes at a time.
TEST(StreamedTest, StatisticsEqualTheGeneratedSchedule) {
  struct Case {
    ScheduleSpec spec;
    bool uneven;
  };
  ScheduleSpec zbv_planned = Spec(ScheduleKind::kZBV, 6, 20);
  zbv_planned.planning_costs = {2, 2, 1};
  for (const Case& c :
       {Case{Spec(ScheduleKind::kZBV, 8, 32), false}, Case{Spec(ScheduleKind::kZBV, 5, 11), true},
        Case{zbv_planned, true}, Case{Spec(ScheduleKind::kHanayo, 8, 24, 1, 2), false},
        Case{Spec(ScheduleKind::kHanayo, 5, 9), true}, Case{Spec(ScheduleKind::kChimera, 6, 18), true},
        Case{Spec(ScheduleKind::kZBV, 64, 256), false}}) {
    auto schedule = GenerateSchedule(c.spec);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    auto costs_for = [&](const ScheduleSpec& spec) -> absl::StatusOr<CostModel> {
      return c.uneven ? UnevenCosts(spec) : CostModel::Uniform(spec, 1, 2, 1);
    };
    auto whole = Simulate(*schedule, *costs_for(schedule->spec));
    ASSERT_TRUE(whole.ok()) << whole.status();
    ValidationOptions grouped;
    grouped.grouped_rendezvous = true;
    const bool grouped_ok = ValidateSchedule(*schedule, grouped).ok();
    for (int64_t round : {int64_t{1}, int64_t{37}, int64_t{100000}}) {
      StreamOptions options;
      options.round_computes = round;
      // A grid's start kept: computes only in one round, every action in the others.
      options.kept_ranks = 3;
      options.kept_cells = 10;
      options.kept_transfers = round != 37;
      auto streamed = GenerateAndSimulateStreamed(c.spec, costs_for, options);
      ASSERT_TRUE(streamed.ok()) << streamed.status();
      ASSERT_TRUE(streamed->has_value()) << ScheduleKindName(c.spec.kind);
      const StreamedSchedule& s = **streamed;
      const std::string what =
          absl::StrCat(ScheduleKindName(c.spec.kind), " p=", c.spec.num_ranks, " round=", round);
      EXPECT_EQ(s.spec, schedule->spec) << what;
      EXPECT_EQ(s.num_actions, schedule->NumActions()) << what;
      EXPECT_EQ(s.valid_grouped_rendezvous, grouped_ok) << what;
      ExpectSameResult(s.simulation, *whole, what);
      ASSERT_EQ(s.kept.NumRanks(), schedule->NumRanks()) << what;
      ASSERT_EQ(s.cells_not_kept.size(), 3u) << what;
      for (int r = 0; r < s.kept.NumRanks(); ++r) {
        std::vector<Action> cells;
        for (const Action& a : schedule->programs[r]) {
          if (options.kept_transfers || IsCompute(a.type)) cells.push_back(a);
        }
        if (r >= 3) {
          EXPECT_TRUE(s.kept.programs[r].empty()) << what << " rank " << r;
          continue;
        }
        const size_t kept = std::min<size_t>(10, cells.size());
        EXPECT_EQ(s.kept.programs[r], std::vector<Action>(cells.begin(), cells.begin() + kept))
            << what << " rank " << r;
        EXPECT_EQ(s.cells_not_kept[r], static_cast<int64_t>(cells.size() - kept))
            << what << " rank " << r;
      }
    }
  }
}

// Kinds completed from fixed orders are not streamed (the caller generates them whole), and
// a bad spec is the generator's error.
TEST(StreamedTest, FixedOrdersAndBadSpecs) {
  auto uniform = [](const ScheduleSpec& spec) -> absl::StatusOr<CostModel> {
    return CostModel::Uniform(spec, 1, 2);
  };
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZBH1,
                            ScheduleKind::kDualPipe}) {
    auto streamed = GenerateAndSimulateStreamed(Spec(kind, 4, 8), uniform);
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_FALSE(streamed->has_value()) << ScheduleKindName(kind);
  }
  auto odd = GenerateAndSimulateStreamed(Spec(ScheduleKind::kChimera, 3, 6), uniform);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status(), GenerateSchedule(Spec(ScheduleKind::kChimera, 3, 6)).status());
  auto refused = GenerateAndSimulateStreamed(
      Spec(ScheduleKind::kZBV, 4, 8),
      [](const ScheduleSpec&) -> absl::StatusOr<CostModel> {
        return absl::InvalidArgumentError("costs: refused");
      });
  EXPECT_EQ(refused.status().message(), "costs: refused");
}

}  // namespace
}  // namespace tandem::pipeline
