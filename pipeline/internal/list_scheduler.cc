#include "pipeline/internal/list_scheduler.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "pipeline/internal/completion.h"
#include "pipeline/internal/program_builder.h"

namespace tandem::pipeline::internal {
namespace {

// Ranks waiting to run, each with the start time of its best head, popped in order of
// (start, rank). Every queued start lies within a few time units of the last one popped (a
// start is the end of an action already scheduled, and no action costs more than 2), so the
// ranks are kept in one bucket per start time, a bitset over ranks, in a ring indexed by the
// time: the lowest rank of the earliest non-empty bucket comes next. After the stash cap is
// relaxed a start may lie further back; the ring then grows to span every queued start.
class StartQueue {
 public:
  void Reset(int num_ranks) {
    words_ = (static_cast<size_t>(num_ranks) + 63) / 64;
    start_of_.assign(num_ranks, kAbsent);
    Resize(4);
    size_ = 0;
  }
  bool empty() const { return size_ == 0; }

  // Queues `rank` at `start` (moving it if it waits at another start). Runs a few times per
  // scheduled action, hence inlined.
  [[gnu::always_inline]] void Set(int rank, Time start) {
    const Time old = start_of_[rank];
    if (old == start) return;
    if (old != kAbsent) Clear(rank, old);
    if (size_ == 0 || start < low_ || start > high_) Widen(start);
    const size_t slot = Slot(start);
    const size_t word = static_cast<size_t>(rank) / 64;
    bits_[slot * words_ + word] |= uint64_t{1} << (rank % 64);
    first_word_[slot] = std::min(first_word_[slot], word);
    ++count_[slot];
    start_of_[rank] = start;
    ++size_;
  }

  void Remove(int rank) {
    const Time old = start_of_[rank];
    if (old != kAbsent) Clear(rank, old);
  }

  // The rank with the earliest start (the lowest such rank); sets *start. Not empty().
  int PopMin(Time* start) {
    while (count_[Slot(low_)] == 0) ++low_;
    const size_t slot = Slot(low_);
    const uint64_t* bits = &bits_[slot * words_];
    size_t& word = first_word_[slot];
    while (bits[word] == 0) ++word;
    const int rank = static_cast<int>(word * 64) + LowestBit(bits[word]);
    *start = low_;
    Clear(rank, low_);
    return rank;
  }

 private:
  static constexpr Time kAbsent = std::numeric_limits<Time>::min();

  size_t Slot(Time start) const { return static_cast<size_t>(start) & (slots_ - 1); }

  [[gnu::always_inline]] void Clear(int rank, Time start) {
    const size_t slot = Slot(start);
    bits_[slot * words_ + static_cast<size_t>(rank) / 64] &= ~(uint64_t{1} << (rank % 64));
    if (--count_[slot] == 0) first_word_[slot] = words_;
    start_of_[rank] = kAbsent;
    --size_;
  }

  void Resize(size_t slots) {
    slots_ = slots;
    bits_.assign(slots_ * words_, 0);
    count_.assign(slots_, 0);
    first_word_.assign(slots_, words_);
  }

  // Makes [low_, high_] include `start` (once per time step, when the first rank is queued
  // at a new latest start). Kept out of line so that Set stays small.
  [[gnu::noinline]] void Widen(Time start) {
    if (size_ == 0) {
      low_ = high_ = start;
      return;
    }
    const Time low = std::min(low_, start), high = std::max(high_, start);
    if (static_cast<int64_t>(high) - low >= static_cast<int64_t>(slots_)) {
      Grow(static_cast<size_t>(static_cast<int64_t>(high) - low + 1));
    }
    low_ = low;
    high_ = high;
  }

  // Room for `span` consecutive starts (rare: only after a relaxed cap).
  void Grow(size_t span) {
    size_t slots = slots_;
    while (slots < span) slots *= 2;
    Resize(slots);
    size_ = 0;
    std::vector<Time> queued;
    queued.swap(start_of_);
    start_of_.assign(queued.size(), kAbsent);
    for (size_t rank = 0; rank < queued.size(); ++rank) {
      if (queued[rank] == kAbsent) continue;
      const size_t slot = Slot(queued[rank]);
      const size_t word = rank / 64;
      bits_[slot * words_ + word] |= uint64_t{1} << (rank % 64);
      first_word_[slot] = std::min(first_word_[slot], word);
      ++count_[slot];
      start_of_[rank] = queued[rank];
      ++size_;
    }
  }

