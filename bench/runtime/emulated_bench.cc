// The runtime's own overhead: every schedule run by the engine with emulated-compute stages
// (each action sleeps its profiled time), measured iteration time against the simulator's
// makespan for the same costs. Run under mpirun, one rank per pipeline position:
//
//   mpirun -np 4 --oversubscribe build/bench/runtime/runtime_emulated_bench
//       [--forward_ms=10] [--backward_ms=20] [--microbatches=16] [--iterations=5]
//       [--timeline_dir=out]
//
// The measured time of an iteration is the slowest rank's; the figure is the mean over the
// measured iterations (after one warm-up). Two predictions: the simulator with the nominal
// costs (the goal: within 5%), and with the stage times the timeline measured (each sleep
// overshoots a little, more on a loaded machine), whose ratio is the runtime's own overhead
// (transfers, synchronisation, bookkeeping). With --timeline_dir, each schedule's last
// iteration is written as <dir>/emulated_<schedule>.trace.json with the prediction beside it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "pipeline/plan.h"
#include "pipeline/simulator.h"
#include "runtime/emulated_stage.h"
#include "runtime/engine.h"
#include "runtime/timeline.h"

ABSL_FLAG(double, forward_ms, 10, "forward time of one full stage per micro-batch (ms)");
ABSL_FLAG(double, backward_ms, 20, "backward time of one full stage per micro-batch (ms)");
ABSL_FLAG(int, microbatches, 16, "micro-batches per iteration, m");
ABSL_FLAG(int, iterations, 5, "measured iterations per schedule (after one warm-up)");
ABSL_FLAG(int64_t, activation_elements, 4096, "float32 elements of each activation");
ABSL_FLAG(std::string, timeline_dir, "", "write each schedule's last iteration here");

