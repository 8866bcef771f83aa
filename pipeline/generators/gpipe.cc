// GPipe: all forwards, then all backwards, micro-batches ascending.
#include "pipeline/generators.h"

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

absl::StatusOr<Schedule> GenerateGPipe(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kGPipe, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  OpOrders orders(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    orders[r].reserve(2 * num_microbatches);
    for (int mb = 0; mb < num_microbatches; ++mb) {
      orders[r].push_back(OpOf(ActionType::kForward, 0, r, mb));
    }
    for (int mb = 0; mb < num_microbatches; ++mb) {
      orders[r].push_back(OpOf(ActionType::kBackward, 0, r, mb));
    }
  }
  return CompleteScheduleFor<Op>(spec, Placement::Linear(num_ranks), std::move(orders),
                                 {UnitCosts{}});
}

}  // namespace tandem::pipeline
