// Speed of the schedule engine on one core: for each schedule and size, the time to generate
// the programs, to validate them (buffered sends; grouped rendezvous) and to simulate them,
// and the simulated actions per second (the goal: at least one million). Generation
// plus validation has a goal of its own: at most 2 s per schedule at p=1024, m=4096. Each line
// says whether it is met, on processor time since the machine may be shared ("goal 2s: ok" or
// "goal 2s: MISSED"; the exit status stays 0 for a missed goal, which depends on the machine).
// Each line ends with a digest of the programs, so that two builds can be checked to generate
// the same schedules.
//
//   pipeline_schedule_bench                       # the sizes, every schedule
//   pipeline_schedule_bench 1f1b:64:512 zb-v:1024:4096:1   # kind:p:m[:v or W]
//
// Simulation is timed with a ScheduleSimulator built once (what the planner does) over
// several runs with uniform costs, and once through Simulate() (indexing included).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "pipeline/generators.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"

namespace {

using tandem::pipeline::CostModel;
using tandem::pipeline::Schedule;
using tandem::pipeline::ScheduleKind;
using tandem::pipeline::ScheduleSpec;

// Processor time of this process: on a shared machine, what the wall time would be alone.
double CpuNow() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds allowed for generation plus validation (the goal at p=1024, m=4096).
constexpr double kGenerateValidateGoalSeconds = 2.0;


ScheduleSpec Make(ScheduleKind kind, int p, int m, int extra = 1) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.num_ranks = p;
  spec.num_microbatches = m;
  if (kind == ScheduleKind::kInterleaved) spec.chunks = extra;
  if (kind == ScheduleKind::kHanayo) spec.waves = extra;
  return spec;
}

std::vector<ScheduleSpec> DefaultCases() {
  std::vector<ScheduleSpec> cases;
  for (auto [p, m] : {std::pair{64, 512}, std::pair{1024, 4096}}) {
    cases.push_back(Make(ScheduleKind::kGPipe, p, m));
    cases.push_back(Make(ScheduleKind::k1F1B, p, m));
    cases.push_back(Make(ScheduleKind::kInterleaved, p, m, 2));
    cases.push_back(Make(ScheduleKind::kZBH1, p, m));
    cases.push_back(Make(ScheduleKind::kChimera, p, m));
    // The list-scheduled kinds are slower to generate; still worth a figure.
    cases.push_back(Make(ScheduleKind::kZBV, p, m));
    cases.push_back(Make(ScheduleKind::kHanayo, p, m, 1));
    cases.push_back(Make(ScheduleKind::kDualPipe, p, m));
    cases.push_back(Make(ScheduleKind::kDualPipeV, p, m));
  }
  return cases;
}

bool ParseCase(const std::string& text, ScheduleSpec* spec) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  if (parts.size() < 3 || parts.size() > 4) return false;
  auto kind = tandem::pipeline::ParseScheduleKind(parts[0]);
  int p = 0, m = 0, extra = 1;
  if (!kind.ok() || !absl::SimpleAtoi(parts[1], &p) || !absl::SimpleAtoi(parts[2], &m)) {
    return false;
  }
  if (parts.size() == 4 && !absl::SimpleAtoi(parts[3], &extra)) return false;
  *spec = Make(*kind, p, m, extra);
  return true;
}

int RunCase(const ScheduleSpec& spec) {
  const double c0 = CpuNow();
  const double t0 = Now();
  auto schedule = tandem::pipeline::GenerateSchedule(spec);
  const double t1 = Now();
  if (!schedule.ok()) {
    std::printf("%-12s p=%-5d m=%-5d skipped: %s\n",
                std::string(tandem::pipeline::ScheduleKindName(spec.kind)).c_str(),
                spec.num_ranks, spec.num_microbatches,
                std::string(schedule.status().message()).c_str());
    return 0;
  }
  absl::Status valid = tandem::pipeline::ValidateSchedule(*schedule);
  const double t2 = Now();
  const double c2 = CpuNow();
  tandem::pipeline::ValidationOptions strict;
  strict.grouped_rendezvous = true;
  absl::Status grouped = tandem::pipeline::ValidateSchedule(*schedule, strict);
  const double t3 = Now();
  if (!valid.ok() || !grouped.ok()) {
    std::printf("INVALID: %s / %s\n", std::string(valid.message()).c_str(),
                std::string(grouped.message()).c_str());
    return 1;
  }
  const CostModel costs = CostModel::Uniform(schedule->spec, 1.0, 2.0);
  // Once through Simulate (indexing included).
  const double t4 = Now();
  auto once = tandem::pipeline::Simulate(*schedule, costs);
  const double t5 = Now();
  // Repeated runs on one simulator.
  auto simulator = tandem::pipeline::ScheduleSimulator::Create(*schedule);
  if (!once.ok() || !simulator.ok()) {
    std::printf("simulation failed\n");
    return 1;
  }
  constexpr double kMinSeconds = 1.0;
  constexpr int kMinRuns = 3;
  int runs = 0;
  int64_t actions = 0;
  const double t6 = Now();
  double t7 = t6;
  while (runs < kMinRuns || t7 - t6 < kMinSeconds) {
    auto result = simulator->Run(costs);
    if (!result.ok()) return 1;
    actions += result->simulated_actions;
    ++runs;
    t7 = Now();
  }
  const double per_run = (t7 - t6) / runs;
  std::printf(
      "%-12s p=%-5d m=%-5d actions=%-10lld generate=%8.3fs validate=%8.3fs "
      "validate-grouped=%8.3fs gen+validate=%8.3fs (cpu %7.3fs) simulate=%8.3fs (with indexing %8.3fs) "
      "%7.1f M actions/s  makespan=%.1f bubble=%.4f  goal %.0fs: %s  digest=%016" PRIx64 "\n",
      std::string(tandem::pipeline::ScheduleKindName(spec.kind)).c_str(), spec.num_ranks,
      spec.num_microbatches, static_cast<long long>(schedule->NumActions()), t1 - t0, t2 - t1,
      t3 - t2, t2 - t0, c2 - c0, per_run, t5 - t4, actions / (t7 - t6) / 1e6, once->makespan_seconds,
      once->bubble_ratio, kGenerateValidateGoalSeconds,
      c2 - c0 <= kGenerateValidateGoalSeconds ? "ok" : "MISSED", ScheduleDigest(*schedule));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<ScheduleSpec> cases;
  for (int i = 1; i < argc; ++i) {
    ScheduleSpec spec;
    if (!ParseCase(argv[i], &spec)) {
      std::fprintf(stderr, "pipeline_schedule_bench: bad case '%s' (expected kind:p:m[:v|W])\n",
                   argv[i]);
      return 2;
    }
    cases.push_back(spec);
  }
  if (cases.empty()) cases = DefaultCases();
  int failures = 0;
  for (const ScheduleSpec& spec : cases) failures += RunCase(spec);
  return failures == 0 ? 0 : 1;
}
