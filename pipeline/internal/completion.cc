#include "pipeline/internal/completion.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "pipeline/generators.h"

namespace tandem::pipeline::internal {
namespace {

// ---- CompleteSchedule helpers ----------------------------------------------------------------

// Start times of every compute in `orders` run with data-flow semantics at nominal
// costs (a compute starts when its rank is free and its inputs exist; transfers are free).
// The times do not depend on the order in which ranks are advanced. FailedPrecondition if the
// orders cannot run to the end (a cycle between ranks).
template <typename Item>
absl::Status NominalTimeline(const Placement& placement, const PairTable& table,
                             int num_microbatches, const Orders<Item>& orders,
                             const UnitCosts& costs,
                             std::vector<std::vector<Time>>* start) {
  const int num_ranks = placement.num_ranks;
  const int num_stages = placement.num_stages;
  constexpr Time kPending = -1;
  // End of each triple's forward and of its backward (B, or Bi: what W and the previous
  // stage's backward wait for).
  const BlockedLayout layout(table.NumPairs(), num_microbatches);
  std::vector<Time> forward_end(layout.Entries(), kPending);
  std::vector<Time> backward_end(layout.Entries(), kPending);
  std::vector<size_t> pc(num_ranks, 0);
  std::vector<Time> free_at(num_ranks, 0);
  start->assign(num_ranks, {});
  for (int r = 0; r < num_ranks; ++r) (*start)[r].resize(orders[r].size());
  // Ranks woken when an input they may wait for exists: a worklist, each rank at most once.
  std::vector<int> worklist;
  for (int r = num_ranks - 1; r >= 0; --r) worklist.push_back(r);
  std::vector<uint8_t> queued(num_ranks, 1);
  auto wake = [&](int r) {
    if (queued[r]) return;
    queued[r] = 1;
    worklist.push_back(r);
    // It resumes where it stopped, after this rank stops: a few actions at a time in an
    // order no hardware prefetcher follows, in tables far larger than the caches.
    if (pc[r] < orders[r].size()) {
      Prefetch(&orders[r][pc[r]]);
      Prefetch(&(*start)[r][pc[r]]);
    }
  };
  int64_t done = 0, total = 0;
  for (const auto& order : orders) total += static_cast<int64_t>(order.size());
  while (!worklist.empty()) {
    const int r = worklist.back();
    worklist.pop_back();
    queued[r] = 0;
    const auto& order = orders[r];
    Time* rank_start = (*start)[r].data();
    size_t i = pc[r];
    Time free = free_at[r];
    for (; i < order.size(); ++i) {
      const Action a = ActionOf(order[i]);
      const size_t pair = table.Pair(a.replica, a.stage);
      const size_t t = layout.Index(pair, a.microbatch);
      Time ready = 0;
      switch (a.type) {
        case ActionType::kForward:
          if (a.stage > 0) ready = forward_end[layout.Index(pair - 1, a.microbatch)];
          break;
        case ActionType::kBackward:
        case ActionType::kBackwardInput:
          ready = forward_end[t];
          if (ready != kPending && a.stage + 1 < num_stages) {
            const Time next = backward_end[layout.Index(pair + 1, a.microbatch)];
            ready = next == kPending ? kPending : std::max(ready, next);
          }
          break;
        default:
          ready = backward_end[t];
          break;
      }
      if (ready == kPending) break;
      const Time t0 = std::max(ready, free);
      free = t0 + costs.Of(a.type);
      rank_start[i] = t0;
      switch (a.type) {
        case ActionType::kForward:
          forward_end[t] = free;
          if (a.stage + 1 < num_stages) wake(table.Owner(a.replica, a.stage + 1));
          break;
        case ActionType::kBackward:
        case ActionType::kBackwardInput:
          backward_end[t] = free;
          if (a.stage > 0) wake(table.Owner(a.replica, a.stage - 1));
          break;
        default:
          break;
      }
    }
    done += static_cast<int64_t>(i - pc[r]);
    pc[r] = i;
    free_at[r] = free;
  }
  if (done != total) {
    for (int r = 0; r < num_ranks; ++r) {
      if (pc[r] < orders[r].size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("compute orders cannot run: rank ", r, " step ", pc[r], " (",
                         ToString(ActionOf(orders[r][pc[r]])),
                         ") waits for an input that never comes"));
      }
    }
  }
  return absl::OkStatus();
}

// A receive to post on a rank, and the compute it goes before.
struct PlacedReceive {
  int before;
  Action action;
};

}  // namespace

