#include "pipeline/validator.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "pipeline/internal/emitted_actions.h"
#include "pipeline/validator_internal.h"

namespace tandem::pipeline {
namespace {

constexpr int kUnassigned = -1;
constexpr int kNoChannel = -1;

// What has happened to one (replica, stage, micro-batch): one byte of flags per triple, so
// that a compute's checks and effects touch one flat array (at p=1024, m=4096 ZB-V has 8M
// triples; separate arrays per flag cost a cache miss each).
enum TripleFlag : uint8_t {
  kForwardDone = 1 << 0,
  kBackwardDone = 1 << 1,  // B, or Bi when backward is split
  kWeightDone = 1 << 2,
  kActivationSent = 1 << 3,
  kActivationArrived = 1 << 4,
  kGradientSent = 1 << 5,
  kGradientArrived = 1 << 6,
};

// Switches rather than IsTransfer (schedule.cc): these run per action, inlined.
bool IsTransferType(ActionType type) {
  switch (type) {
    case ActionType::kSendActivation:
    case ActionType::kRecvActivation:
    case ActionType::kSendGradient:
    case ActionType::kRecvGradient:
      return true;
    default:
      return false;
  }
}

bool IsSendType(ActionType type) {
  return type == ActionType::kSendActivation || type == ActionType::kSendGradient;
}

// A transfer waiting on a channel for its counterpart. It carries what matching compares
// (the triple and the kind), so that matching never reads the other rank's program: the
// counterpart was usually posted long before and its action is no longer in cache.
struct Posted {
  uint64_t triple;  // Index(replica, stage, micro-batch) of the data
  int step;         // index in the posting rank's program
  bool activation;  // activation (sA/rA) or gradient (sG/rG)
};

// Transfers from one rank to another, matched in order (FIFO per direction).
struct Channel {
  int from = 0;
  int to = 0;
  int first_use = -1;  // order of the first transfer posted on it, for error reports
  std::vector<Posted> sends;  // posted, not yet matched (from `head_send` on)
  std::vector<Posted> recvs;
  size_t head_send = 0;
  size_t head_recv = 0;
};

// What the quick proof and the reference execution (below) need from the placement, checked
// and flattened once.
class Layout {
 public:
  explicit Layout(const Schedule& schedule)
      : s_(schedule),
        num_ranks_(schedule.placement.num_ranks),
        num_stages_(schedule.placement.num_stages),
        num_replicas_(schedule.placement.NumReplicas()),
        m_(schedule.spec.num_microbatches) {}

  // The program count and the placement; on success builds the tables below.
  absl::Status Check() {
    const Placement& pl = s_.placement;
    if (static_cast<int>(s_.programs.size()) != num_ranks_) {
      return absl::InvalidArgumentError(absl::StrCat("schedule has ", s_.programs.size(),
                                                     " programs for ", num_ranks_, " ranks"));
    }
    if (num_replicas_ < 1 || num_stages_ < 1 || m_ < 1) {
      return absl::InvalidArgumentError("schedule has no replicas, stages or micro-batches");
    }
    for (int replica = 0; replica < num_replicas_; ++replica) {
      if (static_cast<int>(pl.stage_to_rank[replica].size()) != num_stages_) {
        return absl::InvalidArgumentError(
            absl::StrCat("placement replica ", replica, " maps ",
                         pl.stage_to_rank[replica].size(), " stages, expected ", num_stages_));
      }
      for (int stage = 0; stage < num_stages_; ++stage) {
        int r = pl.stage_to_rank[replica][stage];
        if (r < 0 || r >= num_ranks_) {
          return absl::InvalidArgumentError(absl::StrCat(
              "placement puts replica ", replica, " stage ", stage, " on rank ", r,
              " outside [0, ", num_ranks_, ")"));
        }
      }
    }
    Build();
    return absl::OkStatus();
  }

  int num_ranks() const { return num_ranks_; }
  int num_stages() const { return num_stages_; }
  int num_replicas() const { return num_replicas_; }
  int num_microbatches() const { return m_; }
  size_t NumTriples() const { return static_cast<size_t>(num_replicas_) * num_stages_ * m_; }
  size_t NumPairs() const { return static_cast<size_t>(num_replicas_) * num_stages_; }

  // Rank of (replica, stage).
  int RankOf(int replica, int stage) const { return rank_of_[Pair(replica, stage)]; }
  size_t Pair(int replica, int stage) const {
    return static_cast<size_t>(replica) * num_stages_ + stage;
  }
  size_t Index(int replica, int stage, int mb) const { return Pair(replica, stage) * m_ + mb; }

  // (replica, stage) pairs rank r holds, as Placement::StagesOf(r) lists them.
  const std::pair<int, int>* StagesBegin(int r) const { return held_.data() + held_offset_[r]; }
  const std::pair<int, int>* StagesEnd(int r) const { return held_.data() + held_offset_[r + 1]; }

  // Channels: one per ordered pair of ranks holding neighbouring stages. Every transfer of
  // (replica, stage) travels on the channel of its stage and direction, known from the
  // placement (the shape checks make sure its ends are the placement's).
  int NumChannels() const { return static_cast<int>(channel_ends_.size()); }
  int ChannelOf(const Action& a) const {
    const bool activation =
        a.type == ActionType::kSendActivation || a.type == ActionType::kRecvActivation;
    const size_t pair = Pair(a.replica, a.stage);
    return activation ? activation_channel_[pair] : gradient_channel_[pair];
  }
  int ChannelFrom(int channel) const { return channel_ends_[channel].first; }
  int ChannelTo(int channel) const { return channel_ends_[channel].second; }
  // The tables themselves, for loops that keep them in locals.
  const int* RankOfTable() const { return rank_of_.data(); }
  const int* ActivationChannelTable() const { return activation_channel_.data(); }
  const int* GradientChannelTable() const { return gradient_channel_.data(); }
  const std::pair<int, int>* ChannelEndsTable() const { return channel_ends_.data(); }

 private:
  void Build() {
    const Placement& pl = s_.placement;
    rank_of_.resize(NumPairs());
    held_offset_.assign(num_ranks_ + 1, 0);
    for (int replica = 0; replica < num_replicas_; ++replica) {
      for (int stage = 0; stage < num_stages_; ++stage) {
        const int r = pl.stage_to_rank[replica][stage];
        rank_of_[Pair(replica, stage)] = r;
        ++held_offset_[r + 1];
      }
    }
    for (int r = 0; r < num_ranks_; ++r) held_offset_[r + 1] += held_offset_[r];
    held_.resize(rank_of_.size());
    std::vector<int> fill(held_offset_.begin(), held_offset_.end() - 1);
    for (int replica = 0; replica < num_replicas_; ++replica) {
      for (int stage = 0; stage < num_stages_; ++stage) {
        held_[fill[RankOf(replica, stage)]++] = {replica, stage};
      }
    }
    activation_channel_.assign(NumPairs(), kNoChannel);
    gradient_channel_.assign(NumPairs(), kNoChannel);
    absl::flat_hash_map<int64_t, int> ids;
    auto channel = [&](int from, int to) {
      const int64_t key = static_cast<int64_t>(from) * num_ranks_ + to;
      auto [it, inserted] = ids.try_emplace(key, static_cast<int>(channel_ends_.size()));
      if (inserted) channel_ends_.emplace_back(from, to);
      return it->second;
    };
    for (int replica = 0; replica < num_replicas_; ++replica) {
      for (int stage = 0; stage + 1 < num_stages_; ++stage) {
        const int low = RankOf(replica, stage);
        const int high = RankOf(replica, stage + 1);
        if (low == high) continue;
        activation_channel_[Pair(replica, stage)] = channel(low, high);
        gradient_channel_[Pair(replica, stage + 1)] = channel(high, low);
      }
    }
  }

