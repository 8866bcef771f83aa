// Prints the planner's figures: results and planning times side by side with the published
// planners' own figures (PipeDream's optimizer on VGG-16, Piper on BERT-32), every algorithm on
// a 96-layer GPT-3 (175B) at 1,024 and 4,096 devices, how planning time grows with layers and
// devices, and AdaPipe's predicted speedup over Megatron-LM's default (uniform partition, full
// recomputation). Times are processor seconds of one core (the planners are
// single-threaded), the best of a few runs.
//
//   planner_bench [--quick]      (--quick: fewer repetitions and sizes)
#include <algorithm>
#include <ctime>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "planner/adapipe.h"
#include "planner/gpt_profile.h"
#include "planner/importers.h"
#include "planner/layer_chain.h"
#include "planner/pipedream.h"
#include "planner/piper.h"
#include "planner/planner.h"

namespace tandem::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kPipeDreamBandwidth = 1e9;
constexpr double kNvlink = 300e9;      // A100 NVLink, bytes/s
constexpr double kInfiniBand = 25e9;   // per-node network, bytes/s
constexpr double kA100Memory = 80e9;
constexpr double kA100SmallMemory = 40e9;
constexpr int kDevicesPerNode = 8;
constexpr int kGpt3Microbatches = 1536;  // GPT-3's batch of 1536 sequences, micro-batch 1
// Piper's reference run (algo.cpp single()) took 2.7 s of one core.
constexpr double kPiperReferenceSeconds = 2.7;

int repetitions = 3;

std::string DataPath(const std::string& name) {
  return std::string(TANDEM_BENCH_DATA_DIR) + "/" + name;
}

// Best processor time (one core: the planners are single-threaded) of `repetitions` runs.
double Time(const std::function<void()>& run) {
  double best = 1e300;
  for (int i = 0; i < repetitions; ++i) {
    const std::clock_t start = std::clock();
    run();
    best = std::min(best, static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC);
  }
  return best;
}

void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) {
    std::cerr << what << ": " << status << "\n";
    std::exit(1);
  }
}

void ReferenceFigures() {
  std::cout << "== Reference figures: tandem vs the published planners on their own profiles ==\n";
  std::cout << absl::StrFormat("%-44s %-14s %-14s %-10s %s\n", "case", "tandem", "reference",
                               "ratio", "planning time");
  auto vgg = ReadPipeDreamGraphFile(DataPath("pipedream/vgg16.graph.txt"));
  Check(vgg.status(), "vgg16");
  auto chain = LayerChain::FromProfile(*vgg);
  Check(chain.status(), "vgg16 chain");
  struct Case {
    const char* name;
    int machines;
    bool straight;
    double reference;
  };
  for (const Case& c : {Case{"vgg16 PipeDream single machine", 1, false, 0.672535},
                        Case{"vgg16 PipeDream straight, 2 stages", 2, true, 0.370931},
                        Case{"vgg16 PipeDream straight, 4 stages", 4, true, 0.21645},
                        Case{"vgg16 PipeDream replicated, 4 machines", 4, false, 0.175732624},
                        Case{"vgg16 PipeDream replicated, 8 machines", 8, false, 0.09351323}}) {
    PipeDreamOptions options;
    options.levels = {{c.machines, kPipeDreamBandwidth}};
    options.straight = c.straight;
    double result = 0;
    const double seconds = Time([&] {
      auto r = RunPipeDream(*chain, options);
      Check(r.status(), c.name);
      result = r->bottleneck_seconds;
    });
    std::cout << absl::StrFormat("%-44s %-14.9g %-14.9g %-10.6f %.3g ms\n", c.name, result,
                                 c.reference, result / c.reference, seconds * 1e3);
  }
  auto bert = ReadPiperFile(DataPath("piper/bert32a100.json"));
  Check(bert.status(), "bert32a100");
  bert->max_devices = 512;
  bert->memory_per_device_bytes = 8 * kGiB;
  bert->microbatches_per_batch = 1920;
  bert->bandwidth_bytes_per_second = 25 * kGiB;
  for (KnapsackMode mode : {KnapsackMode::kGreedy, KnapsackMode::kExact}) {
    PiperOptions options;
    options.knapsack = mode;
    PiperResult result;
    const double seconds = Time([&] {
      auto r = RunPiper(*bert, options);
      Check(r.status(), "piper bert");
      result = *r;
    });
    const std::string name = absl::StrFormat(
        "bert32 Piper 512 dev, 8 GiB, 1920 mb (%s)",
        mode == KnapsackMode::kGreedy ? "greedy" : "exact");
    std::cout << absl::StrFormat("%-44s %-14.9g %-14.9g %-10.6f %.3f s (Piper: %.1f s, %.1fx "
                                 "faster); %d devices (Piper: 510)\n",
                                 name, result.time_per_sample, 0.00256113,
                                 result.time_per_sample / 0.00256113, seconds,
                                 kPiperReferenceSeconds, kPiperReferenceSeconds / seconds,
                                 result.devices_used);
  }
  std::cout << "\n";
}

