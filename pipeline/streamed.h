// A schedule's statistics without its programs: `tandem schedule` at p=1024, m=4096 generates
// up to 10^8 actions, and holding them costs more (their memory, the kernel's page faults, a
// cache miss per action for each reader) than generating, validating and simulating them. For
// the list-scheduled kinds (Hanayo, ZB-V, Chimera, and GPipe, 1F1B and interleaved, whose fixed
// orders the scheduler only times) every action goes to the validator's proof
// and to the simulator as the list scheduler's program builder emits it, a few thousand at a
// time, and is never stored. The builder emits in order of start in its timeline, so every
// receive comes after its send and the simulator takes each action as it comes, no rank ever
// waiting. The figures equal those of the whole programs (GenerateSchedule, ValidateSchedule,
// Simulate): each check and each rank's clock and sums follow program order, whatever the
// interleaving. Only the statistics come out: a command that writes the schedule, its trace or
// its chart takes the programs whole.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace tandem::pipeline {

struct StreamedSchedule {
  ScheduleSpec spec;  // as generated (ZB-V's two chunks, ...)
  int64_t num_actions = 0;
  // Validity with buffered sends is implied: anything else is not a StreamedSchedule.
  bool valid_grouped_rendezvous = false;
  SimulationResult simulation;
  // The spec and placement, with the kept start of the first ranks' programs (StreamOptions)
  // and empty programs for the rest; and per kept rank, how many cells of its program
  // (computes, or every action) were not kept.
  Schedule kept;
  std::vector<int64_t> cells_not_kept;
};

struct StreamOptions {
  // Actions emitted between two hand-overs to the readers. Each of the three (scheduler and
  // builder, proof, simulator) then runs over many actions with its own tables in the caches;
  // the batch itself stays in the second-level cache. At p=1024, m=4096 (ZB-V, processor
  // seconds of the command): 512 actions 2.06-2.13 s, 2,048 2.07-2.11 s, 8,192 1.96-1.99 s,
  // 32,768 1.92-1.95 s, 131,072 1.92-1.93 s, 524,288 1.96-2.02 s.
  int64_t batch_actions = 32768;
  // For a grid of the schedule's start: of each of the first `kept_ranks` ranks, the first
  // `kept_cells` computes (every action with `kept_transfers`) are kept (see
  // StreamedSchedule::kept).
  int kept_ranks = 0;
  int kept_cells = 0;
  bool kept_transfers = false;
};

// Generates `spec`'s schedule, proving it valid and simulating it with `costs_for(spec as
// generated)` as it is generated. nullopt when the programs cannot be streamed: a kind
// completed from fixed orders, a stash cap the list scheduler had to relax, or a schedule
// that fails a check or receives before it sends (a generator's bug; validating the whole
// programs names it). The caller then takes the whole path. Errors: the spec's (as
// GenerateSchedule's) and costs_for's.
absl::StatusOr<std::optional<StreamedSchedule>> GenerateAndSimulateStreamed(
    const ScheduleSpec& spec,
    const std::function<absl::StatusOr<CostModel>(const ScheduleSpec&)>& costs_for,
    const StreamOptions& options = {});

}  // namespace tandem::pipeline
