#include "pipeline/simulator.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_util.h"
#include "common/status.h"
#include "pipeline/internal/emitted_actions.h"

namespace tandem::pipeline {
namespace {

constexpr int64_t kNotBlocked = -1;

// The timeline's names (record_trace and SimulatedTraceFile write the same events).
constexpr int kTraceLanes = 4;
constexpr const char* kLaneNames[kTraceLanes] = {"compute", "receive wait", "send in flight",
                                                 "gradient sync"};
std::string RankName(int rank) { return absl::StrCat("rank ", rank); }
absl::string_view EventPrefix(int lane) { return lane == kTraceLaneWait ? "wait " : ""; }
// An event's arguments: its stage, micro-batch and (when not 0) replica, where it has them.
// Fills `args` (room for 3); returns how many.
size_t EventArgs(const Action& a, TraceFileWriter::IntArg* args) {
  size_t n = 0;
  if (a.stage >= 0) args[n++] = {"stage", a.stage};
  if (a.microbatch >= 0) args[n++] = {"microbatch", a.microbatch};
  if (a.replica != 0) args[n++] = {"replica", a.replica};
  return n;
}
// Actions fetched ahead for a rank that will resume later (see Run): four cache lines.
constexpr int64_t kActionsPerLine = 64 / sizeof(Action);
constexpr int64_t kPrefetchActions = 4 * kActionsPerLine;

void Prefetch(const void* address) {
#if defined(__GNUC__)
  __builtin_prefetch(address);
#else
  (void)address;
#endif
}

absl::Status CheckArray(const std::vector<double>& values, absl::string_view name,
                        int num_stages, bool may_be_empty) {
  if (values.empty() && may_be_empty) return absl::OkStatus();
  if (static_cast<int>(values.size()) != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected ", num_stages,
                                                   " values (one per stage), got ",
                                                   values.size()));
  }
  for (int s = 0; s < num_stages; ++s) {
    if (!std::isfinite(values[s]) || values[s] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", s, "]: must be a finite non-negative number, got ", values[s]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckScalar(double value, absl::string_view name) {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": must be a finite non-negative number, got ", value));
  }
  return absl::OkStatus();
}

// Reads an optional array of numbers; empty when absent.
absl::StatusOr<std::vector<double>> NumberArray(const nlohmann::json& j, absl::string_view field,
                                                absl::string_view where, bool required) {
  std::vector<double> out;
  if (!j.contains(std::string(field))) {
    if (required) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".", field, ": missing field"));
    }
    return out;
  }
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* array, GetArray(j, field, where));
  out.reserve(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    const nlohmann::json& v = (*array)[i];
    if (!v.is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", field, "[", i, "]: expected a number, got ", v.dump()));
    }
    out.push_back(v.get<double>());
  }
  return out;
}

// A transfer whose peer is not a rank (checked in the transfer's own case of the loop, so
// that other actions pay nothing for it).
[[gnu::noinline]] absl::Status BadPeer(int rank, int64_t step, const Action& action) {
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, " step ", step, " (", ToString(action), "): bad peer"));
}

}  // namespace

absl::string_view TraceCategory(ActionType type) {
  switch (type) {
    case ActionType::kForward:
      return "forward";
    case ActionType::kBackward:
      return "backward";
    case ActionType::kBackwardInput:
      return "backward-input";
    case ActionType::kBackwardWeight:
      return "backward-weight";
    case ActionType::kSendActivation:
    case ActionType::kSendGradient:
      return "send";
    case ActionType::kRecvActivation:
    case ActionType::kRecvGradient:
      return "receive";
    case ActionType::kGradientSync:
      return "sync";
    case ActionType::kOptimizerStep:
      return "optimizer";
  }
  return "?";
}

CostModel CostModel::Uniform(const ScheduleSpec& spec, double forward, double backward,
                             double weight) {
  CostModel costs;
  const int num_stages = spec.NumStages();
  const double share = static_cast<double>(spec.num_ranks) / num_stages;
  StageCost stage;
  stage.forward_seconds = forward * share;
  stage.backward_seconds = backward * share;
  stage.weight_seconds = weight * share;
  stage.stash_units = share;
  costs.stages.assign(num_stages, stage);
  return costs;
}

