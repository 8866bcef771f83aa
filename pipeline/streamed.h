// A schedule's statistics without its programs: `tandem schedule` at p=1024, m=4096 generates
// up to 10^8 actions, and holding them costs more (their memory, the kernel's page faults, a
// cache miss per action for each reader) than generating, validating and simulating them. For
// the list-scheduled kinds (Hanayo, ZB-V, Chimera) the programs are handed to the validator's
// proof and to the simulator a few actions per rank at a time, while the list scheduler builds
// them, and dropped once both have read them. The figures equal those of the whole programs
// (GenerateSchedule, ValidateSchedule, Simulate): each check and each rank's clock and sums
// follow program order, whatever the hand-overs. Only the statistics come out: a command that
// writes the schedule, its trace or its chart takes the programs whole.
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
  // Computes scheduled between two hand-overs to the readers (each hand-over is two to three
  // times as many actions). Larger rounds read the validator's per-micro-batch state in
  // longer runs; smaller ones keep the actions in cache between their writing and their
  // reading and hold less. At p=1024, m=4096 (ZB-V, processor seconds of the command): 16,384
  // computes 2.9-3.9 s, 65,536 2.5-2.9 s, 262,144 2.5-2.8 s (113 MB), against 2.4-2.6 s and
  // 536 MB for the whole programs.
  int64_t round_computes = 262144;
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
// that fails a check (a generator's bug; validating the whole programs names it). The caller
// then takes the whole path. Errors: the spec's (as GenerateSchedule's) and costs_for's.
absl::StatusOr<std::optional<StreamedSchedule>> GenerateAndSimulateStreamed(
    const ScheduleSpec& spec,
    const std::function<absl::StatusOr<CostModel>(const ScheduleSpec&)>& costs_for,
    const StreamOptions& options = {});

}  // namespace tandem::pipeline
