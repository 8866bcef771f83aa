// Helper program of fault_test.cc (not a test itself): trains with emulated stages under
// mpirun and, on request, kills one rank (SIGKILL, no goodbye) or makes one rank's stage fail
// at a given iteration. Every rank whose engine fails prints "[rank R] error: ..." and exits
// with status 1 without finalising MPI (a peer is gone); ranks that finish print
// "[rank R] done".
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "comm/backend.h"
#include "pipeline/plan.h"
#include "runtime/emulated_stage.h"
#include "runtime/engine.h"

ABSL_FLAG(std::string, schedule, "1f1b", "schedule");
ABSL_FLAG(int, iterations, 20, "iterations to run");
ABSL_FLAG(int, microbatches, 8, "micro-batches");
ABSL_FLAG(double, forward_ms, 2, "emulated forward time (ms)");
ABSL_FLAG(double, backward_ms, 4, "emulated backward time (ms)");
ABSL_FLAG(int, kill_rank, -1, "rank that kills itself (SIGKILL)");
ABSL_FLAG(int, stop_rank, -1, "rank that stops itself (SIGSTOP: alive, silent)");
ABSL_FLAG(int, fail_rank, -1, "rank whose stage returns an error");
ABSL_FLAG(int, at_iteration, 3, "iteration of the kill or the failure");
ABSL_FLAG(double, timeout_s, 5, "engine timeout (seconds)");

namespace tandem::runtime {
namespace {

// An emulated stage that kills its process or fails at one iteration's first forward.
class FaultyStage : public EmulatedStage {
 public:
  FaultyStage(EmulatedStageOptions options, bool kill, bool stop, bool fail, int64_t at)
      : EmulatedStage(options), kill_(kill), stop_(stop), fail_(fail), at_(at) {}
  absl::Status BeginIteration(int64_t iteration) override {
    iteration_ = iteration;
    return EmulatedStage::BeginIteration(iteration);
  }
  absl::StatusOr<std::vector<Tensor>> Forward(int microbatch, std::vector<Tensor> in) override {
    if (iteration_ == at_ && microbatch == 1) {
      if (kill_) std::raise(SIGKILL);
      if (stop_) std::raise(SIGSTOP);
      if (fail_) return absl::DataLossError("injected stage failure");
    }
    return EmulatedStage::Forward(microbatch, std::move(in));
  }

 private:
  bool kill_, stop_, fail_;
  int64_t at_;
  int64_t iteration_ = -1;
};

[[noreturn]] void Exit(int rank, const absl::Status& status) {
  std::fprintf(stderr, "[rank %d] error: %s\n", rank, status.ToString().c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

int Run() {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  if (!world.ok()) Exit(-1, world.status());
  const int rank = (*world)->rank();
  auto kind = pipeline::ParseScheduleKind(absl::GetFlag(FLAGS_schedule));
  if (!kind.ok()) Exit(rank, kind.status());
  pipeline::ScheduleSpec spec;
  spec.kind = *kind;
  spec.num_ranks = (*world)->size();
  spec.num_microbatches = absl::GetFlag(FLAGS_microbatches);
  auto plan = pipeline::MakeUniformPlan(spec.NumStages(), spec, 1, 1);
  if (!plan.ok()) Exit(rank, plan.status());
  const bool kill = absl::GetFlag(FLAGS_kill_rank) == rank;
  const bool stop = absl::GetFlag(FLAGS_stop_rank) == rank;
  const bool fail = absl::GetFlag(FLAGS_fail_rank) == rank;
  const int at = absl::GetFlag(FLAGS_at_iteration);
  StageFactory factory = [&](const StageSpec& s) -> absl::StatusOr<std::unique_ptr<Stage>> {
    EmulatedStageOptions o = EmulatedStageOptionsFor(s);
    o.forward_seconds = absl::GetFlag(FLAGS_forward_ms) * 1e-3;
    o.backward_seconds = absl::GetFlag(FLAGS_backward_ms) * 1e-3;
    o.activation_elements = 64;
    o.parameter_elements = 64;
    return std::unique_ptr<Stage>(new FaultyStage(o, kill, stop, fail, at));
  };
  EngineOptions options;
  options.optimizer = runtime::OptimizerConfig::Sgd(0.9);
  options.lr_schedule.base_lr = 0.01;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  auto engine = Engine::Create(*plan, world->get(), factory, options);
  if (!engine.ok()) Exit(rank, engine.status());
  for (int i = 0; i < absl::GetFlag(FLAGS_iterations); ++i) {
    auto result = (*engine)->RunIteration();
    if (!result.ok()) Exit(rank, result.status());
  }
  std::printf("[rank %d] done\n", rank);
  return 0;
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::runtime::Run();
}
