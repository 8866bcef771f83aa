#include "runtime/timeline.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::runtime {
namespace {

struct Mean {
  double sum = 0;
  int count = 0;
  void Add(double x) {
    sum += x;
    ++count;
  }
  double value() const { return count > 0 ? sum / count : 0; }
};

}  // namespace

absl::StatusOr<pipeline::CostModel> MeasuredCosts(const WorldTimings& timings,
                                                  const pipeline::ScheduleSpec& spec) {
  using pipeline::ActionType;
  const int num_stages = spec.NumStages();
  std::vector<Mean> forward(num_stages), backward(num_stages), input(num_stages),
      weight(num_stages);
  // The k-th optimizer step of each rank belongs to the k-th iteration given.
  std::vector<std::vector<const ActionTiming*>> steps;  // [rank][k]
  for (const std::vector<ActionTiming>& rank : timings) {
    steps.emplace_back();
    for (const ActionTiming& t : rank) {
      const int stage = t.action.stage;
      const double duration = t.end_seconds - t.start_seconds;
      if (t.action.type == ActionType::kOptimizerStep) steps.back().push_back(&t);
      if (stage < 0 || stage >= num_stages) continue;
      switch (t.action.type) {
        case ActionType::kForward: forward[stage].Add(duration); break;
        case ActionType::kBackward: backward[stage].Add(duration); break;
        case ActionType::kBackwardInput: input[stage].Add(duration); break;
        case ActionType::kBackwardWeight: weight[stage].Add(duration); break;
        default: break;
      }
    }
  }
  std::vector<double> f(num_stages), b(num_stages), w(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    const bool split = input[s].count > 0;
    if (forward[s].count == 0 || (backward[s].count == 0 && !split)) {
      return absl::NotFoundError(
          absl::StrCat("the timings have no forward or backward of stage ", s));
    }
    f[s] = forward[s].value();
    b[s] = split ? input[s].value() : backward[s].value();
    w[s] = split ? weight[s].value() : 0;
  }
  TANDEM_ASSIGN_OR_RETURN(pipeline::CostModel costs,
                          pipeline::CostModel::FromStageCosts(spec, f, b, w));
  Mean tail;
  for (size_t k = 0;; ++k) {
    const ActionTiming* last = nullptr;
    for (const auto& rank : steps) {
      if (k < rank.size() && (last == nullptr || rank[k]->start_seconds > last->start_seconds)) {
        last = rank[k];
      }
    }
    if (last == nullptr) break;
    tail.Add(last->end_seconds - last->start_seconds);
  }
  costs.optimizer_seconds = tail.value();
  return costs;
}

absl::StatusOr<TimeRange> IterationRange(const WorldTimings& timings) {
  TimeRange range{std::numeric_limits<double>::infinity(),
                  -std::numeric_limits<double>::infinity()};
  for (const auto& rank : timings) {
    for (const ActionTiming& t : rank) {
      range.start_seconds = std::min(range.start_seconds, t.start_seconds);
      range.end_seconds = std::max(range.end_seconds, t.end_seconds);
    }
  }
  if (range.end_seconds < range.start_seconds) {
    return absl::NotFoundError("no action timings");
  }
  return range;
}

absl::StatusOr<pipeline::SimulationResult> AddPrediction(const pipeline::Schedule& schedule,
                                                         const pipeline::CostModel& costs,
                                                         double start_seconds,
                                                         ChromeTrace* trace) {
  pipeline::SimulationOptions options;
  options.record_trace = true;
  TANDEM_ASSIGN_OR_RETURN(pipeline::SimulationResult result,
                          pipeline::Simulate(schedule, costs, options));
  for (int q = 0; q < schedule.NumRanks(); ++q) {
    const int pid = kPredictionPidOffset + q;
    trace->NameProcess(pid, absl::StrCat("predicted: position ", q));
    trace->NameThread(pid, pipeline::kTraceLaneCompute, "compute");
    trace->NameThread(pid, pipeline::kTraceLaneWait, "receive wait");
    trace->NameThread(pid, pipeline::kTraceLaneTransfer, "send in flight");
    trace->NameThread(pid, pipeline::kTraceLaneSync, "gradient sync");
  }
  for (TraceEvent e : result.trace.events()) {
    e.pid += kPredictionPidOffset;
    e.start_seconds += start_seconds;
    trace->Add(std::move(e));
  }
  result.trace = ChromeTrace();
  return result;
}

ChromeTrace SelectIteration(const ChromeTrace& trace, int64_t iteration) {
  nlohmann::json j = trace.ToJson();
  nlohmann::json kept = nlohmann::json::array();
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e.value("ph", "") == "X") {
      const nlohmann::json args = e.value("args", nlohmann::json::object());
      if (!args.contains("iteration") || args["iteration"] != iteration) continue;
    }
    kept.push_back(e);
  }
  j["traceEvents"] = kept;
  auto selected = ChromeTrace::FromJson(j);
  return selected.ok() ? *selected : ChromeTrace();
}

}  // namespace tandem::runtime
