#include "pipeline/generators.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::pipeline {
namespace {

// Nominal costs the list scheduler uses to choose an order (a common forward:backward ratio;
// the order is then valid for any costs).
constexpr int kNominalForward = 1;
constexpr int kNominalBackward = 2;        // full backward
constexpr int kNominalBackwardInput = 1;   // split backward: input-gradient half
constexpr int kNominalBackwardWeight = 1;  // split backward: weight-gradient half
// Hanayo's activation cap, as a multiple of a 1F1B first stage's (p micro-batches of a full
// stage), about what interleaved 1F1B uses.
constexpr double kHanayoMemoryFactor = 1.5;

Action Compute(ActionType type, int replica, int stage, int microbatch) {
  Action action;
  action.type = type;
  action.stage = stage;
  action.microbatch = microbatch;
  action.replica = replica;
  return action;
}

absl::Status Invalid(absl::string_view kind, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(kind, ": ", message));
}

// Checks ranges and the options that do not apply to `spec.kind`.
absl::Status CheckCommon(const ScheduleSpec& spec) {
  absl::string_view name = ScheduleKindName(spec.kind);
  TANDEM_RETURN_IF_ERROR(Annotate(CheckScheduleSpec(spec), name));
  bool uses_chunks = spec.kind == ScheduleKind::kInterleaved;
  if (!uses_chunks && spec.kind != ScheduleKind::kZBV && spec.chunks != 1) {
    return Invalid(name, absl::StrCat("chunks apply only to interleaved (got chunks=",
                                      spec.chunks, ")"));
  }
  if (spec.kind == ScheduleKind::kZBV && spec.chunks != 1 && spec.chunks != 2) {
    return Invalid(name, absl::StrCat("zb-v always uses 2 chunks per rank (got chunks=",
                                      spec.chunks, ")"));
  }
  if (spec.kind != ScheduleKind::kHanayo && spec.waves != 1) {
    return Invalid(name,
                   absl::StrCat("waves apply only to hanayo (got waves=", spec.waves, ")"));
  }
  return absl::OkStatus();
}

// A spec of `kind`, checked by CheckCommon.
absl::StatusOr<ScheduleSpec> CheckedSpec(ScheduleKind kind, int num_ranks, int num_microbatches,
                                         int chunks, int waves) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.num_ranks = num_ranks;
  spec.num_microbatches = num_microbatches;
  spec.chunks = chunks;
  spec.waves = waves;
  TANDEM_RETURN_IF_ERROR(CheckCommon(spec));
  return spec;
}

using ComputeOrders = std::vector<std::vector<Action>>;

// A compute action as the generators with fixed orders list it: 8 bytes rather than an
// Action's 20 (at p=1024, m=4096 interleaved lists 17M of them, read several times).
struct Op {
  int32_t stage;
  uint16_t microbatch;  // < kMaxMicrobatches
  ActionType type;
  uint8_t replica;  // 0 or 1
};
static_assert(sizeof(Op) == 8, "Op is meant to be 8 bytes");
Op OpOf(ActionType type, int replica, int stage, int microbatch) {
  return Op{stage, static_cast<uint16_t>(microbatch), type, static_cast<uint8_t>(replica)};
}
Action ActionOf(const Op& op) { return Compute(op.type, op.replica, op.stage, op.microbatch); }
const Action& ActionOf(const Action& action) { return action; }
// Compute orders as Ops (generators) or Actions (CompleteSchedule's callers).
template <typename Item>
using Orders = std::vector<std::vector<Item>>;
using OpOrders = Orders<Op>;

// What each compute costs in a generator's timeline (integer ticks).
struct UnitCosts {
  int forward = kNominalForward;
  int backward = kNominalBackward;
  int backward_input = kNominalBackwardInput;
  int backward_weight = kNominalBackwardWeight;

