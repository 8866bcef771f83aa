// GPipe: all forwards, then all backwards, micro-batches ascending.
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

absl::StatusOr<ListScheduled> GPipeKind(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kGPipe, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  // Each rank's order is a 1F1B order whose warm-up is every forward.
  std::vector<Unit> units;
  for (int mb = 0; mb < num_microbatches; ++mb) units.push_back({mb, 0});
  return OneFOneBPerRank(std::move(spec), Placement::Linear(num_ranks), std::move(units),
                         [num_microbatches](int) { return num_microbatches; });
}

}  // namespace internal

absl::StatusOr<Schedule> GenerateGPipe(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(ListScheduled kind, internal::GPipeKind(num_ranks, num_microbatches));
  return ScheduleAndComplete(std::move(kind));
}

}  // namespace tandem::pipeline
