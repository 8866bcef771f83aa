// Builds programs while the list scheduler runs: the on-the-fly form of CompleteSchedule (see
// the class comment). Header-only so that the scheduler's loop inlines its per-action call;
// included by list_scheduler.cc only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/internal/list_scheduler.h"
#include "pipeline/internal/orders.h"
#include "pipeline/internal/emitted_actions.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline::internal {

// The programs whole, as the runtime and the files take them.
class WholeProgramWriter {
 public:
  // Each program is made at its final length (`lengths`, as counted) up front and written
  // through a cursor per rank. Appending with push_back instead costs more than the fill: it
  // reloads the vector's end after every Action stored (an Action's byte fields may alias
  // it), at 50-100 M actions (measured at p=1024, m=4096: ZB-V 2.45 -> 2.32 s of the
  // command).
  void Start(const std::vector<size_t>& lengths) {
    const size_t num_ranks = lengths.size();
    programs_.resize(num_ranks);
    cursor_.resize(num_ranks);
    end_.resize(num_ranks);
    for (size_t r = 0; r < num_ranks; ++r) {
      programs_[r].resize(lengths[r]);
      cursor_[r] = programs_[r].data();
      end_[r] = cursor_[r] + lengths[r];
    }
  }
  // Writes the rank's next action at its cursor. A miscounted length writes nothing past the
  // program's end, and Finish reports it.
  void Emit(int r, const Action& action) {
    Action*& cursor = cursor_[r];
    if (cursor == end_[r]) {
      overflow_ = true;
      return;
    }
    *cursor++ = action;
  }
  // After each compute's actions: the rank writes next where its program has never been
  // touched, at p=1024 a line (and its page's TLB entry) far out of cache. Its next action
  // comes ~p actions later, time enough to fetch the line after the one being written.
  void Scheduled(int r) {
    if (end_[r] - cursor_[r] > static_cast<std::ptrdiff_t>(kWriteAhead)) {
      Prefetch(cursor_[r] + kWriteAhead);
    }
  }
  absl::StatusOr<std::vector<std::vector<Action>>> Finish() {
    for (size_t r = 0; r < programs_.size(); ++r) {
      if (overflow_ || cursor_[r] != end_[r]) {
        return absl::InternalError("program builder: program length miscounted");
      }
    }
    return std::move(programs_);
  }

 private:
  static constexpr size_t kWriteAhead = 64 / sizeof(Action);  // actions: the next cache line
  std::vector<std::vector<Action>> programs_;
  std::vector<Action*> cursor_, end_;  // per program: where its next action goes, its end
  bool overflow_ = false;
};

// The actions handed to a consumer as they are emitted, `batch` at a time (and the rest at the
// end), never held: see EmittedActions.
class EmissionWriter {
 public:
  EmissionWriter() = default;
  EmissionWriter(ActionConsumer* consumer, size_t batch)
      : consumer_(consumer), capacity_(std::max<size_t>(1, batch)) {}
  void Start(const std::vector<size_t>&) {
    ranks_.resize(capacity_);
    actions_.resize(capacity_);
    size_ = 0;
  }
  void Emit(int r, const Action& action) {
    if (size_ == capacity_) Flush(/*last=*/false);
    ranks_[size_] = r;
    actions_[size_] = action;
    ++size_;
  }
  void Scheduled(int) {}
  absl::Status Finish() {
    Flush(/*last=*/true);
    return absl::OkStatus();
  }

 private:
  [[gnu::noinline]] void Flush(bool last) {
    consumer_->Consume(EmittedActions{ranks_.data(), actions_.data(), size_, last});
    size_ = 0;
  }

  ActionConsumer* consumer_ = nullptr;
  size_t capacity_ = 1;
  size_t size_ = 0;
  std::vector<int32_t> ranks_;
  std::vector<Action> actions_;
};