  int Of(ActionType type) const {
    switch (type) {
      case ActionType::kForward:
        return forward;
      case ActionType::kBackward:
        return backward;
      case ActionType::kBackwardInput:
        return backward_input;
      default:
        return backward_weight;
    }
  }
  static UnitCosts WithFullBackward(int backward) {
    UnitCosts costs;
    costs.backward = backward;
    return costs;
  }
  // The spec's planning costs where it has them, else the nominal ones.
  static UnitCosts For(const ScheduleSpec& spec) {
    UnitCosts costs;
    if (spec.planning_costs[0] > 0) {
      costs.forward = spec.planning_costs[0];
      costs.backward_input = spec.planning_costs[1];
      costs.backward_weight = spec.planning_costs[2];
      costs.backward = costs.backward_input + costs.backward_weight;
    }
    return costs;
  }
};

int NominalCost(ActionType type, int full_backward = kNominalBackward) {
  return UnitCosts::WithFullBackward(full_backward).Of(type);
}

// ---- 1F1B family ---------------------------------------------------------------------------

// One stage's 1F1B order over `microbatches` (ascending), with `warmup` forwards first.
void Append1F1B(int replica, int stage, const std::vector<int>& microbatches, int warmup,
                std::vector<Op>* out) {
  const int m = static_cast<int>(microbatches.size());
  warmup = std::clamp(warmup, 0, m);
  int next_forward = 0;
  for (; next_forward < warmup; ++next_forward) {
    out->push_back(OpOf(ActionType::kForward, replica, stage, microbatches[next_forward]));
  }
  for (int next_backward = 0; next_backward < m; ++next_backward) {
    if (next_forward < m) {
      out->push_back(OpOf(ActionType::kForward, replica, stage, microbatches[next_forward]));
      ++next_forward;
    }
    out->push_back(OpOf(ActionType::kBackward, replica, stage, microbatches[next_backward]));
  }
}

std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// ---- List scheduler --------------------------------------------------------------------------
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

// Nominal costs are whole numbers, so times are too: 32-bit integers (at most 3 * 2^24
// actions of cost <= 2 on a rank).
using Time = int32_t;
constexpr Time kUnknownTime = std::numeric_limits<Time>::max();

void Prefetch(const void* address) {
#if defined(__GNUC__)
  __builtin_prefetch(address);
#else
  (void)address;
#endif
}

int LowestBit(uint64_t word) {
#if defined(__GNUC__)
  return __builtin_ctzll(word);
#else
  int bit = 0;
  while (!(word & 1)) {
    word >>= 1;
    ++bit;
  }
  return bit;
#endif
}

// A placement flattened for the lookups made per action: per (replica, stage) pair, its rank,
// the ranks its activations and input gradients go to, and whether its neighbouring stages
// exist and live on the same rank.
class PairTable {
 public:
  static constexpr uint8_t kHasPrevious = 1;
  static constexpr uint8_t kPreviousLocal = 2;
  static constexpr uint8_t kHasNext = 4;
  static constexpr uint8_t kNextLocal = 8;

  explicit PairTable(const Placement& placement)
      : num_stages_(placement.num_stages), num_replicas_(placement.NumReplicas()) {
    const size_t pairs = static_cast<size_t>(num_replicas_) * num_stages_;
    owner_.resize(pairs);
    activation_to_.assign(pairs, -1);
    gradient_to_.assign(pairs, -1);
    neighbours_.assign(pairs, 0);
    for (int replica = 0; replica < num_replicas_; ++replica) {
      for (int stage = 0; stage < num_stages_; ++stage) {
        const size_t pair = Pair(replica, stage);
        const int rank = placement.RankOf(replica, stage);
        owner_[pair] = rank;
        if (stage > 0) {
          const int previous = placement.RankOf(replica, stage - 1);
          neighbours_[pair] |= kHasPrevious | (previous == rank ? kPreviousLocal : 0);
          if (previous != rank) gradient_to_[pair] = previous;
        }
        if (stage + 1 < num_stages_) {
          const int next = placement.RankOf(replica, stage + 1);
          neighbours_[pair] |= kHasNext | (next == rank ? kNextLocal : 0);
          if (next != rank) activation_to_[pair] = next;
        }
      }
    }
  }
  size_t NumPairs() const { return owner_.size(); }
  int num_stages() const { return num_stages_; }
  size_t Pair(int replica, int stage) const {
    return static_cast<size_t>(replica) * num_stages_ + stage;
  }
  int Owner(size_t pair) const { return owner_[pair]; }
  int Owner(int replica, int stage) const { return owner_[Pair(replica, stage)]; }
  uint8_t Neighbours(size_t pair) const { return neighbours_[pair]; }
  int ActivationTo(size_t pair) const { return activation_to_[pair]; }
  int GradientTo(size_t pair) const { return gradient_to_[pair]; }
  // The rank compute `a`'s output goes to; -1 when it stays on a.stage's rank or has none.
  int Destination(const Action& a) const {
    switch (a.type) {
      case ActionType::kForward:
        return activation_to_[Pair(a.replica, a.stage)];
      case ActionType::kBackward:
      case ActionType::kBackwardInput:
        return gradient_to_[Pair(a.replica, a.stage)];
      default:
        return -1;
    }
  }