  size_t words_ = 0;             // per bucket
  size_t slots_ = 0;             // buckets in the ring, a power of two
  std::vector<uint64_t> bits_;   // [slot * words_ + rank / 64]
  std::vector<int> count_;       // ranks per bucket
  std::vector<size_t> first_word_;  // per bucket: no bit below this word
  Time low_ = 0, high_ = 0;      // every queued start lies in [low_, high_]
  std::vector<Time> start_of_;   // per rank; kAbsent when not queued
  int64_t size_ = 0;
};

class ListScheduler {
 public:
  using Config = ListSchedulerConfig;

  ListScheduler(Config config, const Streams& streams, const PairTable& table)
      : config_(std::move(config)),
        table_(table),
        layout_(table.NumPairs(), config_.num_microbatches) {
    const int num_ranks = config_.num_ranks;
    const size_t pairs = table_.NumPairs();
    forward_done_.assign(layout_.Entries(), kUnknownTime);
    backward_done_.assign(layout_.Entries(), kUnknownTime);
    forward_bits_.assign(layout_.Words(), 0);
    backward_bits_.assign(layout_.Words(), 0);
    ranks_.resize(num_ranks);
    queue_.Reset(num_ranks);
    // The streams of all ranks side by side, rank after rank, with a bitset per rank of those
    // whose head is ready. When every stream is a sequence (one type of one stage), a head's
    // priority class and tie never change: each rank's streams are then kept in priority
    // order, the position standing in for the key, and a rank's best head is found with bit
    // operations (see RefreshOrdered). At most 64 streams per rank for that.
    ordered_ = true;
    for (const auto& rank_streams : streams) {
      ordered_ = ordered_ && rank_streams.size() <= 64;
      for (const Stream& stream : rank_streams) ordered_ = ordered_ && stream.sequence();
    }
    int first = 0, first_word = 0;
    std::vector<std::pair<uint64_t, int>> by_key;
    for (int r = 0; r < num_ranks; ++r) {
      RankState& rank = ranks_[r];
      rank.cap = config_.stash_caps.empty() ? config_.stash_cap : config_.stash_caps[r];
      rank.first = first;
      rank.count = static_cast<int>(streams[r].size());
      rank.first_word = first_word;
      rank.words = (rank.count + 63) / 64;
      first += rank.count;
      first_word += rank.words;
      by_key.clear();
      for (size_t k = 0; k < streams[r].size(); ++k) {
        by_key.emplace_back(HeadOf(streams[r][k], static_cast<int>(k)).key, static_cast<int>(k));
      }
      if (ordered_) std::sort(by_key.begin(), by_key.end());
      for (int position = 0; position < rank.count; ++position) {
        const Stream& stream = streams[r][by_key[position].second];
        sources_.push_back(stream);
        heads_.push_back(HeadOf(stream, by_key[position].second));
        rank_of_stream_.push_back(r);
        if (ordered_) {
          heads_.back().key = static_cast<uint64_t>(position);
          if (stream.type == ActionType::kForward) rank.forward |= uint64_t{1} << position;
        }
      }
    }
    ready_bits_.assign(first_word, 0);
    // Which stream holds each (replica, stage, kind), to tell it when an input appears.
    for (auto& kind : stream_of_) kind.assign(pairs, kNoStream);
    for (int r = 0; r < num_ranks; ++r) {
      for (int k = 0; k < ranks_[r].count; ++k) {
        const int g = ranks_[r].first + k;
        const Stream& stream = sources_[g];
        auto note = [&](ActionType type, int replica, int stage) {
          int& entry = stream_of_[KindOf(type)][table_.Pair(replica, stage)];
          entry = entry == kNoStream || entry == g ? g : kEveryStream;
        };
        if (stream.one_f_one_b != nullptr) {
          for (int c = 0; c < stream.num_chunks; ++c) {
            note(ActionType::kForward, stream.replica, c * stream.chunk_stride + stream.stage);
            note(ActionType::kBackward, stream.replica, c * stream.chunk_stride + stream.stage);
          }
        } else if (!stream.actions.empty()) {
          for (const Action& a : stream.actions) note(a.type, a.replica, a.stage);
        } else if (stream.length > 0) {
          note(stream.type, stream.replica, stream.stage);
        }
      }
    }
    for (int g = 0; g < static_cast<int>(heads_.size()); ++g) Evaluate(g);
  }

