// GPipe: all forwards, then all backwards, micro-batches ascending.
#include "pipeline/generators.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"

namespace tandem::pipeline {

using internal::CheckedSpec;
using internal::ConfigFor;
using internal::ListScheduled;
using internal::ScheduleAndComplete;
using internal::Stream;
using internal::Streams;
using internal::Unit;

namespace internal {

absl::StatusOr<ListScheduled> GPipeKind(int num_ranks, int num_microbatches) {
  ListScheduled kind;
  TANDEM_ASSIGN_OR_RETURN(kind.spec, CheckedSpec(ScheduleKind::kGPipe, num_ranks,
                                                 num_microbatches, /*chunks=*/1, /*waves=*/1));
  kind.placement = Placement::Linear(num_ranks);
  kind.config = ConfigFor(kind.spec, kind.placement);
  // Each rank's order is a 1F1B order whose warm-up is every forward; one stream per rank
  // leaves the list scheduler no choice: it only times the order.
  auto units = std::make_shared<std::vector<Unit>>();
  for (int mb = 0; mb < num_microbatches; ++mb) units->push_back({mb, 0});
  kind.make_streams = [num_ranks, num_microbatches, units](const Placement&) {
    Streams streams(num_ranks);
    for (int r = 0; r < num_ranks; ++r) {
      streams[r].push_back(Stream::OneFOneB(/*replica=*/0, /*stage=*/r, units.get(),
                                            /*warmup=*/num_microbatches));
    }
    return streams;
  };
  return kind;
}

}  // namespace internal

absl::StatusOr<Schedule> GenerateGPipe(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(ListScheduled kind, internal::GPipeKind(num_ranks, num_microbatches));
  return ScheduleAndComplete(std::move(kind));
}

}  // namespace tandem::pipeline