  const Schedule& s_;
  const int num_ranks_, num_stages_, num_replicas_, m_;
  std::vector<int> rank_of_;               // [replica * num_stages + stage]
  std::vector<int> held_offset_;           // rank -> first entry in held_
  std::vector<std::pair<int, int>> held_;  // (replica, stage) pairs, grouped by rank
  // Channel of the transfers of (replica, stage): activations to stage + 1, gradients to
  // stage - 1; kNoChannel where the neighbour is on the same rank.
  std::vector<int> activation_channel_, gradient_channel_;
  std::vector<std::pair<int, int>> channel_ends_;  // (from, to) per channel
};

// Proves a schedule valid without executing it in the reference's order. Whether a schedule
// passes does not depend on the order in which ranks run: every check an action makes reads
// what its own rank did before it (its computes and sends, and the data its receives bring),
// and transfers pair up by position on their channel (the k-th send with the k-th receive),
// so which ranks finish is fixed too. The proof therefore (1) walks each rank's program once,
// front to back, making every per-rank check with a receive's data counted as arrived and
// pairing each channel's sends and receives by position, then (2) runs the ranks against each
// other with one pair of counters per channel to see that all of them finish. Both passes read
// memory mostly in order; the reference execution jumps to another rank at almost every
// receive, which at p=1024, m=4096 costs a cache miss each time.
//
// The same proof takes actions as they are emitted (StreamedProof): each is checked as it
// comes, and pass 2 runs alongside, a rank that waits keeping its later transfers until its
// group is matched.
class Proof {
 public:
  Proof(const Schedule& schedule, const ValidationOptions& options, const Layout& layout)
      : layout_(layout),
        grouped_(options.grouped_rendezvous),
        split_(schedule.spec.SplitsBackward()) {}

  // The tables Check reads, as locals of the loop that calls it: it stores bytes (state_),
  // which the compiler would otherwise have to assume may change any member it reads the
  // tables through.
  struct Tables {
    const int* rank_of;
    const int* activation_channel;
    const int* gradient_channel;
    const std::pair<int, int>* ends;
    uint8_t* state;
    int* finished;
    int* finished_at_sync;
    uint8_t* synced;
    int* replica_of;
    size_t num_pairs;
    int num_replicas, num_stages, m;
    bool split;
  };
  Tables MakeTables() {
    return Tables{layout_.RankOfTable(),   layout_.ActivationChannelTable(),
                  layout_.GradientChannelTable(), layout_.ChannelEndsTable(),
                  state_.data(),           finished_.data(),
                  finished_at_sync_.data(), synced_.data(),
                  replica_of_.data(),      layout_.NumPairs(),
                  layout_.num_replicas(),
                  layout_.num_stages(),    layout_.num_microbatches(),
                  split_};
  }

  // True when the schedule is valid; false when it is not or the proof cannot tell (the
  // reference then decides and names the error). The layout must have passed Check().
  bool Run(const std::vector<std::vector<Action>>& programs) {
    Begin(/*emitted=*/false);
    return ScanRanks(programs) && CheckCounts() && Progress(programs);
  }

  // `emitted`: the actions will come as they are emitted (Take), not as whole programs.
  void Begin(bool emitted) {
    const int num_ranks = layout_.num_ranks();
    const int m = layout_.num_microbatches();
    emitted_ = emitted;
    const size_t block = emitted ? kBlock : static_cast<size_t>(m);
    state_.assign((static_cast<size_t>(m) + block - 1) / block * layout_.NumPairs() * block, 0);
    finished_.assign(layout_.NumPairs(), 0);
    synced_.assign(layout_.NumPairs(), 0);
    finished_at_sync_.assign(layout_.NumPairs(), 0);
    // With one replica every micro-batch belongs to it; that each one runs at all follows
    // from the completeness check.
    replica_of_.assign(m, layout_.num_replicas() == 1 ? 0 : kUnassigned);
    queues_.assign(layout_.NumChannels(), Queue{});
    stepped_.assign(num_ranks, 0);
    spare_.clear();
    buffers_.clear();
    posted_sends_.assign(layout_.NumChannels(), 0);
    posted_recvs_.assign(layout_.NumChannels(), 0);
    pc_.assign(num_ranks, 0);
    outstanding_.assign(num_ranks, 0);
    group_end_.assign(num_ranks, 0);
    waiting_.assign(num_ranks, 0);
    pending_.assign(num_ranks, {});
    pending_head_.assign(num_ranks, 0);
    worklist_.clear();
  }

  // Emission order (StreamedProof): after Begin, Take each action of rank r in its program's
  // order (ranks interleaved in any order); false when a check fails, after which the proof
  // knows nothing more. Once every action is in, CheckCounts and EndEmitted.
  [[gnu::always_inline]] bool Take(const Tables& t, int r, const Action& a) {
    if (stepped_[r]) return false;  // nothing may follow the optimizer step
    if (a.type == ActionType::kOptimizerStep) {
      stepped_[r] = 1;
    } else if (!Check</*kBlocked=*/true>(t, r, a)) {
      return false;
    }
    if (waiting_[r]) {
      // Its group waits: what comes after it is taken once it is matched.
      if (IsTransferType(a.type)) {
        pending_[r].push_back(static_cast<uint32_t>(2 * layout_.ChannelOf(a) + IsSendType(a.type)));
      } else if (grouped_) {
        pending_[r].push_back(kGroupEnd);
      }
      return true;
    }
    if (IsTransferType(a.type)) {
      // Posted at once: the rank does not wait before its group, so the group is posted in
      // every order of execution, and what it matches does not depend on when.
      if (Post(layout_.ChannelOf(a), IsSendType(a.type), [&](int q) { MatchedEmitted(q); })) {
        ++outstanding_[r];
      }
      if (!grouped_) EndGroup(r);
    } else {
      EndGroup(r);
    }
    Resume();
    return true;
  }
  // Once every action is in: every rank ran to its end (a group the program ends with ends
  // there).
  bool EndEmitted() {
    for (int r = 0; r < layout_.num_ranks(); ++r) {
      if (!waiting_[r]) EndGroup(r);
      if (waiting_[r]) return false;
    }
    return true;
  }