absl::StatusOr<CostModel> CostModel::FromStageCosts(const ScheduleSpec& spec,
                                                    const std::vector<double>& forward,
                                                    const std::vector<double>& backward,
                                                    const std::vector<double>& weight,
                                                    const std::vector<double>& activation_bytes) {
  const int num_stages = spec.NumStages();
  TANDEM_RETURN_IF_ERROR(CheckArray(forward, "forward", num_stages, false));
  TANDEM_RETURN_IF_ERROR(CheckArray(backward, "backward", num_stages, false));
  TANDEM_RETURN_IF_ERROR(CheckArray(weight, "weight", num_stages, true));
  TANDEM_RETURN_IF_ERROR(CheckArray(activation_bytes, "activation_bytes", num_stages, true));
  CostModel costs;
  costs.stages.resize(num_stages);
  const double share = static_cast<double>(spec.num_ranks) / num_stages;
  for (int s = 0; s < num_stages; ++s) {
    StageCost& c = costs.stages[s];
    c.forward_seconds = forward[s];
    c.backward_seconds = backward[s];
    c.weight_seconds = weight.empty() ? 0 : weight[s];
    c.activation_bytes = activation_bytes.empty() ? 0 : activation_bytes[s];
    c.stash_units = share;
  }
  return costs;
}

absl::StatusOr<CostModel> CostModel::FromJson(const nlohmann::json& j, const ScheduleSpec& spec,
                                              absl::string_view where) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<double> forward, NumberArray(j, "forward", where, true));
  TANDEM_ASSIGN_OR_RETURN(std::vector<double> backward, NumberArray(j, "backward", where, true));
  TANDEM_ASSIGN_OR_RETURN(std::vector<double> weight, NumberArray(j, "weight", where, false));
  TANDEM_ASSIGN_OR_RETURN(std::vector<double> bytes,
                          NumberArray(j, "activation_bytes", where, false));
  TANDEM_ASSIGN_OR_RETURN(std::vector<double> stash, NumberArray(j, "stash_units", where, false));
  TANDEM_ASSIGN_OR_RETURN(std::vector<double> sync,
                          NumberArray(j, "grad_sync_seconds", where, false));
  auto annotated = FromStageCosts(spec, forward, backward, weight, bytes);
  if (!annotated.ok()) return Annotate(annotated.status(), where);
  CostModel costs = *std::move(annotated);
  const int num_stages = spec.NumStages();
  auto check = [&](const std::vector<double>& values, absl::string_view name) {
    return Annotate(CheckArray(values, name, num_stages, true), where);
  };
  TANDEM_RETURN_IF_ERROR(check(stash, "stash_units"));
  TANDEM_RETURN_IF_ERROR(check(sync, "grad_sync_seconds"));
  for (int s = 0; s < static_cast<int>(stash.size()); ++s) costs.stages[s].stash_units = stash[s];
  costs.grad_sync_seconds = std::move(sync);
  TANDEM_ASSIGN_OR_RETURN(costs.p2p_latency_seconds,
                          GetNumberOr(j, "latency_seconds", 0, where));
  TANDEM_ASSIGN_OR_RETURN(costs.p2p_bandwidth_bytes_per_second,
                          GetNumberOr(j, "bandwidth_bytes_per_second", 0, where));
  TANDEM_ASSIGN_OR_RETURN(costs.optimizer_seconds, GetNumberOr(j, "optimizer_seconds", 0, where));
  TANDEM_RETURN_IF_ERROR(Annotate(costs.Check(num_stages), where));
  return costs;
}

absl::Status CostModel::Check(int num_stages) const {
  if (static_cast<int>(stages.size()) != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("costs for ", stages.size(),
                                                   " stages, but the schedule has ", num_stages));
  }
  for (int s = 0; s < num_stages; ++s) {
    const StageCost& c = stages[s];
    for (auto [value, name] : {std::pair<double, const char*>{c.forward_seconds, "forward"},
                               {c.backward_seconds, "backward"},
                               {c.weight_seconds, "weight"},
                               {c.activation_bytes, "activation_bytes"},
                               {c.stash_units, "stash_units"}}) {
      TANDEM_RETURN_IF_ERROR(CheckScalar(value, absl::StrCat(name, "[", s, "]")));
    }
  }
  if (!grad_sync_seconds.empty()) {
    TANDEM_RETURN_IF_ERROR(CheckArray(grad_sync_seconds, "grad_sync_seconds", num_stages, true));
  }
  TANDEM_RETURN_IF_ERROR(CheckScalar(p2p_latency_seconds, "latency_seconds"));
  TANDEM_RETURN_IF_ERROR(CheckScalar(p2p_bandwidth_bytes_per_second, "bandwidth_bytes_per_second"));
  TANDEM_RETURN_IF_ERROR(CheckScalar(optimizer_seconds, "optimizer_seconds"));
  return absl::OkStatus();
}

