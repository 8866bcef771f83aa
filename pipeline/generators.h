// Schedule generators: spec -> per-rank programs. Each checks its constraints first and
// returns InvalidArgument naming the violated one ("chimera needs an even number of ranks,
// got 3"). Every generated schedule passes the validator.
#pragma once

#include "absl/status/statusor.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline {

// Dispatches on spec.kind.
absl::StatusOr<Schedule> GenerateSchedule(const ScheduleSpec& spec);

absl::StatusOr<Schedule> GenerateGPipe(int num_ranks, int num_microbatches);
// PipeDream-Flush: rank r does p-r-1 warm-up forwards, then alternates, then drains.
absl::StatusOr<Schedule> Generate1F1B(int num_ranks, int num_microbatches);
// Megatron-LM interleaved 1F1B with `chunks` model chunks per rank; m need not be a multiple
// of p.
absl::StatusOr<Schedule> GenerateInterleaved(int num_ranks, int num_microbatches, int chunks);
// Chimera: two opposite pipelines, D even, m a multiple of D (basic unit of D micro-batches
// repeated).
absl::StatusOr<Schedule> GenerateChimera(int num_ranks, int num_microbatches);
// Hanayo: W waves, 2W chunks per rank in wave order.
absl::StatusOr<Schedule> GenerateHanayo(int num_ranks, int num_microbatches, int waves);
// ZB-H1: backward split into input gradient (Bi) and weight gradient (W); W delayed to fill
// the drain bubble; activation memory as 1F1B.
absl::StatusOr<Schedule> GenerateZBH1(int num_ranks, int num_microbatches);
// ZB-V: two chunks per rank in V placement with split backward.
absl::StatusOr<Schedule> GenerateZBV(int num_ranks, int num_microbatches);

}  // namespace tandem::pipeline