 private:
  // Pass 1's sends or receives of one channel waiting for their counterparts, as (triple,
  // kind): items [head, tail) of a buffer. A transfer meets a waiting one of the other side
  // before it waits itself, so only one side ever waits. Taken as they are emitted, a channel
  // holds one or two, in `local`: the queue is one cache line. Whole programs are scanned rank
  // after rank, one end of a channel in full before the other starts: the items then move to
  // a larger buffer, which the queue hands on once drained, so that a few buffers serve every
  // channel.
  struct alignas(64) Queue {
    static constexpr uint32_t kLocal = 5;
    uint64_t local[kLocal];
    uint32_t head = 0;
    uint32_t tail = 0;
    uint32_t capacity = kLocal;
    bool sends = false;         // which side is waiting
    uint64_t* grown = nullptr;  // the buffer when not `local` (in buffers_)
    uint64_t* items() { return grown != nullptr ? grown : local; }
  };

  // Meets a transfer with the oldest waiting one of the other side, or queues it.
  [[gnu::always_inline]] bool Pair(int channel, uint64_t item, bool send) {
    Queue& q = queues_[channel];
    if (q.head != q.tail && q.sends != send) {
      if (q.items()[q.head] != item) return false;
      if (++q.head == q.tail) {
        q.head = q.tail = 0;
        if (q.grown != nullptr) Drained(q);
      }
      return true;
    }
    if (q.tail == q.capacity) MakeRoom(q);
    q.sends = send;
    q.items()[q.tail++] = item;
    return true;
  }
  [[gnu::noinline]] void Drained(Queue& q) {
    spare_.emplace_back(q.grown, q.capacity);
    q.grown = nullptr;
    q.capacity = Queue::kLocal;
  }
  // Room for one more item: the waiting ones moved to the front of the buffer, or to one twice
  // as large if they fill more than half of it.
  [[gnu::noinline]] void MakeRoom(Queue& q) {
    const uint32_t size = q.tail - q.head;
    uint64_t* items = q.items();
    if (2 * size <= q.capacity) {
      std::copy(items + q.head, items + q.tail, items);
    } else {
      const uint32_t needed = 2 * q.capacity;
      std::pair<uint64_t*, uint32_t> bigger{nullptr, 0};
      if (!spare_.empty() && spare_.back().second >= needed) {
        bigger = spare_.back();
        spare_.pop_back();
      } else {
        buffers_.push_back(std::make_unique<uint64_t[]>(needed));
        bigger = {buffers_.back().get(), needed};
      }
      std::copy(items + q.head, items + q.tail, bigger.first);
      if (q.grown != nullptr) spare_.emplace_back(q.grown, q.capacity);
      q.grown = bigger.first;
      q.capacity = bigger.second;
    }
    q.head = 0;
    q.tail = size;
  }

  // Where the flags of (pair, mb) are. Whole programs: one row of micro-batches per pair, read
  // in order rank by rank. Actions taken as they are emitted go from rank to rank: rows would
  // put their flags a power of two apart, evicting each other from the caches, so the flags
  // sit in blocks of kBlock micro-batches then, each block holding every pair's.
  static constexpr size_t kBlock = 64;
  template <bool kBlocked>
  static size_t Slot(size_t num_pairs, int m, size_t pair, int mb) {
    if (!kBlocked) return pair * static_cast<size_t>(m) + static_cast<size_t>(mb);
    const size_t block = static_cast<size_t>(mb) / kBlock;
    return (block * num_pairs + pair) * kBlock + static_cast<size_t>(mb) % kBlock;
  }

  // Every check of action `a` (not the optimizer step) of rank r, given what r did before it:
  // the same checks as the reference's shape pass and execution, arranged for speed: a
  // transfer's ends are checked by comparing them with its channel's (the channel exists only
  // between the ranks of neighbouring stages).
  template <bool kBlocked>
  [[gnu::always_inline]] bool Check(const Tables& t, int r, const Action& a) {
    const ActionType type = a.type;
    if (static_cast<unsigned>(a.replica) >= static_cast<unsigned>(t.num_replicas) ||
        static_cast<unsigned>(a.stage) >= static_cast<unsigned>(t.num_stages)) {
      return false;
    }
    const size_t pair = static_cast<size_t>(a.replica) * t.num_stages + a.stage;
    if (type == ActionType::kGradientSync) {
      if (t.rank_of[pair] != r || t.synced[pair]) return false;
      t.synced[pair] = 1;
      t.finished_at_sync[pair] = t.finished[pair];
      return true;
    }
    const int m = t.m;
    if (static_cast<unsigned>(a.microbatch) >= static_cast<unsigned>(m)) return false;
    if (t.num_replicas > 1) {
      int& owner = t.replica_of[a.microbatch];
      if (owner == kUnassigned) owner = a.replica;
      if (owner != a.replica) return false;
    }
    const size_t i = Slot<kBlocked>(t.num_pairs, m, pair, a.microbatch);
    const size_t neighbour = kBlocked ? kBlock : static_cast<size_t>(m);  // (pair +- 1, mb)
    uint8_t* const state = t.state;
    const int* const rank_of = t.rank_of;
    switch (type) {
      case ActionType::kForward:
        if (rank_of[pair] != r || (state[i] & kForwardDone)) return false;
        if (a.stage > 0) {
          const uint8_t input = rank_of[pair - 1] == r ? kForwardDone : kActivationArrived;
          if (!(state[i - neighbour] & input)) return false;
        }
        state[i] |= kForwardDone;
        return true;
      case ActionType::kBackward:
      case ActionType::kBackwardInput:
        if (rank_of[pair] != r || (!t.split && type == ActionType::kBackwardInput)) {
          return false;
        }
        if ((state[i] & kBackwardDone) || !(state[i] & kForwardDone)) return false;
        if (a.stage + 1 < t.num_stages) {
          const uint8_t input = rank_of[pair + 1] == r ? kBackwardDone : kGradientArrived;
          if (!(state[i + neighbour] & input)) return false;
        }
        // A whole B in a split schedule is its Bi and W at once.
        if (type == ActionType::kBackward) {
          state[i] |= kBackwardDone | (t.split ? kWeightDone : 0);
          ++t.finished[pair];
        } else {
          state[i] |= kBackwardDone;
        }
        return true;
      case ActionType::kBackwardWeight:
        if (rank_of[pair] != r || !t.split) return false;
        if ((state[i] & kWeightDone) || !(state[i] & kBackwardDone)) return false;
        state[i] |= kWeightDone;
        ++t.finished[pair];
        return true;
      case ActionType::kSendActivation: {
        const int c = t.activation_channel[pair];
        if (c == kNoChannel || t.ends[c] != std::make_pair(r, int{a.peer})) return false;
        if (!(state[i] & kForwardDone) || (state[i] & kActivationSent)) return false;
        state[i] |= kActivationSent;
        return Pair(c, 2 * i + 1, /*send=*/true);
      }
      case ActionType::kSendGradient: {
        const int c = t.gradient_channel[pair];
        if (c == kNoChannel || t.ends[c] != std::make_pair(r, int{a.peer})) return false;
        if (!(state[i] & kBackwardDone) || (state[i] & kGradientSent)) return false;
        state[i] |= kGradientSent;
        return Pair(c, 2 * i, /*send=*/true);
      }
      case ActionType::kRecvActivation: {
        const int c = t.activation_channel[pair];
        if (c == kNoChannel || t.ends[c] != std::make_pair(int{a.peer}, r)) return false;
        // Counted as arrived: if this receive never completes, pass 2 finds the rank stuck.
        state[i] |= kActivationArrived;
        return Pair(c, 2 * i + 1, /*send=*/false);
      }
      case ActionType::kRecvGradient: {
        const int c = t.gradient_channel[pair];
        if (c == kNoChannel || t.ends[c] != std::make_pair(int{a.peer}, r)) return false;
        state[i] |= kGradientArrived;
        return Pair(c, 2 * i, /*send=*/false);
      }
      default:
        return false;
    }
  }

