#include "pipeline/generators.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::pipeline {
namespace {

// Nominal costs the list scheduler uses to choose an order (a common forward:backward ratio;
// the order is then valid for any costs).
constexpr double kNominalForward = 1.0;
constexpr double kNominalBackward = 2.0;        // full backward
constexpr double kNominalBackwardInput = 1.0;   // split backward: input-gradient half
constexpr double kNominalBackwardWeight = 1.0;  // split backward: weight-gradient half
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

double NominalCost(ActionType type, double full_backward = kNominalBackward) {
  switch (type) {
    case ActionType::kForward:
      return kNominalForward;
    case ActionType::kBackward:
      return full_backward;
    case ActionType::kBackwardInput:
      return kNominalBackwardInput;
    default:
      return kNominalBackwardWeight;
  }
}


// ---- 1F1B family ---------------------------------------------------------------------------

// One stage's 1F1B order over `microbatches` (ascending), with `warmup` forwards first.
void Append1F1B(int replica, int stage, const std::vector<int>& microbatches, int warmup,
                std::vector<Action>* out) {
  const int m = static_cast<int>(microbatches.size());
  warmup = std::clamp(warmup, 0, m);
  int next_forward = 0;
  for (; next_forward < warmup; ++next_forward) {
    out->push_back(Compute(ActionType::kForward, replica, stage, microbatches[next_forward]));
  }
  for (int next_backward = 0; next_backward < m; ++next_backward) {
    if (next_forward < m) {
      out->push_back(Compute(ActionType::kForward, replica, stage, microbatches[next_forward]));
      ++next_forward;
    }
    out->push_back(Compute(ActionType::kBackward, replica, stage, microbatches[next_backward]));
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
  // A 1F1B order (Append1F1B) over these micro-batches with `warmup` forwards first, when not
  // null; shared between the streams of a replica.
  const std::vector<int>* one_f_one_b = nullptr;
  size_t warmup = 0;

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
  static Stream OneFOneB(int replica, int stage, const std::vector<int>* microbatches,
                         int warmup) {
    Stream s;
    s.replica = replica;
    s.stage = stage;
    s.one_f_one_b = microbatches;
    s.length = 2 * microbatches->size();
    s.warmup = static_cast<size_t>(std::clamp(warmup, 0, static_cast<int>(microbatches->size())));
    return s;
  }
  bool done() const { return next >= length; }
  Action Head() const {
    if (one_f_one_b != nullptr) {
      const std::vector<int>& mbs = *one_f_one_b;
      const size_t m = mbs.size();
      if (next < warmup) return Compute(ActionType::kForward, replica, stage, mbs[next]);
      const size_t j = next - warmup;
      const size_t alternating = 2 * (m - warmup);
      if (j < alternating) {
        return j % 2 == 0 ? Compute(ActionType::kForward, replica, stage, mbs[warmup + j / 2])
                          : Compute(ActionType::kBackward, replica, stage, mbs[j / 2]);
      }
      return Compute(ActionType::kBackward, replica, stage, mbs[m - warmup + (j - alternating)]);
    }
    return actions.empty() ? Compute(type, replica, stage, static_cast<int>(next))
                           : actions[next];
  }
};
using Streams = std::vector<std::vector<Stream>>;  // [rank][stream]

// The head a rank would run next and when it could start.
struct Entry {
  double start;
  int priority;
  int tie;
  int rank;
  int stream;
  uint64_t version;
};

// At most one entry per rank, ordered by (start, rank): the earliest start first, the lower
// rank on ties. An indexed binary heap, so that replacing a rank's entry moves it in place.
class RankHeap {
 public:
  void Reset(int num_ranks) {
    heap_.clear();
    position_.assign(num_ranks, kAbsent);
    entries_.assign(num_ranks, Entry{});
  }
  bool empty() const { return heap_.empty(); }
  void Set(int rank, const Entry& entry) {
    entries_[rank] = entry;
    int i = position_[rank];
    if (i == kAbsent) {
      i = static_cast<int>(heap_.size());
      heap_.push_back(rank);
      position_[rank] = i;
    }
    SiftDown(SiftUp(i));
  }
  void Remove(int rank) {
    const int i = position_[rank];
    if (i == kAbsent) return;
    const int last = heap_.back();
    heap_.pop_back();
    position_[rank] = kAbsent;
    if (last == rank) return;
    heap_[i] = last;
    position_[last] = i;
    SiftDown(SiftUp(i));
  }
  Entry PopMin() {
    const Entry top = entries_[heap_[0]];
    Remove(heap_[0]);
    return top;
  }

 private:
  static constexpr int kAbsent = -1;
  bool Less(int a, int b) const {
    const Entry& x = entries_[a];
    const Entry& y = entries_[b];
    return x.start < y.start || (x.start == y.start && a < b);
  }
  int SiftUp(int i) {
    const int rank = heap_[i];
    while (i > 0) {
      const int parent = (i - 1) / 2;
      if (!Less(rank, heap_[parent])) break;
      heap_[i] = heap_[parent];
      position_[heap_[i]] = i;
      i = parent;
    }
    heap_[i] = rank;
    position_[rank] = i;
    return i;
  }
  int SiftDown(int i) {
    const int rank = heap_[i];
    const int n = static_cast<int>(heap_.size());
    while (true) {
      int child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && Less(heap_[child + 1], heap_[child])) ++child;
      if (!Less(heap_[child], rank)) break;
      heap_[i] = heap_[child];
      position_[heap_[i]] = i;
      i = child;
    }
    heap_[i] = rank;
    position_[rank] = i;
    return i;
  }

  std::vector<int> heap_;      // ranks
  std::vector<int> position_;  // rank -> index in heap_, or kAbsent
  std::vector<Entry> entries_; // rank -> its entry
};

class ListScheduler {
 public:
  struct Config {
    int num_ranks = 0;
    int num_stages = 0;
    int num_replicas = 1;
    int num_microbatches = 0;
    bool split_backward = false;
    // Priority class per type (lower first) for kForward, kBackward/kBackwardInput,
    // kBackwardWeight.
    int forward_class = 1;
    int backward_class = 0;
    int weight_class = 2;
    int64_t stash_cap = std::numeric_limits<int64_t>::max();  // per rank, in chunks
    std::vector<int64_t> stash_caps;  // per-rank caps; overrides stash_cap when not empty
  };

