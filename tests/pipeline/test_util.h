// Helpers shared by the schedule engine's tests: specs, schedules written out, and random
// edits of schedules.
#pragma once

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline::testing {

inline ScheduleSpec Spec(ScheduleKind kind, int p, int m, int chunks = 1, int waves = 1) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.num_ranks = p;
  spec.num_microbatches = m;
  spec.chunks = chunks;
  spec.waves = waves;
  return spec;
}

// One random edit of a schedule: actions reordered, dropped, duplicated, altered or moved
// to another rank.
inline void Edit(Schedule* s, std::mt19937* rng) {
  auto pick = [&](size_t n) { return static_cast<int>((*rng)() % n); };
  std::vector<Action>& program = s->programs[pick(s->programs.size())];
  if (program.empty()) return;
  const int i = pick(program.size());
  Action& a = program[i];
  const int delta = pick(2) == 0 ? -1 : 1;
  switch (pick(9)) {
    case 0:  // swap with a later action nearby
      std::swap(a, program[std::min<size_t>(program.size() - 1, i + 1 + pick(3))]);
      break;
    case 1:
      program.erase(program.begin() + i);
      break;
    case 2:
      program.insert(program.begin() + pick(program.size()), a);
      break;
    case 3:
      a.microbatch += delta;
      break;
    case 4:
      a.stage += delta;
      break;
    case 5:
      a.peer += delta;
      break;
    case 6:
      a.type = static_cast<ActionType>(pick(10));
      break;
    case 7:
      a.replica ^= 1;
      break;
    default: {  // move to another rank
      const Action moved = a;
      program.erase(program.begin() + i);
      std::vector<Action>& other = s->programs[pick(s->programs.size())];
      other.insert(other.begin() + pick(other.size() + 1), moved);
      break;
    }
  }
}

// A schedule from one line of actions per rank ("F0.0 sA0.0>1 ...").
inline Schedule Parse(ScheduleKind kind, int num_microbatches, Placement placement,
               const std::vector<std::string>& lines) {
  Schedule s;
  s.spec.kind = kind;
  s.spec.num_ranks = placement.num_ranks;
  s.spec.num_microbatches = num_microbatches;
  s.placement = std::move(placement);
  for (const std::string& line : lines) {
    std::vector<Action> program;
    for (absl::string_view token : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      auto action = ParseAction(token);
      EXPECT_TRUE(action.ok()) << action.status();
      program.push_back(*action);
    }
    s.programs.push_back(std::move(program));
  }
  return s;
}

// `rounds` schedules generated from specs picked at random, each with one or two random edits
// (none every `unedited`-th round), handed to check(spec, schedule) while the test holds.
template <typename Check>
void ForEditedSchedules(const std::vector<ScheduleSpec>& specs, int rounds, int unedited,
                        std::mt19937* rng, Check check) {
  for (int round = 0; round < rounds && !::testing::Test::HasFatalFailure(); ++round) {
    const ScheduleSpec& spec = specs[(*rng)() % specs.size()];
    auto generated = GenerateSchedule(spec);
    ASSERT_TRUE(generated.ok()) << generated.status();
    Schedule s = *std::move(generated);
    const int edits = round % unedited == 0 ? 0 : 1 + static_cast<int>((*rng)() % 2);
    for (int e = 0; e < edits; ++e) Edit(&s, rng);
    check(spec, s);
  }
}

}  // namespace tandem::pipeline::testing