  // Pass 1: every check of every action, rank by rank.
  bool ScanRanks(const std::vector<std::vector<Action>>& programs) {
    const Tables t = MakeTables();
    for (int r = 0; r < layout_.num_ranks(); ++r) {
      const Action* const program = programs[r].data();
      const size_t size = programs[r].size();
      for (size_t step = 0; step < size; ++step) {
        const Action& a = program[step];
        if (a.type == ActionType::kOptimizerStep) {
          // The optimizer step is the last action: nothing may follow it.
          if (step + 1 != size) return false;
          stepped_[r] = 1;
          break;
        }
        if (!Check</*kBlocked=*/false>(t, r, a)) return false;
      }
    }
    return true;
  }

 public:
  // What pass 1 could only count: every transfer paired, every micro-batch on one replica and
  // complete, every stage synchronised once after all of its backward passes.
  bool CheckCounts() {
    for (uint8_t stepped : stepped_) {
      if (!stepped) return false;
    }
    for (const Queue& q : queues_) {
      if (q.head != q.tail) return false;
    }
    std::vector<int> expected(layout_.num_replicas(), 0);
    for (int mb = 0; mb < layout_.num_microbatches(); ++mb) {
      if (replica_of_[mb] == kUnassigned) return false;
      ++expected[replica_of_[mb]];
    }
    for (int r = 0; r < layout_.num_ranks(); ++r) {
      for (const auto* held = layout_.StagesBegin(r); held != layout_.StagesEnd(r); ++held) {
        const size_t pair = layout_.Pair(held->first, held->second);
        if (!synced_[pair] || finished_at_sync_[pair] != expected[held->first]) return false;
      }
    }
    const uint8_t done = kForwardDone | kBackwardDone | (split_ ? kWeightDone : 0);
    // In the flags' order: blocks of micro-batches, pairs, micro-batches.
    const size_t pairs = layout_.NumPairs();
    const size_t block = emitted_ ? kBlock : static_cast<size_t>(layout_.num_microbatches());
    const size_t m = static_cast<size_t>(layout_.num_microbatches());
    const uint8_t* state = state_.data();
    for (size_t first = 0; first < m; first += block) {
      const size_t count = std::min(block, m - first);
      const int* replica_of = &replica_of_[first];
      for (size_t pair = 0; pair < pairs; ++pair, state += block) {
        const int replica = static_cast<int>(pair / layout_.num_stages());
        for (size_t j = 0; j < count; ++j) {
          if ((state[j] & done) != done && replica_of[j] == replica) return false;
        }
      }
    }
    return true;
  }

 private:
  // Posts one transfer on channel c: it is matched when its counterpart has been posted (the
  // k-th send with the k-th receive). Calls matched(rank) for the rank whose earlier
  // transfer this one matches, when that one waits (receives always; sends with grouped
  // rendezvous). True when this one waits.
  template <typename Matched>
  [[gnu::always_inline]] bool Post(int c, bool send, Matched matched) {
    if (send) {
      if (++posted_sends_[c] <= posted_recvs_[c]) {
        matched(layout_.ChannelTo(c));
        return false;
      }
      return grouped_;
    }
    if (++posted_recvs_[c] <= posted_sends_[c]) {
      if (grouped_) matched(layout_.ChannelFrom(c));
      return false;
    }
    return true;
  }

  // Pass 2: whether every rank finishes. A receive, and with grouped rendezvous a whole run of
  // transfers (a group), waits until all of its transfers are matched. Runs every rank that
  // can move until each waits for a counterpart or ends.
  bool Progress(const std::vector<std::vector<Action>>& programs) {
    for (int r = layout_.num_ranks() - 1; r >= 0; --r) worklist_.push_back(r);
    while (!worklist_.empty()) {
      const int r = worklist_.back();
      worklist_.pop_back();
      Advance(programs[r], r);
    }
    for (int r = 0; r < layout_.num_ranks(); ++r) {
      if (pc_[r] != static_cast<int64_t>(programs[r].size())) return false;
    }
    return true;
  }

  // An earlier transfer of `rank`'s waiting group got its counterpart.
  void Matched(int rank) {
    if (--outstanding_[rank] == 0) {
      pc_[rank] = group_end_[rank];
      worklist_.push_back(rank);
    }
  }

  // Runs rank r until it waits or ends.
  void Advance(const std::vector<Action>& whole, int r) {
    // In locals: Matched may grow the worklist, after which members would be read again.
    const Action* const program = whole.data();
    const int64_t size = static_cast<int64_t>(whole.size());
    const bool grouped = grouped_;
    int64_t pc = pc_[r];
    while (pc < size) {
      if (!IsTransferType(program[pc].type)) {
        ++pc;
        continue;
      }
      // A group: one transfer, or with grouped rendezvous the maximal run of transfers,
      // which ends only where a non-transfer follows or the program ends.
      int64_t end = pc + 1;
      if (grouped) {
        while (end < size && IsTransferType(program[end].type)) ++end;
      }
      int waiting = 0;
      for (int64_t k = pc; k < end; ++k) {
        const Action& a = program[k];
        waiting += Post(layout_.ChannelOf(a), IsSendType(a.type), [&](int q) { Matched(q); });
      }
      if (waiting > 0) {
        outstanding_[r] = waiting;
        group_end_[r] = end;
        pc_[r] = pc;
        // The rank resumes here after its peers have moved (often ~p resumes later): the
        // actions after this group have not been read yet, and no hardware prefetcher follows
        // a program read a few actions at a time. Ask for them now.
        for (int64_t k = end; k < size && k < end + kPrefetchActions; k += kActionsPerLine) {
          Prefetch(&program[k]);
        }
        return;
      }
      pc = end;
    }
    pc_[r] = pc;
  }