 private:
  int num_stages_, num_replicas_;
  std::vector<int> owner_, activation_to_, gradient_to_;
  std::vector<uint8_t> neighbours_;
};

Action SyncOf(int replica, int stage) {
  Action sync;
  sync.type = ActionType::kGradientSync;
  sync.stage = stage;
  sync.microbatch = -1;
  sync.replica = replica;
  return sync;
}

Action StepAction() {
  Action step;
  step.type = ActionType::kOptimizerStep;
  step.stage = -1;
  step.microbatch = -1;
  return step;
}

// Tables with an entry (or a bit) per (replica, stage) pair and micro-batch, laid out in
// blocks of micro-batches with every pair of a block side by side. The list scheduler works
// on neighbouring stages at nearby micro-batches at any one time: with a row per pair it
// would touch a page per stage (thousands at p=1024, far more than the TLB holds), with
// blocks a few dozen.
class BlockedLayout {
 public:
  BlockedLayout(size_t pairs, int num_microbatches)
      : pairs_(pairs), microbatches_(static_cast<size_t>(num_microbatches)) {}
  // Entries: kBlock micro-batches of a pair per block.
  size_t Entries() const { return (microbatches_ + kBlock - 1) / kBlock * pairs_ * kBlock; }
  size_t Index(size_t pair, int mb) const {
    const size_t b = static_cast<size_t>(mb) / kBlock;
    return (b * pairs_ + pair) * kBlock + static_cast<size_t>(mb) % kBlock;
  }
  // Bits: a 64-bit word per pair and 64 micro-batches.
  size_t Words() const { return (microbatches_ + 63) / 64 * pairs_; }
  size_t Word(size_t pair, int mb) const { return static_cast<size_t>(mb) / 64 * pairs_ + pair; }
  static uint64_t Bit(int mb) { return uint64_t{1} << (mb % 64); }