// Per rank, together: actions taken as they are emitted go from rank to rank, and one line
// per rank is all that each action touches of them.
struct ScheduleSimulator::Clock {
  double now = 0;
  double busy = 0;
  double stashed = 0;
  double peak = 0;
  double sync_end = 0;
  int64_t pc = 0;  // the next step
};

// What each action of a stage costs, in one cache line per stage.
struct alignas(64) ScheduleSimulator::StageCosts {
  double forward = 0, backward_full = 0, backward_input = 0, weight = 0, stash = 0,
         activation_transfer = 0, gradient_transfer = 0, sync = 0;
};

struct ScheduleSimulator::RunState {
  SimulationOptions options;
  double optimizer = 0;
  std::vector<StageCosts> stages;
  SimulationResult result;
  std::vector<Clock> ranks;
  int64_t executed = 0;
};

ScheduleSimulator::ScheduleSimulator() = default;
ScheduleSimulator::~ScheduleSimulator() = default;
ScheduleSimulator::ScheduleSimulator(ScheduleSimulator&&) noexcept = default;
ScheduleSimulator& ScheduleSimulator::operator=(ScheduleSimulator&&) noexcept = default;

absl::StatusOr<ScheduleSimulator> ScheduleSimulator::Create(const Schedule& schedule) {
  ScheduleSimulator sim;
  sim.schedule_ = &schedule;
  // Channels are found by the first run, as their first messages go by: a pass over the
  // programs just to list them would read 10^8 actions at p=1024, m=4096.
  sim.rank_peers_.assign(schedule.NumRanks(), {});
  return sim;
}

int ScheduleSimulator::AddChannel(int from, int to) {
  const int id = num_channels_++;
  auto add = [](PeerList& list, const Peer& peer) {
    if (list.count < kInlinePeers) {
      list.inline_peers[list.count] = peer;
    } else {
      list.more.push_back(peer);
    }
    ++list.count;
  };
  add(rank_peers_[from], {id, static_cast<int16_t>(to), true});
  add(rank_peers_[to], {id, static_cast<int16_t>(from), false});
  in_flight_.emplace_back();
  return id;
}

void ScheduleSimulator::InFlight::Grow() {
  const uint32_t capacity = 2 * (mask + 1);
  auto bigger = std::make_unique<double[]>(capacity);
  const double* old = ring();
  for (uint32_t j = 0; j < size; ++j) bigger[j] = old[(head + j) & mask];
  grown = std::move(bigger);
  mask = capacity - 1;
  head = 0;
}

absl::Status ScheduleSimulator::Start(const CostModel& costs, const SimulationOptions& options) {
  const Schedule& schedule = *schedule_;
  const int num_ranks = schedule.NumRanks();
  const int num_stages = schedule.placement.num_stages;
  TANDEM_RETURN_IF_ERROR(costs.Check(num_stages));
  run_ = std::make_unique<RunState>();
  RunState& run = *run_;
  run.options = options;
  run.optimizer = costs.optimizer_seconds;
  // Per-stage tables, so the loop below only indexes arrays.
  run.stages.assign(num_stages, StageCosts{});
  auto transfer_seconds = [&](double bytes) {
    double t = costs.p2p_latency_seconds;
    if (costs.p2p_bandwidth_bytes_per_second > 0) t += bytes / costs.p2p_bandwidth_bytes_per_second;
    return t;
  };
  for (int s = 0; s < num_stages; ++s) {
    const StageCost& c = costs.stages[s];
    StageCosts& stage = run.stages[s];
    stage.forward = c.forward_seconds;
    stage.backward_full = c.backward_seconds + c.weight_seconds;
    // Costs that do not split backward give a split schedule half of it for each part.
    const bool split_costs = c.weight_seconds > 0;
    stage.backward_input = split_costs ? c.backward_seconds : c.backward_seconds / 2;
    stage.weight = split_costs ? c.weight_seconds : c.backward_seconds / 2;
    stage.stash = c.stash_units;
    stage.activation_transfer = transfer_seconds(c.activation_bytes);
    // The gradient of stage s's input has the size of stage s-1's output.
    stage.gradient_transfer = transfer_seconds(s > 0 ? costs.stages[s - 1].activation_bytes : 0);
    if (!costs.grad_sync_seconds.empty()) stage.sync = costs.grad_sync_seconds[s];
  }
  SimulationResult& result = run.result;
  run.ranks.assign(num_ranks, Clock{});
  // Per channel, the arrival times of the messages sent and not yet received, in order.
  for (InFlight& queue : in_flight_) {
    queue.head = 0;
    queue.size = 0;
  }
  blocked_on_.assign(num_ranks, kNotBlocked);
  worklist_.clear();
  if (options.record_trace) {
    for (int r = 0; r < num_ranks; ++r) {
      result.trace.NameProcess(r, RankName(r));
      for (int lane = 0; lane < kTraceLanes; ++lane) {
        result.trace.NameThread(r, lane, kLaneNames[lane]);
      }
    }
  }
  return absl::OkStatus();
}