  // Schedules every action, handing each to sink.Scheduled(rank, action, start) in the order
  // they are scheduled. Relaxing the stash cap can schedule an action earlier than one before
  // it: the sink's AllowsRelaxedCap() decides whether to go on (else Aborted).
  template <typename Sink>
  absl::Status Run(Sink& sink) {
    int64_t remaining = 0;
    for (const Stream& stream : sources_) remaining += static_cast<int64_t>(stream.length);
    for (int r = 0; r < config_.num_ranks; ++r) Refresh(r, /*ignore_cap=*/false);
    while (remaining > 0) {
      bool relaxed = false;
      if (queue_.empty()) {
        // Every rank is blocked by the stash cap (or waits on one that is): relax it for one
        // action.
        for (int r = 0; r < config_.num_ranks; ++r) Refresh(r, /*ignore_cap=*/true);
        if (queue_.empty()) {
          return absl::InternalError("list scheduler: no action can run (cyclic streams)");
        }
        if (!sink.AllowsRelaxedCap()) return absl::AbortedError("stash cap relaxed");
        relaxed = true;
      }
      Time start = 0;
      const int r = queue_.PopMin(&start);
      RankState& rank = ranks_[r];
      const int g = rank.first + rank.best.stream;
      rank.best.stream = kNoStream;
      const Head& head = heads_[g];
      const Action action = Compute(head.type, head.replica, head.stage, head.microbatch);
      const size_t pair = static_cast<size_t>(head.pair);
      --remaining;
      rank.free = start + config_.costs.Of(action.type);
      sink.Scheduled(r, action, start);
      const Wakeup woken = MarkDone(action, pair, rank.free);
      Advance(g);
      Refresh(r, /*ignore_cap=*/false);
      // Only the neighbour's stream waiting on this action can have changed: it is offered
      // instead of refreshing all of that rank's streams.
      if (woken.stream >= 0) {
        Offer(woken.stream);
      } else if (woken.stream == kEveryStream) {
        Refresh(woken.rank, /*ignore_cap=*/false);
      }
      // Entries queued while relaxed would ignore the cap: requeue every rank under it.
      if (relaxed) {
        for (int other = 0; other < config_.num_ranks; ++other) Refresh(other, false);
      }
    }
    return absl::OkStatus();
  }

 private:
  static constexpr int kNoStream = -1;
  static constexpr int kEveryStream = -2;  // the kind is spread over several streams
  // Streams by the kind of action they hold: forwards, backwards (B or Bi), weight gradients.
  static constexpr int kForwardKind = 0;
  static constexpr int kBackwardKind = 1;
  static constexpr int kWeightKind = 2;

  // What the scheduler reads of a stream, in 32 bytes: its head, when the head's inputs are
  // ready, and the head's order among heads of its rank starting at the same time.
  struct Head {
    Time ready = kUnknownTime;  // known once the inputs exist (final then); never when done
    int32_t pair = 0;           // replica * num_stages + stage
    int32_t stage = 0;
    int32_t microbatch = 0;
    // For a sequence (micro-batches 0, 1, ... of one stage and type): its length, so that the
    // head moves without the listed stream; -1 for other streams.
    int32_t sequence_end = -1;
    ActionType type = ActionType::kForward;
    uint8_t replica = 0;
    bool done = false;
    // Priority class, then tie, then stream (see Key()).
    uint64_t key = 0;
  };

  // A rank's best head: the earliest start, then the lowest key. stream (index within the
  // rank) is kNoStream when the rank is not queued.
  struct Best {
    Time start = 0;
    int stream = kNoStream;
    uint64_t key = 0;
  };