 private:
  static constexpr size_t kBlock = 16;  // 64 bytes of 32-bit times
  size_t pairs_, microbatches_;
};

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
  struct Config {
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
  void Evaluate(int g) {
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
  void Refresh(int r, bool ignore_cap) {
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
  void RefreshOrdered(int r, bool ignore_cap) {
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
// Bi=W=1): starts[rank][i] is when orders[rank][i] starts. A sink for ListScheduler::Run.
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

// Builds the programs while the list scheduler runs (a sink for ListScheduler::Run), with the
// receives CompleteSchedule would place: before the receiver's first compute that starts at or
// after the send ends, in the scheduler's timeline and (if asked) in a second one with another
// cost of full backward. The scheduler hands over actions in order of start time, so when a
// compute starts at t every send ending by t is known: the receives due are those waiting on
// the rank's channels (senders in ascending order, each in its order). Both timelines keep a
// rank's computes in order and a consumer starts after its input arrives, so these are exactly
// CompleteSchedule's slots. Only a relaxed stash cap, which schedules an action before one
// already handed over, breaks the order: then the caller records orders instead.
class ProgramBuilder {
 public:
  ProgramBuilder(const ScheduleSpec& spec, const PairTable& table, const Streams& streams,
                 int second_full_backward, const UnitCosts& costs)
      : table_(table),
        costs_(costs),
        layout_(table.NumPairs(), spec.num_microbatches),
        second_full_backward_(second_full_backward),
        final_backward_(spec.SplitsBackward() ? ActionType::kBackwardWeight
                                              : ActionType::kBackward) {
    const int num_ranks = static_cast<int>(streams.size());
    const size_t pairs = table_.NumPairs();
    // Per pair: how many final backwards it has (its sync follows the last), and where its
    // messages go: the channel (sender -> receiver) on the receiver.
    backwards_left_.assign(pairs, 0);
    std::vector<size_t> length(num_ranks, 0);
    auto count = [&](int r, const Action& a, size_t times) {
      if (a.type == final_backward_) backwards_left_[table_.Pair(a.replica, a.stage)] += times;
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
    // Each program at its final length, written in place (see Emit).
    programs_.resize(num_ranks);
    written_.assign(num_ranks, 0);
    for (int r = 0; r < num_ranks; ++r) programs_[r].resize(length[r] + 1);
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
    if (a.type == final_backward_ && --backwards_left_[pair] == 0) {
      Emit(r, SyncOf(a.replica, a.stage));
    }
    const bool activation = a.type == ActionType::kForward;
    const int channel = activation ? activation_channel_[pair]
                                   : (a.type == ActionType::kBackwardWeight
                                          ? -1
                                          : gradient_channel_[pair]);
    if (channel >= 0) {
      Action send = a;
      send.type = activation ? ActionType::kSendActivation : ActionType::kSendGradient;
      send.peer = activation ? table_.ActivationTo(pair) : table_.GradientTo(pair);
      Emit(r, send);
      Action receive = a;
      receive.type = activation ? ActionType::kRecvActivation : ActionType::kRecvGradient;
      receive.peer = r;
      Push(channel, {start + costs_.Of(a.type), end2, receive});
    }
    // The rank writes next where its program has never been touched: at p=1024 that line
    // (and its page's TLB entry) is far out of cache. Its next action comes ~p actions later,
    // time enough to fetch the line after the one being written.
    const size_t ahead = written_[r] + kWriteAhead;
    if (ahead < programs_[r].size()) Prefetch(programs_[r].data() + ahead);
  }

  // The programs, once every action has been scheduled.
  absl::StatusOr<std::vector<std::vector<Action>>> Finish() {
    for (const Channel& channel : channels_) {
      if (channel.head != channel.tail) {
        return absl::InternalError("program builder: a receive was never placed");
      }
    }
    for (int r = 0; r < static_cast<int>(programs_.size()); ++r) {
      // A held stage that never ran a backward still gets its sync (the validator then
      // reports the missing backward).
      for (size_t pair : held_[r]) {
        if (!had_backward_[pair]) {
          Emit(r, SyncOf(static_cast<int>(pair / table_.num_stages()),
                         static_cast<int>(pair % table_.num_stages())));
        }
      }
      Emit(r, StepAction());
      if (programs_[r].size() != written_[r]) {
        return absl::InternalError("program builder: program length miscounted");
      }
    }
    return std::move(programs_);
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

  // Writes the rank's next action in place (see the prefetch in Scheduled). Past the counted
  // length nothing is written, and Finish reports the miscount.
  static constexpr size_t kWriteAhead = 4;  // actions: the next cache line
  void Emit(int r, const Action& action) {
    if (written_[r] < programs_[r].size()) programs_[r][written_[r]] = action;
    ++written_[r];
  }

  const PairTable& table_;
  const UnitCosts costs_;  // the list scheduler's
  const BlockedLayout layout_;      // of the second timeline's tables
  const int second_full_backward_;  // 0: no second timeline
  const ActionType final_backward_;
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
  std::vector<std::vector<Action>> programs_;
  std::vector<size_t> written_;  // per program
};

// Streams of one forward sequence and one backward (and W) sequence per stage a rank holds,
// each in micro-batch order.
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

ListScheduler::Config ConfigFor(const ScheduleSpec& spec, const Placement& placement) {
  ListScheduler::Config config;
  config.num_ranks = placement.num_ranks;
  config.num_microbatches = spec.num_microbatches;
  return config;
}

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

}  // namespace

absl::StatusOr<Schedule> CompleteSchedule(const ScheduleSpec& spec, Placement placement,
                                          std::vector<std::vector<Action>> compute_orders) {
  return CompleteScheduleFor<Action>(spec, std::move(placement), std::move(compute_orders),
                                     {UnitCosts{}});
}

namespace {

// A receive to post on a rank, and the compute it goes before.
struct PlacedReceive {
  int before;
  Action action;
};

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
  const ActionType final_backward =
      spec.SplitsBackward() ? ActionType::kBackwardWeight : ActionType::kBackward;
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
      if (a.type == final_backward) last_backward[pair] = i;
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
  // go before; then all of them by that compute (senders ascending on ties). Built rank by
  // rank, so no table of every receive.
  std::vector<int> senders;
  std::vector<std::vector<PlacedReceive>> channels;
  std::vector<size_t> channel_next;
  std::vector<PlacedReceive> receives;
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
    const auto& order = compute_orders[r];
    size_t total_receives = 0;
    for (size_t k = 0; k < senders.size(); ++k) {
      const int q = senders[k];
      const auto& sender_order = compute_orders[q];
      std::vector<PlacedReceive>& channel = channels[k];
      channel.clear();
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
        Action recv = a;
        recv.type = activation ? ActionType::kRecvActivation : ActionType::kRecvGradient;
        recv.peer = q;
        channel.push_back({std::min(consumer, static_cast<int>(latest)), recv});
      }
      // FIFO: receive k must precede receive k+1.
      for (size_t j = channel.size(); j-- > 1;) {
        channel[j - 1].before = std::min(channel[j - 1].before, channel[j].before);
      }
      total_receives += channel.size();
    }
    // Merge the channels (each ordered by `before`), the lower sender first on ties.
    receives.clear();
    receives.reserve(total_receives);
    channel_next.assign(senders.size(), 0);
    for (size_t n = 0; n < total_receives; ++n) {
      size_t best = senders.size();
      for (size_t k = 0; k < senders.size(); ++k) {
        if (channel_next[k] == channels[k].size()) continue;
        if (best == senders.size() ||
            channels[k][channel_next[k]].before < channels[best][channel_next[best]].before) {
          best = k;
        }
      }
      receives.push_back(channels[best][channel_next[best]++]);
    }

    // The program: receives, each compute with its sync and its send, the syncs of stages
    // without a backward here, the step. Its length is known, so it is written in place.
    std::vector<Action>& program = schedule.programs[r];
    program.resize(order.size() + sends[r] + receives.size() + held[r].size() + 1);
    Action* out = program.data();
    const PlacedReceive* next = receives.data();
    const PlacedReceive* const receives_end = next + receives.size();
    for (int i = 0; i < static_cast<int>(order.size()); ++i) {
      while (next != receives_end && next->before == i) *out++ = (next++)->action;
      const Action a = ActionOf(order[i]);
      *out++ = a;
      // The stage's gradients are final: start their synchronisation before the sends, so
      // that the transfer run after this compute stays one group.
      if (a.type == final_backward &&
          last_backward[table.Pair(a.replica, a.stage)] == i) {
        *out++ = SyncOf(a.replica, a.stage);
      }
      const int peer = table.Destination(a);
      if (peer >= 0) {
        Action send = a;
        send.type = a.type == ActionType::kForward ? ActionType::kSendActivation
                                                   : ActionType::kSendGradient;
        send.peer = peer;
        *out++ = send;
      }
    }
    // A held stage that never ran a backward still gets its sync (the validator then reports
    // the missing backward).
    for (const auto& [replica, stage] : held[r]) {
      if (last_backward[table.Pair(replica, stage)] == kNone) *out++ = SyncOf(replica, stage);
    }
    *out++ = StepAction();
    if (out != program.data() + program.size()) {
      return absl::InternalError(absl::StrCat("rank ", r, ": program length miscounted"));
    }
  }
  return schedule;
}

// Runs the list scheduler over the streams `make_streams(placement)` returns and completes its
// orders into a schedule, with receives placed against its timeline (F=1, B=2) and, when
// `second_full_backward` > 0, also against one where a full backward costs that much. The
// programs are built while scheduling; only if the stash cap has to be relaxed (actions are
// then not scheduled in order of start) are the orders recorded and completed afterwards.
template <typename MakeStreams>
absl::StatusOr<Schedule> ScheduleAndComplete(const ScheduleSpec& spec, Placement placement,
                                             const ListScheduler::Config& config,
                                             MakeStreams make_streams,
                                             int second_full_backward = 0) {
  const PairTable table(placement);
  {
    const Streams streams = make_streams(placement);
    ProgramBuilder builder(spec, table, streams, second_full_backward, config.costs);
    ListScheduler scheduler(config, streams, table);
    const absl::Status status = scheduler.Run(builder);
    if (status.ok()) {
      Schedule schedule;
      schedule.spec = spec;
      TANDEM_ASSIGN_OR_RETURN(schedule.programs, builder.Finish());
      schedule.placement = std::move(placement);
      return schedule;
    }
    if (!absl::IsAborted(status)) return status;
  }
  ListScheduler scheduler(config, make_streams(placement), table);
  OrderRecorder recorder(config.num_ranks);
  TANDEM_RETURN_IF_ERROR(scheduler.Run(recorder));
  std::vector<UnitCosts> timeline_costs = {config.costs};
  if (second_full_backward > 0) {
    timeline_costs.push_back(UnitCosts::WithFullBackward(second_full_backward));
  }
  return CompleteScheduleFor<Action>(spec, std::move(placement), std::move(recorder.orders()),
                                     timeline_costs, std::move(recorder.starts()));
}

}  // namespace

absl::StatusOr<Schedule> GenerateGPipe(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kGPipe, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  OpOrders orders(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    orders[r].reserve(2 * num_microbatches);
    for (int mb = 0; mb < num_microbatches; ++mb) {
      orders[r].push_back(OpOf(ActionType::kForward, 0, r, mb));
    }
    for (int mb = 0; mb < num_microbatches; ++mb) {
      orders[r].push_back(OpOf(ActionType::kBackward, 0, r, mb));
    }
  }
  return CompleteScheduleFor<Op>(spec, Placement::Linear(num_ranks), std::move(orders),
                                 {UnitCosts{}});
}

absl::StatusOr<Schedule> Generate1F1B(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::k1F1B, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  OpOrders orders(num_ranks);
  const std::vector<int> microbatches = Iota(num_microbatches);
  for (int r = 0; r < num_ranks; ++r) {
    orders[r].reserve(2 * num_microbatches);
    Append1F1B(/*replica=*/0, /*stage=*/r, microbatches, /*warmup=*/num_ranks - r - 1,
               &orders[r]);
  }
  return CompleteScheduleFor<Op>(spec, Placement::Linear(num_ranks), std::move(orders),
                                 {UnitCosts{}});
}

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
    ListScheduler::Config config = ConfigFor(spec, placement);
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
    return ScheduleAndComplete(spec, std::move(placement), config, make_streams);
  }
}

