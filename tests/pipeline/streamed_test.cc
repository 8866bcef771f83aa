// Actions taken as they are emitted (pipeline/streamed.h): the validator's proof and the
// simulator must give what they give on the whole programs, however the ranks interleave, and
// `tandem schedule`'s streamed statistics must equal those of the generated schedule.
#include "pipeline/streamed.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/internal/emitted_actions.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"
#include "pipeline/validator_internal.h"
#include "tests/pipeline/test_util.h"

namespace tandem::pipeline {
namespace {

using internal::EmittedActions;

using testing::ForEditedSchedules;
using testing::Parse;
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

// Every action of `s` once, as (rank, action), each rank's in its program's order and the
// ranks interleaved at random. With `sends_first`, a receive is taken only after the send it
// pairs with (the k-th on its channel), as the program builder emits them; the order then
// ends early if the programs deadlock.
std::vector<std::pair<int, Action>> Interleaving(const Schedule& s, std::mt19937* rng,
                                                 bool sends_first) {
  const int num_ranks = s.NumRanks();
  std::vector<size_t> next(num_ranks, 0);
  std::map<std::pair<int, int>, int64_t> sent;  // (from, to) -> sends taken, less receives
  std::vector<std::pair<int, Action>> order;
  for (;;) {
    std::vector<int> ready;
    for (int r = 0; r < num_ranks; ++r) {
      if (next[r] == s.programs[r].size()) continue;
      const Action& a = s.programs[r][next[r]];
      const bool receive =
          a.type == ActionType::kRecvActivation || a.type == ActionType::kRecvGradient;
      if (sends_first && receive && sent[{a.peer, r}] == 0) continue;
      ready.push_back(r);
    }
    if (ready.empty()) return order;
    const int r = ready[(*rng)() % ready.size()];
    const Action& a = s.programs[r][next[r]++];
    if (a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient) {
      ++sent[{r, a.peer}];
    } else if (a.type == ActionType::kRecvActivation || a.type == ActionType::kRecvGradient) {
      --sent[{a.peer, r}];
    }
    order.emplace_back(r, a);
  }
}

// Hands `order` to `take` in batches of 1 to `most` actions, the last one marked.
void HandOver(const std::vector<std::pair<int, Action>>& order, std::mt19937* rng, int most,
              const std::function<void(const EmittedActions&)>& take) {
  std::vector<int32_t> ranks;
  std::vector<Action> actions;
  size_t j = 0;
  do {
    const size_t n = std::min<size_t>(1 + (*rng)() % most, order.size() - j);
    ranks.clear();
    actions.clear();
    for (size_t k = 0; k < n; ++k, ++j) {
      ranks.push_back(order[j].first);
      actions.push_back(order[j].second);
    }
    take(EmittedActions{ranks.data(), actions.data(), n, j == order.size()});
  } while (j < order.size());
}

// Every action of `s`, rank 0's program first, then rank 1's, ...
std::vector<std::pair<int, Action>> RankAfterRank(const Schedule& s) {
  std::vector<std::pair<int, Action>> order;
  for (int r = 0; r < s.NumRanks(); ++r) {
    for (const Action& a : s.programs[r]) order.emplace_back(r, a);
  }
  return order;
}

// Whether the streamed proof accepts `s`, its actions interleaved at random (or rank after
// rank) and handed over in batches of at most `most`.
bool StreamedVerdict(const Schedule& s, const ValidationOptions& options, std::mt19937* rng,
                     int most, bool rank_after_rank = false) {
  const Schedule shape = ShapeOf(s);
  auto proof = internal::StreamedProof::Create(shape, options);
  EXPECT_TRUE(proof.ok()) << proof.status();
  bool checked = true;
  HandOver(rank_after_rank ? RankAfterRank(s) : Interleaving(s, rng, /*sends_first=*/false),
           rng, most,
           [&](const EmittedActions& batch) { checked = (*proof)->Take(batch) && checked; });
  return checked && (*proof)->Finished();
}

// The streamed proof accepts exactly what ValidateSchedule accepts, in both modes, on
// generated schedules and random edits of them, whatever the interleaving of the ranks.
TEST(StreamedTest, ProofAgreesWithTheValidator) {
  std::vector<ScheduleSpec> specs = {
      Spec(ScheduleKind::kGPipe, 3, 4),      Spec(ScheduleKind::k1F1B, 4, 8),
      Spec(ScheduleKind::kZBH1, 3, 5),       Spec(ScheduleKind::kZBV, 4, 8),
      Spec(ScheduleKind::kInterleaved, 4, 6, 2), Spec(ScheduleKind::kHanayo, 3, 6, 1, 2),
      Spec(ScheduleKind::kChimera, 4, 8),    Spec(ScheduleKind::kDualPipeV, 4, 8)};
  std::mt19937 rng(20261129);
  int rejected = 0, checked = 0;
  ForEditedSchedules(specs, 600, 5, &rng, [&](const ScheduleSpec& spec, const Schedule& s) {
    for (bool grouped : {false, true}) {
      ValidationOptions options;
      options.grouped_rendezvous = grouped;
      const bool valid = ValidateSchedule(s, options).ok();
      const int most = 1 + static_cast<int>(rng() % 7);
      EXPECT_EQ(StreamedVerdict(s, options, &rng, most), valid)
          << ScheduleKindName(spec.kind) << " grouped=" << grouped << " batches of at most "
          << most << "\n"
          << FormatGrid(s, true);
      rejected += !valid;
      ++checked;
    }
  });
  EXPECT_GT(rejected, checked / 3);
  EXPECT_LT(rejected, checked);
  // Each rank receives, then sends to the other in the same run of transfers: grouped, the
  // runs match; with buffered sends each rank waits for the other's send, behind its receive.
  const Schedule exchange = Parse(
      ScheduleKind::k1F1B, 2, Placement::Linear(2),
      {"F0.0 sA0.0>1 F0.1 rG1.0<1 sA0.1>1 B0.0 rG1.1<1 B0.1 sync0 step",
       "rA0.0<0 F1.0 B1.0 rA0.1<0 sG1.0>0 F1.1 B1.1 sG1.1>0 sync1 step"});
  for (bool grouped : {false, true}) {
    ValidationOptions options;
    options.grouped_rendezvous = grouped;
    ASSERT_EQ(ValidateSchedule(exchange, options).ok(), grouped);
    for (int most : {1, 3, 30}) {
      EXPECT_EQ(StreamedVerdict(exchange, options, &rng, most), grouped) << most;
    }
  }
  // Rank 0's first run waits on two transfers; the second (rG1.0) only comes after rank 1
  // receives what rank 0 sends after that run: stuck in both modes, however the ranks
  // interleave (the first transfer matched alone does not let rank 0 go on).
  const Schedule stuck = Parse(
      ScheduleKind::k1F1B, 2, Placement::Linear(2),
      {"F0.0 sA0.0>1 rG1.0<1 F0.1 sA0.1>1 B0.0 rG1.1<1 B0.1 sync0 step",
       "rA0.0<0 F1.0 B1.0 rA0.1<0 F1.1 sG1.0>0 B1.1 sG1.1>0 sync1 step"});
  for (bool grouped : {false, true}) {
    ValidationOptions options;
    options.grouped_rendezvous = grouped;
    ASSERT_FALSE(ValidateSchedule(stuck, options).ok());
    for (int trial = 0; trial < 20; ++trial) {
      EXPECT_FALSE(StreamedVerdict(stuck, options, &rng, 1 + trial % 4, trial % 2 == 0))
          << trial;
    }
  }
  // The verdict does not depend on the interleaving or the batches.
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

// The simulator taking emitted actions gives Run's result on the whole programs, bit for bit,
// however the ranks interleave (each receive after its send); a receive that comes before its
// send stops it.
TEST(StreamedTest, SimulatorTakingEmittedActionsEqualsTheWholeRun) {
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
        const auto order = Interleaving(*schedule, &rng, /*sends_first=*/true);
        ASSERT_EQ(static_cast<int64_t>(order.size()), schedule->NumActions());
        const Schedule shape = ShapeOf(*schedule);
        auto simulator = ScheduleSimulator::Create(shape);
        ASSERT_TRUE(simulator.ok());
        ASSERT_TRUE(simulator->Start(costs).ok());
        HandOver(order, &rng, most, [&](const EmittedActions& batch) {
          ASSERT_TRUE(simulator->Take(batch).ok());
        });
        auto streamed = simulator->Finish();
        ASSERT_TRUE(streamed.ok()) << streamed.status();
        ExpectSameResult(*streamed, *whole,
                         absl::StrCat(ScheduleKindName(spec.kind), " most=", most));
      }
    }
  }
  // A receive taken before its send.
  auto schedule = GenerateSchedule(Spec(ScheduleKind::k1F1B, 2, 2));
  ASSERT_TRUE(schedule.ok());
  const Schedule shape = ShapeOf(*schedule);
  auto simulator = ScheduleSimulator::Create(shape);
  ASSERT_TRUE(simulator.ok());
  ASSERT_TRUE(simulator->Start(CostModel::Uniform(schedule->spec, 1, 2)).ok());
  std::vector<int32_t> ranks;
  std::vector<Action> actions;
  for (const Action& a : schedule->programs[1]) {
    ranks.push_back(1);
    actions.push_back(a);
  }
  const absl::Status early =
      simulator->Take(EmittedActions{ranks.data(), actions.data(), actions.size(), false});
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_NE(early.message().find("received before its send"), std::string::npos) << early;
  EXPECT_FALSE(simulator->Finish().ok());
  // Sends never received: the whole run's error.
  auto unmatched = GenerateSchedule(Spec(ScheduleKind::k1F1B, 2, 2));
  ASSERT_TRUE(unmatched.ok());
  auto& program = unmatched->programs[1];
  program.erase(std::find_if(program.begin(), program.end(), [](const Action& a) {
    return a.type == ActionType::kRecvActivation;
  }));
  const CostModel costs = CostModel::Uniform(unmatched->spec, 1, 2);
  auto whole = Simulate(*unmatched, costs);
  ASSERT_FALSE(whole.ok());
  auto again = ScheduleSimulator::Create(shape);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->Start(costs).ok());
  HandOver(Interleaving(*unmatched, &rng, /*sends_first=*/true), &rng, 4,
           [&](const EmittedActions& batch) { ASSERT_TRUE(again->Take(batch).ok()); });
  EXPECT_EQ(again->Finish().status(), whole.status());
}