  struct RankState {
    Time free = 0;       // when its last action ends
    int first = 0;       // its first stream in heads_ / sources_
    int count = 0;       // its streams
    int first_word = 0;  // its ready bits in ready_bits_
    int words = 0;
    int64_t stash = 0;
    int64_t cap = 0;
    Best best;
    // Ordered mode (see the constructor): its forward streams, and its ready heads whose
    // inputs come after it is free, by position.
    uint64_t forward = 0;
    uint64_t late = 0;
    bool capped() const { return stash >= cap; }
  };

  // Priority class, tie and stream index packed so that comparing keys compares them in that
  // order: 16 bits of class, 32 of tie (offset to be unsigned), 16 of stream (a rank has at
  // most 3 streams per chunk, 3 * 2 * kMaxWaves of them).
  static uint64_t Key(int priority, int tie, int stream) {
    return (static_cast<uint64_t>(priority) << 48) |
           (static_cast<uint64_t>(static_cast<uint32_t>(tie) ^ 0x80000000u) << 16) |
           static_cast<uint64_t>(stream);
  }

  Head HeadOf(const Stream& stream, int k) const {
    Head head;
    if (stream.done()) {
      head.done = true;
      return head;
    }
    const Action a = stream.Head();
    head.pair = static_cast<int32_t>(table_.Pair(a.replica, a.stage));
    head.stage = a.stage;
    head.microbatch = a.microbatch;
    head.type = a.type;
    head.replica = static_cast<uint8_t>(a.replica);
    head.key = Key(PriorityClass(a.type), Tie(a), k);
    if (stream.sequence()) head.sequence_end = static_cast<int32_t>(stream.length);
    return head;
  }

  // Moves stream g past its head, and looks up when the new head's inputs are ready.
  void Advance(int g) {
    Head& head = heads_[g];
    if (head.sequence_end >= 0) {
      head.done = ++head.microbatch == head.sequence_end;
    } else {
      Stream& source = sources_[g];
      ++source.next;
      head = HeadOf(source, g - ranks_[rank_of_stream_[g]].first);
    }
    Evaluate(g);
  }

  // Looks up when stream g's head's inputs are ready. A head's readiness changes only when it
  // becomes the head or when one of its inputs is produced, so this runs exactly then, and
  // choosing a rank's best head only compares cached times.
  [[gnu::always_inline]] void Evaluate(int g) {
    Head& head = heads_[g];
    head.ready = head.done ? kUnknownTime : ReadyTime(head);
    RankState& rank = ranks_[rank_of_stream_[g]];
    const int k = g - rank.first;
    uint64_t& word = ready_bits_[rank.first_word + k / 64];
    const uint64_t bit = uint64_t{1} << (k % 64);
    word = head.ready == kUnknownTime ? word & ~bit : word | bit;
    if (ordered_) {
      rank.late = head.ready != kUnknownTime && head.ready > rank.free ? rank.late | bit
                                                                       : rank.late & ~bit;
    }
  }

  static int KindOf(ActionType type) {
    switch (type) {
      case ActionType::kForward:
        return kForwardKind;
      case ActionType::kBackwardWeight:
        return kWeightKind;
      default:
        return kBackwardKind;
    }
  }

  // A stream looked at again after an input appeared (see Wake).
  struct Wakeup {
    int stream = kNoStream;
    int rank = -1;
  };