absl::StatusOr<Schedule> GenerateChimera(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
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
  std::vector<Unit> down, up;
  for (int mb = 0; mb < m; ++mb) (mb % d < d / 2 ? down : up).push_back({mb, 0});
  Placement placement = Placement::Bidirectional(d);
  auto make_streams = [&](const Placement& placement) {
    Streams streams(d);
    for (int replica = 0; replica < 2; ++replica) {
      for (int stage = 0; stage < d; ++stage) {
        streams[placement.RankOf(replica, stage)].push_back(Stream::OneFOneB(
            replica, stage, replica == 0 ? &down : &up, /*warmup=*/d - stage - 1));
      }
    }
    return streams;
  };
  ListScheduler::Config config = ConfigFor(spec, placement);
  config.backward_class = 0;
  config.forward_class = 1;
  // Receives placed for equal forward and backward costs too (the paper's figures), so
  // that the order runs in 2N + D - 2 there as well as in 3N + 2D - 4 at F=1, B=2.
  return ScheduleAndComplete(spec, std::move(placement), config, make_streams,
                             /*second_full_backward=*/kNominalForward);
}

absl::StatusOr<Schedule> GenerateHanayo(int num_ranks, int num_microbatches, int waves) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kHanayo, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/waves));
  Placement placement = Placement::Wave(num_ranks, waves);
  ListScheduler::Config config = ConfigFor(spec, placement);
  config.forward_class = 0;
  config.backward_class = 1;
  const int64_t chunks_per_rank = spec.ChunksPerRank();
  config.stash_cap = static_cast<int64_t>(kHanayoMemoryFactor * num_ranks * chunks_per_rank);
  auto make_streams = [&](const Placement& placement) {
    return PerStageStreams(placement, num_microbatches, false);
  };
  return ScheduleAndComplete(spec, std::move(placement), config, make_streams);
}

