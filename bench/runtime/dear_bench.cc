// DeAR against the plain bucketed all-reduce on a data-parallel training step whose compute is
// emulated: every layer's forward and backward take a fixed time (the thread sleeps, so two
// cores carry two ranks), while gradient synchronisation and the optimizer run for real on
// real buffers.
//
//   mpirun -np 2 dear_bench                                  # 12 layers x 2 MiB, SGD
//   mpirun -np 2 dear_bench --layers=8 --layer_bytes=8MiB --forward_ms=3 --backward_ms=6
//   mpirun -np 2 dear_bench --optimizer=adamw --bucket_bytes=4MiB,25MiB --layouts=arena
//
// Printed per strategy and bucket size: the iteration time (forward to forward; per iteration
// the slowest rank, then the median over iterations), and against it the lower bound
// max(compute, communication), where compute is the emulated forward + backward time measured
// without any communication (a loaded machine wakes sleepers late) and communication the time
// of one all-reduce of every gradient (one bucket, alone on the same ranks), both measured just
// before the row; plus the no-overlap time compute + communication + optimizer step.
// "of bound" = bound / iteration (100% = perfect overlap).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "comm/buffer.h"
#include "runtime/grad_sync.h"
#include "comm/mpi/mpi_communicator.h"
#include "common/units.h"

ABSL_FLAG(int, layers, 12, "layers of the emulated model");
ABSL_FLAG(std::string, layer_bytes, "2MiB", "float32 parameter bytes per layer");
ABSL_FLAG(double, forward_ms, 1.0, "emulated forward time per layer");
ABSL_FLAG(double, backward_ms, 2.0, "emulated backward time per layer");
ABSL_FLAG(int, iterations, 10, "measured iterations per configuration");
ABSL_FLAG(int, warmup, 3, "unmeasured iterations per configuration");
ABSL_FLAG(std::string, bucket_bytes, "2MiB,8MiB,25MiB,auto",
          "bucket sizes to compare ('auto' too)");
ABSL_FLAG(std::string, optimizer, "sgd", "sgd (momentum 0.9) or adamw");
ABSL_FLAG(std::string, strategies, "allreduce,dear", "strategies to compare");
ABSL_FLAG(std::string, layouts, "arena,separate",
          "parameter layouts: arena (one buffer, buckets in place) and/or separate (packed)");