// What `tandem schedule --format json` prints for the list-scheduled kinds: the streamed
// figures equal the whole schedule's, with the readers handed 1 to 100,000 actions at a time.
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
        Case{Spec(ScheduleKind::kHanayo, 5, 9), true},
        Case{Spec(ScheduleKind::kChimera, 6, 18), true},
        Case{Spec(ScheduleKind::kZBV, 64, 256), false},
        // Fixed orders, one stream per rank: the scheduler only times them.
        Case{Spec(ScheduleKind::kGPipe, 6, 13), true}, Case{Spec(ScheduleKind::k1F1B, 7, 20), true},
        Case{Spec(ScheduleKind::k1F1B, 16, 64), false},
        Case{Spec(ScheduleKind::kInterleaved, 4, 12, 3), true},
        Case{Spec(ScheduleKind::kInterleaved, 8, 32, 2), false},
        // Interleaved with a short last group: chosen by the list scheduler.
        Case{Spec(ScheduleKind::kInterleaved, 4, 10, 2), true}}) {
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
    for (int64_t batch : {int64_t{1}, int64_t{37}, int64_t{100000}}) {
      StreamOptions options;
      options.batch_actions = batch;
      // A grid's start kept: computes only with one batch size, every action with the others.
      options.kept_ranks = 3;
      options.kept_cells = 10;
      options.kept_transfers = batch != 37;
      auto streamed = GenerateAndSimulateStreamed(c.spec, costs_for, options);
      ASSERT_TRUE(streamed.ok()) << streamed.status();
      ASSERT_TRUE(streamed->has_value()) << ScheduleKindName(c.spec.kind);
      const StreamedSchedule& s = **streamed;
      const std::string what =
          absl::StrCat(ScheduleKindName(c.spec.kind), " p=", c.spec.num_ranks, " batch=", batch);
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
  for (ScheduleKind kind :
       {ScheduleKind::kZBH1, ScheduleKind::kDualPipe, ScheduleKind::kDualPipeV}) {
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
