// 1F1B (PipeDream-Flush): rank r does p-r-1 warm-up forwards, then alternates forward and
// backward, then drains.
#include "pipeline/generators.h"

#include <algorithm>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"

namespace tandem::pipeline {

using internal::CheckedSpec;
using internal::CompleteScheduleFor;
using internal::Op;
using internal::OpOf;
using internal::OpOrders;
using internal::UnitCosts;

namespace {

// One stage's 1F1B order over `microbatches` (ascending), with `warmup` forwards first.
void Append1F1B(int replica, int stage, const std::vector<int>& microbatches, int warmup,
                std::vector<Op>* out) {
  const int m = static_cast<int>(microbatches.size());
  warmup = std::clamp(warmup, 0, m);
  int next_forward = 0;
  for (; next_forward < warmup; ++next_forward) {
    out->push_back(OpOf(ActionType::kForward, replica, stage, microbatches[next_forward]));
  }
  for (int next_backward = 0; next_backward < m; ++next_backward) {
    if (next_forward < m) {
      out->push_back(OpOf(ActionType::kForward, replica, stage, microbatches[next_forward]));
      ++next_forward;
    }
    out->push_back(OpOf(ActionType::kBackward, replica, stage, microbatches[next_backward]));
  }
}

std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

absl::StatusOr<Schedule> Generate1F1B(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::k1F1B, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  OpOrders orders(num_ranks);
  const std::vector<int> microbatches = Iota(num_microbatches);
  for (int r = 0; r < num_ranks; ++r) {
    orders[r].reserve(2 * num_microbatches);
    Append1F1B(/*replica=*/0, /*stage=*/r, microbatches, /*warmup=*/num_ranks - r - 1,
               &orders[r]);
  }
  return CompleteScheduleFor<Op>(spec, Placement::Linear(num_ranks), std::move(orders),
                                 {UnitCosts{}});
}

}  // namespace tandem::pipeline