template <bool kTrace, bool kMayWait, typename Record, typename Woken>
[[gnu::always_inline]] inline ScheduleSimulator::Outcome ScheduleSimulator::Execute(
    Clock& clock, const StageCosts* stages, int r, int64_t k, const Action& op, double& t,
    double& busy, Record& record, Woken& woken) {
  const RunState& run = *run_;
  const int s = op.stage;
  if (static_cast<unsigned>(s) >= static_cast<unsigned>(run.stages.size()) &&
      op.type != ActionType::kOptimizerStep) {
    return Outcome::kBadStage;
  }
  // Not read for the optimizer step (stage -1).
  const StageCosts* const stage = op.type == ActionType::kOptimizerStep ? nullptr : &stages[s];
  double cost = 0;
  switch (op.type) {
    case ActionType::kForward:
      cost = stage->forward;
      clock.stashed += stage->stash;
      clock.peak = std::max(clock.peak, clock.stashed);
      break;
    case ActionType::kBackward:
      cost = stage->backward_full;
      clock.stashed -= stage->stash;
      break;
    case ActionType::kBackwardInput:
      cost = stage->backward_input;
      break;
    case ActionType::kBackwardWeight:
      cost = stage->weight;
      clock.stashed -= stage->stash;
      break;
    case ActionType::kSendActivation:
    case ActionType::kSendGradient: {
      if (op.peer < 0 || op.peer >= static_cast<int>(run.ranks.size())) return Outcome::kBadPeer;
      const double flight = op.type == ActionType::kSendActivation ? stage->activation_transfer
                                                                   : stage->gradient_transfer;
      int c = ChannelOf(r, op.peer, /*send=*/true);
      if (c < 0) c = AddChannel(r, op.peer);
      in_flight_[c].push(t + flight);
      if (kTrace && flight > 0) record(r, k, op, kTraceLaneTransfer, t, flight);
      if (kMayWait && blocked_on_[op.peer] == c) {
        blocked_on_[op.peer] = kNotBlocked;
        woken(op.peer);
      }
      break;
    }
    case ActionType::kRecvActivation:
    case ActionType::kRecvGradient: {
      if (op.peer < 0 || op.peer >= static_cast<int>(run.ranks.size())) return Outcome::kBadPeer;
      int c = ChannelOf(r, op.peer, /*send=*/false);
      if (c < 0) c = AddChannel(op.peer, r);
      if (in_flight_[c].empty()) {
        blocked_on_[r] = c;
        return Outcome::kWaits;
      }
      const double arrives = in_flight_[c].pop();
      if (arrives > t) {
        if (kTrace) record(r, k, op, kTraceLaneWait, t, arrives - t);
        t = arrives;
      }
      break;
    }
    case ActionType::kGradientSync:
      if (kTrace && stage->sync > 0) record(r, k, op, kTraceLaneSync, t, stage->sync);
      clock.sync_end = std::max(clock.sync_end, t + stage->sync);
      break;
    case ActionType::kOptimizerStep:
      t = std::max(t, clock.sync_end);
      if (kTrace && run.optimizer > 0) record(r, k, op, kTraceLaneCompute, t, run.optimizer);
      t += run.optimizer;
      break;
  }
  if (cost > 0) {
    if (kTrace) record(r, k, op, kTraceLaneCompute, t, cost);
    t += cost;
    busy += cost;
  }
  return Outcome::kDone;
}

