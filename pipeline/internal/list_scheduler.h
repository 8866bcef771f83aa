// The list scheduler: compute orders chosen by simulating at nominal costs. Private to
// pipeline/; the generators of list-scheduled kinds (interleaved with a short last group,
// Chimera, Hanayo, ZB-V) describe their streams and priorities and call ScheduleAndComplete.
//
// Builds compute orders by simulating at nominal costs: every rank has streams (fixed
// sequences of compute actions); whenever a rank can start the head of a stream, the head
// that can start earliest runs (ties: priority class of its type, then closeness to the end of
// the pipeline). The rank whose best head starts earliest goes first. Forwards may be held
// back by a cap on stashed activations (in chunks); the cap is soft: if every rank is stuck
// on it, the earliest capped forward runs anyway, so the scheduler always finishes.
//
// At p=1024, m=4096 ZB-V schedules 25M actions this way, so the loop does little per action:
// each stream caches its head and when the head's inputs are ready (looked up only when the
// head changes or an input appears), a rank looks only at its ready streams, and ranks wait
// in buckets of equal start time (see StartQueue) instead of a heap. The scheduler also hands
// each action, as it is scheduled, to a sink: the programs can be built on the fly (see
// ProgramBuilder), without storing the orders and their timeline for CompleteSchedule.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/internal/orders.h"
#include "pipeline/internal/emitted_actions.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline::internal {

// A unit of a 1F1B order: a micro-batch and the model chunk it runs on.
struct Unit {
  int microbatch;
  int chunk;
};

// A fixed sequence of compute actions the list scheduler takes in order: either listed, or
// the actions of one type for one (replica, stage) over micro-batches 0, 1, ... (not
// materialised: at p=1024, m=4096 ZB-V's would take half a gigabyte).
struct Stream {
  std::vector<Action> actions;  // listed; empty for a sequence
  ActionType type = ActionType::kForward;
  int replica = 0;
  int stage = 0;
  size_t length = 0;
  size_t next = 0;  // index of the head
  // A 1F1B order (Append1F1B) over these units with `warmup` forwards first, when not null;
  // shared between streams. Unit k's forward runs on stage chunk * chunk_stride + stage, its
  // backward on (num_chunks - 1 - chunk) * chunk_stride + stage (interleaving takes the
  // chunks in reverse on the way back).
  const std::vector<Unit>* one_f_one_b = nullptr;
  size_t warmup = 0;
  int chunk_stride = 0;
  int num_chunks = 1;

  static Stream Listed(std::vector<Action> actions) {
    Stream s;
    s.length = actions.size();
    s.actions = std::move(actions);
    return s;
  }
  static Stream Sequence(ActionType type, int replica, int stage, int num_microbatches) {
    Stream s;
    s.type = type;
    s.replica = replica;
    s.stage = stage;
    s.length = static_cast<size_t>(num_microbatches);
    return s;
  }
  // Append1F1B's order without listing it: `warmup` forwards, then forward and backward
  // alternating while forwards remain, then the remaining backwards.
  static Stream OneFOneB(int replica, int stage, const std::vector<Unit>* units, int warmup,
                         int chunk_stride = 0, int num_chunks = 1) {
    Stream s;
    s.replica = replica;
    s.stage = stage;
    s.one_f_one_b = units;
    s.length = 2 * units->size();
    s.warmup = static_cast<size_t>(std::clamp(warmup, 0, static_cast<int>(units->size())));
    s.chunk_stride = chunk_stride;
    s.num_chunks = num_chunks;
    return s;
  }
  bool sequence() const { return one_f_one_b == nullptr && actions.empty(); }
  bool done() const { return next >= length; }
  Action Head() const { return At(next); }
  // The stream's j-th action.
  Action At(size_t j) const {
    if (one_f_one_b != nullptr) {
      const std::vector<Unit>& units = *one_f_one_b;
      const size_t n = units.size();
      auto forward = [&](size_t u) {
        return Compute(ActionType::kForward, replica, units[u].chunk * chunk_stride + stage,
                       units[u].microbatch);
      };
      auto backward = [&](size_t u) {
        return Compute(ActionType::kBackward, replica,
                       (num_chunks - 1 - units[u].chunk) * chunk_stride + stage,
                       units[u].microbatch);
      };
      if (j < warmup) return forward(j);
      const size_t k = j - warmup;
      const size_t alternating = 2 * (n - warmup);
      if (k < alternating) return k % 2 == 0 ? forward(warmup + k / 2) : backward(k / 2);
      return backward(n - warmup + (k - alternating));
    }
    return actions.empty() ? Compute(type, replica, stage, static_cast<int>(j)) : actions[j];
  }
  // Calls f(action) for every action of the stream, in order.
  template <typename F>
  void ForEach(F f) const {
    for (size_t j = 0; j < length; ++j) f(At(j));
  }
};
using Streams = std::vector<std::vector<Stream>>;  // [rank][stream]

// How the list scheduler chooses among ready heads.
struct ListSchedulerConfig {
  int num_ranks = 0;
  int num_microbatches = 0;
  // Priority class per type (lower first) for kForward, kBackward/kBackwardInput,
  // kBackwardWeight.
  int forward_class = 1;
  int backward_class = 0;
  int weight_class = 2;
  int64_t stash_cap = std::numeric_limits<int64_t>::max();  // per rank, in chunks
  UnitCosts costs;  // what each compute costs in its timeline
  std::vector<int64_t> stash_caps;  // per-rank caps; overrides stash_cap when not empty
};

// A config for the spec's ranks and micro-batches, with the default classes and no cap.
ListSchedulerConfig ConfigFor(const ScheduleSpec& spec, const Placement& placement);

// Streams of one forward sequence and one backward (and W) sequence per stage a rank holds,
// each in micro-batch order.
Streams PerStageStreams(const Placement& placement, int num_microbatches, bool split_backward);

// A list-scheduled kind as its generator describes it: the spec, the placement, how the
// scheduler chooses, and its streams (made from the placement when needed, possibly twice).
// When `second_full_backward` > 0 receives are also placed against a timeline where a full
// backward costs that much.
struct ListScheduled {
  ScheduleSpec spec;
  Placement placement;
  ListSchedulerConfig config;
  std::function<Streams(const Placement&)> make_streams;
  int second_full_backward = 0;
};

// Runs the list scheduler over the kind's streams and completes its orders into a schedule,
// with receives placed against its timeline (F=1, B=2) and the second one if asked. The
// programs are built while scheduling; only if the stash cap has to be relaxed (actions are
// then not scheduled in order of start) are the orders recorded and completed afterwards
// (make_streams is then called a second time).
absl::StatusOr<Schedule> ScheduleAndComplete(ListScheduled kind);

// The same programs, handed to `consumer` as they are built, `batch_actions` at a time in the
// order of emission (see EmittedActions), and never held. Aborted when the stash cap has to be
// relaxed: the programs are then not built in order, and the caller generates the schedule
// whole instead.
absl::Status ScheduleAndStream(const ListScheduled& kind, ActionConsumer& consumer,
                               size_t batch_actions);

}  // namespace tandem::pipeline::internal
