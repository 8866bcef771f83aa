// 1F1B (PipeDream-Flush): rank r does p-r-1 warm-up forwards, then alternates forward and
// backward, then drains.
#include "pipeline/generators.h"

#include <utility>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"

namespace tandem::pipeline {

using internal::CheckedSpec;
using internal::ListScheduled;
using internal::ScheduleAndComplete;
using internal::Unit;

namespace internal {

absl::StatusOr<ListScheduled> OneFOneBKind(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::k1F1B, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  std::vector<Unit> units;  // the micro-batches, ascending
  for (int mb = 0; mb < num_microbatches; ++mb) units.push_back({mb, 0});
  return OneFOneBPerRank(std::move(spec), Placement::Linear(num_ranks), std::move(units),
                         [num_ranks](int r) { return num_ranks - r - 1; });
}

}  // namespace internal

absl::StatusOr<Schedule> Generate1F1B(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(ListScheduled kind,
                          internal::OneFOneBKind(num_ranks, num_microbatches));
  return ScheduleAndComplete(std::move(kind));
}

}  // namespace tandem::pipeline