absl::Status ScheduleSimulator::Drain() {
  RunState& run = *run_;
  SimulationResult& result = run.result;
  const std::vector<std::vector<Action>>& programs = schedule_->programs;
  const int num_ranks = static_cast<int>(programs.size());
  for (int r = num_ranks - 1; r >= 0; --r) worklist_.push_back(r);
  const SimulationOptions& options = run.options;
  auto record = [&](int r, int64_t k, const Action& a, int lane, double start,
                    double duration) {
    if (options.on_interval) options.on_interval({r, lane, k, start, duration});
    if (!options.record_trace) return;
    TraceEvent e;
    e.name = absl::StrCat(EventPrefix(lane), ToString(a));
    e.category = std::string(TraceCategory(a.type));
    e.pid = r;
    e.tid = lane;
    e.start_seconds = start;
    e.duration_seconds = duration;
    TraceFileWriter::IntArg args[3];
    for (const auto& arg : absl::MakeSpan(args, EventArgs(a, args))) e.args[arg.key] = arg.value;
    result.trace.Add(std::move(e));
  };
  auto woken = [&](int peer) {
    worklist_.push_back(peer);
    // It resumes soon, where it stopped long ago: a line no cache holds any more.
    Prefetch(&programs[peer][run.ranks[peer].pc]);
  };
  const StageCosts* const stages = run.stages.data();
  auto drain = [&](auto trace) -> absl::Status {
    constexpr bool kTrace = decltype(trace)::value;
    while (!worklist_.empty()) {
      const int r = worklist_.back();
      worklist_.pop_back();
      const std::vector<Action>& program = programs[r];
      Clock& clock = run.ranks[r];
      int64_t k = clock.pc;
      const int64_t end = static_cast<int64_t>(program.size());
      double t = clock.now;
      double busy = clock.busy;
      for (; k < end; ++k) {
        const Action& op = program[k];
        const Outcome outcome = Execute<kTrace, /*kMayWait=*/true>(clock, stages, r, k, op, t,
                                                                   busy, record, woken);
        if (outcome == Outcome::kDone) continue;
        if (outcome == Outcome::kWaits) {
          // The rank resumes here after its peers have moved (often ~p ranks later): fetch
          // the actions after this receive now, as no hardware prefetcher will.
          for (int64_t ahead = k; ahead < end && ahead < k + kPrefetchActions;
               ahead += kActionsPerLine) {
            Prefetch(&program[ahead]);
          }
          break;
        }
        if (outcome == Outcome::kBadStage) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", r, " step ", k, " (", ToString(op), "): stage out of range"));
        }
        return BadPeer(r, k, op);
      }
      run.executed += k - clock.pc;
      clock.pc = k;
      clock.now = t;
      clock.busy = busy;
    }
    return absl::OkStatus();
  };
  if (options.record_trace || options.on_interval) return drain(std::true_type{});
  return drain(std::false_type{});
}

absl::StatusOr<SimulationResult> ScheduleSimulator::Result() {
  RunState& run = *run_;
  SimulationResult& result = run.result;
  const int num_ranks = static_cast<int>(run.ranks.size());
  for (int r = 0; r < num_ranks; ++r) {
    const PeerList& list = rank_peers_[r];
    for (int j = 0; j < list.count; ++j) {
      const Peer& peer = j < kInlinePeers ? list.inline_peers[j] : list.more[j - kInlinePeers];
      if (peer.send && !in_flight_[peer.channel].empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "transfers do not pair up: ", in_flight_[peer.channel].size, " of rank ", r,
            "'s sends to rank ", peer.rank, " are never received (run the validator for "
            "details)"));
      }
    }
  }
  double makespan = 0;
  for (const Clock& clock : run.ranks) makespan = std::max(makespan, clock.now);
  double total_busy = 0;
  result.busy_seconds.resize(num_ranks);
  result.idle_seconds.resize(num_ranks);
  result.peak_activations.resize(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    const Clock& clock = run.ranks[r];
    result.busy_seconds[r] = clock.busy;
    result.idle_seconds[r] = makespan - clock.busy;
    result.peak_activations[r] = clock.peak;
    total_busy += clock.busy;
  }
  result.makespan_seconds = makespan;
  result.bubble_ratio = makespan > 0 ? 1.0 - total_busy / (num_ranks * makespan) : 0.0;
  result.simulated_actions = run.executed;
  SimulationResult out = std::move(result);
  run_.reset();
  return out;
}