// Builds the programs while the list scheduler runs (a sink for ListScheduler::Run), with the
// receives CompleteSchedule would place: before the receiver's first compute that starts at or
// after the send ends, in the scheduler's timeline and (if asked) in a second one with another
// cost of full backward. The scheduler hands over actions in order of start time, so when a
// compute starts at t every send ending by t is known: the receives due are those waiting on
// the rank's channels (senders in ascending order, each in its order). Both timelines keep a
// rank's computes in order and a consumer starts after its input arrives, so these are exactly
// CompleteSchedule's slots. Only a relaxed stash cap, which schedules an action before one
// already handed over, breaks the order: then the caller records orders instead.
template <typename Writer = WholeProgramWriter>
class ProgramBuilder {
 public:
  ProgramBuilder(const ScheduleSpec& spec, const PairTable& table, const Streams& streams,
                 int second_full_backward, const UnitCosts& costs, Writer writer = Writer())
      : table_(table),
        costs_(costs),
        layout_(table.NumPairs(), spec.num_microbatches),
        second_full_backward_(second_full_backward),
        writer_(std::move(writer)) {
    const int num_ranks = static_cast<int>(streams.size());
    const size_t pairs = table_.NumPairs();
    // Per pair: how many final backwards it has (its sync follows the last), and where its
    // messages go: the channel (sender -> receiver) on the receiver.
    backwards_left_.assign(pairs, 0);
    std::vector<size_t> length(num_ranks, 0);
    auto count = [&](int r, const Action& a, size_t times) {
      if (FinishesWeightGradient(a.type)) {
        backwards_left_[table_.Pair(a.replica, a.stage)] += times;
      }
      length[r] += times;
      const int to = table_.Destination(a);
      if (to >= 0) {
        length[r] += times;   // the sends
        length[to] += times;  // the receives
      }
    };
    for (int r = 0; r < num_ranks; ++r) {
      for (const Stream& stream : streams[r]) {
        if (stream.sequence()) {
          if (stream.length > 0) count(r, stream.At(0), stream.length);
        } else {
          stream.ForEach([&](const Action& a) { count(r, a, 1); });
        }
      }
    }
    had_backward_.resize(pairs);
    for (size_t pair = 0; pair < pairs; ++pair) had_backward_[pair] = backwards_left_[pair] > 0;
    held_.resize(num_ranks);
    for (size_t pair = 0; pair < pairs; ++pair) {
      const int r = table_.Owner(pair);
      held_[r].push_back(pair);
      ++length[r];  // the sync
    }
    for (int r = 0; r < num_ranks; ++r) ++length[r];  // the optimizer step
    writer_.Start(length);
    first_channel_.assign(num_ranks + 1, 0);
    activation_channel_.assign(pairs, -1);
    gradient_channel_.assign(pairs, -1);
    for (int r = 0; r < num_ranks; ++r) {
      std::vector<int> senders;
      for (size_t pair : held_[r]) {
        const uint8_t n = table_.Neighbours(pair);
        if ((n & PairTable::kHasPrevious) && !(n & PairTable::kPreviousLocal)) {
          senders.push_back(table_.Owner(pair - 1));
        }
        if ((n & PairTable::kHasNext) && !(n & PairTable::kNextLocal)) {
          senders.push_back(table_.Owner(pair + 1));
        }
      }
      std::sort(senders.begin(), senders.end());
      senders.erase(std::unique(senders.begin(), senders.end()), senders.end());
      for (int q : senders) {
        channels_.emplace_back();
        channels_.back().sender = q;
      }
      first_channel_[r + 1] = static_cast<int>(channels_.size());
    }
    auto channel = [&](int receiver, int sender) {
      for (int c = first_channel_[receiver]; c < first_channel_[receiver + 1]; ++c) {
        if (channels_[c].sender == sender) return c;
      }
      return -1;
    };
    slots_ = kInitialSlots;
    messages_.resize(channels_.size() * slots_);
    for (size_t pair = 0; pair < pairs; ++pair) {
      if (table_.ActivationTo(pair) >= 0) {
        activation_channel_[pair] = channel(table_.ActivationTo(pair), table_.Owner(pair));
      }
      if (table_.GradientTo(pair) >= 0) {
        gradient_channel_[pair] = channel(table_.GradientTo(pair), table_.Owner(pair));
      }
    }
    if (second_full_backward_ > 0) {
      forward_end2_.assign(layout_.Entries(), 0);
      backward_end2_.assign(layout_.Entries(), 0);
      free2_.assign(num_ranks, 0);
    }
  }

  bool AllowsRelaxedCap() const { return false; }

