// Hanayo: waves of chunks, list-scheduled with a cap on stashed activations.
#include "pipeline/generators.h"

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

namespace {

// Hanayo's activation cap, as a multiple of a 1F1B first stage's (p micro-batches of a full
// stage), about what interleaved 1F1B uses.
constexpr double kHanayoMemoryFactor = 1.5;

}  // namespace

namespace internal {

absl::StatusOr<ListScheduled> HanayoKind(int num_ranks, int num_microbatches, int waves) {
  ListScheduled kind;
  TANDEM_ASSIGN_OR_RETURN(kind.spec,
                          CheckedSpec(ScheduleKind::kHanayo, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/waves));
  kind.placement = Placement::Wave(num_ranks, waves);
  ListSchedulerConfig& config = kind.config;
  config = ConfigFor(kind.spec, kind.placement);
  config.forward_class = 0;
  config.backward_class = 1;
  const int64_t chunks_per_rank = kind.spec.ChunksPerRank();
  config.stash_cap = static_cast<int64_t>(kHanayoMemoryFactor * num_ranks * chunks_per_rank);
  kind.make_streams = [num_microbatches](const Placement& placement) {
    return PerStageStreams(placement, num_microbatches, false);
  };
  return kind;
}

}  // namespace internal

absl::StatusOr<Schedule> GenerateHanayo(int num_ranks, int num_microbatches, int waves) {
  TANDEM_ASSIGN_OR_RETURN(internal::ListScheduled kind,
                          internal::HanayoKind(num_ranks, num_microbatches, waves));
  return ScheduleAndComplete(std::move(kind));
}

}  // namespace tandem::pipeline