  // Records a finished action and looks again at the streams that may wait on it: those of
  // its stage on this rank, and the one of the next (forward) or previous (backward) stage,
  // returned to be offered once this rank is requeued.
  Wakeup MarkDone(const Action& a, size_t pair, Time finish) {
    const int mb = a.microbatch;
    const size_t i = layout_.Index(pair, mb);
    const size_t word = layout_.Word(pair, mb);
    const uint64_t bit = BlockedLayout::Bit(mb);
    const uint8_t neighbours = table_.Neighbours(pair);
    switch (a.type) {
      case ActionType::kForward:
        forward_done_[i] = finish;
        forward_bits_[word] |= bit;
        ++ranks_[table_.Owner(pair)].stash;
        Wake(kBackwardKind, pair, mb);
        if (neighbours & PairTable::kHasNext) return Wake(kForwardKind, pair + 1, mb);
        return Wakeup{};
      case ActionType::kBackward:
        backward_done_[i] = finish;
        backward_bits_[word] |= bit;
        --ranks_[table_.Owner(pair)].stash;
        if (neighbours & PairTable::kHasPrevious) return Wake(kBackwardKind, pair - 1, mb);
        return Wakeup{};
      case ActionType::kBackwardInput:
        // W waits on this (a split schedule has no full B to confuse it with).
        backward_done_[i] = finish;
        backward_bits_[word] |= bit;
        Wake(kWeightKind, pair, mb);
        if (neighbours & PairTable::kHasPrevious) return Wake(kBackwardKind, pair - 1, mb);
        return Wakeup{};
      case ActionType::kBackwardWeight:
        --ranks_[table_.Owner(pair)].stash;
        return Wakeup{};
      default:
        return Wakeup{};
    }
  }

  // The (pair, mb) action of `kind` got an input: looks again at the stream holding such
  // actions if that action is its head (any other head does not wait on this input), and says
  // where: the stream, or kEveryStream and its rank when the kind is spread over several.
  Wakeup Wake(int kind, size_t pair, int mb) {
    const int g = stream_of_[kind][pair];
    if (g == kNoStream) return Wakeup{};
    const int r = table_.Owner(pair);
    if (g == kEveryStream) {
      const RankState& rank = ranks_[r];
      for (int j = rank.first; j < rank.first + rank.count; ++j) {
        if (Waits(heads_[j], kind, pair, mb)) Evaluate(j);
      }
      return Wakeup{g, r};
    }
    if (!Waits(heads_[g], kind, pair, mb)) return Wakeup{};
    Evaluate(g);
    return Wakeup{g, r};
  }

  static bool Waits(const Head& head, int kind, size_t pair, int mb) {
    return !head.done && head.microbatch == mb && static_cast<size_t>(head.pair) == pair &&
           KindOf(head.type) == kind;
  }

  // A time no later than when the head's inputs are ready, and as late as that where it
  // matters (kUnknownTime if a dependency is not scheduled yet). An input made on the same
  // rank ended before the rank is free again, and starts are max(ready, free), so such an
  // input counts as 0: the scheduler then reads a done bit instead of an end time written long
  // before (a ZB-V backward looks up a forward from ~2p steps earlier, in a table far larger
  // than the caches).
  Time ReadyTime(const Head& a) const {
    const size_t pair = static_cast<size_t>(a.pair);
    const int mb = a.microbatch;
    const uint64_t bit = BlockedLayout::Bit(mb);
    const uint8_t neighbours = table_.Neighbours(pair);
    switch (a.type) {
      case ActionType::kForward:
        if (!(neighbours & PairTable::kHasPrevious)) return 0;
        if (neighbours & PairTable::kPreviousLocal) {
          return (forward_bits_[layout_.Word(pair - 1, mb)] & bit) ? 0 : kUnknownTime;
        }
        return forward_done_[layout_.Index(pair - 1, mb)];
      case ActionType::kBackward:
      case ActionType::kBackwardInput:
        if (!(forward_bits_[layout_.Word(pair, mb)] & bit)) return kUnknownTime;
        if (!(neighbours & PairTable::kHasNext)) return 0;
        if (neighbours & PairTable::kNextLocal) {
          return (backward_bits_[layout_.Word(pair + 1, mb)] & bit) ? 0 : kUnknownTime;
        }
        return backward_done_[layout_.Index(pair + 1, mb)];
      case ActionType::kBackwardWeight:
        return (backward_bits_[layout_.Word(pair, mb)] & bit) ? 0 : kUnknownTime;
      default:
        return 0;
    }
  }

  int PriorityClass(ActionType type) const {
    switch (type) {
      case ActionType::kForward:
        return config_.forward_class;
      case ActionType::kBackwardWeight:
        return config_.weight_class;
      default:
        return config_.backward_class;
    }
  }

