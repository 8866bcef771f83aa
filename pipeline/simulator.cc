#include "pipeline/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_util.h"
#include "common/status.h"

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
  add(rank_peers_[from], {to, id, true});
  add(rank_peers_[to], {from, id, false});
  in_flight_.emplace_back();
  return id;
}

void ScheduleSimulator::InFlight::Grow() {
  std::vector<double> grown(ring.empty() ? 8 : 2 * ring.size());
  for (size_t j = 0; j < size; ++j) grown[j] = ring[(head + j) & (ring.size() - 1)];
  ring.swap(grown);
  head = 0;
}

absl::StatusOr<SimulationResult> ScheduleSimulator::Run(const CostModel& costs,
                                                        const SimulationOptions& options) {
  const Schedule& schedule = *schedule_;
  const int num_ranks = schedule.NumRanks();
  const int num_stages = schedule.placement.num_stages;
  TANDEM_RETURN_IF_ERROR(costs.Check(num_stages));

  // Per-stage tables, so the loop below only indexes arrays.
  std::vector<double> forward(num_stages), backward_full(num_stages), backward_input(num_stages),
      weight(num_stages), stash(num_stages), activation_transfer(num_stages),
      gradient_transfer(num_stages), sync(num_stages, 0.0);
  auto transfer_seconds = [&](double bytes) {
    double t = costs.p2p_latency_seconds;
    if (costs.p2p_bandwidth_bytes_per_second > 0) t += bytes / costs.p2p_bandwidth_bytes_per_second;
    return t;
  };
  for (int s = 0; s < num_stages; ++s) {
    const StageCost& c = costs.stages[s];
    forward[s] = c.forward_seconds;
    backward_full[s] = c.backward_seconds + c.weight_seconds;
    // Costs that do not split backward give a split schedule half of it for each part.
    const bool split_costs = c.weight_seconds > 0;
    backward_input[s] = split_costs ? c.backward_seconds : c.backward_seconds / 2;
    weight[s] = split_costs ? c.weight_seconds : c.backward_seconds / 2;
    stash[s] = c.stash_units;
    activation_transfer[s] = transfer_seconds(c.activation_bytes);
    // The gradient of stage s's input has the size of stage s-1's output.
    gradient_transfer[s] = transfer_seconds(s > 0 ? costs.stages[s - 1].activation_bytes : 0);
    if (!costs.grad_sync_seconds.empty()) sync[s] = costs.grad_sync_seconds[s];
  }

  SimulationResult result;
  result.busy_seconds.assign(num_ranks, 0.0);
  result.idle_seconds.assign(num_ranks, 0.0);
  result.peak_activations.assign(num_ranks, 0.0);
  std::vector<double> now(num_ranks, 0.0), stashed(num_ranks, 0.0), sync_end(num_ranks, 0.0);
  // Per channel, the arrival times of the messages sent and not yet received, in order.
  for (InFlight& queue : in_flight_) {
    queue.head = 0;
    queue.size = 0;
  }
  pc_.assign(num_ranks, 0);
  blocked_on_.assign(num_ranks, kNotBlocked);
  worklist_.clear();
  for (int r = num_ranks - 1; r >= 0; --r) worklist_.push_back(r);
  const bool trace = options.record_trace || options.on_interval;
  if (options.record_trace) {
    for (int r = 0; r < num_ranks; ++r) {
      result.trace.NameProcess(r, RankName(r));
      for (int lane = 0; lane < kTraceLanes; ++lane) {
        result.trace.NameThread(r, lane, kLaneNames[lane]);
      }
    }
  }
  auto record = [&](int r, int64_t k, int lane, double start, double duration) {
    if (options.on_interval) options.on_interval({r, lane, k, start, duration});
    if (!options.record_trace) return;
    const Action& a = schedule.programs[r][k];
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

  int64_t executed = 0;
  while (!worklist_.empty()) {
    const int r = worklist_.back();
    worklist_.pop_back();
    const std::vector<Action>& program = schedule.programs[r];
    int64_t k = pc_[r];
    const int64_t end = static_cast<int64_t>(program.size());
    double t = now[r];
    double busy = 0;
    bool blocked = false;
    for (; k < end && !blocked; ++k) {
      const Action& op = program[k];
      const int s = op.stage;
      if (static_cast<unsigned>(s) >= static_cast<unsigned>(num_stages) &&
          op.type != ActionType::kOptimizerStep) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " step ", k, " (", ToString(op), "): stage out of range"));
      }
      double cost = 0;
      switch (op.type) {
        case ActionType::kForward:
          cost = forward[s];
          stashed[r] += stash[s];
          result.peak_activations[r] = std::max(result.peak_activations[r], stashed[r]);
          break;
        case ActionType::kBackward:
          cost = backward_full[s];
          stashed[r] -= stash[s];
          break;
        case ActionType::kBackwardInput:
          cost = backward_input[s];
          break;
        case ActionType::kBackwardWeight:
          cost = weight[s];
          stashed[r] -= stash[s];
          break;
        case ActionType::kSendActivation:
        case ActionType::kSendGradient: {
          if (op.peer < 0 || op.peer >= num_ranks) return BadPeer(r, k, op);
          const double flight = op.type == ActionType::kSendActivation ? activation_transfer[s]
                                                                       : gradient_transfer[s];
          int c = ChannelOf(r, op.peer, /*send=*/true);
          if (c < 0) c = AddChannel(r, op.peer);
          in_flight_[c].push(t + flight);
          if (trace && flight > 0) record(r, k, kTraceLaneTransfer, t, flight);
          if (blocked_on_[op.peer] == c) {
            blocked_on_[op.peer] = kNotBlocked;
            worklist_.push_back(op.peer);
            // It resumes soon, where it stopped long ago: a line no cache holds any more.
            Prefetch(&schedule.programs[op.peer][pc_[op.peer]]);
          }
          break;
        }
        case ActionType::kRecvActivation:
        case ActionType::kRecvGradient: {
          if (op.peer < 0 || op.peer >= num_ranks) return BadPeer(r, k, op);
          int c = ChannelOf(r, op.peer, /*send=*/false);
          if (c < 0) c = AddChannel(op.peer, r);
          if (in_flight_[c].empty()) {
            blocked_on_[r] = c;
            blocked = true;
            // The rank resumes here after its peers have moved (often ~p ranks later): fetch
            // the actions after this receive now, as no hardware prefetcher will.
            for (int64_t ahead = k; ahead < end && ahead < k + kPrefetchActions;
                 ahead += kActionsPerLine) {
              Prefetch(&program[ahead]);
            }
            --k;  // stay on this receive
            break;
          }
          const double arrives = in_flight_[c].pop();
          if (arrives > t) {
            if (trace) record(r, k, kTraceLaneWait, t, arrives - t);
            t = arrives;
          }
          break;
        }
        case ActionType::kGradientSync:
          if (trace && sync[s] > 0) record(r, k, kTraceLaneSync, t, sync[s]);
          sync_end[r] = std::max(sync_end[r], t + sync[s]);
          break;
        case ActionType::kOptimizerStep:
          t = std::max(t, sync_end[r]);
          if (trace && costs.optimizer_seconds > 0) {
            record(r, k, kTraceLaneCompute, t, costs.optimizer_seconds);
          }
          t += costs.optimizer_seconds;
          break;
      }
      if (cost > 0) {
        if (trace) record(r, k, kTraceLaneCompute, t, cost);
        t += cost;
        busy += cost;
      }
    }
    executed += k - pc_[r];
    pc_[r] = k;
    now[r] = t;
    result.busy_seconds[r] += busy;
  }
  for (int r = 0; r < num_ranks; ++r) {
    if (pc_[r] < static_cast<int64_t>(schedule.programs[r].size())) {
      const int64_t step = pc_[r];
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " step ", step, " (", ToString(schedule.programs[r][step]),
          "): deadlock: waiting for a send that never comes"));
    }
  }
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
  for (int r = 0; r < num_ranks; ++r) makespan = std::max(makespan, now[r]);
  double total_busy = 0;
  for (int r = 0; r < num_ranks; ++r) {
    result.idle_seconds[r] = makespan - result.busy_seconds[r];
    total_busy += result.busy_seconds[r];
  }
  result.makespan_seconds = makespan;
  result.bubble_ratio = makespan > 0 ? 1.0 - total_busy / (num_ranks * makespan) : 0.0;
  result.simulated_actions = executed;
  return result;
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
