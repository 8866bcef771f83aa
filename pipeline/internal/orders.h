// Shared by the schedule generators, the list scheduler and the program completion: compute
// orders in their compact form, the nominal costs orders are planned and completed with, and
// a placement flattened into tables for per-action lookups. Private to pipeline/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "pipeline/schedule.h"

namespace tandem::pipeline::internal {

// Nominal costs the list scheduler uses to choose an order (a common forward:backward ratio;
// the order is then valid for any costs).
constexpr int kNominalForward = 1;
constexpr int kNominalBackward = 2;        // full backward
constexpr int kNominalBackwardInput = 1;   // split backward: input-gradient half
constexpr int kNominalBackwardWeight = 1;  // split backward: weight-gradient half

// An Action built as one 8-byte word in a register. One assembled field by field on the stack
// and then copied whole (into a program, a queue) is a load the store buffer cannot forward,
// and the builders copy tens of millions of them.
inline Action PackedAction(ActionType type, int replica, int stage, int microbatch, int peer) {
  static_assert(offsetof(Action, type) == 0 && offsetof(Action, replica) == 1 &&
                    offsetof(Action, peer) == 2 && offsetof(Action, stage) == 4 &&
                    offsetof(Action, microbatch) == 6 && sizeof(Action) == 8 &&
                    std::is_trivially_copyable_v<Action>,
                "PackedAction knows Action's layout");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  static_assert(false, "PackedAction assumes a little-endian target");
#endif
  const uint64_t word = uint64_t{static_cast<uint8_t>(type)} |
                        (uint64_t{static_cast<uint8_t>(replica)} << 8) |
                        (uint64_t{static_cast<uint16_t>(peer)} << 16) |
                        (uint64_t{static_cast<uint16_t>(stage)} << 32) |
                        (uint64_t{static_cast<uint16_t>(microbatch)} << 48);
  Action out;
  std::memcpy(static_cast<void*>(&out), &word, sizeof(out));
  return out;
}

inline Action Compute(ActionType type, int replica, int stage, int microbatch) {
  return PackedAction(type, replica, stage, microbatch, /*peer=*/-1);
}

using ComputeOrders = std::vector<std::vector<Action>>;

// A compute action as the generators with fixed orders list it: an Action (8 bytes; at
// p=1024, m=4096 interleaved lists 17M of them, read several times).
using Op = Action;
inline Op OpOf(ActionType type, int replica, int stage, int microbatch) {
  return Compute(type, replica, stage, microbatch);
}
inline const Action& ActionOf(const Action& action) { return action; }
// Compute orders (the generators' and CompleteSchedule's callers').
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

// Whether a compute completes its micro-batch's weight gradient: a whole B, or W (the last
// such action of a stage is followed by its GradientSync).
inline bool FinishesWeightGradient(ActionType type) {
  return type == ActionType::kBackward || type == ActionType::kBackwardWeight;
}

inline int NominalCost(ActionType type, int full_backward = kNominalBackward) {
  return UnitCosts::WithFullBackward(full_backward).Of(type);
}

// Nominal costs are whole numbers, so times are too: 32-bit integers (at most 3 * 2^24
// actions of cost <= 2 on a rank).
using Time = int32_t;
constexpr Time kUnknownTime = std::numeric_limits<Time>::max();

inline void Prefetch(const void* address) {
#if defined(__GNUC__)
  __builtin_prefetch(address);
#else
  (void)address;
#endif
}

inline int LowestBit(uint64_t word) {
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

// The transfer of compute `a`'s data: `a` with `type` and `peer` (see PackedAction).
inline Action TransferOf(const Action& a, ActionType type, int peer) {
  return PackedAction(type, a.replica, a.stage, a.microbatch, peer);
}

inline Action SyncOf(int replica, int stage) {
  return PackedAction(ActionType::kGradientSync, replica, stage, /*microbatch=*/-1, /*peer=*/-1);
}

inline Action StepAction() {
  return PackedAction(ActionType::kOptimizerStep, 0, /*stage=*/-1, /*microbatch=*/-1, -1);
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

}  // namespace tandem::pipeline::internal