namespace {

using tandem::comm::CpuBuffer;
using tandem::runtime::GradientSync;
using tandem::runtime::GradSyncOptions;
using tandem::runtime::GradSyncStrategy;
using tandem::comm::MpiCommunicator;
using tandem::runtime::OptimizerConfig;
using tandem::runtime::SyncParameter;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Sleeps `ms` milliseconds, finishing the last stretch by polling the clock so that emulated
// layers take their time to within a few microseconds.
void Compute(double ms) {
  const double end = Now() + ms * 1e-3;
  constexpr double kSpinSeconds = 200e-6;
  if (ms * 1e-3 > kSpinSeconds) {
    std::this_thread::sleep_for(std::chrono::duration<double>(ms * 1e-3 - kSpinSeconds));
  }
  while (Now() < end) std::this_thread::yield();
}

// Per-iteration times: the slowest rank's time for each iteration, then the median over
// iterations (robust to a loaded machine's occasional late wake-ups).
double MedianOverIterations(std::vector<double> seconds) {
  MPI_Allreduce(MPI_IN_PLACE, seconds.data(), static_cast<int>(seconds.size()), MPI_DOUBLE,
                MPI_MAX, MPI_COMM_WORLD);
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

void Check(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// The emulated model's parameters. With `arena`, values and gradients live in one buffer each,
// laid out in backward order (as a runtime allocating them together would), so buckets
// communicate in place; otherwise every layer has its own buffers and buckets pack them.
struct Model {
  std::vector<float> value_arena, grad_arena;
  std::vector<std::vector<float>> values, grads;
  int layers;
  int64_t count;
  bool arena;
  Model(int layers, int64_t count, bool arena) : layers(layers), count(count), arena(arena) {
    if (arena) {
      value_arena.assign(static_cast<size_t>(layers) * count, 0.01f);
      grad_arena.assign(value_arena.size(), 0.001f);
      return;
    }
    for (int l = 0; l < layers; ++l) {
      values.emplace_back(count, 0.01f * l);
      grads.emplace_back(count, 0.001f);
    }
  }
  // Backward order: the last layer first.
  std::vector<SyncParameter> Views() {
    std::vector<SyncParameter> views;
    for (int l = layers - 1; l >= 0; --l) {
      const size_t slot = static_cast<size_t>(layers - 1 - l) * count;  // arena position
      float* value = arena ? value_arena.data() + slot : values[l].data();
      float* grad = arena ? grad_arena.data() + slot : grads[l].data();
      views.push_back({"layer" + std::to_string(l), CpuBuffer(value, count),
                       CpuBuffer(grad, count)});
    }
    return views;
  }
};

// Median iteration seconds of the emulated compute alone: what the sleeps really take on this
// machine (a loaded machine wakes sleepers late).
double RunComputeOnly(int layers, int iterations) {
  const double forward_ms = absl::GetFlag(FLAGS_forward_ms);
  const double backward_ms = absl::GetFlag(FLAGS_backward_ms);
  std::vector<double> seconds;
  MPI_Barrier(MPI_COMM_WORLD);
  for (int it = 0; it < iterations; ++it) {
    const double start = Now();
    for (int l = 0; l < layers; ++l) Compute(forward_ms);
    for (int l = 0; l < layers; ++l) Compute(backward_ms);
    seconds.push_back(Now() - start);
  }
  return MedianOverIterations(seconds);
}

// Median seconds of one all-reduce of `data` (every gradient in one bucket) through tandem.
double RunCommunicationOnly(MpiCommunicator& comm, std::vector<float>& data, int repeats) {
  std::vector<double> seconds;
  Check(comm.AllReduce(CpuBuffer(data.data(), data.size()))->Wait(), "all-reduce");
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < repeats; ++i) {
    const double start = Now();
    Check(comm.AllReduce(CpuBuffer(data.data(), data.size()))->Wait(), "all-reduce");
    seconds.push_back(Now() - start);
  }
  return MedianOverIterations(seconds);
}

// Medians over iterations (slowest rank each) of the iteration and of the time spent in
// gradient synchronisation: waiting for parameters in forward, in GradReady (packing and
// posting), in FinishBackward, and in Step.
struct IterationTimes {
  double iteration = 0;
  double forward_wait = 0;
  double grad_ready = 0;
  double finish_backward = 0;
  double step = 0;
};

IterationTimes RunIterations(GradientSync& sync, int layers, int iterations, int warmup) {
  const double forward_ms = absl::GetFlag(FLAGS_forward_ms);
  const double backward_ms = absl::GetFlag(FLAGS_backward_ms);
  std::vector<double> total, forward_wait, grad_ready, finish, step;
  for (int it = 0; it < warmup + iterations; ++it) {
    if (it == warmup) MPI_Barrier(MPI_COMM_WORLD);
    const double start = Now();
    double waited = 0, readied = 0;
    for (int l = 0; l < layers; ++l) {
      const double before = Now();
      Check(sync.WaitForParameters(layers - 1 - l), "wait for parameters");
      waited += Now() - before;
      Compute(forward_ms);
    }
    for (int l = layers - 1; l >= 0; --l) {
      Compute(backward_ms);
      const double before = Now();
      Check(sync.GradReady(layers - 1 - l), "grad ready");
      readied += Now() - before;
    }
    const double backward_end = Now();
    Check(sync.FinishBackward(), "finish backward");
    const double finished = Now();
    Check(sync.Step(/*lr=*/1e-3), "step");
    // DeAR's all-gathers are still in flight here: they overlap the next forward, and an
    // iteration is measured from forward to forward.
    const double end = Now();
    if (it < warmup) continue;
    total.push_back(end - start);
    forward_wait.push_back(waited);
    grad_ready.push_back(readied);
    finish.push_back(finished - backward_end);
    step.push_back(end - finished);
  }
  Check(sync.Flush(), "flush");
  IterationTimes times;
  times.iteration = MedianOverIterations(total);
  times.forward_wait = MedianOverIterations(forward_wait);
  times.grad_ready = MedianOverIterations(grad_ready);
  times.finish_backward = MedianOverIterations(finish);
  times.step = MedianOverIterations(step);
  return times;
}

// One row of the table: a layout, a strategy and a bucket size.
struct Row {
  std::string layout;
  std::string strategy;
  std::string bucket;  // a size, or "auto"
};

void RunRow(MpiCommunicator& comm, const Row& row, int layers, int64_t layer_count,
            const OptimizerConfig& optimizer, std::vector<float>& all_gradients) {
  const int iterations = absl::GetFlag(FLAGS_iterations);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  auto strategy = tandem::runtime::ParseGradSyncStrategy(row.strategy);
  Check(strategy.status(), "--strategies");
  Model model(layers, layer_count, /*arena=*/row.layout == "arena");
  GradSyncOptions options;
  options.strategy = *strategy;
  options.optimizer = optimizer;
  int extra_warmup = 0;
  if (row.bucket == "auto") {
    options.auto_bucket = true;
    options.tune_iterations = 2;
    extra_warmup = 3 * static_cast<int>(options.candidate_bucket_bytes.size());
  } else {
    auto bytes = tandem::ParseBytes(row.bucket);
    Check(bytes.status(), "--bucket_bytes");
    options.bucket_bytes = static_cast<int64_t>(*bytes);
  }
  auto sync = GradientSync::Create(comm, model.Views(), options);
  Check(sync.status(), "create");
  // The optimizer step alone (for the no-overlap figure).
  Check((*sync)->FinishBackward(), "finish");
  MPI_Barrier(MPI_COMM_WORLD);
  const double step_start = Now();
  Check((*sync)->Step(1e-3), "step");
  Check((*sync)->Flush(), "flush");
  double step_seconds = Now() - step_start;
  MPI_Allreduce(MPI_IN_PLACE, &step_seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double compute = RunComputeOnly(layers, iterations);
  const double communication = RunCommunicationOnly(comm, all_gradients, /*repeats=*/5);
  const double bound = std::max(compute, communication);
  const IterationTimes times = RunIterations(**sync, layers, iterations, warmup + extra_warmup);
  if (comm.rank() != 0) return;
  std::string label = row.bucket;
  if (row.bucket == "auto") {
    label = "auto:" + std::to_string((*sync)->bucket_bytes() >> 20) + "MiB";
  }
  std::printf("%-8s %-10s %-11s | %9.1f | %8.1f %8.1f %9.1f %10.1f | %7.1f%% | %8.1f %6.1f "
              "%6.1f %6.1f\n",
              row.layout.c_str(), row.strategy.c_str(), label.c_str(), times.iteration * 1e3,
              compute * 1e3, communication * 1e3, bound * 1e3,
              (compute + communication + step_seconds) * 1e3, 100.0 * bound / times.iteration,
              times.forward_wait * 1e3, times.grad_ready * 1e3, times.finish_backward * 1e3,
              times.step * 1e3);
  if (row.bucket == "auto") std::printf("#   tuning: %s\n", (*sync)->TuningReport().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  absl::SetProgramUsageMessage(
      "DeAR against the plain bucketed all-reduce on a data-parallel step with emulated "
      "compute: iteration time against max(compute, communication). Run under mpirun: mpirun "
      "-np 2 dear_bench [flags]");
  absl::ParseCommandLine(argc, argv);
  auto created = MpiCommunicator::World();
  Check(created.status(), "world");
  MpiCommunicator& comm = **created;
  const int rank = comm.rank();
  const int layers = absl::GetFlag(FLAGS_layers);
  auto layer_bytes = tandem::ParseBytes(absl::GetFlag(FLAGS_layer_bytes));
  Check(layer_bytes.status(), "--layer_bytes");
  const int64_t layer_count = static_cast<int64_t>(*layer_bytes) / 4;
  const OptimizerConfig optimizer = absl::GetFlag(FLAGS_optimizer) == "adamw"
                                        ? OptimizerConfig::AdamW()
                                        : OptimizerConfig::Sgd(/*momentum=*/0.9);
  const double compute_seconds =
      layers * (absl::GetFlag(FLAGS_forward_ms) + absl::GetFlag(FLAGS_backward_ms)) * 1e-3;

  std::vector<float> all(static_cast<size_t>(layer_count) * layers, 1.0f);
  if (rank == 0) {
    std::printf("# dear_bench: %d ranks, %d layers x %.2f MiB float32 (%.1f MiB), forward %.2f ms"
                " + backward %.2f ms per layer, %s\n",
                comm.size(), layers, layer_count * 4 / 1048576.0,
                layer_count * 4.0 * layers / 1048576.0, absl::GetFlag(FLAGS_forward_ms),
                absl::GetFlag(FLAGS_backward_ms), absl::GetFlag(FLAGS_optimizer).c_str());
    std::printf("# compute %.1f ms nominal per iteration. Per row, measured just before it"
                " (medians over iterations):\n# compute = the sleeps alone, comm = one all-reduce"
                " of all gradients alone, bound = max(compute, comm),\n# no-overlap = compute +"
                " comm + optimizer step; of bound = bound / iteration\n",
                compute_seconds * 1e3);
    std::printf("# in sync: median ms per iteration waiting for parameters in forward (fwd-wait),"
                " in GradReady (ready), in FinishBackward (finish), in Step (step)\n");
    std::printf("%-8s %-10s %-11s | %9s | %8s %8s %9s %10s | %8s | %8s %6s %6s %6s\n",
                "layout", "strategy", "bucket", "iter(ms)", "compute", "comm", "bound",
                "no-overlap", "of bound", "fwd-wait", "ready", "finish", "step");
  }
  const std::vector<std::string> layouts = absl::StrSplit(absl::GetFlag(FLAGS_layouts), ',');
  const std::vector<std::string> strategies =
      absl::StrSplit(absl::GetFlag(FLAGS_strategies), ',');
  const std::vector<std::string> buckets = absl::StrSplit(absl::GetFlag(FLAGS_bucket_bytes), ',');
  for (const std::string& layout : layouts) {
    for (const std::string& strategy : strategies) {
      for (const std::string& bucket : buckets) {
        RunRow(comm, Row{layout, strategy, bucket}, layers, layer_count, optimizer, all);
      }
    }
  }
  created->reset();
  MPI_Finalize();
  return 0;
}