template <typename Item>
absl::StatusOr<Schedule> CompleteScheduleFor(const ScheduleSpec& spec, Placement placement,
                                             Orders<Item> compute_orders,
                                             const std::vector<UnitCosts>& timeline_costs,
                                             std::vector<std::vector<Time>> first_timeline) {
  const int num_ranks = placement.num_ranks;
  const int num_stages = placement.num_stages;
  const int num_replicas = placement.NumReplicas();
  const int m = spec.num_microbatches;
  if (static_cast<int>(compute_orders.size()) != num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", num_ranks,
                                                   " compute orders, got ",
                                                   compute_orders.size()));
  }
  const PairTable table(placement);
  const size_t pairs = static_cast<size_t>(num_replicas) * num_stages;
  const size_t triples = pairs * m;
  // Where each activation / gradient is consumed: compute index on its consumer rank.
  constexpr int kNone = -1;
  std::vector<int> activation_consumer(triples, kNone);  // output of (rep, s, mb) -> F(s+1)
  std::vector<int> gradient_consumer(triples, kNone);    // input grad of (rep, s, mb) -> B(s-1)
  // Last backward (or W) per (replica, stage) on its rank, for GradientSync.
  std::vector<int> last_backward(pairs, kNone);
  // Sends per rank, to size the programs.
  std::vector<size_t> sends(num_ranks, 0);
  for (int r = 0; r < num_ranks; ++r) {
    const auto& order = compute_orders[r];
    for (int i = 0; i < static_cast<int>(order.size()); ++i) {
      const Action a = ActionOf(order[i]);
      if (!IsCompute(a.type) || a.replica >= num_replicas || a.stage < 0 ||
          a.stage >= num_stages || a.microbatch < 0 || a.microbatch >= m ||
          table.Owner(a.replica, a.stage) != r) {
        return absl::InvalidArgumentError(absl::StrCat("compute order of rank ", r, " step ", i,
                                                       ": bad action ", ToString(a)));
      }
      const size_t pair = table.Pair(a.replica, a.stage);
      const size_t t = pair * m + a.microbatch;
      if (a.type == ActionType::kForward && a.stage > 0) {
        activation_consumer[t - m] = i;
      }
      if ((a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) &&
          a.stage + 1 < num_stages) {
        gradient_consumer[t + m] = i;
      }
      if (FinishesWeightGradient(a.type)) last_backward[pair] = i;
      if (table.Destination(a) >= 0) ++sends[r];
    }
  }

  // Receives are posted where the data exists in the nominal timeline: in the transfer run
  // before the receiver's first compute that starts at or after the send (so that the peer's
  // send and this receive meet in groups issued at about the same time, as NCCL wants), and
  // never after the consumer.
  const size_t num_timelines = timeline_costs.size();
  std::vector<std::vector<std::vector<Time>>> starts(num_timelines);
  for (size_t c = 0; c < num_timelines; ++c) {
    if (c == 0 && !first_timeline.empty()) {
      starts[0] = std::move(first_timeline);
      continue;
    }
    TANDEM_RETURN_IF_ERROR(NominalTimeline<Item>(placement, table, m, compute_orders,
                                                 timeline_costs[c], &starts[c]));
  }

  // The (replica, stage) pairs of each rank, in Placement::StagesOf order.
  std::vector<std::vector<std::pair<int, int>>> held(num_ranks);
  for (int replica = 0; replica < num_replicas; ++replica) {
    for (int stage = 0; stage < num_stages; ++stage) {
      held[table.Owner(replica, stage)].emplace_back(replica, stage);
    }
  }

  // The first message nobody consumes, in the order senders are listed (ascending, each
  // destination in the order of its first message): the error CompleteSchedule reports.
  auto unconsumed_error = [&]() -> absl::Status {
    for (int r = 0; r < num_ranks; ++r) {
      std::vector<int> peers;
      for (const Item& item : compute_orders[r]) {
        const int peer = table.Destination(ActionOf(item));
        if (peer >= 0 && std::find(peers.begin(), peers.end(), peer) == peers.end()) {
          peers.push_back(peer);
        }
      }
      for (int peer : peers) {
        for (const Item& item : compute_orders[r]) {
          const Action a = ActionOf(item);
          if (table.Destination(a) != peer) continue;
          Action send = a;
          send.type = a.type == ActionType::kForward ? ActionType::kSendActivation
                                                     : ActionType::kSendGradient;
          const size_t t = table.Pair(a.replica, a.stage) * m + a.microbatch;
          const int consumer = a.type == ActionType::kForward ? activation_consumer[t]
                                                              : gradient_consumer[t];
          if (consumer == kNone) {
            return absl::InvalidArgumentError(absl::StrCat(
                "rank ", peer, " never consumes ", ToString(send), " sent by rank ", r));
          }
        }
      }
    }
    return absl::InternalError("a message without a consumer could not be found again");
  };

  Schedule schedule;
  schedule.spec = spec;
  schedule.placement = std::move(placement);
  schedule.programs.resize(num_ranks);
  // Per receiver: the messages of each sender, in the sender's order, with the compute they
  // go before; merged by that compute (senders ascending on ties) as the program is written.
  // Built rank by rank, so no table of every receive.
  std::vector<int> senders;
  // channels[k] holds channel_size[k] receives: the room grows to the longest sender order
  // seen and is reused, written through a pointer (see the program below).
  std::vector<std::vector<PlacedReceive>> channels;
  std::vector<size_t> channel_size, channel_next;
  std::vector<size_t> available(num_timelines);
  for (int r = 0; r < num_ranks; ++r) {
    senders.clear();
    for (const auto& [replica, stage] : held[r]) {
      for (int neighbour : {stage - 1, stage + 1}) {
        if (neighbour < 0 || neighbour >= num_stages) continue;
        const int q = table.Owner(replica, neighbour);
        if (q != r) senders.push_back(q);
      }
    }
    std::sort(senders.begin(), senders.end());
    senders.erase(std::unique(senders.begin(), senders.end()), senders.end());
    if (channels.size() < senders.size()) channels.resize(senders.size());
    channel_size.assign(senders.size(), 0);
    const auto& order = compute_orders[r];
    size_t total_receives = 0;
    for (size_t k = 0; k < senders.size(); ++k) {
      const int q = senders[k];
      const auto& sender_order = compute_orders[q];
      if (channels[k].size() < sender_order.size()) channels[k].resize(sender_order.size());
      PlacedReceive* const channel = channels[k].data();
      size_t size = 0;
      std::fill(available.begin(), available.end(), 0);
      for (size_t ci = 0; ci < sender_order.size(); ++ci) {
        const Action a = ActionOf(sender_order[ci]);
        if (table.Destination(a) != r) continue;
        const size_t t = table.Pair(a.replica, a.stage) * m + a.microbatch;
        const bool activation = a.type == ActionType::kForward;
        const int consumer = activation ? activation_consumer[t] : gradient_consumer[t];
        if (consumer == kNone) return unconsumed_error();
        // Sends of a channel leave in program order, so at nondecreasing times: the first
        // receiver compute starting at or after each only moves forward.
        size_t latest = 0;
        for (size_t c = 0; c < num_timelines; ++c) {
          const std::vector<Time>& receiver_start = starts[c][r];
          const Time time = starts[c][q][ci] + timeline_costs[c].Of(a.type);
          size_t& at = available[c];
          while (at < receiver_start.size() && receiver_start[at] < time) ++at;
          latest = std::max(latest, at);
        }
        channel[size++] = {std::min(consumer, static_cast<int>(latest)),
                           TransferOf(a,
                                      activation ? ActionType::kRecvActivation
                                                 : ActionType::kRecvGradient,
                                      q)};
      }
      // FIFO: receive k must precede receive k+1.
      for (size_t j = size; j-- > 1;) {
        channel[j - 1].before = std::min(channel[j - 1].before, channel[j].before);
      }
      channel_size[k] = size;
      total_receives += size;
    }
    // The channels (each ordered by `before`) are merged as the program is written: before
    // compute i go the receives placed there, channel by channel, the lower sender first.
    channel_next.assign(senders.size(), 0);

    // The program: receives, each compute with its sync and its send, the syncs of stages
    // without a backward here, the step. Its length is known: the room is made at that length
    // just before it is written (a few hundred KB, so the lines the fill touches are still in
    // cache when the actions overwrite them) and written through a pointer the compiler keeps
    // in a register (push_back reloads the vector's end after every store of an Action, whose
    // byte fields may alias it).
    std::vector<Action>& program = schedule.programs[r];
    const size_t length = order.size() + sends[r] + total_receives + held[r].size() + 1;
    program.resize(length);
    Action* out = program.data();
    Action* const out_end = out + length;
    bool overflow = false;
    auto put = [&](const Action& action) {
      if (out == out_end) {
        overflow = true;
        return;
      }
      *out++ = action;
    };
    const size_t num_senders = senders.size();
    for (int i = 0; i < static_cast<int>(order.size()); ++i) {
      for (size_t k = 0; k < num_senders; ++k) {
        const PlacedReceive* const channel = channels[k].data();
        const size_t size = channel_size[k];
        size_t& at = channel_next[k];
        while (at < size && channel[at].before == i) put(channel[at++].action);
      }
      const Action a = ActionOf(order[i]);
      put(a);
      // The stage's gradients are final: start their synchronisation before the sends, so
      // that the transfer run after this compute stays one group.
      if (FinishesWeightGradient(a.type) &&
          last_backward[table.Pair(a.replica, a.stage)] == i) {
        put(SyncOf(a.replica, a.stage));
      }
      const int peer = table.Destination(a);
      if (peer >= 0) {
        put(TransferOf(a,
                       a.type == ActionType::kForward ? ActionType::kSendActivation
                                                      : ActionType::kSendGradient,
                       peer));
      }
    }
    // A held stage that never ran a backward still gets its sync (the validator then reports
    // the missing backward).
    for (const auto& [replica, stage] : held[r]) {
      if (last_backward[table.Pair(replica, stage)] == kNone) put(SyncOf(replica, stage));
    }
    put(StepAction());
    if (overflow || out != out_end) {
      return absl::InternalError(absl::StrCat("rank ", r, ": program length miscounted"));
    }
  }
  return schedule;
}

// Runs the list scheduler over the streams `make_streams(placement)` returns and completes its
// orders into a schedule, with receives placed against its timeline (F=1, B=2) and, when
// `second_full_backward` > 0, also against one where a full backward costs that much. The
// programs are built while scheduling; only if the stash cap has to be relaxed (actions are

template absl::StatusOr<Schedule> CompleteScheduleFor<Action>(
    const ScheduleSpec&, Placement, Orders<Action>, const std::vector<UnitCosts>&,
    std::vector<std::vector<Time>>);

}  // namespace tandem::pipeline::internal

namespace tandem::pipeline {

absl::StatusOr<Schedule> CompleteSchedule(const ScheduleSpec& spec, Placement placement,
                                          std::vector<std::vector<Action>> compute_orders) {
  return internal::CompleteScheduleFor<Action>(spec, std::move(placement),
                                               std::move(compute_orders),
                                               {internal::UnitCosts{}});
}

}  // namespace tandem::pipeline
