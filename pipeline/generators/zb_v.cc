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
using internal::ListSchedulerConfig;
using internal::PerStageStreams;
using internal::ScheduleAndComplete;
using internal::UnitCosts;

absl::StatusOr<Schedule> GenerateZBV(int num_ranks, int num_microbatches,
                                     std::array<int, 3> planning_costs) {
  TANDEM_ASSIGN_OR_RETURN(ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kZBV, num_ranks, num_microbatches,
                                      /*chunks=*/2, /*waves=*/1));
  spec.planning_costs = planning_costs;
  TANDEM_RETURN_IF_ERROR(CheckScheduleSpec(spec));
  Placement placement = Placement::Wave(num_ranks, /*waves=*/1);
  ListSchedulerConfig config = ConfigFor(spec, placement);
  config.backward_class = 0;
  config.forward_class = 1;
  config.weight_class = 2;
  // 2p chunks of half a stage: the activation memory of 1F1B's first stage.
  config.stash_cap = 2 * static_cast<int64_t>(num_ranks);
  // Planned with the spec's costs where it has them: with a weight gradient cheaper than an
  // input gradient (as on CPUs) the nominal order leaves a wait in every cycle.
  config.costs = UnitCosts::For(spec);
  auto make_streams = [&](const Placement& placement) {
    return PerStageStreams(placement, num_microbatches, true);
  };
  return ScheduleAndComplete(spec, std::move(placement), config, make_streams);
}

}  // namespace tandem::pipeline
