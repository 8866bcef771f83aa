// What the LibTorch adapter costs: one iteration (M micro-batches, forward and backward) of a
// GPT with plain LibTorch against the same work through TorchStage (one stage, two stages with
// tensors passed by hand, recomputation, zero-bubble split backward), and the profiler's
// prediction (sum over layers of forward + backward, times M) against the plain measurement.
// Median of --repeats after --warmup, one process, intra-op threads as LibTorch chooses
// (set OMP_NUM_THREADS to pin them).
//
//   build/bench/torch/torch_stage_bench --layers 4 --hidden 64 --seq-len 32 --microbatch-size 4
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/autograd.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/profiler.h"
#include "runtime/torch/torch_stage.h"

ABSL_FLAG(int, layers, 4, "GPT blocks");
ABSL_FLAG(int, hidden, 64, "hidden size");
ABSL_FLAG(int, heads, 4, "attention heads");
ABSL_FLAG(int, seq_len, 32, "sequence length");
ABSL_FLAG(int, microbatch_size, 4, "samples per micro-batch");
ABSL_FLAG(int, microbatches, 4, "micro-batches per iteration");
ABSL_FLAG(int, warmup, 2, "untimed iterations");
ABSL_FLAG(int, repeats, 7, "timed iterations (median reported)");

namespace tandem::runtime::libtorch {
namespace {

double MedianSeconds(const std::function<void()>& iteration) {
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) iteration();
  std::vector<double> seconds;
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    const auto start = std::chrono::steady_clock::now();
    iteration();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

void Check(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    std::exit(1);
  }
}

enum class Backward { kFull, kSplit };

// One iteration through `stages` (a pipeline cut), GPipe order, tensors passed by hand.
void RunStages(std::vector<std::unique_ptr<TorchStage>>& stages, int microbatches,
               Backward backward) {
  for (auto& stage : stages) Check(stage->BeginIteration(0));
  for (int m = 0; m < microbatches; ++m) {
    std::vector<Tensor> x;
    for (auto& stage : stages) x = stage->Forward(m, x).value();
  }
  for (int m = 0; m < microbatches; ++m) {
    std::vector<Tensor> g;
    for (int s = static_cast<int>(stages.size()) - 1; s >= 0; --s) {
      g = backward == Backward::kFull ? stages[s]->Backward(m, g).value()
                                      : stages[s]->BackwardInput(m, g).value();
    }
  }
  if (backward == Backward::kSplit) {
    for (auto& stage : stages) {
      for (int m = 0; m < microbatches; ++m) Check(stage->BackwardWeight(m));
    }
  }
}

int Main() {
  GptConfig config;
  config.layers = absl::GetFlag(FLAGS_layers);
  config.hidden = absl::GetFlag(FLAGS_hidden);
  config.heads = absl::GetFlag(FLAGS_heads);
  config.seq_len = absl::GetFlag(FLAGS_seq_len);
  const int microbatches = absl::GetFlag(FLAGS_microbatches);
  const int64_t microbatch_size = absl::GetFlag(FLAGS_microbatch_size);
  Check(ValidateGptConfig(config));
  const LayeredModel model = GptModelSpec(config).Build(/*seed=*/1).value();
  const std::shared_ptr<Dataset> data =
      MakeSyntheticDataset({config.vocab, config.seq_len, /*seed=*/2}).value();
  const Batch batch = data->Samples(0, 0, microbatches * microbatch_size).value();
  const int num_layers = model.num_layers();

  std::vector<torch::Tensor> parameters;
  for (auto& named : model.NamedParameters(0, num_layers)) parameters.push_back(named.second);
  const double plain = MedianSeconds([&] {
    for (auto& p : parameters) p.mutable_grad() = torch::Tensor();
    for (int m = 0; m < microbatches; ++m) {
      const auto inputs = batch.inputs.narrow(0, m * microbatch_size, microbatch_size);
      const auto targets = batch.targets.narrow(0, m * microbatch_size, microbatch_size);
      (model.loss(model.Forward(inputs, 0, num_layers), targets) / microbatches).backward();
    }
  });

  auto make = [&](std::vector<std::pair<int, int>> cuts, std::vector<int> recompute) {
    std::vector<std::unique_ptr<TorchStage>> stages;
    for (auto [first, end] : cuts) {
      TorchStageOptions options;
      options.first_layer = first;
      options.end_layer = end;
      options.recompute_layers = recompute;
      options.microbatches = microbatches;
      options.microbatch_size = microbatch_size;
      stages.push_back(TorchStage::Create(model, data, options).value());
    }
    return stages;
  };
  std::vector<int> all_layers(num_layers);
  for (int l = 0; l < num_layers; ++l) all_layers[l] = l;
  const int middle = num_layers / 2;
  struct Row {
    const char* name;
    std::vector<std::pair<int, int>> cuts;
    std::vector<int> recompute;
    Backward backward;
  };
  const std::vector<Row> rows = {
      {"TorchStage, 1 stage", {{0, num_layers}}, {}, Backward::kFull},
      {"TorchStage, 2 stages", {{0, middle}, {middle, num_layers}}, {}, Backward::kFull},
      {"2 stages, split backward", {{0, middle}, {middle, num_layers}}, {}, Backward::kSplit},
      {"2 stages, recompute all", {{0, middle}, {middle, num_layers}}, all_layers,
       Backward::kFull},
  };
  std::printf("GPT L=%lld H=%lld S=%lld, %d micro-batches of %lld, median of %d\n",
              static_cast<long long>(config.layers), static_cast<long long>(config.hidden),
              static_cast<long long>(config.seq_len), microbatches,
              static_cast<long long>(microbatch_size), absl::GetFlag(FLAGS_repeats));
  std::printf("%-28s %12s %10s\n", "iteration (fw + bw)", "ms", "vs plain");
  std::printf("%-28s %12.2f %10s\n", "plain LibTorch", plain * 1e3, "1.00");
  for (const Row& row : rows) {
    auto stages = make(row.cuts, row.recompute);
    const double seconds = MedianSeconds([&] { RunStages(stages, microbatches, row.backward); });
    std::printf("%-28s %12.2f %10.2f\n", row.name, seconds * 1e3, seconds / plain);
  }
  ProfilerOptions profiler;
  profiler.microbatch_size = microbatch_size;
  profiler.warmup = absl::GetFlag(FLAGS_warmup);
  profiler.repeats = absl::GetFlag(FLAGS_repeats);
  const pipeline::Profile profile = ProfileModel(model, *data, profiler).value();
  const double predicted =
      (profile.TotalForwardSeconds() + profile.TotalBackwardSeconds()) * microbatches;
  std::printf("%-28s %12.2f %10.2f\n", "profile prediction", predicted * 1e3, predicted / plain);
  return 0;
}

}  // namespace
}  // namespace tandem::runtime::libtorch

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "What the LibTorch adapter costs: a GPT iteration with plain LibTorch against the same "
      "work through TorchStage, and the profiler's prediction. torch_stage_bench [flags]");
  absl::ParseCommandLine(argc, argv);
  return tandem::runtime::libtorch::Main();
}