PlanRequest GptRequest(Algorithm algorithm, int layers, int devices) {
  GptShape shape = Gpt3Shape();
  shape.layers = layers;
  PlanRequest request;
  request.algorithm = algorithm;
  request.profile = MakeGptProfile(shape, A100Figures());
  auto cluster = MakeCluster(devices, kDevicesPerNode, kA100Memory, {kNvlink, kInfiniBand});
  Check(cluster.status(), "cluster");
  request.cluster = *cluster;
  request.microbatches = kGpt3Microbatches;
  if (algorithm == Algorithm::kPipeDream) {
    // PipeDream's memory estimate does not know tensor parallelism: plan without it, and let
    // the pipeline leave devices unused (the O(L^2 N) search).
    request.cluster.device_memory_bytes = 0;
    request.use_fewer_machines = true;
  }
  return request;
}

std::string Describe(const PlanOutcome& outcome) {
  const pipeline::Plan& plan = outcome.plan;
  if (plan.algorithm == "pipedream") {
    return absl::StrFormat("bottleneck %.4g s/stage, %d stages", plan.bottleneck_seconds,
                           static_cast<int>(plan.stages.size()));
  }
  if (plan.algorithm == "piper") {
    return absl::StrFormat("time per sample %.4g s, %d stages", plan.time_per_sample,
                           static_cast<int>(plan.stages.size()));
  }
  return absl::StrFormat("iteration %.4g s, D=%d p=%d t=%d", plan.predicted_iteration_seconds,
                         plan.data_parallel, plan.pipeline_parallel, plan.tensor_parallel);
}

void Gpt3AtScale(bool quick) {
  std::cout << "== GPT-3 175B (96 layers, A100 80 GB, 8 per node, 300 GB/s + 25 GB/s, 1536 "
               "micro-batches) ==\n";
  std::cout << "goal: PipeDream and AdaPipe under 1 s, Piper under 10 s on one core\n";
  std::cout << absl::StrFormat("%-10s %-8s %-12s %s\n", "algorithm", "devices", "planning",
                               "result");
  for (int devices : {1024, 4096}) {
    for (Algorithm algorithm : {Algorithm::kPipeDream, Algorithm::kPiper, Algorithm::kAdaPipe}) {
      const PlanRequest request = GptRequest(algorithm, 96, devices);
      PlanOutcome outcome;
      const double seconds = Time([&] {
        auto r = MakePlan(request);
        Check(r.status(), "gpt3");
        outcome = *r;
      });
      std::cout << absl::StrFormat("%-10s %-8d %-12s %s\n", AlgorithmName(algorithm), devices,
                                   absl::StrFormat("%.3f s", seconds), Describe(outcome));
    }
  }
  // PipeDream's default (every machine used) is O(L^2 N^2).
  for (int devices : quick ? std::vector<int>{1024} : std::vector<int>{1024, 4096}) {
    PlanRequest request = GptRequest(Algorithm::kPipeDream, 96, devices);
    request.use_fewer_machines = false;
    PlanOutcome outcome;
    const int saved = repetitions;
    repetitions = 1;
    const double seconds = Time([&] {
      auto r = MakePlan(request);
      Check(r.status(), "gpt3 pipedream all machines");
      outcome = *r;
    });
    repetitions = saved;
    std::cout << absl::StrFormat("%-10s %-8d %-12s %s (every machine used, PipeDream's "
                                 "default)\n",
                                 "pipedream", devices, absl::StrFormat("%.3f s", seconds),
                                 Describe(outcome));
  }
  std::cout << "\n";
}

void Growth(bool quick) {
  std::cout << "== Planning time growth (seconds) ==\n";
  const std::vector<int> layer_counts =
      quick ? std::vector<int>{24, 96} : std::vector<int>{24, 48, 96, 192};
  std::cout << absl::StrFormat("%-10s", "layers");
  for (int layers : layer_counts) std::cout << absl::StrFormat(" %-10d", layers);
  std::cout << "   (1,024 devices)\n";
  for (Algorithm algorithm : {Algorithm::kPipeDream, Algorithm::kPiper, Algorithm::kAdaPipe}) {
    std::cout << absl::StrFormat("%-10s", AlgorithmName(algorithm));
    for (int layers : layer_counts) {
      const PlanRequest request = GptRequest(algorithm, layers, 1024);
      const double seconds = Time([&] { Check(MakePlan(request).status(), "growth"); });
      std::cout << absl::StrFormat(" %-10.3g", seconds);
    }
    std::cout << "\n";
  }
  const std::vector<int> device_counts =
      quick ? std::vector<int>{256, 4096} : std::vector<int>{256, 512, 1024, 2048, 4096, 8192};
  std::cout << absl::StrFormat("%-10s", "devices");
  for (int devices : device_counts) std::cout << absl::StrFormat(" %-10d", devices);
  std::cout << "   (96 layers)\n";
  for (Algorithm algorithm : {Algorithm::kPipeDream, Algorithm::kPiper, Algorithm::kAdaPipe}) {
    std::cout << absl::StrFormat("%-10s", AlgorithmName(algorithm));
    for (int devices : device_counts) {
      const PlanRequest request = GptRequest(algorithm, 96, devices);
      const double seconds = Time([&] { Check(MakePlan(request).status(), "growth"); });
      std::cout << absl::StrFormat(" %-10.3g", seconds);
    }
    std::cout << "\n";
  }
  std::cout << "\n";
}