absl::StatusOr<Schedule> GenerateZBH1(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kZBH1, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  const int p = num_ranks, m = num_microbatches;
  OpOrders orders(p);
  for (int r = 0; r < p; ++r) {
    auto& order = orders[r];
    order.reserve(3 * m);
    const int warmup = std::min(p - r - 1, m);
    // Rank r delays each W by r micro-batches: the W passes fill the drain bubble, and the
    // stash peaks at (p - r) + r = p, 1F1B's first stage.
    const int weight_lag = r;
    int next_forward = 0, next_weight = 0;
    for (; next_forward < warmup; ++next_forward) {
      order.push_back(OpOf(ActionType::kForward, 0, r, next_forward));
    }
    for (int next_backward = 0; next_backward < m; ++next_backward) {
      if (next_forward < m) {
        order.push_back(OpOf(ActionType::kForward, 0, r, next_forward++));
      }
      order.push_back(OpOf(ActionType::kBackwardInput, 0, r, next_backward));
      if (next_backward - next_weight >= weight_lag) {
        order.push_back(OpOf(ActionType::kBackwardWeight, 0, r, next_weight++));
      }
    }
    while (next_weight < m) {
      order.push_back(OpOf(ActionType::kBackwardWeight, 0, r, next_weight++));
    }
  }
  return CompleteScheduleFor<Op>(spec, Placement::Linear(p), std::move(orders),
                                 {UnitCosts{}});
}