absl::StatusOr<SimulationResult> ScheduleSimulator::Run(const CostModel& costs,
                                                        const SimulationOptions& options) {
  TANDEM_RETURN_IF_ERROR(Start(costs, options));
  TANDEM_RETURN_IF_ERROR(Drain());
  const std::vector<std::vector<Action>>& programs = schedule_->programs;
  for (int r = 0; r < static_cast<int>(programs.size()); ++r) {
    if (run_->ranks[r].pc < static_cast<int64_t>(programs[r].size())) {
      const int64_t step = run_->ranks[r].pc;
      run_.reset();
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r, " step ", step, " (", ToString(programs[r][step]),
                       "): deadlock: waiting for a send that never comes"));
    }
  }
  return Result();
}

absl::Status ScheduleSimulator::Start(const CostModel& costs) {
  return Start(costs, SimulationOptions{});
}

absl::Status ScheduleSimulator::Take(const internal::EmittedActions& batch) {
  if (run_ == nullptr) return absl::FailedPreconditionError("simulation not started");
  RunState& run = *run_;
  auto record = [](int, int64_t, const Action&, int, double, double) {};
  auto woken = [](int) {};
  const StageCosts* const stages = run.stages.data();
  for (size_t j = 0; j < batch.size; ++j) {
    const int r = batch.ranks[j];
    const Action& op = batch.actions[j];
    Clock& clock = run.ranks[r];
    const int64_t k = clock.pc;
    double t = clock.now;
    double busy = clock.busy;
    const Outcome outcome = Execute</*kTrace=*/false, /*kMayWait=*/false>(
        clock, stages, r, k, op, t, busy, record, woken);
    if (outcome != Outcome::kDone) {
      run_.reset();
      switch (outcome) {
        case Outcome::kWaits:
          return absl::FailedPreconditionError(absl::StrCat(
              "rank ", r, " step ", k, " (", ToString(op), "): received before its send"));
        case Outcome::kBadStage:
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", r, " step ", k, " (", ToString(op), "): stage out of range"));
        default:
          return BadPeer(r, k, op);
      }
    }
    clock.pc = k + 1;
    clock.now = t;
    clock.busy = busy;
  }
  run.executed += static_cast<int64_t>(batch.size);
  return absl::OkStatus();
}

absl::StatusOr<SimulationResult> ScheduleSimulator::Finish() {
  if (run_ == nullptr) return absl::FailedPreconditionError("simulation not started");
  return Result();
}

absl::StatusOr<SimulatedTraceFile> SimulatedTraceFile::Open(const std::string& path,
                                                             const Schedule& schedule) {
  TANDEM_ASSIGN_OR_RETURN(TraceFileWriter writer, TraceFileWriter::Open(path));
  // In ChromeTrace::ToJson's order: the processes, then their threads.
  for (int r = 0; r < schedule.NumRanks(); ++r) writer.NameProcess(r, RankName(r));
  for (int r = 0; r < schedule.NumRanks(); ++r) {
    for (int lane = 0; lane < kTraceLanes; ++lane) writer.NameThread(r, lane, kLaneNames[lane]);
  }
  return SimulatedTraceFile(std::move(writer), schedule);
}

void SimulatedTraceFile::Add(const SimulatedInterval& interval) {
  const Action& a = schedule_->programs[interval.rank][interval.step];
  name_.clear();
  AppendAction(&name_, a);
  TraceFileWriter::IntArg args[3];
  writer_.Complete(EventPrefix(interval.lane), name_, TraceCategory(a.type),
                   interval.rank, interval.lane, interval.start_seconds,
                   interval.duration_seconds, absl::MakeConstSpan(args, EventArgs(a, args)));
}

absl::Status SimulatedTraceFile::Close() { return writer_.Close(); }

absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const CostModel& costs,
                                          const SimulationOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(ScheduleSimulator simulator, ScheduleSimulator::Create(schedule));
  return simulator.Run(costs, options);
}

}  // namespace tandem::pipeline