  // Emission order: rank r's group ends here (a non-transfer follows, or with buffered sends
  // after every transfer); it waits if a transfer of the group is not matched yet.
  void EndGroup(int r) {
    if (outstanding_[r] > 0) waiting_[r] = 1;
  }
  // An earlier transfer of `rank` got its counterpart; a waiting group all of whose transfers
  // are matched lets the rank go on with what it kept.
  void MatchedEmitted(int rank) {
    if (--outstanding_[rank] == 0 && waiting_[rank]) {
      waiting_[rank] = 0;
      worklist_.push_back(rank);
    }
  }
  // Takes what the ranks let go kept, until each waits again or has nothing kept.
  void Resume() {
    while (!worklist_.empty()) {
      const int r = worklist_.back();
      worklist_.pop_back();
      std::vector<uint32_t>& kept = pending_[r];
      size_t& head = pending_head_[r];
      while (head < kept.size() && !waiting_[r]) {
        const uint32_t item = kept[head++];
        if (item == kGroupEnd) {
          EndGroup(r);
          continue;
        }
        if (Post(static_cast<int>(item / 2), item % 2 != 0, [&](int q) { MatchedEmitted(q); })) {
          ++outstanding_[r];
        }
        if (!grouped_) EndGroup(r);
      }
      if (head == kept.size()) {
        kept.clear();
        head = 0;
      }
    }
  }

  static void Prefetch(const void* address) {
#if defined(__GNUC__)
    __builtin_prefetch(address);
#else
    (void)address;
#endif
  }
  static constexpr int kActionsPerLine = 64 / sizeof(Action);
  static constexpr int kPrefetchActions = 4 * kActionsPerLine;
  static constexpr uint32_t kGroupEnd = ~uint32_t{0};  // a kept non-transfer (grouped)

  const Layout& layout_;
  const bool grouped_;
  const bool split_;
  // Pass 1.
  std::vector<uint8_t> stepped_;  // per rank: its optimizer step was checked
  std::vector<uint8_t> state_;  // TripleFlag bits per (replica, stage, mb), at Slot()
  bool emitted_ = false;        // Begin's
  std::vector<int> finished_, finished_at_sync_;  // per (replica, stage)
  std::vector<uint8_t> synced_;
  std::vector<int> replica_of_;
  std::vector<Queue> queues_;  // per channel
  std::vector<std::unique_ptr<uint64_t[]>> buffers_;  // every queue buffer made
  std::vector<std::pair<uint64_t*, uint32_t>> spare_;  // those not in use, with capacities
  // Pass 2.
  std::vector<int64_t> posted_sends_, posted_recvs_;  // per channel
  std::vector<int64_t> pc_, group_end_;  // whole programs: per rank
  std::vector<int> outstanding_;  // per rank: its posted transfers not matched yet
  std::vector<int> worklist_;
  // Emission order, per rank: its group waits; what it was handed meanwhile (2 * channel +
  // send per transfer, kGroupEnd per non-transfer), from pending_head_ on.
  std::vector<uint8_t> waiting_;
  std::vector<std::vector<uint32_t>> pending_;
  std::vector<size_t> pending_head_;
};

// The reference: executes the programs symbolically in a fixed order (rank 0 first, then
// whichever rank was woken last) and reports the first error it meets. ValidateSchedule runs
// it when the quick proof below fails, to name that error.
class Validator {
 public:
  Validator(const Schedule& schedule, const ValidationOptions& options, const Layout& layout)
      : s_(schedule),
        options_(options),
        layout_(layout),
        num_ranks_(schedule.placement.num_ranks),
        num_stages_(schedule.placement.num_stages),
        num_replicas_(schedule.placement.NumReplicas()),
        m_(schedule.spec.num_microbatches),
        split_(schedule.spec.SplitsBackward()) {}

  // The layout must have passed Check().
  absl::Status Run() {
    TANDEM_RETURN_IF_ERROR(CheckShapeAndAssignReplicas());
    Allocate();
    TANDEM_RETURN_IF_ERROR(Execute());
    return CheckComplete();
  }

 private:
  const Action& At(int rank, int step) const { return s_.programs[rank][step]; }

  absl::Status Error(int rank, int step, absl::string_view message) const {
    const auto& program = s_.programs[rank];
    std::string what = step < static_cast<int>(program.size())
                           ? absl::StrCat(" (", ToString(program[step]), ")")
                           : std::string(" (end of program)");
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " step ", step, what, ": ",
                                                   message));
  }

  int RankOf(int replica, int stage) const { return layout_.RankOf(replica, stage); }
  size_t Index(int replica, int stage, int mb) const {
    return layout_.Index(replica, stage, mb);
  }
  const std::pair<int, int>* StagesBegin(int r) const { return layout_.StagesBegin(r); }
  const std::pair<int, int>* StagesEnd(int r) const { return layout_.StagesEnd(r); }

  // Ranges, placement and transfer ends of every action, then (in the same pass, reported
  // only when the shape is sound) each micro-batch's replica: that of its first forward.
  absl::Status CheckShapeAndAssignReplicas() {
    replica_of_.assign(m_, kUnassigned);
    absl::Status replica_error;
    for (int r = 0; r < num_ranks_; ++r) {
      const auto& program = s_.programs[r];
      const int size = static_cast<int>(program.size());
      for (int step = 0; step < size; ++step) {
        const Action& a = program[step];
        if (a.type == ActionType::kOptimizerStep) continue;
        if (a.replica >= num_replicas_) return Error(r, step, "bad replica");
        if (a.stage < 0 || a.stage >= num_stages_) return Error(r, step, "bad stage");
        if (a.type == ActionType::kGradientSync) {
          if (RankOf(a.replica, a.stage) != r) return PlacedElsewhere(r, step, a);
          continue;
        }
        if (a.microbatch < 0 || a.microbatch >= m_) {
          return Error(r, step, absl::StrCat("micro-batch outside [0, ", m_, ")"));
        }
        if (IsTransferType(a.type)) {
          TANDEM_RETURN_IF_ERROR(CheckTransferEnds(r, step, a));
        } else if (RankOf(a.replica, a.stage) != r) {
          return PlacedElsewhere(r, step, a);
        }
        // A compute or a transfer: its micro-batch's replica.
        int& owner = replica_of_[a.microbatch];
        if (owner == kUnassigned) owner = a.replica;
        if (owner != a.replica && replica_error.ok()) {
          replica_error =
              Error(r, step, absl::StrCat("micro-batch ", a.microbatch, " is run by replicas ",
                                          owner, " and ", a.replica));
        }
      }
    }
    TANDEM_RETURN_IF_ERROR(replica_error);
    expected_per_replica_.assign(num_replicas_, 0);
    for (int mb = 0; mb < m_; ++mb) {
      if (replica_of_[mb] == kUnassigned) {
        return absl::InvalidArgumentError(
            absl::StrCat("micro-batch ", mb, " is never run by any rank"));
      }
      ++expected_per_replica_[replica_of_[mb]];
    }
    return absl::OkStatus();
  }

  absl::Status PlacedElsewhere(int r, int step, const Action& a) const {
    return Error(r, step, absl::StrCat("stage ", a.stage, " (replica ", a.replica,
                                       ") is placed on rank ", RankOf(a.replica, a.stage)));
  }