  ListScheduler(Config config, Streams streams)
      : config_(config), streams_(std::move(streams)) {
    const size_t triples = static_cast<size_t>(config_.num_replicas) * config_.num_stages *
                           config_.num_microbatches;
    forward_done_.assign(triples, kNotScheduled);
    backward_done_.assign(triples, kNotScheduled);
    free_at_.assign(config_.num_ranks, 0.0);
    stash_.assign(config_.num_ranks, 0);
    version_.assign(config_.num_ranks, 0);
    queue_.Reset(config_.num_ranks);
  }

  // Returns per-rank compute orders.
  absl::StatusOr<ComputeOrders> Run() {
    int64_t remaining = 0;
    for (const auto& rank_streams : streams_) {
      for (const auto& stream : rank_streams) remaining += static_cast<int64_t>(stream.length);
    }
    ComputeOrders orders(config_.num_ranks);
    for (int r = 0; r < config_.num_ranks; ++r) {
      int64_t n = 0;
      for (const auto& stream : streams_[r]) n += static_cast<int64_t>(stream.length);
      orders[r].reserve(n);
      Refresh(r, /*ignore_cap=*/false);
    }
    while (remaining > 0) {
      bool relaxed = false;
      if (queue_.empty()) {
        // Every rank is blocked by the stash cap (or waits on one that is): relax it for one
        // action.
        for (int r = 0; r < config_.num_ranks; ++r) Refresh(r, /*ignore_cap=*/true);
        if (queue_.empty()) {
          return absl::InternalError("list scheduler: no action can run (cyclic streams)");
        }
        relaxed = true;
      }
      const Entry top = queue_.PopMin();
      const int r = top.rank;
      Stream& stream = streams_[r][top.stream];
      const Action action = stream.Head();
      ++stream.next;
      --remaining;
      const double finish = top.start + NominalCost(action.type);
      free_at_[r] = finish;
      MarkDone(action, finish);
      orders[r].push_back(action);
      Refresh(r, /*ignore_cap=*/false);
      // Neighbours whose heads may have become ready.
      if (action.type == ActionType::kForward && action.stage + 1 < config_.num_stages) {
        RefreshOwner(action.replica, action.stage + 1);
      }
      if ((action.type == ActionType::kBackward || action.type == ActionType::kBackwardInput) &&
          action.stage > 0) {
        RefreshOwner(action.replica, action.stage - 1);
      }
      // Entries queued while relaxed would ignore the cap: requeue every rank under it.
      if (relaxed) {
        for (int other = 0; other < config_.num_ranks; ++other) Refresh(other, false);
      }
    }
    return orders;
  }

