// CompleteSchedule's machinery: compute orders (F, B, Bi, W only) completed into programs with
// transfers, gradient synchronisation and the optimizer step (see CompleteSchedule in
// pipeline/generators.h for the rules). Private to pipeline/. Instantiated for Action (Op, the
// generators' fixed orders, is an Action; also the list scheduler's recorded orders and
// hand-made orders).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/internal/orders.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline::internal {

// CompleteSchedule, with receives placed against nominal timelines in which a full backward
// costs each of `timeline_costs`: a receive goes before the receiver's first
// compute that starts after the send in every timeline (never after its consumer), so that
// none of those cost ratios makes the receiver wait on it early. `first_timeline`, when not
// empty, holds the timeline for timeline_costs[0] (the list scheduler's).
template <typename Item>
absl::StatusOr<Schedule> CompleteScheduleFor(const ScheduleSpec& spec, Placement placement,
                                             Orders<Item> compute_orders,
                                             const std::vector<UnitCosts>& timeline_costs,
                                             std::vector<std::vector<Time>> first_timeline = {});

}  // namespace tandem::pipeline::internal