namespace tandem {
namespace {

constexpr int kLayersPerStage = 4;
constexpr int64_t kParameterElements = 1 << 16;

struct Variant {
  pipeline::ScheduleKind kind;
  int chunks = 1;
  int waves = 1;
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "runtime_emulated_bench: %s\n", status.ToString().c_str());
  return 1;
}

absl::StatusOr<double> MaxOverRanks(comm::Communicator& world, double value) {
  comm::Buffer b;
  b.data = &value;
  b.count = 1;
  b.dtype = comm::DataType::kFloat64;
  absl::Status s = world.AllReduce(b, comm::ReduceOp::kMax)->Wait();
  if (!s.ok()) return s;
  return value;
}

int Run() {
  // Emulated actions sleep, so a rank waiting for a transfer may spin without taking a core
  // from computing ranks; polite (sleeping) waits, the default when ranks outnumber cores,
  // add up to their back-off to every transfer. TANDEM_COMM_WAIT in the environment wins.
  setenv("TANDEM_COMM_WAIT", "spin", /*overwrite=*/0);
  auto world_or = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  if (!world_or.ok()) return Fail(world_or.status());
  comm::Communicator& world = **world_or;
  const int p = world.size();
  const double forward = absl::GetFlag(FLAGS_forward_ms) * 1e-3;
  const double backward = absl::GetFlag(FLAGS_backward_ms) * 1e-3;
  const int m = absl::GetFlag(FLAGS_microbatches);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  const std::string timeline_dir = absl::GetFlag(FLAGS_timeline_dir);
  const bool root = world.rank() == 0;
  if (root) {
    std::printf("emulated stages: p=%d m=%d, per full stage F=%.1f ms B=%.1f ms "
                "(ZB-H1, ZB-V: Bi=W=B/2), %d measured iterations, waits: %s\n",
                p, m, forward * 1e3, backward * 1e3, iterations, std::getenv("TANDEM_COMM_WAIT"));
    std::printf("%-12s %12s %13s %7s %14s %7s %8s\n", "schedule", "measured_ms",
                "simulated_ms", "ratio", "sim_measured", "ratio", "bubble");
  }
  const std::vector<Variant> variants = {
      {pipeline::ScheduleKind::kGPipe},        {pipeline::ScheduleKind::k1F1B},
      {pipeline::ScheduleKind::kInterleaved, 2}, {pipeline::ScheduleKind::kChimera},
      {pipeline::ScheduleKind::kHanayo, 1, 1},  {pipeline::ScheduleKind::kZBH1},
      {pipeline::ScheduleKind::kZBV, 2},
  };
  for (const Variant& v : variants) {
    pipeline::ScheduleSpec spec;
    spec.kind = v.kind;
    spec.num_ranks = p;
    spec.num_microbatches = m;
    spec.chunks = v.chunks;
    spec.waves = v.waves;
    const bool split = spec.SplitsBackward();
    const pipeline::CostModel costs =
        split ? pipeline::CostModel::Uniform(spec, forward, backward / 2, backward / 2)
              : pipeline::CostModel::Uniform(spec, forward, backward);
    auto plan = pipeline::MakeUniformPlan(kLayersPerStage * spec.NumStages(), spec,
                                          /*data_parallel=*/1, /*microbatch_size=*/1);
    if (!plan.ok()) return Fail(plan.status());
    runtime::StageFactory factory =
        [&](const runtime::StageSpec& s) -> absl::StatusOr<std::unique_ptr<runtime::Stage>> {
      runtime::EmulatedStageOptions o = runtime::EmulatedStageOptionsFor(s);
      o.forward_seconds = costs.stages[s.stage].forward_seconds;
      o.backward_seconds = costs.stages[s.stage].backward_seconds;
      o.weight_seconds = costs.stages[s.stage].weight_seconds;
      o.activation_elements = absl::GetFlag(FLAGS_activation_elements);
      o.parameter_elements = kParameterElements;
      return std::unique_ptr<runtime::Stage>(new runtime::EmulatedStage(o));
    };
    runtime::EngineOptions options;
    options.optimizer = runtime::OptimizerConfig::Sgd(/*momentum=*/0.9);
    options.lr_schedule.base_lr = 1e-3;
    options.timeout = absl::Seconds(120);
    auto engine = runtime::Engine::Create(*plan, &world, factory, options);
    if (!engine.ok()) return Fail(engine.status());
    double total = 0;
    double bubble = 0;
    std::vector<runtime::ActionTiming> timings;  // every measured iteration
    std::vector<runtime::ActionTiming> last_timings;
    for (int it = 0; it <= iterations; ++it) {
      (*engine)->set_record_timeline(it > 0);
      auto result = (*engine)->RunIteration();
      if (!result.ok()) return Fail(result.status());
      auto slowest = MaxOverRanks(world, result->seconds);
      if (!slowest.ok()) return Fail(slowest.status());
      if (it > 0) {
        total += *slowest;
        bubble += result->bubble_ratio;
        timings.insert(timings.end(), result->timings.begin(), result->timings.end());
        last_timings = result->timings;
      }
    }
    auto simulated = pipeline::Simulate((*engine)->schedule(), costs);
    if (!simulated.ok()) return Fail(simulated.status());
    const double measured = total / iterations;
    auto merged = (*engine)->GatherTimeline();
    if (!merged.ok()) return Fail(merged.status());
    auto all_timings = (*engine)->GatherTimings(timings);
    if (!all_timings.ok()) return Fail(all_timings.status());
    auto last_world = (*engine)->GatherTimings(last_timings);
    if (!last_world.ok()) return Fail(last_world.status());
    if (root) {
      auto measured_costs = runtime::MeasuredCosts(*all_timings, spec);
      if (!measured_costs.ok()) return Fail(measured_costs.status());
      auto with_measured = pipeline::Simulate((*engine)->schedule(), *measured_costs);
      if (!with_measured.ok()) return Fail(with_measured.status());
      std::printf("%-12s %12.1f %13.1f %7.3f %14.1f %7.3f %8.3f\n",
                  std::string(pipeline::ScheduleKindName(v.kind)).c_str(), measured * 1e3,
                  simulated->makespan_seconds * 1e3, measured / simulated->makespan_seconds,
                  with_measured->makespan_seconds * 1e3,
                  measured / with_measured->makespan_seconds, bubble / iterations);
      if (!timeline_dir.empty()) {
        ChromeTrace last = runtime::SelectIteration(*merged, iterations);
        auto range = runtime::IterationRange(*last_world);
        if (!range.ok()) return Fail(range.status());
        auto predicted =
            runtime::AddPrediction((*engine)->schedule(), costs, range->start_seconds, &last);
        if (!predicted.ok()) return Fail(predicted.status());
        const std::string path = absl::StrCat(timeline_dir, "/emulated_",
                                              pipeline::ScheduleKindName(v.kind), ".trace.json");
        absl::Status s = last.WriteFile(path);
        if (!s.ok()) return Fail(s);
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Every schedule run by the engine with emulated-compute stages, measured iteration time "
      "against the simulator's makespan. Run under mpirun, one rank per pipeline position: "
      "mpirun -np 4 runtime_emulated_bench [flags]");
  absl::ParseCommandLine(argc, argv);
  return tandem::Run();
}
