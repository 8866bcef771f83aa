// Programs handed over while they are built, a few actions per rank at a time, to readers that
// validate and simulate them as they come (pipeline/streamed.h): at p=1024, m=4096 a
// schedule's programs are up to 10^8 actions, and held whole they cost the command more in
// page faults and cache misses than its readers' work. Private to pipeline/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pipeline/schedule.h"

namespace tandem::pipeline::internal {

// Per rank, the actions built and not yet read by every reader: steps first[r],
// first[r] + 1, ... of its program. `complete` once the last action of every program is in.
struct ProgramChunks {
  std::vector<std::vector<Action>> actions;
  std::vector<int64_t> first;
  bool complete = false;

  explicit ProgramChunks(int num_ranks) : actions(num_ranks), first(num_ranks, 0) {}
  int num_ranks() const { return static_cast<int>(actions.size()); }
  // One past the last step handed over.
  int64_t Available(int r) const {
    return first[r] + static_cast<int64_t>(actions[r].size());
  }
  // Where step `first[r]` is; step k is at Begin(r)[k - First(r)].
  const Action* Begin(int r) const { return actions[r].data(); }
  int64_t First(int r) const { return first[r]; }
  bool Complete() const { return complete; }
  // Drops the steps before `step` of rank r (every reader is past them).
  void Trim(int r, int64_t step) {
    const size_t drop = static_cast<size_t>(step - first[r]);
    if (drop == 0) return;
    std::vector<Action>& a = actions[r];
    a.erase(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(drop));
    first[r] = step;
  }
};

// Whole programs seen through ProgramChunks' accessors (the readers are written once for both).
struct WholePrograms {
  const std::vector<std::vector<Action>>& programs;
  int num_ranks() const { return static_cast<int>(programs.size()); }
  int64_t Available(int r) const { return static_cast<int64_t>(programs[r].size()); }
  const Action* Begin(int r) const { return programs[r].data(); }
  static constexpr int64_t First(int) { return 0; }
  static constexpr bool Complete() { return true; }
};

// Takes the actions as they are handed over. Consume is called every few tens of thousands of
// actions and once more when `chunks.complete`; it reads what is new and trims what every
// reader is done with.
class ProgramConsumer {
 public:
  virtual ~ProgramConsumer() = default;
  virtual void Consume(ProgramChunks& chunks) = 0;
};

}  // namespace tandem::pipeline::internal