  // The sender and receiver ranks a transfer must have.
  absl::Status CheckTransferEnds(int r, int step, const Action& a) const {
    const bool activation =
        a.type == ActionType::kSendActivation || a.type == ActionType::kRecvActivation;
    const int neighbour = activation ? a.stage + 1 : a.stage - 1;
    if (neighbour < 0 || neighbour >= num_stages_) {
      return Error(r, step, activation ? "the last stage has no activation to send"
                                       : "the first stage has no input gradient to send");
    }
    const int producer = RankOf(a.replica, a.stage);
    const int consumer = RankOf(a.replica, neighbour);
    const bool send = IsSendType(a.type);
    const int self = send ? producer : consumer;
    const int peer = send ? consumer : producer;
    if (self != r) {
      return Error(r, step, absl::StrCat("belongs on rank ", self));
    }
    if (a.peer != peer) {
      return Error(r, step, absl::StrCat("peer should be rank ", peer));
    }
    if (producer == consumer) {
      return Error(r, step, "neighbouring stages on the same rank need no transfer");
    }
    return absl::OkStatus();
  }

  void Allocate() {
    const size_t triples = static_cast<size_t>(num_replicas_) * num_stages_ * m_;
    state_.assign(triples, 0);
    finished_backwards_.assign(static_cast<size_t>(num_replicas_) * num_stages_, 0);
    synced_.assign(static_cast<size_t>(num_replicas_) * num_stages_, 0);
    pc_.assign(num_ranks_, 0);
    outstanding_.assign(num_ranks_, 0);
    group_end_.assign(num_ranks_, -1);
    channels_.resize(layout_.NumChannels());
    for (int id = 0; id < layout_.NumChannels(); ++id) {
      channels_[id].from = layout_.ChannelFrom(id);
      channels_[id].to = layout_.ChannelTo(id);
    }
  }

  // The execution below runs once per action: its steps return false on an error, kept in
  // error_, rather than building a Status for every action.
  bool Fail(absl::Status status) {
    error_ = std::move(status);
    return false;
  }

  // Checks a compute action's inputs and records its effect.
  bool RunCompute(int r, int step, const Action& a) {
    const size_t i = Index(a.replica, a.stage, a.microbatch);
    uint8_t& state = state_[i];
    switch (a.type) {
      case ActionType::kForward: {
        if (state & kForwardDone) return Fail(Error(r, step, "forward runs twice"));
        if (a.stage > 0) {
          const bool local = RankOf(a.replica, a.stage - 1) == r;
          const uint8_t needed = local ? kForwardDone : kActivationArrived;
          if (!(state_[i - m_] & needed)) {
            return Fail(Error(r, step,
                              absl::StrCat("needs the activation of stage ", a.stage - 1,
                                           " for micro-batch ", a.microbatch,
                                           local ? ", not computed yet" : ", not received yet")));
          }
        }
        state |= kForwardDone;
        return true;
      }
      case ActionType::kBackward:
      case ActionType::kBackwardInput: {
        if (!split_ && a.type == ActionType::kBackwardInput) {
          return Fail(Error(r, step, "this schedule does not split backward: expected B"));
        }
        if (state & kBackwardDone) return Fail(Error(r, step, "backward runs twice"));
        if (!(state & kForwardDone)) return Fail(Error(r, step, "backward before its forward"));
        if (a.stage + 1 < num_stages_) {
          const bool local = RankOf(a.replica, a.stage + 1) == r;
          const uint8_t needed = local ? kBackwardDone : kGradientArrived;
          if (!(state_[i + m_] & needed)) {
            return Fail(Error(r, step,
                              absl::StrCat("needs the gradient from stage ", a.stage + 1,
                                           " for micro-batch ", a.microbatch,
                                           local ? ", not computed yet" : ", not received yet")));
          }
        }
        // A whole B in a split schedule is its Bi and W at once.
        if (a.type == ActionType::kBackward) {
          state |= kBackwardDone | (split_ ? kWeightDone : 0);
          ++finished_backwards_[a.replica * num_stages_ + a.stage];
        } else {
          state |= kBackwardDone;
        }
        return true;
      }
      case ActionType::kBackwardWeight: {
        if (!split_) {
          return Fail(Error(r, step, "this schedule does not split backward: expected B"));
        }
        if (state & kWeightDone) return Fail(Error(r, step, "weight gradient runs twice"));
        if (!(state & kBackwardDone)) return Fail(Error(r, step, "weight gradient before its Bi"));
        state |= kWeightDone;
        ++finished_backwards_[a.replica * num_stages_ + a.stage];
        return true;
      }
      default:
        return Fail(absl::InternalError("not a compute action"));
    }
  }

  // A send and the receive it meets must carry the same data.
  bool CheckPair(const Channel& c, const Posted& send, const Posted& recv) {
    if (send.activation == recv.activation && send.triple == recv.triple) return true;
    return Fail(Error(c.to, recv.step,
                      absl::StrCat("does not match the peer's next send ",
                                   ToString(At(c.from, send.step)), " (rank ", c.from, " step ",
                                   send.step,
                                   "): transfers between two ranks must be in the same order")));
  }

  // Records that a matched transfer's data is on the receiver.
  void Deliver(const Posted& send) {
    state_[send.triple] |= send.activation ? kActivationArrived : kGradientArrived;
  }

  // Keeps only what is still unmatched, so the queues stay short.
  static void Compact(Channel& c) {
    if (c.head_send == c.sends.size()) {
      c.sends.clear();
      c.head_send = 0;
    }
    if (c.head_recv == c.recvs.size()) {
      c.recvs.clear();
      c.head_recv = 0;
    }
  }

  // Matches posted sends and receives on a channel in order. Wakes ranks whose groups finish.
  bool Match(int channel_id) {
    Channel& c = channels_[channel_id];
    while (c.head_send < c.sends.size() && c.head_recv < c.recvs.size()) {
      const Posted send = c.sends[c.head_send++];
      const Posted recv = c.recvs[c.head_recv++];
      if (!CheckPair(c, send, recv)) return false;
      Deliver(send);
      Complete(c.to);
      if (options_.grouped_rendezvous) Complete(c.from);
    }
    Compact(c);
    return true;
  }

  void Complete(int rank) {
    if (--outstanding_[rank] == 0 && rank != advancing_) {
      pc_[rank] = group_end_[rank];
      worklist_.push_back(rank);
    }
  }

  // Checks a send's data exists and was not sent before, and marks it sent.
  bool CheckSend(int r, int step, size_t triple, bool activation) {
    uint8_t& state = state_[triple];
    if (activation) {
      if (!(state & kForwardDone)) {
        return Fail(Error(r, step, "sends an activation not computed yet"));
      }
      if (state & kActivationSent) return Fail(Error(r, step, "activation sent twice"));
      state |= kActivationSent;
    } else {
      if (!(state & kBackwardDone)) return Fail(Error(r, step, "sends a gradient not computed yet"));
      if (state & kGradientSent) return Fail(Error(r, step, "gradient sent twice"));
      state |= kGradientSent;
    }
    return true;
  }