  // Closeness to the end of the pipeline: forwards further down, backwards further up first.
  static int Tie(const Action& a) { return a.type == ActionType::kForward ? -a.stage : a.stage; }

  // Queues rank r with its best head over its ready streams.
  [[gnu::noinline]] void Refresh(int r, bool ignore_cap) {
    if (ordered_) {
      RefreshOrdered(r, ignore_cap);
      return;
    }
    RankState& rank = ranks_[r];
    const bool capped = !ignore_cap && rank.capped();
    const Head* heads = &heads_[rank.first];
    // Any candidate beats the initial (latest start, largest key).
    Best best{kUnknownTime, kNoStream, ~uint64_t{0}};
    for (int w = 0; w < rank.words; ++w) {
      for (uint64_t bits = ready_bits_[rank.first_word + w]; bits != 0; bits &= bits - 1) {
        const int k = w * 64 + LowestBit(bits);
        const Head& head = heads[k];
        if (capped && head.type == ActionType::kForward) continue;
        const Time start = std::max(head.ready, rank.free);
        if (start < best.start || (start == best.start && head.key < best.key)) {
          best.start = start;
          best.key = head.key;
          best.stream = k;
        }
      }
    }
    rank.best = best;
    if (best.stream != kNoStream) {
      queue_.Set(r, best.start);
    } else {
      queue_.Remove(r);
    }
  }

  // Refresh in ordered mode. Heads ready by the time the rank is free all start then, and
  // the first of them in priority order wins; if there is none, the earliest ready head
  // (the first in priority order on ties) sets a later start.
  [[gnu::always_inline]] void RefreshOrdered(int r, bool ignore_cap) {
    RankState& rank = ranks_[r];
    const Head* heads = &heads_[rank.first];
    uint64_t candidates = ready_bits_[rank.first_word];
    if (!ignore_cap && rank.capped()) candidates &= ~rank.forward;
    // Late heads the rank's free time has caught up with.
    for (uint64_t bits = rank.late; bits != 0; bits &= bits - 1) {
      const int k = LowestBit(bits);
      if (heads[k].ready <= rank.free) rank.late &= ~(uint64_t{1} << k);
    }
    Best best{kUnknownTime, kNoStream, 0};
    if (const uint64_t due = candidates & ~rank.late; due != 0) {
      best.stream = LowestBit(due);
      best.start = rank.free;
    } else {
      for (uint64_t bits = candidates; bits != 0; bits &= bits - 1) {
        const int k = LowestBit(bits);
        if (heads[k].ready < best.start) {
          best.start = heads[k].ready;
          best.stream = k;
        }
      }
    }
    best.key = static_cast<uint64_t>(best.stream);
    rank.best = best;
    if (best.stream != kNoStream) {
      queue_.Set(r, best.start);
    } else {
      queue_.Remove(r);
    }
  }

  // An input of stream g's head was produced on another rank: its rank's best head is the
  // better of its current one and g's. The rank's other streams, free time and stash are
  // unchanged, so this is what Refresh would find.
  void Offer(int g) {
    const int r = rank_of_stream_[g];
    RankState& rank = ranks_[r];
    const Head& head = heads_[g];
    if (head.ready == kUnknownTime) return;
    if (head.type == ActionType::kForward && rank.capped()) return;
    const Time start = std::max(head.ready, rank.free);
    Best& best = rank.best;
    if (best.stream != kNoStream &&
        !(start < best.start || (start == best.start && head.key < best.key))) {
      return;
    }
    best.start = start;
    best.key = head.key;
    best.stream = g - rank.first;
    queue_.Set(r, start);
  }