  // Which rank owns (replica, stage); set before Run().
  void SetOwners(std::vector<std::vector<int>> owner) { owner_ = std::move(owner); }

 private:
  // Nominal costs are whole numbers, so finish times are too: stored as 32-bit integers
  // (half the memory traffic of doubles; at most 3 * 2^24 actions of cost <= 2 on a rank).
  using Time = int32_t;
  static constexpr Time kNotScheduled = std::numeric_limits<Time>::max();


  size_t Index(int replica, int stage, int microbatch) const {
    return (static_cast<size_t>(replica) * config_.num_stages + stage) *
               config_.num_microbatches +
           microbatch;
  }

  void MarkDone(const Action& a, double finish) {
    const size_t i = Index(a.replica, a.stage, a.microbatch);
    switch (a.type) {
      case ActionType::kForward:
        forward_done_[i] = static_cast<Time>(finish);
        ++stash_[owner_[a.replica][a.stage]];
        break;
      case ActionType::kBackward:
        backward_done_[i] = static_cast<Time>(finish);
        --stash_[owner_[a.replica][a.stage]];
        break;
      case ActionType::kBackwardInput:
        // W waits on this (a split schedule has no full B to confuse it with).
        backward_done_[i] = static_cast<Time>(finish);
        break;
      case ActionType::kBackwardWeight:
        --stash_[owner_[a.replica][a.stage]];
        break;
      default:
        break;
    }
  }