  void Scheduled(int r, const Action& a, Time start) {
    const size_t pair = table_.Pair(a.replica, a.stage);
    Time start2 = 0, end2 = 0;
    if (second_full_backward_ > 0) {
      // The second timeline: the same orders run with data-flow semantics at the other cost;
      // an input from this rank ended before the rank is free again (as in the scheduler).
      const uint8_t n = table_.Neighbours(pair);
      Time ready = 0;
      if (a.type == ActionType::kForward) {
        if ((n & PairTable::kHasPrevious) && !(n & PairTable::kPreviousLocal)) {
          ready = forward_end2_[layout_.Index(pair - 1, a.microbatch)];
        }
      } else if (a.type != ActionType::kBackwardWeight) {
        if ((n & PairTable::kHasNext) && !(n & PairTable::kNextLocal)) {
          ready = backward_end2_[layout_.Index(pair + 1, a.microbatch)];
        }
      }
      start2 = std::max(ready, free2_[r]);
      end2 = start2 + NominalCost(a.type, second_full_backward_);
      free2_[r] = end2;
      if (a.type == ActionType::kForward) {
        forward_end2_[layout_.Index(pair, a.microbatch)] = end2;
      } else if (a.type != ActionType::kBackwardWeight) {
        backward_end2_[layout_.Index(pair, a.microbatch)] = end2;
      }
    }
    // Receives due before this compute.
    for (int c = first_channel_[r]; c < first_channel_[r + 1]; ++c) {
      Channel& channel = channels_[c];
      for (; channel.head != channel.tail; ++channel.head) {
        const Message& message = messages_[c * slots_ + (channel.head & (slots_ - 1))];
        if (message.end > start || message.end2 > start2) break;
        Emit(r, message.receive);
      }
    }
    Emit(r, a);
    // The stage's gradients are final: start their synchronisation before the sends, so that
    // the transfer run after this compute stays one group.
    if (FinishesWeightGradient(a.type) && --backwards_left_[pair] == 0) {
      Emit(r, SyncOf(a.replica, a.stage));
    }
    const bool activation = a.type == ActionType::kForward;
    const int channel = activation ? activation_channel_[pair]
                                   : (a.type == ActionType::kBackwardWeight
                                          ? -1
                                          : gradient_channel_[pair]);
    if (channel >= 0) {
      Emit(r, TransferOf(a,
                         activation ? ActionType::kSendActivation : ActionType::kSendGradient,
                         activation ? table_.ActivationTo(pair) : table_.GradientTo(pair)));
      Push(channel, {start + costs_.Of(a.type), end2,
                     TransferOf(a,
                                activation ? ActionType::kRecvActivation
                                           : ActionType::kRecvGradient,
                                r)});
    }
    writer_.Scheduled(r);
  }

  // What the writer makes of the programs (WholeProgramWriter: the programs; EmissionWriter:
  // nothing, its consumer has had them), once every action has been scheduled.
  auto Finish() -> decltype(std::declval<Writer&>().Finish()) {
    for (const Channel& channel : channels_) {
      if (channel.head != channel.tail) {
        return absl::InternalError("program builder: a receive was never placed");
      }
    }
    for (int r = 0; r < static_cast<int>(held_.size()); ++r) {
      // A held stage that never ran a backward still gets its sync (the validator then
      // reports the missing backward).
      for (size_t pair : held_[r]) {
        if (!had_backward_[pair]) {
          Emit(r, SyncOf(static_cast<int>(pair / table_.num_stages()),
                         static_cast<int>(pair % table_.num_stages())));
        }
      }
      Emit(r, StepAction());
    }
    return writer_.Finish();
  }

 private:
  // A send on its way: when it ends in each timeline, and the receive to post for it.
  struct Message {
    Time end;
    Time end2;
    Action receive;
  };
  // Sends from one rank to one receiver, in the sender's order, not yet received: the
  // messages head, head + 1, ..., tail - 1 of the channel's ring in messages_.
  struct Channel {
    int sender = 0;
    size_t head = 0;
    size_t tail = 0;
  };

  // The rings of all channels share one array (slots_ messages each), so that the few
  // messages in flight on a rank's channels sit near each other rather than in a heap block
  // per channel. A ring that fills up doubles every ring (rare: senders run at most a little
  // ahead of their receivers).
  static constexpr size_t kInitialSlots = 8;
  void Push(int c, const Message& message) {
    Channel& channel = channels_[c];
    if (channel.tail - channel.head == slots_) Grow();
    messages_[c * slots_ + (channel.tail & (slots_ - 1))] = message;
    ++channel.tail;
  }
  void Grow() {
    std::vector<Message> grown(messages_.size() * 2);
    for (size_t c = 0; c < channels_.size(); ++c) {
      const Channel& channel = channels_[c];
      for (size_t j = channel.head; j != channel.tail; ++j) {
        grown[c * 2 * slots_ + (j & (2 * slots_ - 1))] = messages_[c * slots_ + (j & (slots_ - 1))];
      }
    }
    messages_.swap(grown);
    slots_ *= 2;
  }

  void Emit(int r, const Action& action) { writer_.Emit(r, action); }

  const PairTable& table_;
  const UnitCosts costs_;  // the list scheduler's
  const BlockedLayout layout_;      // of the second timeline's tables
  const int second_full_backward_;  // 0: no second timeline
  std::vector<int> backwards_left_;              // per pair: final backwards to come
  std::vector<bool> had_backward_;               // per pair
  std::vector<std::vector<size_t>> held_;        // per rank: its pairs
  // Channels by receiver (first_channel_[r] ..), senders ascending within a receiver.
  std::vector<int> first_channel_;
  std::vector<Channel> channels_;
  std::vector<Message> messages_;  // [channel * slots_ + position % slots_]
  size_t slots_ = 0;
  std::vector<int> activation_channel_, gradient_channel_;  // per pair, on the receiver
  std::vector<Time> forward_end2_, backward_end2_, free2_;  // the second timeline
  Writer writer_;
};

}  // namespace tandem::pipeline::internal
