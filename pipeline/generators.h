// Schedule generators: spec -> per-rank programs.
//
// How each orders its compute (transfers are added by CompleteSchedule):
//   gpipe        all forwards, then all backwards, micro-batches ascending.
//   1f1b         rank r: p-r-1 warm-up forwards, then one forward / one backward, then drain.
//   interleaved  Megatron-LM's table: micro-batches in groups of p (the last group takes the
//                remainder), chunk by chunk; (p-r-1)*2 + (v-1)*p warm-up forwards. When m is
//                not a multiple of p that strict alternation can deadlock, so the same
//                sequences go through the list scheduler (forward first, at most warm-up + 1
//                forwards in flight).
//   chimera      per replica a 1F1B order over its micro-batches; the two orders of a rank are
//                merged by a list scheduler at nominal costs (F=1, B=2): whichever can start
//                first, backward before forward on ties, then the op closest to the end.
//                Receives are placed for both F=1, B=2 and F=B=1, so the schedule takes the
//                paper's 2N + D - 2 with equal costs and at most 3N + 2(D - 2) with B = 2F.
//   hanayo       list scheduler over the wave placement: forward first, stashed activations
//                capped at 1.5x a 1F1B first stage (1.5 * p * 2W chunks).
//   zb-h1        1F1B with backward split; rank r runs W of micro-batch i after Bi of i+r.
//   zb-v         list scheduler over the V placement: Bi, then F, then W fills the gaps;
//                stashed activations capped at 2p chunks (1F1B's first stage).
//   dualpipe     DeepSeek's eight steps per rank over its two mirrored stages (see
//   dualpipev    pipeline/generators/dualpipe.cc): warm-up forwards of both, then
//                forward/backward pairs of opposite chunks, weight gradients deferred into
//                the warm-up and drain bubbles.
// The list-scheduled orders use nominal costs only to choose an order; any costs can then be
// simulated. Each checks its constraints first and
// returns InvalidArgument naming the violated one ("chimera needs an even number of ranks,
// got 3"). Every generated schedule passes the validator.
#pragma once

#include <array>

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
// ZB-V: two chunks per rank in V placement with split backward, list-scheduled with
// `planning_costs` (forward, input gradient, weight gradient; all zero: equal).
absl::StatusOr<Schedule> GenerateZBV(int num_ranks, int num_microbatches,
                                     std::array<int, 3> planning_costs = {});
// DualPipe (DeepSeek-V3): two opposite pipelines as Chimera's (2x parameters), p even, m even
// and at least 2p; the first m/2 micro-batches go down, the rest up. Backward split where it
// fills a bubble, whole elsewhere.
absl::StatusOr<Schedule> GenerateDualPipe(int num_ranks, int num_microbatches);
// DualPipeV: DualPipe cut in half: two chunks per rank in V placement (ZB-V's), m >= 2p.
absl::StatusOr<Schedule> GenerateDualPipeV(int num_ranks, int num_microbatches);

// Completes per-rank compute orders (F, B, Bi, W actions only) into a schedule: inserts the
// transfers, one GradientSync per (replica, stage) a rank holds and the final OptimizerStep.
// Sends follow their producing compute. Receives are posted in the order the peer sends
// (FIFO per direction), in the transfer run before the first compute that starts after the
// data exists in a nominal data-flow timeline (F=1, B=2, Bi=W=1), and never after the compute
// that needs them: a send and its receive then sit in runs issued at about the same time, as
// NCCL's grouped point-to-point wants. GradientSync of a stage directly follows the last
// backward (or W) of that stage (before its sends, so that the transfers after a compute stay
// one run). FailedPrecondition if the compute orders cannot run. Used by every generator; also
// the way to build hand-made or searched schedules.
absl::StatusOr<Schedule> CompleteSchedule(const ScheduleSpec& spec, Placement placement,
                                          std::vector<std::vector<Action>> compute_orders);

}  // namespace tandem::pipeline
