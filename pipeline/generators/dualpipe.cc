// DualPipe and DualPipeV (DeepSeek-V3; DualPipeV is Sea AI Lab's "cut-in-half" of it).
//
// Each rank holds two chunks, "phase 0" (early in its pipeline: stage h) and "phase 1" (late:
// stage 2H-1-h), where H is the number of rank pairs sharing the two directions (DualPipe: p/2,
// the ranks r and p-1-r hold mirrored stages of the two replicas; DualPipeV: p, the two chunks
// of a V) and h the rank's position in it. Every rank runs the same eight steps over its
// phases (deepseek-ai/DualPipe, `step`):
//   1  2(H-h-1)        F0
//   2  h+1             F0 F1
//   3  H-h-1           B1 W F1        backward split, its W right away
//   4  M-2H+h+1        F0 B1 F1 B0    (the overlapped "F&B" pairs, run one after the other)
//   5  H-h-1           B1 F1 B0
//   6  h+1             B1 B0          from the middle on, backward split with W deferred
//   7  H-h-1           W B0           B0 split, W deferred
//   8  h+1             W
// where M is the number of micro-batches per phase (DualPipe: m/2 per direction; DualPipeV: m)
// and deferred weight gradients run first in, first out; other backwards run whole (B). tandem
// runs one compute at a time, so "F&B" costs F + B here rather than the overlapped time
// DualPipe gets from two CUDA streams.
#include "pipeline/generators.h"

#include <deque>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"

namespace tandem::pipeline {

using internal::CheckedSpec;
using internal::CompleteScheduleFor;
using internal::Invalid;
using internal::Op;
using internal::OpOf;
using internal::OpOrders;
using internal::UnitCosts;

namespace {

// Where a phase's actions go: its (replica, stage) and its micro-batches
// first_microbatch .. first_microbatch + M - 1.
struct Phase {
  int replica = 0;
  int stage = 0;
  int first_microbatch = 0;
  int next_forward = 0;
  int next_backward = 0;
};

// One rank's order, DualPipe's eight steps (see the file comment).
class DualPipeOrder {
 public:
  DualPipeOrder(Phase phase0, Phase phase1, std::vector<Op>* out)
      : phases_{phase0, phase1}, out_(out) {}

  void Build(int half, int h, int per_phase) {
    for (int i = 0; i < 2 * (half - h - 1); ++i) Forward(0);
    for (int i = 0; i < h + 1; ++i) {
      Forward(0);
      Forward(1);
    }
    for (int i = 0; i < half - h - 1; ++i) {
      Backward(1, /*defer_weight=*/true);
      DeferredWeight();
      Forward(1);
    }
    for (int i = 0; i < per_phase - 2 * half + h + 1; ++i) {
      Forward(0);
      Backward(1, false);
      Forward(1);
      Backward(0, false);
    }
    for (int i = 0; i < half - h - 1; ++i) {
      Backward(1, false);
      Forward(1);
      Backward(0, false);
    }
    // From the middle of this step on, weight gradients wait (B1 first on odd positions).
    bool defer = false;
    for (int i = 0; i < h + 1; ++i) {
      if (i == (h + 1) / 2 && h % 2 == 1) defer = true;
      Backward(1, defer);
      if (i == (h + 1) / 2 && h % 2 == 0) defer = true;
      Backward(0, defer);
    }
    for (int i = 0; i < half - h - 1; ++i) {
      DeferredWeight();
      Backward(0, true);
    }
    while (!deferred_.empty()) DeferredWeight();
  }

 private:
  void Forward(int p) {
    Phase& phase = phases_[p];
    out_->push_back(OpOf(ActionType::kForward, phase.replica, phase.stage,
                         phase.first_microbatch + phase.next_forward++));
  }
  // A whole backward, or (defer_weight) its input half now and its weight half queued.
  void Backward(int p, bool defer_weight) {
    Phase& phase = phases_[p];
    const int mb = phase.first_microbatch + phase.next_backward++;
    if (!defer_weight) {
      out_->push_back(OpOf(ActionType::kBackward, phase.replica, phase.stage, mb));
      return;
    }
    out_->push_back(OpOf(ActionType::kBackwardInput, phase.replica, phase.stage, mb));
    deferred_.push_back(OpOf(ActionType::kBackwardWeight, phase.replica, phase.stage, mb));
  }
  void DeferredWeight() {
    out_->push_back(deferred_.front());
    deferred_.pop_front();
  }

  Phase phases_[2];
  std::deque<Op> deferred_;
  std::vector<Op>* out_;
};

}  // namespace

absl::StatusOr<Schedule> GenerateDualPipe(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kDualPipe, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  const int p = num_ranks, m = num_microbatches;
  if (p % 2 != 0) {
    return Invalid("dualpipe", absl::StrCat("needs an even number of ranks, got ", p));
  }
  if (m % 2 != 0 || m < 2 * p) {
    return Invalid("dualpipe", absl::StrCat("needs an even number of micro-batches, at least "
                                            "twice the ranks (",
                                            2 * p, "), got ", m));
  }
  // Replica 0 runs stage s on rank s over micro-batches [0, m/2); replica 1 stage s on rank
  // p-1-s over [m/2, m).
  const int half = p / 2, per_phase = m / 2;
  OpOrders orders(p);
  for (int r = 0; r < p; ++r) {
    const int h = std::min(r, p - 1 - r);
    const int early = r < half ? 0 : 1;  // the replica in which this rank holds stage h
    Phase phase0{early, h, early * per_phase};
    Phase phase1{1 - early, p - 1 - h, (1 - early) * per_phase};
    orders[r].reserve(3 * m);
    DualPipeOrder(phase0, phase1, &orders[r]).Build(half, h, per_phase);
  }
  return CompleteScheduleFor<Op>(spec, Placement::Bidirectional(p), std::move(orders),
                                 {UnitCosts{}});
}

absl::StatusOr<Schedule> GenerateDualPipeV(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kDualPipeV, num_ranks, num_microbatches,
                                      /*chunks=*/2, /*waves=*/1));
  const int p = num_ranks, m = num_microbatches;
  if (m < 2 * p) {
    return Invalid("dualpipev", absl::StrCat("needs at least twice the ranks (", 2 * p,
                                             ") in micro-batches, got ", m));
  }
  // The V: rank r holds stages r and 2p-1-r, every micro-batch passes both.
  OpOrders orders(p);
  for (int r = 0; r < p; ++r) {
    orders[r].reserve(6 * static_cast<size_t>(m));
    DualPipeOrder(Phase{0, r, 0}, Phase{0, 2 * p - 1 - r, 0}, &orders[r])
        .Build(/*half=*/p, /*h=*/r, /*per_phase=*/m);
  }
  return CompleteScheduleFor<Op>(spec, Placement::Wave(p, /*waves=*/1), std::move(orders),
                                 {UnitCosts{}});
}

}  // namespace tandem::pipeline