  // Time at which `a`'s inputs are ready (kNotScheduled if a dependency is not scheduled yet).
  Time ReadyTime(const Action& a) const {
    const size_t i = Index(a.replica, a.stage, a.microbatch);
    switch (a.type) {
      case ActionType::kForward:
        return a.stage == 0 ? 0 : forward_done_[Index(a.replica, a.stage - 1, a.microbatch)];
      case ActionType::kBackward:
      case ActionType::kBackwardInput: {
        Time t = forward_done_[i];
        if (a.stage + 1 < config_.num_stages) {
          t = std::max(t, backward_done_[Index(a.replica, a.stage + 1, a.microbatch)]);
        }
        return t;
      }
      case ActionType::kBackwardWeight:
        return backward_done_[i];
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

  void Refresh(int r, bool ignore_cap) {
    ++version_[r];
    bool found = false;
    Entry best{};
    const int64_t cap = config_.stash_caps.empty() ? config_.stash_cap : config_.stash_caps[r];
    const bool capped = !ignore_cap && stash_[r] >= cap;
    const std::vector<Stream>& streams = streams_[r];
    for (size_t k = 0; k < streams.size(); ++k) {
      const Stream& stream = streams[k];
      if (stream.done()) continue;
      const Action head = stream.Head();
      if (head.type == ActionType::kForward && capped) continue;
      const Time ready = ReadyTime(head);
      if (ready == kNotScheduled) continue;
      Entry e{std::max(static_cast<double>(ready), free_at_[r]), PriorityClass(head.type), Tie(head), r,
              static_cast<int>(k), version_[r]};
      if (!found || std::tie(e.start, e.priority, e.tie, e.stream) <
                        std::tie(best.start, best.priority, best.tie, best.stream)) {
        best = e;
        found = true;
      }
    }
    if (found) {
      queue_.Set(r, best);
    } else {
      queue_.Remove(r);
    }
  }

  void RefreshOwner(int replica, int stage) {
    const int r = owner_[replica][stage];
    Refresh(r, /*ignore_cap=*/false);
  }

  Config config_;
  Streams streams_;
  std::vector<std::vector<int>> owner_;  // [replica][stage] -> rank
  std::vector<Time> forward_done_, backward_done_;  // finish times; Bi's for W
  std::vector<double> free_at_;
  std::vector<int64_t> stash_;
  std::vector<uint64_t> version_;
  RankHeap queue_;
};

// Streams of one forward sequence and one backward (and W) sequence per stage a rank holds,
// each in micro-batch order.
Streams PerStageStreams(const Placement& placement, int num_microbatches, bool split_backward) {
  Streams streams(placement.num_ranks);
  for (int r = 0; r < placement.num_ranks; ++r) {
    for (const auto& [replica, stage] : placement.StagesOf(r)) {
      streams[r].push_back(
          Stream::Sequence(ActionType::kForward, replica, stage, num_microbatches));
      streams[r].push_back(Stream::Sequence(
          split_backward ? ActionType::kBackwardInput : ActionType::kBackward, replica, stage,
          num_microbatches));
      if (split_backward) {
        streams[r].push_back(
            Stream::Sequence(ActionType::kBackwardWeight, replica, stage, num_microbatches));
      }
    }
  }
  return streams;
}

ListScheduler::Config ConfigFor(const ScheduleSpec& spec, const Placement& placement) {
  ListScheduler::Config config;
  config.num_ranks = placement.num_ranks;
  config.num_stages = placement.num_stages;
  config.num_replicas = placement.NumReplicas();
  config.num_microbatches = spec.num_microbatches;
  config.split_backward = spec.SplitsBackward();
  return config;
}

// ---- CompleteSchedule helpers ----------------------------------------------------------------

// A message crossing ranks: the receive action and the compute index (on the receiver) of the
// compute that consumes it.
struct PendingReceive {
  int before;  // insert before this compute index on the receiver
  Action action;
};

// Start times of every compute in `orders` run with data-flow semantics at nominal
// costs (a compute starts when its rank is free and its inputs exist; transfers are free).
// FailedPrecondition if the orders cannot run to the end (a cycle between ranks).
absl::Status NominalTimeline(const Placement& placement, int num_microbatches,
                             const ComputeOrders& orders, double full_backward,
                             std::vector<std::vector<double>>* start) {
  const int num_ranks = placement.num_ranks;
  const int num_stages = placement.num_stages;
  const size_t triples =
      static_cast<size_t>(placement.NumReplicas()) * num_stages * num_microbatches;
  auto index = [&](int replica, int stage, int mb) {
    return (static_cast<size_t>(replica) * num_stages + stage) * num_microbatches + mb;
  };
  constexpr double kPending = -1;
  std::vector<double> forward_end(triples, kPending), backward_end(triples, kPending),
      input_end(triples, kPending);
  std::vector<size_t> pc(num_ranks, 0);
  std::vector<double> free_at(num_ranks, 0.0);
  start->assign(num_ranks, {});
  for (int r = 0; r < num_ranks; ++r) {
    (*start)[r].resize(orders[r].size());
  }
  // Ranks waiting for a given (kind, triple) to finish: woken through a per-rank re-scan.
  std::vector<int> worklist;
  for (int r = num_ranks - 1; r >= 0; --r) worklist.push_back(r);
  std::vector<uint8_t> queued(num_ranks, 1);
  auto wake = [&](int r) {
    if (!queued[r]) {
      queued[r] = 1;
      worklist.push_back(r);
    }
  };
  int64_t done = 0, total = 0;
  for (const auto& order : orders) total += static_cast<int64_t>(order.size());
  while (!worklist.empty()) {
    const int r = worklist.back();
    worklist.pop_back();
    queued[r] = 0;
    const auto& order = orders[r];
    while (pc[r] < order.size()) {
      const Action& a = order[pc[r]];
      const size_t i = index(a.replica, a.stage, a.microbatch);
      double ready = 0;
      switch (a.type) {
        case ActionType::kForward:
          if (a.stage > 0) ready = forward_end[index(a.replica, a.stage - 1, a.microbatch)];
          break;
        case ActionType::kBackward:
        case ActionType::kBackwardInput:
          ready = forward_end[i];
          if (ready != kPending && a.stage + 1 < num_stages) {
            double next = backward_end[index(a.replica, a.stage + 1, a.microbatch)];
            ready = next == kPending ? kPending : std::max(ready, next);
          }
          break;
        default:
          ready = input_end[i];
          break;
      }
      if (ready == kPending) break;
      const double t0 = std::max(ready, free_at[r]);
      const double t1 = t0 + NominalCost(a.type, full_backward);
      (*start)[r][pc[r]] = t0;
      free_at[r] = t1;
      ++pc[r];
      ++done;
      switch (a.type) {
        case ActionType::kForward:
          forward_end[i] = t1;
          if (a.stage + 1 < num_stages) wake(placement.RankOf(a.replica, a.stage + 1));
          break;
        case ActionType::kBackward:
        case ActionType::kBackwardInput:
          backward_end[i] = t1;
          input_end[i] = t1;
          if (a.stage > 0) wake(placement.RankOf(a.replica, a.stage - 1));
          break;
        default:
          break;
      }
    }
  }
  if (done != total) {
    for (int r = 0; r < num_ranks; ++r) {
      if (pc[r] < orders[r].size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("compute orders cannot run: rank ", r, " step ", pc[r], " (",
                         ToString(orders[r][pc[r]]), ") waits for an input that never comes"));
      }
    }
  }
  return absl::OkStatus();
}

// CompleteSchedule, with receives placed against nominal timelines in which a full backward
// costs each of `full_backward_costs` (forward 1): a receive goes before the receiver's first
// compute that starts after the send in every timeline (never after its consumer), so that
// none of those cost ratios makes the receiver wait on it early.
absl::StatusOr<Schedule> CompleteScheduleFor(const ScheduleSpec& spec, Placement placement,
                                             std::vector<std::vector<Action>> compute_orders,
                                             const std::vector<double>& full_backward_costs);

}  // namespace

absl::StatusOr<Schedule> CompleteSchedule(const ScheduleSpec& spec, Placement placement,
                                          std::vector<std::vector<Action>> compute_orders) {
  return CompleteScheduleFor(spec, std::move(placement), std::move(compute_orders),
                             {kNominalBackward});
}

namespace {

absl::StatusOr<Schedule> CompleteScheduleFor(const ScheduleSpec& spec, Placement placement,
                                             std::vector<std::vector<Action>> compute_orders,
                                             const std::vector<double>& full_backward_costs) {
  const int num_ranks = placement.num_ranks;
  const int num_stages = placement.num_stages;
  const int num_replicas = placement.NumReplicas();
  const int m = spec.num_microbatches;
  if (static_cast<int>(compute_orders.size()) != num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", num_ranks,
                                                   " compute orders, got ",
                                                   compute_orders.size()));
  }
  const size_t triples = static_cast<size_t>(num_replicas) * num_stages * m;
  auto index = [&](int replica, int stage, int mb) {
    return (static_cast<size_t>(replica) * num_stages + stage) * m + mb;
  };
  // Where each activation / gradient is consumed: compute index on its consumer rank.
  constexpr int kNone = -1;
  std::vector<int> activation_consumer(triples, kNone);  // output of (rep, s, mb) -> F(s+1)
  std::vector<int> gradient_consumer(triples, kNone);    // input grad of (rep, s, mb) -> B(s-1)
  // Last backward (or W) per (replica, stage) on its rank, for GradientSync.
  std::vector<int> last_backward(static_cast<size_t>(num_replicas) * num_stages, kNone);
  const ActionType final_backward =
      spec.SplitsBackward() ? ActionType::kBackwardWeight : ActionType::kBackward;
  for (int r = 0; r < num_ranks; ++r) {
    const auto& order = compute_orders[r];
    for (int i = 0; i < static_cast<int>(order.size()); ++i) {
      const Action& a = order[i];
      if (!IsCompute(a.type) || a.replica < 0 || a.replica >= num_replicas || a.stage < 0 ||
          a.stage >= num_stages || a.microbatch < 0 || a.microbatch >= m ||
          placement.RankOf(a.replica, a.stage) != r) {
        return absl::InvalidArgumentError(absl::StrCat("compute order of rank ", r, " step ", i,
                                                       ": bad action ", ToString(a)));
      }
      if (a.type == ActionType::kForward && a.stage > 0) {
        activation_consumer[index(a.replica, a.stage - 1, a.microbatch)] = i;
      }
      if ((a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) &&
          a.stage + 1 < num_stages) {
        gradient_consumer[index(a.replica, a.stage + 1, a.microbatch)] = i;
      }
      if (a.type == final_backward) last_backward[a.replica * num_stages + a.stage] = i;
    }
  }

