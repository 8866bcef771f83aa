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

absl::string_view Category(ActionType type) {
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

}  // namespace

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
  const bool trace = options.record_trace;
  if (trace) {
    for (int r = 0; r < num_ranks; ++r) {
      result.trace.NameProcess(r, absl::StrCat("rank ", r));
      result.trace.NameThread(r, kTraceLaneCompute, "compute");
      result.trace.NameThread(r, kTraceLaneWait, "receive wait");
      result.trace.NameThread(r, kTraceLaneTransfer, "send in flight");
      result.trace.NameThread(r, kTraceLaneSync, "gradient sync");
    }
  }
  auto record = [&](int r, int64_t k, int lane, double start, double duration) {
    const Action& a = schedule.programs[r][k];
    TraceEvent e;
    e.name = lane == kTraceLaneWait ? absl::StrCat("wait ", ToString(a)) : ToString(a);
    e.category = std::string(Category(a.type));
    e.pid = r;
    e.tid = lane;
    e.start_seconds = start;
    e.duration_seconds = duration;
    if (a.stage >= 0) e.args["stage"] = a.stage;
    if (a.microbatch >= 0) e.args["microbatch"] = a.microbatch;
    if (a.replica != 0) e.args["replica"] = a.replica;
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

absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const CostModel& costs,
                                          const SimulationOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(ScheduleSimulator simulator, ScheduleSimulator::Create(schedule));
  return simulator.Run(costs, options);
}

namespace {

const char* FillColour(absl::string_view category) {
  if (category == "forward") return "#4e79a7";
  if (category == "backward") return "#59a14f";
  if (category == "backward-input") return "#f28e2b";
  if (category == "backward-weight") return "#b07aa1";
  if (category == "sync") return "#bab0ac";
  if (category == "optimizer") return "#e15759";
  return "#9c9c9c";
}

std::string EscapeXml(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks.
double TickStep(double span, int target) {
  if (span <= 0) return 1;
  double raw = span / target;
  double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= f * power) return f * power;
  }
  return 10 * power;
}

}  // namespace

std::string RenderSvgGantt(const SimulationResult& result, int num_ranks) {
  constexpr double kChartWidth = 1200;
  constexpr double kLabelWidth = 70;
  constexpr double kRowHeight = 26;
  constexpr double kRowGap = 4;
  constexpr double kTop = 30;
  constexpr double kAxisHeight = 30;
  constexpr double kLegendHeight = 24;
  constexpr double kCharWidth = 6.5;  // at font-size 11
  const double makespan = result.makespan_seconds > 0 ? result.makespan_seconds : 1;
  const double scale = kChartWidth / makespan;
  const double rows_height = num_ranks * (kRowHeight + kRowGap);
  const double width = kLabelWidth + kChartWidth + 20;
  const double height = kTop + rows_height + kAxisHeight + kLegendHeight + 10;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"18\" font-size=\"13\">makespan %.6g s, bubble ratio %.4f</text>\n",
      width, height, kLabelWidth, result.makespan_seconds, result.bubble_ratio);
  for (int r = 0; r < num_ranks; ++r) {
    const double y = kTop + r * (kRowHeight + kRowGap);
    absl::StrAppendFormat(&svg,
                          "<text x=\"4\" y=\"%.1f\">rank %d</text>\n"
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"#f4f4f4\"/>\n",
                          y + kRowHeight * 0.65, r, kLabelWidth, y, kChartWidth, kRowHeight);
  }
  for (const TraceEvent& e : result.trace.events()) {
    if (e.tid != kTraceLaneCompute || e.pid < 0 || e.pid >= num_ranks) continue;
    const double x = kLabelWidth + e.start_seconds * scale;
    const double w = std::max(e.duration_seconds * scale, 0.5);
    const double y = kTop + e.pid * (kRowHeight + kRowGap);
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
                          "stroke=\"white\" stroke-width=\"0.5\"><title>%s %.6g s</title></rect>\n",
                          x, y, w, kRowHeight, FillColour(e.category), EscapeXml(e.name),
                          e.duration_seconds);
    if (w >= kCharWidth * e.name.size() + 4) {
      absl::StrAppendFormat(&svg,
                            "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\" "
                            "text-anchor=\"middle\">%s</text>\n",
                            x + w / 2, y + kRowHeight * 0.65, EscapeXml(e.name));
    }
  }
  // Time axis.
  const double axis_y = kTop + rows_height + 4;
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                        kLabelWidth, axis_y, kLabelWidth + kChartWidth, axis_y);
  const double step = TickStep(makespan, 10);
  for (double t = 0; t <= makespan * (1 + 1e-9); t += step) {
    const double x = kLabelWidth + t * scale;
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.6g</text>\n",
                          x, axis_y, x, axis_y + 5, x, axis_y + 17, t);
  }
  absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.1f\">seconds</text>\n",
                        kLabelWidth + kChartWidth - 50, axis_y + 28);
  // Legend.
  double lx = kLabelWidth;
  const double ly = axis_y + kAxisHeight + 4;
  for (auto [category, label] :
       {std::pair<const char*, const char*>{"forward", "F forward"},
        {"backward", "B backward"},
        {"backward-input", "Bi input gradient"},
        {"backward-weight", "W weight gradient"},
        {"optimizer", "optimizer step"}}) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.0f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                          "<text x=\"%.0f\" y=\"%.1f\">%s</text>\n",
                          lx, ly, FillColour(category), lx + 16, ly + 10, label);
    lx += 140;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace tandem::pipeline