void AdaPipeVsMegatron() {
  std::cout << "== AdaPipe vs Megatron-LM default (uniform partition, full recomputation), "
               "GPT-3 175B on A100 80 GB and 40 GB ==\n";
  std::cout << "AdaPipe paper: up to 1.32x on GPT-3 175B\n";
  std::cout << absl::StrFormat("%-34s %-6s %-4s %-4s %-6s %-12s %-12s %s\n", "profile", "D", "p",
                               "t", "memory", "Megatron", "AdaPipe", "speedup");
  // Whole transformer layers, attention and MLP as parts (recomputed separately), and whole
  // layers with sequence parallelism (activations outside the products split by t: less to
  // keep, so less to recompute).
  struct Kind {
    const char* name;
    bool split;
    bool sequence_parallel;
  };
  for (double memory : {kA100Memory, kA100SmallMemory})
  for (const Kind& kind : {Kind{"gpt3-175b, whole layers", false, false},
                           Kind{"gpt3-175b, attention/MLP parts", true, false},
                           Kind{"gpt3-175b, sequence parallel", false, true}}) {
    GptShape shape = Gpt3Shape();
    shape.split_blocks = kind.split;
    shape.sequence_parallel = kind.sequence_parallel;
    const pipeline::Profile profile = MakeGptProfile(shape, A100Figures());
    struct Shape {
      int data_parallel, stages, tensor_parallel;
    };
    for (const Shape& s : {Shape{8, 16, 8}, Shape{16, 8, 8}, Shape{32, 16, 8}}) {
      auto at_t = ProfileAtTensorParallel(profile, s.tensor_parallel);
      Check(at_t.status(), "tp");
      auto chain = LayerChain::FromProfile(*at_t);
      Check(chain.status(), "chain");
      const int m = kGpt3Microbatches / s.data_parallel;
      const AdaPipeOptions options{s.stages, m, memory, true, kInfiniBand};
      auto adaptive = RunAdaPipe(*chain, options);
      auto uniform = UniformFullRecompute(*chain, options);
      if (!adaptive.ok() || !uniform.ok()) {
        std::cout << absl::StrFormat(
            "%-34s %-6d %-4d %-4d %-6s %s\n", kind.name, s.data_parallel, s.stages,
            s.tensor_parallel,
            absl::StrFormat("%.0fGB", memory / 1e9),
            adaptive.ok() ? "Megatron's layout does not fit" : "does not fit");
        continue;
      }
      std::cout << absl::StrFormat(
          "%-34s %-6d %-4d %-4d %-6s %-12s %-12s %.3fx\n", kind.name, s.data_parallel,
          s.stages, s.tensor_parallel, absl::StrFormat("%.0fGB", memory / 1e9),
          absl::StrFormat("%.3f s", uniform->iteration_seconds),
          absl::StrFormat("%.3f s", adaptive->iteration_seconds),
          uniform->iteration_seconds / adaptive->iteration_seconds);
    }
  }
  // The Metis GPT-3 sample (10 layer groups) on 4 stages with 16 GB.
  auto metis = ReadProfileAs(DataPath("metis/gpt3_a100_tp1_bs1.json"), "metis");
  Check(metis.status(), "metis");
  auto chain = LayerChain::FromProfile(*metis);
  Check(chain.status(), "metis chain");
  const AdaPipeOptions options{4, 32, 16e9, true, kInfiniBand};
  auto adaptive = RunAdaPipe(*chain, options);
  auto uniform = UniformFullRecompute(*chain, options);
  Check(adaptive.status(), "metis adapipe");
  Check(uniform.status(), "metis uniform");
  std::cout << absl::StrFormat("%-34s %-6d %-4d %-4d %-6s %-12s %-12s %.3fx\n",
                               "metis gpt3 (tp1, bs1)", 1, 4, 1, "16GB",
                               absl::StrFormat("%.3f s", uniform->iteration_seconds),
                               absl::StrFormat("%.3f s", adaptive->iteration_seconds),
                               uniform->iteration_seconds / adaptive->iteration_seconds);
  std::cout << "\n";
}

}  // namespace
}  // namespace tandem::planner

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (quick) tandem::planner::repetitions = 1;
  tandem::planner::ReferenceFigures();
  tandem::planner::Gpt3AtScale(quick);
  tandem::planner::AdaPipeVsMegatron();
  tandem::planner::Growth(quick);
  return 0;
}
