// Interleaved 1F1B: Megatron-LM's table, list-scheduled when the last group is short.
#include "pipeline/generators.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"

namespace tandem::pipeline {

using internal::CheckedSpec;
using internal::CompleteScheduleFor;
using internal::Compute;
using internal::ConfigFor;
using internal::ListSchedulerConfig;
using internal::Op;
using internal::OpOf;
using internal::OpOrders;
using internal::ScheduleAndComplete;
using internal::Stream;
using internal::Streams;
using internal::UnitCosts;

absl::StatusOr<Schedule> GenerateInterleaved(int num_ranks, int num_microbatches, int chunks) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kInterleaved, num_ranks, num_microbatches,
                                      /*chunks=*/chunks, /*waves=*/1));
  const int p = num_ranks, m = num_microbatches, v = chunks;
  // Megatron-LM's schedule table: micro-batches in groups of p, each group run chunk by
  // chunk; the last group takes all remaining micro-batches (m need not be a multiple of p).
  const int group = p;
  std::vector<std::pair<int, int>> table;  // (micro-batch, chunk)
  table.reserve(static_cast<size_t>(m) * v);
  for (int low = 0; low < m; low += group) {
    const int high = low + group >= m ? m : low + group;
    for (int c = 0; c < v; ++c) {
      for (int mb = low; mb < high; ++mb) table.emplace_back(mb, c);
    }
    if (high == m) break;
  }
  const int total = m * v;
  auto warmup_of = [&](int r) {
    // With one chunk this is plain 1F1B.
    int warmup = v == 1 ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * group;
    return std::min(warmup, total);
  };
  auto forward = [&](int r, int k) {
    return Compute(ActionType::kForward, 0, table[k].second * p + r, table[k].first);
  };
  auto backward = [&](int r, int k) {
    return Compute(ActionType::kBackward, 0, (v - 1 - table[k].second) * p + r, table[k].first);
  };
  Placement placement = Placement::Looped(p, v);
  if (m % p == 0 || v == 1) {
    // Megatron's order: warm-up forwards, then strictly one forward, one backward.
    auto op = [](const Action& a) { return OpOf(a.type, a.replica, a.stage, a.microbatch); };
    OpOrders orders(p);
    for (int r = 0; r < p; ++r) {
      const int warmup = warmup_of(r);
      auto& order = orders[r];
      order.reserve(2 * total);
      int next_forward = 0;
      for (; next_forward < warmup; ++next_forward) order.push_back(op(forward(r, next_forward)));
      for (int next_backward = 0; next_backward < total; ++next_backward) {
        if (next_forward < total) order.push_back(op(forward(r, next_forward++)));
        order.push_back(op(backward(r, next_backward)));
      }
    }
    return CompleteScheduleFor<Op>(spec, std::move(placement), std::move(orders),
                                   {UnitCosts{}});
  } else {
    // With a short last group the strict alternation can wait on itself across ranks (a
    // rank's last warm-up forward needs a backward that waits for that rank). Run the same
    // forward and backward sequences through the list scheduler instead, forward first and
    // at most Megatron's warm-up + 1 forwards in flight: identical to Megatron where it runs,
    // and never slower on the grid we checked.
    ListSchedulerConfig config = ConfigFor(spec, placement);
    config.forward_class = 0;
    config.backward_class = 1;
    for (int r = 0; r < p; ++r) config.stash_caps.push_back(warmup_of(r) + 1);
    auto make_streams = [&](const Placement&) {
      Streams streams(p);
      for (int r = 0; r < p; ++r) {
        std::vector<Action> forwards, backwards;
        forwards.reserve(total);
        backwards.reserve(total);
        for (int k = 0; k < total; ++k) {
          forwards.push_back(forward(r, k));
          backwards.push_back(backward(r, k));
        }
        streams[r].push_back(Stream::Listed(std::move(forwards)));
        streams[r].push_back(Stream::Listed(std::move(backwards)));
      }
      return streams;
    };
    return ScheduleAndComplete({spec, std::move(placement), config, make_streams});
  }
}

}  // namespace tandem::pipeline