  // Receives are posted where the data exists in the nominal timeline: in the transfer run
  // before the receiver's first compute that starts at or after the send (so that the peer's
  // send and this receive meet in groups issued at about the same time, as NCCL wants), and
  // never after the consumer.
  std::vector<std::vector<std::vector<double>>> starts(full_backward_costs.size());
  for (size_t c = 0; c < full_backward_costs.size(); ++c) {
    TANDEM_RETURN_IF_ERROR(
        NominalTimeline(placement, m, compute_orders, full_backward_costs[c], &starts[c]));
  }
  // Receives per receiving rank, collected channel by channel in the sender's order.
  std::vector<std::vector<PendingReceive>> receives(num_ranks);
  // Per sender: the computes whose output it sends, in program order, grouped by destination.
  std::vector<std::pair<int, std::vector<int>>> by_peer;
  std::vector<int> slot;
  std::vector<size_t> available;
  for (int r = 0; r < num_ranks; ++r) {
    by_peer.clear();
    auto channel = [&](int peer) -> std::vector<int>& {
      for (auto& [p, list] : by_peer) {
        if (p == peer) return list;
      }
      by_peer.emplace_back(peer, std::vector<int>{});
      return by_peer.back().second;
    };
    const auto& order = compute_orders[r];
    for (size_t ci = 0; ci < order.size(); ++ci) {
      const Action& a = order[ci];
      if (a.type == ActionType::kForward && a.stage + 1 < num_stages) {
        int peer = placement.RankOf(a.replica, a.stage + 1);
        if (peer != r) channel(peer).push_back(static_cast<int>(ci));
      }
      if ((a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) &&
          a.stage > 0) {
        int peer = placement.RankOf(a.replica, a.stage - 1);
        if (peer != r) channel(peer).push_back(static_cast<int>(ci));
      }
    }
    // A compute sends at most one message to a given peer (forwards go down the stages,
    // backwards up, and neighbouring stages on one rank need no transfer).
    auto sent_action = [&](int ci) {
      Action send = order[ci];
      send.type = send.type == ActionType::kForward ? ActionType::kSendActivation
                                                    : ActionType::kSendGradient;
      return send;
    };
    for (auto& [peer, sends] : by_peer) {
      const int n = static_cast<int>(sends.size());
      slot.assign(n, 0);
      // Sends of a channel leave in program order, so at nondecreasing times: the first
      // receiver compute starting at or after each only moves forward.
      available.assign(full_backward_costs.size(), 0);
      for (int k = 0; k < n; ++k) {
        const Action s = sent_action(sends[k]);
        const size_t i = index(s.replica, s.stage, s.microbatch);
        int consumer = s.type == ActionType::kSendActivation ? activation_consumer[i]
                                                             : gradient_consumer[i];
        if (consumer == kNone) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", peer, " never consumes ", ToString(s), " sent by rank ", r));
        }
        size_t latest = 0;
        for (size_t c = 0; c < full_backward_costs.size(); ++c) {
          const std::vector<double>& peer_start = starts[c][peer];
          const double time =
              starts[c][r][sends[k]] + NominalCost(order[sends[k]].type, full_backward_costs[c]);
          size_t& at = available[c];
          while (at < peer_start.size() && peer_start[at] < time) ++at;
          latest = std::max(latest, at);
        }
        slot[k] = std::min(consumer, static_cast<int>(latest));
      }
      // FIFO: receive k must precede receive k+1.
      for (int k = n - 2; k >= 0; --k) slot[k] = std::min(slot[k], slot[k + 1]);
      for (int k = 0; k < n; ++k) {
        Action recv = sent_action(sends[k]);
        recv.type = recv.type == ActionType::kSendActivation ? ActionType::kRecvActivation
                                                             : ActionType::kRecvGradient;
        recv.peer = r;
        receives[peer].push_back({slot[k], recv});
      }
    }
  }

  Schedule schedule;
  schedule.spec = spec;
  schedule.placement = std::move(placement);
  schedule.programs.resize(num_ranks);
  const Placement& pl = schedule.placement;
  std::vector<size_t> bucket;
  std::vector<PendingReceive> sorted;
  for (int r = 0; r < num_ranks; ++r) {
    // Order by (before, peer, order): the list is already in (peer, order) order (senders
    // ascending, each channel in its sender's order), so a stable counting sort on `before`.
    const auto& order = compute_orders[r];
    {
      const auto& unsorted = receives[r];
      bucket.assign(order.size() + 2, 0);
      for (const PendingReceive& p : unsorted) ++bucket[p.before + 1];
      for (size_t b = 1; b < bucket.size(); ++b) bucket[b] += bucket[b - 1];
      sorted.resize(unsorted.size());
      for (const PendingReceive& p : unsorted) sorted[bucket[p.before]++] = p;
      std::vector<PendingReceive>().swap(receives[r]);
    }
    const std::vector<PendingReceive>& pending = sorted;
    std::vector<Action>& program = schedule.programs[r];
    // Compute + its sends + receives (+ up to a few syncs), plus the step.
    program.reserve(order.size() * 2 + pending.size() + 8);
    size_t next_receive = 0;
    for (int i = 0; i < static_cast<int>(order.size()); ++i) {
      while (next_receive < pending.size() && pending[next_receive].before == i) {
        program.push_back(pending[next_receive].action);
        ++next_receive;
      }
      const Action& a = order[i];
      program.push_back(a);
      // The stage's gradients are final: start their synchronisation before the sends, so
      // that the transfer run after this compute stays one group.
      if (a.type == final_backward && last_backward[a.replica * num_stages + a.stage] == i) {
        Action sync;
        sync.type = ActionType::kGradientSync;
        sync.stage = a.stage;
        sync.microbatch = -1;
        sync.replica = a.replica;
        program.push_back(sync);
      }
      if (a.type == ActionType::kForward && a.stage + 1 < num_stages) {
        int peer = pl.RankOf(a.replica, a.stage + 1);
        if (peer != r) {
          Action send = a;
          send.type = ActionType::kSendActivation;
          send.peer = peer;
          program.push_back(send);
        }
      }
      if ((a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) &&
          a.stage > 0) {
        int peer = pl.RankOf(a.replica, a.stage - 1);
        if (peer != r) {
          Action send = a;
          send.type = ActionType::kSendGradient;
          send.peer = peer;
          program.push_back(send);
        }
      }
    }
    if (next_receive != pending.size()) {
      return absl::InternalError(absl::StrCat("rank ", r, ": receives left unplaced"));
    }
    // A held stage that never ran a backward still gets its sync (the validator then reports
    // the missing backward).
    for (const auto& [replica, stage] : pl.StagesOf(r)) {
      if (last_backward[replica * num_stages + stage] == kNone) {
        Action sync;
        sync.type = ActionType::kGradientSync;
        sync.stage = stage;
        sync.microbatch = -1;
        sync.replica = replica;
        program.push_back(sync);
      }
    }
    Action step;
    step.type = ActionType::kOptimizerStep;
    step.stage = -1;
    step.microbatch = -1;
    program.push_back(step);
  }
  return schedule;
}

}  // namespace