  // The channel of a transfer (its ends are the placement's, checked by the shape pass).
  Channel& ChannelOf(const Action& a, int* id) {
    *id = layout_.ChannelOf(a);
    Channel& c = channels_[*id];
    if (c.first_use < 0) c.first_use = next_first_use_++;
    return c;
  }

  // Posts one transfer of rank r's open group on its channel (grouped_rendezvous); returns the
  // channel, or -1 on an error.
  int Post(int r, int step, const Action& a) {
    const size_t i = Index(a.replica, a.stage, a.microbatch);
    const bool activation =
        a.type == ActionType::kSendActivation || a.type == ActionType::kRecvActivation;
    int id;
    Channel& c = ChannelOf(a, &id);
    if (IsSendType(a.type)) {
      if (!CheckSend(r, step, i, activation)) return -1;
      c.sends.push_back({i, step, activation});
      if (options_.grouped_rendezvous) ++outstanding_[r];
    } else {
      c.recvs.push_back({i, step, activation});
      ++outstanding_[r];
    }
    return id;
  }

  // One transfer as a group of its own (buffered sends): the same effect as posting it and
  // matching its channel, without the general bookkeeping. In this mode a channel never holds
  // both unmatched sends and receives, and at most one receive (its receiver is then blocked).
  // Returns false on an error; *blocked when the receive has to wait.
  bool Transfer(int r, int step, const Action& a, bool* blocked) {
    const size_t i = Index(a.replica, a.stage, a.microbatch);
    const bool activation =
        a.type == ActionType::kSendActivation || a.type == ActionType::kRecvActivation;
    int id;
    Channel& c = ChannelOf(a, &id);
    const Posted posted{i, step, activation};
    if (IsSendType(a.type)) {
      if (!CheckSend(r, step, i, activation)) return false;
      if (c.head_recv < c.recvs.size()) {
        // The receiver waits for this send.
        const Posted recv = c.recvs[c.head_recv++];
        if (!CheckPair(c, posted, recv)) return false;
        Deliver(posted);
        Complete(c.to);
        Compact(c);
      } else {
        c.sends.push_back(posted);
      }
      return true;
    }
    if (c.head_send < c.sends.size()) {
      const Posted send = c.sends[c.head_send++];
      if (!CheckPair(c, send, posted)) return false;
      Deliver(send);
      Compact(c);
      return true;
    }
    c.recvs.push_back(posted);
    outstanding_[r] = 1;
    *blocked = true;
    return true;
  }

  // Runs rank r until it blocks or ends.
  bool Advance(int r) {
    const auto& program = s_.programs[r];
    const int size = static_cast<int>(program.size());
    if (outstanding_[r] != 0) return true;
    int pc = pc_[r];
    while (pc < size) {
      const int step = pc;
      const Action& a = program[step];
      switch (a.type) {
        case ActionType::kForward:
        case ActionType::kBackward:
        case ActionType::kBackwardInput:
        case ActionType::kBackwardWeight:
          if (!RunCompute(r, step, a)) return false;
          ++pc;
          break;
        case ActionType::kSendActivation:
        case ActionType::kRecvActivation:
        case ActionType::kSendGradient:
        case ActionType::kRecvGradient: {
          if (!options_.grouped_rendezvous) {
            bool blocked = false;
            if (!Transfer(r, step, a, &blocked)) return false;
            if (blocked) {
              group_end_[r] = step + 1;
              pc_[r] = pc;
              return true;
            }
            ++pc;
            break;
          }
          // A group: the maximal run of transfers, posted together.
          int end = step + 1;
          while (end < size && IsTransferType(program[end].type)) ++end;
          group_end_[r] = end;
          touched_.clear();
          for (int k = step; k < end; ++k) {
            const int id = Post(r, k, program[k]);
            if (id < 0) return false;
            touched_.push_back(id);
          }
          // Matching may complete groups of peers (they go on the worklist) and this one.
          advancing_ = r;
          for (int id : touched_) {
            if (!Match(id)) return false;
          }
          advancing_ = -1;
          if (outstanding_[r] > 0) {  // blocked until matched
            pc_[r] = pc;
            return true;
          }
          pc = end;
          break;
        }
        case ActionType::kGradientSync: {
          const int key = a.replica * num_stages_ + a.stage;
          if (synced_[key]) return Fail(Error(r, step, "gradient sync of this stage runs twice"));
          if (finished_backwards_[key] != expected_per_replica_[a.replica]) {
            return Fail(Error(r, step, absl::StrCat("gradient sync before ",
                                                    FirstMissingBackward(a.replica, a.stage),
                                                    " (", finished_backwards_[key], " of ",
                                                    expected_per_replica_[a.replica],
                                                    " backward passes of the stage done)")));
          }
          synced_[key] = 1;
          ++pc;
          break;
        }
        case ActionType::kOptimizerStep: {
          if (step != size - 1) {
            return Fail(Error(r, step, "optimizer step must be the last action"));
          }
          for (const auto* held = StagesBegin(r); held != StagesEnd(r); ++held) {
            const auto [replica, stage] = *held;
            if (!synced_[replica * num_stages_ + stage]) {
              return Fail(Error(r, step,
                                absl::StrCat("optimizer step before the gradient sync of stage ",
                                             stage, replica ? " replica 1" : "")));
            }
          }
          ++pc;
          break;
        }
      }
    }
    pc_[r] = pc;
    return true;
  }

  // Name of the first backward action of (replica, stage) that has not run.
  std::string FirstMissingBackward(int replica, int stage) const {
    for (int mb = 0; mb < m_; ++mb) {
      if (replica_of_[mb] != replica) continue;
      const uint8_t state = state_[Index(replica, stage, mb)];
      Action missing;
      missing.stage = stage;
      missing.microbatch = mb;
      missing.replica = replica;
      if (!(state & kBackwardDone)) {
        missing.type = split_ ? ActionType::kBackwardInput : ActionType::kBackward;
      } else if (split_ && !(state & kWeightDone)) {
        missing.type = ActionType::kBackwardWeight;
      } else {
        continue;
      }
      return ToString(missing);
    }
    return "?";
  }

  // The first transfer of rank r's open group that no peer has matched.
  int FirstUnmatched(int r) const {
    int first = group_end_[r];
    for (const Channel& c : channels_) {
      if (c.from == r) {
        for (size_t k = c.head_send; k < c.sends.size(); ++k) {
          if (c.sends[k].step >= pc_[r]) first = std::min(first, c.sends[k].step);
        }
      }
      if (c.to == r) {
        for (size_t k = c.head_recv; k < c.recvs.size(); ++k) {
          if (c.recvs[k].step >= pc_[r]) first = std::min(first, c.recvs[k].step);
        }
      }
    }
    return first < group_end_[r] ? first : pc_[r];
  }

