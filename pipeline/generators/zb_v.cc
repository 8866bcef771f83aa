// ZB-V: two chunks per rank in V placement with split backward, list-scheduled.
#include "pipeline/generators.h"

#include <array>
#include <cstdint>
#include <utility>

#include "common/status.h"
#include "pipeline/internal/generator.h"

namespace tandem::pipeline {

using internal::CheckedSpec;
using internal::ConfigFor;
using internal::ListScheduled;
using internal::ListSchedulerConfig;
using internal::PerStageStreams;
using internal::ScheduleAndComplete;
using internal::UnitCosts;

namespace internal {

absl::StatusOr<ListScheduled> ZBVKind(int num_ranks, int num_microbatches,
                                      std::array<int, 3> planning_costs) {
  ListScheduled kind;
  TANDEM_ASSIGN_OR_RETURN(kind.spec,
                          CheckedSpec(ScheduleKind::kZBV, num_ranks, num_microbatches,
                                      /*chunks=*/2, /*waves=*/1));
  kind.spec.planning_costs = planning_costs;
  TANDEM_RETURN_IF_ERROR(CheckScheduleSpec(kind.spec));
  kind.placement = Placement::Wave(num_ranks, /*waves=*/1);
  ListSchedulerConfig& config = kind.config;
  config = ConfigFor(kind.spec, kind.placement);
  config.backward_class = 0;
  config.forward_class = 1;
  config.weight_class = 2;
  // 2p chunks of half a stage: the activation memory of 1F1B's first stage.
  config.stash_cap = 2 * static_cast<int64_t>(num_ranks);
  // Planned with the spec's costs where it has them: with a weight gradient cheaper than an
  // input gradient (as on CPUs) the nominal order leaves a wait in every cycle.
  config.costs = UnitCosts::For(kind.spec);
  kind.make_streams = [num_microbatches](const Placement& placement) {
    return PerStageStreams(placement, num_microbatches, true);
  };
  return kind;
}

}  // namespace internal

absl::StatusOr<Schedule> GenerateZBV(int num_ranks, int num_microbatches,
                                     std::array<int, 3> planning_costs) {
  TANDEM_ASSIGN_OR_RETURN(internal::ListScheduled kind,
                          internal::ZBVKind(num_ranks, num_microbatches, planning_costs));
  return ScheduleAndComplete(std::move(kind));
}

}  // namespace tandem::pipeline
