// Proves a schedule correct by executing it symbolically:
//   * every (replica, stage, micro-batch) forward exactly once on the rank that owns the stage,
//     and backward exactly once (or, where the spec splits backward, backward-input and
//     backward-weight exactly once each, or a whole backward standing for both);
//   * dependencies: F(s) after F(s-1) of the same micro-batch; B(s) after B(s+1) and after
//     F(s); W after Bi; data from another rank only after its receive;
//   * every send matched by a receive on the peer, in the same order per direction (FIFO);
//   * no deadlock: sends are buffered (non-blocking), receives block; if no rank can move
//     while some have actions left, that is a deadlock;
//   * GradientSync(stage) after every backward of that stage on the rank, exactly once per
//     (replica, stage) the rank holds; OptimizerStep once, last;
//   * Chimera: each micro-batch runs on exactly one replica (the one of its first forward).
// Errors are InvalidArgument. Runs in time linear in the number of actions.
// An error names the rank, the step (index in its program) and the action:
//   "rank 2 step 5 (rA1.3<1): deadlock: waiting for a send that never comes".
#pragma once

#include "absl/status/status.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline {

absl::Status ValidateSchedule(const Schedule& schedule);

struct ValidationOptions {
  // Stricter model of NCCL-style execution: a maximal run of consecutive transfer actions on a
  // rank is issued as one group (ncclGroupStart/End, batch_isend_irecv) that completes when
  // every transfer in it is matched, and a send also waits for the peer's matching receive
  // (rendezvous). Every generator's output passes this mode too.
  bool grouped_rendezvous = false;
};
absl::Status ValidateSchedule(const Schedule& schedule, const ValidationOptions& options);

}  // namespace tandem::pipeline