absl::StatusOr<Schedule> GenerateGPipe(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kGPipe, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  ComputeOrders orders(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    orders[r].reserve(2 * num_microbatches);
    for (int mb = 0; mb < num_microbatches; ++mb) {
      orders[r].push_back(Compute(ActionType::kForward, 0, r, mb));
    }
    for (int mb = 0; mb < num_microbatches; ++mb) {
      orders[r].push_back(Compute(ActionType::kBackward, 0, r, mb));
    }
  }
  return CompleteSchedule(spec, Placement::Linear(num_ranks), std::move(orders));
}

absl::StatusOr<Schedule> Generate1F1B(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::k1F1B, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  ComputeOrders orders(num_ranks);
  const std::vector<int> microbatches = Iota(num_microbatches);
  for (int r = 0; r < num_ranks; ++r) {
    orders[r].reserve(2 * num_microbatches);
    Append1F1B(/*replica=*/0, /*stage=*/r, microbatches, /*warmup=*/num_ranks - r - 1,
               &orders[r]);
  }
  return CompleteSchedule(spec, Placement::Linear(num_ranks), std::move(orders));
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
  ComputeOrders orders(p);
  if (m % p == 0 || v == 1) {
    // Megatron's order: warm-up forwards, then strictly one forward, one backward.
    for (int r = 0; r < p; ++r) {
      const int warmup = warmup_of(r);
      auto& order = orders[r];
      order.reserve(2 * total);
      int next_forward = 0;
      for (; next_forward < warmup; ++next_forward) order.push_back(forward(r, next_forward));
      for (int next_backward = 0; next_backward < total; ++next_backward) {
        if (next_forward < total) order.push_back(forward(r, next_forward++));
        order.push_back(backward(r, next_backward));
      }
    }
  } else {
    // With a short last group the strict alternation can wait on itself across ranks (a
    // rank's last warm-up forward needs a backward that waits for that rank). Run the same
    // forward and backward sequences through the list scheduler instead, forward first and
    // at most Megatron's warm-up + 1 forwards in flight: identical to Megatron where it runs,
    // and never slower on the grid we checked.
    Streams streams(p);
    ListScheduler::Config config = ConfigFor(spec, placement);
    config.forward_class = 0;
    config.backward_class = 1;
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
      config.stash_caps.push_back(warmup_of(r) + 1);
    }
    ListScheduler scheduler(config, std::move(streams));
    scheduler.SetOwners(placement.stage_to_rank);
    TANDEM_ASSIGN_OR_RETURN(orders, scheduler.Run());
  }
  return CompleteSchedule(spec, std::move(placement), std::move(orders));
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
  std::vector<int> down, up;
  for (int mb = 0; mb < m; ++mb) (mb % d < d / 2 ? down : up).push_back(mb);
  Placement placement = Placement::Bidirectional(d);
  Streams streams(d);
  for (int replica = 0; replica < 2; ++replica) {
    for (int stage = 0; stage < d; ++stage) {
      streams[placement.RankOf(replica, stage)].push_back(Stream::OneFOneB(
          replica, stage, replica == 0 ? &down : &up, /*warmup=*/d - stage - 1));
    }
  }
  ListScheduler::Config config = ConfigFor(spec, placement);
  config.backward_class = 0;
  config.forward_class = 1;
  ListScheduler scheduler(config, std::move(streams));
  scheduler.SetOwners(placement.stage_to_rank);
  TANDEM_ASSIGN_OR_RETURN(ComputeOrders orders, scheduler.Run());
  // Receives placed for equal forward and backward costs too (the paper's figures), so
  // that the order runs in 2N + D - 2 there as well as in 3N + 2D - 4 at F=1, B=2.
  return CompleteScheduleFor(spec, std::move(placement), std::move(orders),
                             {kNominalBackward, kNominalForward});
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
  ListScheduler scheduler(config, PerStageStreams(placement, num_microbatches, false));
  scheduler.SetOwners(placement.stage_to_rank);
  TANDEM_ASSIGN_OR_RETURN(ComputeOrders orders, scheduler.Run());
  return CompleteSchedule(spec, std::move(placement), std::move(orders));
}

