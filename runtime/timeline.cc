#include "runtime/timeline.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::runtime {
namespace {

bool InIteration(const TraceEvent& e, int64_t iteration) {
  if (iteration < 0) return true;
  return e.args.is_object() && e.args.contains("iteration") &&
         e.args["iteration"].is_number_integer() &&
         e.args["iteration"].get<int64_t>() == iteration;
}

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

absl::StatusOr<pipeline::CostModel> MeasuredCosts(const ChromeTrace& trace,
                                                  const pipeline::ScheduleSpec& spec,
                                                  int64_t iteration) {
  const int num_stages = spec.NumStages();
  std::vector<Mean> forward(num_stages), backward(num_stages), input(num_stages),
      weight(num_stages);
  for (const TraceEvent& e : trace.events()) {
    if (!InIteration(e, iteration) || !e.args.is_object() || !e.args.contains("type") ||
        !e.args.contains("stage")) {
      continue;
    }
    const int stage = e.args["stage"].get<int>();
    if (stage < 0 || stage >= num_stages) continue;
    const std::string type = e.args["type"].get<std::string>();
    if (type == "F") forward[stage].Add(e.duration_seconds);
    if (type == "B") backward[stage].Add(e.duration_seconds);
    if (type == "Bi") input[stage].Add(e.duration_seconds);
    if (type == "W") weight[stage].Add(e.duration_seconds);
  }
  std::vector<double> f(num_stages), b(num_stages), w(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    const bool split = input[s].count > 0;
    if (forward[s].count == 0 || (backward[s].count == 0 && !split)) {
      return absl::NotFoundError(absl::StrCat("timeline has no forward or backward of stage ",
                                              s, iteration >= 0
                                                     ? absl::StrCat(" in iteration ", iteration)
                                                     : std::string()));
    }
    f[s] = forward[s].value();
    b[s] = split ? input[s].value() : backward[s].value();
    w[s] = split ? weight[s].value() : 0;
  }
  return pipeline::CostModel::FromStageCosts(spec, f, b, w);
}

absl::StatusOr<TimeRange> IterationRange(const ChromeTrace& trace, int64_t iteration) {
  TimeRange range{std::numeric_limits<double>::infinity(),
                  -std::numeric_limits<double>::infinity()};
  for (const TraceEvent& e : trace.events()) {
    if (!InIteration(e, iteration)) continue;
    range.start_seconds = std::min(range.start_seconds, e.start_seconds);
    range.end_seconds = std::max(range.end_seconds, e.start_seconds + e.duration_seconds);
  }
  if (range.end_seconds < range.start_seconds) {
    return absl::NotFoundError(absl::StrCat("timeline has no events of iteration ", iteration));
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