  absl::Status Execute() {
    for (int r = num_ranks_ - 1; r >= 0; --r) worklist_.push_back(r);
    while (!worklist_.empty()) {
      int r = worklist_.back();
      worklist_.pop_back();
      if (!Advance(r)) return error_;
    }
    // Deadlock: ranks left with an unmatched group.
    for (int r = 0; r < num_ranks_; ++r) {
      if (pc_[r] >= static_cast<int>(s_.programs[r].size())) continue;
      const int step = FirstUnmatched(r);
      const Action& a = At(r, step);
      const int peer = a.peer;
      std::string peer_state =
          pc_[peer] >= static_cast<int>(s_.programs[peer].size())
              ? absl::StrCat("rank ", peer, " has finished")
              : absl::StrCat("rank ", peer, " waits at step ", pc_[peer], " (",
                             ToString(At(peer, pc_[peer])), ")");
      return Error(r, step,
                   absl::StrCat("deadlock: ",
                                IsSendType(a.type) ? "waiting for a receive that never comes"
                                                   : "waiting for a send that never comes",
                                "; ", peer_state));
    }
    // Sends nobody received, on the channels in the order they were first used.
    std::vector<const Channel*> used;
    for (const Channel& c : channels_) {
      if (c.first_use >= 0) used.push_back(&c);
    }
    std::sort(used.begin(), used.end(),
              [](const Channel* a, const Channel* b) { return a->first_use < b->first_use; });
    for (const Channel* c : used) {
      if (c->head_send < c->sends.size()) {
        return Error(c->from, c->sends[c->head_send].step, "sent but never received");
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckComplete() {
    // Every triple of its micro-batch's replica computed: one pass in memory order first, the
    // report (first missing action by micro-batch, then stage) only if something is missing.
    const uint8_t done = kForwardDone | kBackwardDone | (split_ ? kWeightDone : 0);
    bool complete = true;
    for (int replica = 0; replica < num_replicas_ && complete; ++replica) {
      for (int stage = 0; stage < num_stages_ && complete; ++stage) {
        const uint8_t* state = &state_[Index(replica, stage, 0)];
        for (int mb = 0; mb < m_; ++mb) {
          if ((state[mb] & done) != done && replica_of_[mb] == replica) {
            complete = false;
            break;
          }
        }
      }
    }
    const Placement& pl = s_.placement;
    if (!complete) {
      for (int mb = 0; mb < m_; ++mb) {
        const int replica = replica_of_[mb];
        for (int stage = 0; stage < num_stages_; ++stage) {
          const uint8_t state = state_[Index(replica, stage, mb)];
          const int r = pl.RankOf(replica, stage);
          const int end = static_cast<int>(s_.programs[r].size());
          Action missing;
          missing.stage = stage;
          missing.microbatch = mb;
          missing.replica = replica;
          if (!(state & kForwardDone)) {
            missing.type = ActionType::kForward;
          } else if (!(state & kBackwardDone)) {
            missing.type = split_ ? ActionType::kBackwardInput : ActionType::kBackward;
          } else if (split_ && !(state & kWeightDone)) {
            missing.type = ActionType::kBackwardWeight;
          } else {
            continue;
          }
          return Error(r, end, absl::StrCat("missing ", ToString(missing)));
        }
      }
    }
    for (int r = 0; r < num_ranks_; ++r) {
      const auto& program = s_.programs[r];
      const int end = static_cast<int>(program.size());
      for (const auto* held = StagesBegin(r); held != StagesEnd(r); ++held) {
        const auto [replica, stage] = *held;
        if (!synced_[replica * num_stages_ + stage]) {
          return Error(r, end, absl::StrCat("missing gradient sync of stage ", stage,
                                            replica ? " replica 1" : ""));
        }
      }
      if (program.empty() || program.back().type != ActionType::kOptimizerStep) {
        return Error(r, end, "missing optimizer step");
      }
    }
    return absl::OkStatus();
  }

  const Schedule& s_;
  const ValidationOptions options_;
  const Layout& layout_;
  const int num_ranks_, num_stages_, num_replicas_, m_;
  const bool split_;

  std::vector<int> replica_of_;
  std::vector<int> expected_per_replica_;
  std::vector<uint8_t> state_;               // TripleFlag bits per (replica, stage, mb)
  std::vector<int> finished_backwards_;
  std::vector<uint8_t> synced_;
  std::vector<int> pc_, outstanding_, group_end_;
  std::vector<int> worklist_;
  int advancing_ = -1;  // the rank whose group is being posted
  std::vector<int> touched_;
  std::vector<Channel> channels_;
  int next_first_use_ = 0;
  absl::Status error_;  // the error that stopped the execution
};

}  // namespace

absl::Status ValidateSchedule(const Schedule& schedule) {
  return ValidateSchedule(schedule, ValidationOptions{});
}

absl::Status ValidateSchedule(const Schedule& schedule, const ValidationOptions& options) {
  Layout layout(schedule);
  TANDEM_RETURN_IF_ERROR(layout.Check());
  if (Proof(schedule, options, layout).Run(schedule.programs)) return absl::OkStatus();
  // Invalid: the reference execution finds the first error in its order and names it.
  return Validator(schedule, options, layout).Run();
}

namespace internal {

absl::Status ValidateScheduleByExecution(const Schedule& schedule,
                                         const ValidationOptions& options) {
  Layout layout(schedule);
  TANDEM_RETURN_IF_ERROR(layout.Check());
  return Validator(schedule, options, layout).Run();
}

struct StreamedProof::Impl {
  Impl(const Schedule& shape, const ValidationOptions& options)
      : layout(shape), proof(shape, options, layout) {}
  Layout layout;
  Proof proof;
  bool checked = true;  // every check so far passed
  bool counted = false;
  bool ended = false;
};

StreamedProof::StreamedProof(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StreamedProof::~StreamedProof() = default;

absl::StatusOr<std::unique_ptr<StreamedProof>> StreamedProof::Create(
    const Schedule& shape, const ValidationOptions& options) {
  auto impl = std::make_unique<Impl>(shape, options);
  TANDEM_RETURN_IF_ERROR(impl->layout.Check());
  impl->proof.Begin(/*emitted=*/true);
  return std::unique_ptr<StreamedProof>(new StreamedProof(std::move(impl)));
}

bool StreamedProof::Take(const EmittedActions& batch) {
  Impl& impl = *impl_;
  if (!impl.checked) return false;
  Proof& proof = impl.proof;
  const Proof::Tables tables = proof.MakeTables();
  for (size_t j = 0; j < batch.size; ++j) {
    if (!proof.Take(tables, batch.ranks[j], batch.actions[j])) {
      impl.checked = false;
      return false;
    }
  }
  if (batch.last) {
    impl.counted = proof.CheckCounts();
    impl.ended = proof.EndEmitted();
  }
  return true;
}

bool StreamedProof::ChecksPassed() const { return impl_->checked && impl_->counted; }

bool StreamedProof::Finished() const { return ChecksPassed() && impl_->ended; }

}  // namespace internal

}  // namespace tandem::pipeline