absl::StatusOr<Schedule> GenerateZBH1(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kZBH1, num_ranks, num_microbatches,
                                      /*chunks=*/1, /*waves=*/1));
  const int p = num_ranks, m = num_microbatches;
  ComputeOrders orders(p);
  for (int r = 0; r < p; ++r) {
    auto& order = orders[r];
    order.reserve(3 * m);
    const int warmup = std::min(p - r - 1, m);
    // Rank r delays each W by r micro-batches: the W passes fill the drain bubble, and the
    // stash peaks at (p - r) + r = p, 1F1B's first stage.
    const int weight_lag = r;
    int next_forward = 0, next_weight = 0;
    for (; next_forward < warmup; ++next_forward) {
      order.push_back(Compute(ActionType::kForward, 0, r, next_forward));
    }
    for (int next_backward = 0; next_backward < m; ++next_backward) {
      if (next_forward < m) {
        order.push_back(Compute(ActionType::kForward, 0, r, next_forward++));
      }
      order.push_back(Compute(ActionType::kBackwardInput, 0, r, next_backward));
      if (next_backward - next_weight >= weight_lag) {
        order.push_back(Compute(ActionType::kBackwardWeight, 0, r, next_weight++));
      }
    }
    while (next_weight < m) {
      order.push_back(Compute(ActionType::kBackwardWeight, 0, r, next_weight++));
    }
  }
  return CompleteSchedule(spec, Placement::Linear(p), std::move(orders));
}

absl::StatusOr<Schedule> GenerateZBV(int num_ranks, int num_microbatches) {
  TANDEM_ASSIGN_OR_RETURN(const ScheduleSpec spec,
                          CheckedSpec(ScheduleKind::kZBV, num_ranks, num_microbatches,
                                      /*chunks=*/2, /*waves=*/1));
  Placement placement = Placement::Wave(num_ranks, /*waves=*/1);
  ListScheduler::Config config = ConfigFor(spec, placement);
  config.backward_class = 0;
  config.forward_class = 1;
  config.weight_class = 2;
  // 2p chunks of half a stage: the activation memory of 1F1B's first stage.
  config.stash_cap = 2 * static_cast<int64_t>(num_ranks);
  ListScheduler scheduler(config, PerStageStreams(placement, num_microbatches, true));
  scheduler.SetOwners(placement.stage_to_rank);
  TANDEM_ASSIGN_OR_RETURN(ComputeOrders orders, scheduler.Run());
  return CompleteSchedule(spec, std::move(placement), std::move(orders));
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
      return GenerateZBV(spec.num_ranks, spec.num_microbatches);
  }
  return absl::InvalidArgumentError("unknown schedule kind");
}

}  // namespace tandem::pipeline