absl::StatusOr<Schedule> GenerateZBV(int num_ranks, int num_microbatches,
                                     std::array<int, 3> planning_costs) {
  TANDEM_ASSIGN_OR_RETURN(ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kZBV, num_ranks, num_microbatches,
                                      /*chunks=*/2, /*waves=*/1));
  spec.planning_costs = planning_costs;
  TANDEM_RETURN_IF_ERROR(CheckScheduleSpec(spec));
  Placement placement = Placement::Wave(num_ranks, /*waves=*/1);
  ListScheduler::Config config = ConfigFor(spec, placement);
  config.backward_class = 0;
  config.forward_class = 1;
  config.weight_class = 2;
  // 2p chunks of half a stage: the activation memory of 1F1B's first stage.
  config.stash_cap = 2 * static_cast<int64_t>(num_ranks);
  // Planned with the spec's costs where it has them: with a weight gradient cheaper than an
  // input gradient (as on CPUs) the nominal order leaves a wait in every cycle.
  config.costs = UnitCosts::For(spec);
  auto make_streams = [&](const Placement& placement) {
    return PerStageStreams(placement, num_microbatches, true);
  };
  return ScheduleAndComplete(spec, std::move(placement), config, make_streams);
}

absl::StatusOr<Schedule> GenerateSchedule(const ScheduleSpec& spec) {
  TANDEM_RETURN_IF_ERROR(CheckCommon(spec));
  switch (spec.kind) {
    case ScheduleKind::kGPipe:
      return GenerateGPipe(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::k1F1B:
      return Generate1F1B(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kInterleaved:
      return GenerateInterleaved(spec.num_ranks, spec.num_microbatches, spec.chunks);
    case ScheduleKind::kChimera:
      return GenerateChimera(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kHanayo:
      return GenerateHanayo(spec.num_ranks, spec.num_microbatches, spec.waves);
    case ScheduleKind::kZBH1:
      return GenerateZBH1(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kZBV:
      return GenerateZBV(spec.num_ranks, spec.num_microbatches, spec.planning_costs);
  }
  return absl::InvalidArgumentError("unknown schedule kind");
}

}  // namespace tandem::pipeline
