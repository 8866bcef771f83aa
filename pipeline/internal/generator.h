// What every schedule generator (pipeline/generators/*.cc) shares: the checked spec, the
// error form, compute orders and the two ways to complete them (CompleteScheduleFor for fixed
// orders, ScheduleAndComplete for list-scheduled ones). Private to pipeline/.
//
// Adding a schedule: a ScheduleKind (pipeline/schedule.h), its placement (PlacementFor in
// pipeline/plan.cc), a file here that builds its per-rank compute orders, and a case in
// GenerateSchedule (pipeline/generators.cc).
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "pipeline/internal/completion.h"
#include "pipeline/internal/list_scheduler.h"
#include "pipeline/internal/orders.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline::internal {

// InvalidArgument "<kind>: <message>".
inline absl::Status Invalid(absl::string_view kind, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(kind, ": ", message));
}

// A spec of `kind`, with the range checks every kind shares and a refusal of the options that
// do not apply to it (chunks, waves).
absl::StatusOr<ScheduleSpec> CheckedSpec(ScheduleKind kind, int num_ranks, int num_microbatches,
                                         int chunks, int waves);

// The list-scheduled kinds, described (their generators complete these; pipeline/streamed.cc
// streams them).
absl::StatusOr<ListScheduled> HanayoKind(int num_ranks, int num_microbatches, int waves);
absl::StatusOr<ListScheduled> ZBVKind(int num_ranks, int num_microbatches,
                                      std::array<int, 3> planning_costs);
absl::StatusOr<ListScheduled> ChimeraKind(int num_ranks, int num_microbatches);
absl::StatusOr<ListScheduled> InterleavedKind(int num_ranks, int num_microbatches, int chunks);
// GPipe's and 1F1B's fixed orders, one stream per rank: the list scheduler only times them.
absl::StatusOr<ListScheduled> GPipeKind(int num_ranks, int num_microbatches);
absl::StatusOr<ListScheduled> OneFOneBKind(int num_ranks, int num_microbatches);

// A kind whose ranks each run one fixed 1F1B order (Stream::OneFOneB) over `units`: rank r's
// stream on stage r with warmup(r) forwards first (chunks `chunk_stride` stages apart). One
// stream per rank leaves the list scheduler no choice: it only times the order.
ListScheduled OneFOneBPerRank(ScheduleSpec spec, Placement placement, std::vector<Unit> units,
                              const std::function<int(int)>& warmup, int chunk_stride = 0,
                              int num_chunks = 1);

// The description of `spec`'s kind when it is list-scheduled; nullopt for the kinds completed
// from fixed orders.
absl::StatusOr<std::optional<ListScheduled>> ListScheduledFor(const ScheduleSpec& spec);

}  // namespace tandem::pipeline::internal
