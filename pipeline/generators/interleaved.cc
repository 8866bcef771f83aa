// Interleaved 1F1B: Megatron-LM's table, timed by the list scheduler (which chooses the order
// itself only when the last group is short).
#include "pipeline/generators.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"

namespace tandem::pipeline {

using internal::CheckedSpec;
using internal::Compute;
using internal::ConfigFor;
using internal::ListScheduled;
using internal::ListSchedulerConfig;
using internal::ScheduleAndComplete;
using internal::Stream;
using internal::Streams;
using internal::Unit;

namespace internal {

absl::StatusOr<ListScheduled> InterleavedKind(int num_ranks, int num_microbatches, int chunks) {
  TANDEM_ASSIGN_OR_RETURN(ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kInterleaved, num_ranks, num_microbatches,
                                      /*chunks=*/chunks, /*waves=*/1));
  const int p = num_ranks, m = num_microbatches, v = chunks;
  // Megatron-LM's schedule table: micro-batches in groups of p, each group run chunk by
  // chunk; the last group takes all remaining micro-batches (m need not be a multiple of p).
  const int group = p;
  std::vector<Unit> table;  // (micro-batch, chunk)
  table.reserve(static_cast<size_t>(m) * v);
  for (int low = 0; low < m; low += group) {
    const int high = low + group >= m ? m : low + group;
    for (int c = 0; c < v; ++c) {
      for (int mb = low; mb < high; ++mb) table.push_back({mb, c});
    }
    if (high == m) break;
  }
  const int total = m * v;
  auto warmup_of = [=](int r) {
    // With one chunk this is plain 1F1B.
    int warmup = v == 1 ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * group;
    return std::min(warmup, total);
  };
  if (m % p == 0 || v == 1) {
    // Megatron's order: warm-up forwards, then strictly one forward, one backward; unit k's
    // forward on stage chunk * p + r, its backward on (v - 1 - chunk) * p + r.
    return OneFOneBPerRank(std::move(spec), Placement::Looped(p, v), std::move(table), warmup_of,
                           /*chunk_stride=*/p, /*num_chunks=*/v);
  }
  // With a short last group the strict alternation can wait on itself across ranks (a
  // rank's last warm-up forward needs a backward that waits for that rank). Run the same
  // forward and backward sequences through the list scheduler instead, forward first and
  // at most Megatron's warm-up + 1 forwards in flight: identical to Megatron where it runs,
  // and never slower on the grid we checked.
  ListScheduled kind;
  kind.spec = std::move(spec);
  kind.placement = Placement::Looped(p, v);
  ListSchedulerConfig& config = kind.config;
  config = ConfigFor(kind.spec, kind.placement);
  config.forward_class = 0;
  config.backward_class = 1;
  for (int r = 0; r < p; ++r) config.stash_caps.push_back(warmup_of(r) + 1);
  kind.make_streams = [p, v, total, table = std::move(table)](const Placement&) {
    Streams streams(p);
    for (int r = 0; r < p; ++r) {
      std::vector<Action> forwards, backwards;
      forwards.reserve(total);
      backwards.reserve(total);
      for (const Unit& unit : table) {
        forwards.push_back(Compute(ActionType::kForward, 0, unit.chunk * p + r, unit.microbatch));
        backwards.push_back(
            Compute(ActionType::kBackward, 0, (v - 1 - unit.chunk) * p + r, unit.microbatch));
      }
      streams[r].push_back(Stream::Listed(std::move(forwards)));
      streams[r].push_back(Stream::Listed(std::move(backwards)));
    }
    return streams;
  };
  return kind;
}

}  // namespace internal

absl::StatusOr<Schedule> GenerateInterleaved(int num_ranks, int num_microbatches, int chunks) {
  TANDEM_ASSIGN_OR_RETURN(internal::ListScheduled kind,
                          internal::InterleavedKind(num_ranks, num_microbatches, chunks));
  return ScheduleAndComplete(std::move(kind));
}

}  // namespace tandem::pipeline
