// ZB-H1: 1F1B with the backward split, each W delayed to fill the drain bubble.
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

absl::StatusOr<Schedule> GenerateZBH1(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kZBH1, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  const int p = num_ranks, m = num_microbatches;
  OpOrders orders(p);
  for (int r = 0; r < p; ++r) {
    auto& order = orders[r];
    order.reserve(3 * m);
    const int warmup = std::min(p - r - 1, m);
    // Rank r delays each W by r micro-batches: the W passes fill the drain bubble, and the
    // stash peaks at (p - r) + r = p, 1F1B's first stage.
    const int weight_lag = r;
    int next_forward = 0, next_weight = 0;
    for (; next_forward < warmup; ++next_forward) {
      order.push_back(OpOf(ActionType::kForward, 0, r, next_forward));
    }
    for (int next_backward = 0; next_backward < m; ++next_backward) {
      if (next_forward < m) {
        order.push_back(OpOf(ActionType::kForward, 0, r, next_forward++));
      }
      order.push_back(OpOf(ActionType::kBackwardInput, 0, r, next_backward));
      if (next_backward - next_weight >= weight_lag) {
        order.push_back(OpOf(ActionType::kBackwardWeight, 0, r, next_weight++));
      }
    }
    while (next_weight < m) {
      order.push_back(OpOf(ActionType::kBackwardWeight, 0, r, next_weight++));
    }
  }
  return CompleteScheduleFor<Op>(spec, Placement::Linear(p), std::move(orders),
                                 {UnitCosts{}});
}

}  // namespace tandem::pipeline