  Config config_;
  const PairTable& table_;
  const BlockedLayout layout_;       // of the tables below
  std::vector<Stream> sources_;      // the streams, rank after rank
  std::vector<Head> heads_;          // their heads
  std::vector<int> rank_of_stream_;  // their ranks
  std::vector<RankState> ranks_;
  std::vector<uint64_t> ready_bits_;  // per rank: which of its streams has a ready head
  bool ordered_ = false;              // see the constructor
  // [kind][pair] -> the stream holding those actions (or kNoStream / kEveryStream)
  std::vector<int> stream_of_[3];
  std::vector<Time> forward_done_, backward_done_;  // finish times; Bi's for W
  std::vector<uint64_t> forward_bits_, backward_bits_;  // done bits of the same
  StartQueue queue_;
};

// Compute orders with the start of every action in the list scheduler's timeline (F=1, B=2,
// Bi=W=1): what CompleteSchedule needs when a relaxed stash cap broke the order of start.
class OrderRecorder {
 public:
  explicit OrderRecorder(int num_ranks) : orders_(num_ranks), starts_(num_ranks) {}
  bool AllowsRelaxedCap() const { return true; }
  void Scheduled(int r, const Action& action, Time start) {
    orders_[r].push_back(action);
    starts_[r].push_back(start);
  }
  ComputeOrders& orders() { return orders_; }
  std::vector<std::vector<Time>>& starts() { return starts_; }

 private:
  ComputeOrders orders_;
  std::vector<std::vector<Time>> starts_;
};

}  // namespace

Streams PerStageStreams(const Placement& placement, int num_microbatches, bool split_backward) {
  Streams streams(placement.num_ranks);
  for (int replica = 0; replica < placement.NumReplicas(); ++replica) {
    for (int stage = 0; stage < placement.num_stages; ++stage) {
      auto& rank_streams = streams[placement.RankOf(replica, stage)];
      rank_streams.push_back(
          Stream::Sequence(ActionType::kForward, replica, stage, num_microbatches));
      rank_streams.push_back(Stream::Sequence(
          split_backward ? ActionType::kBackwardInput : ActionType::kBackward, replica, stage,
          num_microbatches));
      if (split_backward) {
        rank_streams.push_back(
            Stream::Sequence(ActionType::kBackwardWeight, replica, stage, num_microbatches));
      }
    }
  }
  return streams;
}

ListSchedulerConfig ConfigFor(const ScheduleSpec& spec, const Placement& placement) {
  ListSchedulerConfig config;
  config.num_ranks = placement.num_ranks;
  config.num_microbatches = spec.num_microbatches;
  return config;
}

absl::StatusOr<Schedule> ScheduleAndComplete(ListScheduled kind) {
  const PairTable table(kind.placement);
  const ListSchedulerConfig& config = kind.config;
  {
    const Streams streams = kind.make_streams(kind.placement);
    ProgramBuilder<> builder(kind.spec, table, streams, kind.second_full_backward, config.costs);
    ListScheduler scheduler(config, streams, table);
    const absl::Status status = scheduler.Run(builder);
    if (status.ok()) {
      Schedule schedule;
      schedule.spec = kind.spec;
      TANDEM_ASSIGN_OR_RETURN(schedule.programs, builder.Finish());
      schedule.placement = std::move(kind.placement);
      return schedule;
    }
    if (!absl::IsAborted(status)) return status;
  }
  ListScheduler scheduler(config, kind.make_streams(kind.placement), table);
  OrderRecorder recorder(config.num_ranks);
  TANDEM_RETURN_IF_ERROR(scheduler.Run(recorder));
  std::vector<UnitCosts> timeline_costs = {config.costs};
  if (kind.second_full_backward > 0) {
    timeline_costs.push_back(UnitCosts::WithFullBackward(kind.second_full_backward));
  }
  return CompleteScheduleFor<Action>(kind.spec, std::move(kind.placement),
                                     std::move(recorder.orders()), timeline_costs,
                                     std::move(recorder.starts()));
}

absl::Status ScheduleAndStream(const ListScheduled& kind, ActionConsumer& consumer,
                               size_t batch_actions) {
  const PairTable table(kind.placement);
  const Streams streams = kind.make_streams(kind.placement);
  ProgramBuilder<EmissionWriter> builder(kind.spec, table, streams, kind.second_full_backward,
                                         kind.config.costs,
                                         EmissionWriter(&consumer, batch_actions));
  ListScheduler scheduler(kind.config, streams, table);
  TANDEM_RETURN_IF_ERROR(scheduler.Run(builder));
  return builder.Finish();
}

}  // namespace tandem::pipeline::internal
