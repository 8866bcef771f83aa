// Chimera: two opposite pipelines whose 1F1B orders the list scheduler merges per rank.
#include "pipeline/generators.h"

#include <memory>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"

namespace tandem::pipeline {

using internal::CheckedSpec;
using internal::ConfigFor;
using internal::Invalid;
using internal::ListSchedulerConfig;
using internal::ScheduleAndComplete;
using internal::Stream;
using internal::Streams;
using internal::Unit;
using internal::kNominalForward;

namespace internal {

absl::StatusOr<ListScheduled> ChimeraKind(int num_ranks, int num_microbatches) {
  ListScheduled kind;
  TANDEM_ASSIGN_OR_RETURN(kind.spec,
                          CheckedSpec(ScheduleKind::kChimera, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  const int d = num_ranks, m = num_microbatches;
  if (d % 2 != 0) {
    return Invalid("chimera", absl::StrCat("needs an even number of ranks, got ", d));
  }
  if (m % d != 0) {
    return Invalid("chimera", absl::StrCat("needs micro-batches a multiple of the ranks (", d,
                                           "), got ", m));
  }
  // Basic unit of D micro-batches: the first D/2 go down (replica 0), the rest up (replica 1).
  // The streams point into them, so the streams' maker holds them.
  auto down = std::make_shared<std::vector<Unit>>();
  auto up = std::make_shared<std::vector<Unit>>();
  for (int mb = 0; mb < m; ++mb) (mb % d < d / 2 ? *down : *up).push_back({mb, 0});
  kind.placement = Placement::Bidirectional(d);
  kind.make_streams = [d, down, up](const Placement& placement) {
    Streams streams(d);
    for (int replica = 0; replica < 2; ++replica) {
      for (int stage = 0; stage < d; ++stage) {
        streams[placement.RankOf(replica, stage)].push_back(Stream::OneFOneB(
            replica, stage, replica == 0 ? down.get() : up.get(), /*warmup=*/d - stage - 1));
      }
    }
    return streams;
  };
  ListSchedulerConfig& config = kind.config;
  config = ConfigFor(kind.spec, kind.placement);
  config.backward_class = 0;
  config.forward_class = 1;
  // Receives placed for equal forward and backward costs too (the paper's figures), so
  // that the order runs in 2N + D - 2 there as well as in 3N + 2D - 4 at F=1, B=2.
  kind.second_full_backward = kNominalForward;
  return kind;
}

}  // namespace internal

absl::StatusOr<Schedule> GenerateChimera(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(internal::ListScheduled kind,
                          internal::ChimeraKind(num_ranks, num_microbatches));
  return ScheduleAndComplete(std::move(kind));
}

}  // namespace tandem::pipeline
