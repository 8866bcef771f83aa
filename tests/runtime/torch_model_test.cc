// The LibTorch adapter's model side: the batch rule and data sets, GPT construction, the
// single-process reference trainer (the synthetic task's loss falls; stages stepped by hand
// follow it) and the layer profiler.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>

#include "gtest/gtest.h"
#include "pipeline/profile.h"
#include "runtime/lr_schedule.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/model.h"
#include "runtime/torch/profiler.h"
#include "runtime/torch/reference.h"
#include "runtime/torch/torch_stage.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr int64_t kFloatBytes = 4;

GptConfig SmallGpt(int64_t layers = 2, int64_t hidden = 32) {
  GptConfig config;
  config.vocab = 16;
  config.layers = layers;
  config.hidden = hidden;
  config.heads = 4;
  config.seq_len = 12;
  return config;
}

std::shared_ptr<Dataset> SyntheticFor(const GptConfig& config, uint64_t seed = 5) {
  SyntheticTaskOptions task;
  task.vocab = config.vocab;
  task.seq_len = config.seq_len;
  task.seed = seed;
  auto data = MakeSyntheticDataset(task);
  EXPECT_TRUE(data.ok()) << data.status();
  return *data;
}

LayeredModel BuildGpt(const GptConfig& config, uint64_t seed = 3) {
  auto model = GptModelSpec(config).Build(seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

TEST(BatchRuleTest, MicrobatchOfReplicaIsItsSliceOfTheGlobalBatch) {
  // G = 24, D = 2, M = 3: b = 4; replica 1, micro-batch 2 -> samples [(1*3+2)*4, +4).
  auto range = MicrobatchSamples(24, 2, 3, 1, 2);
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->first, 20);
  EXPECT_EQ(range->count, 4);
  auto first = MicrobatchSamples(24, 2, 3, 0, 0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->first, 0);
  EXPECT_EQ(MicrobatchSamples(25, 2, 3, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MicrobatchSamples(24, 2, 3, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DataTest, SyntheticSamplesArePureFunctionsOfTheirIndex) {
  const auto data = SyntheticFor(SmallGpt());
  auto whole = data->Samples(7, 0, 8);
  auto part = data->Samples(7, 4, 2);
  ASSERT_TRUE(whole.ok() && part.ok());
  EXPECT_TRUE(torch::equal(whole->inputs.narrow(0, 4, 2), part->inputs));
  EXPECT_TRUE(torch::equal(whole->targets.narrow(0, 4, 2), part->targets));
  auto other_iteration = data->Samples(8, 0, 8);
  ASSERT_TRUE(other_iteration.ok());
  EXPECT_FALSE(torch::equal(whole->inputs, other_iteration->inputs));
  // Targets are the inputs shifted by one; every sequence is arithmetic modulo the vocabulary.
  EXPECT_TRUE(torch::equal(whole->targets.narrow(1, 0, 11), whole->inputs.narrow(1, 1, 11)));
  const auto ids = whole->inputs;
  const auto stride = (ids.select(1, 1) - ids.select(1, 0)).remainder(16);
  EXPECT_TRUE(stride.ge(1).all().item<bool>() && stride.le(3).all().item<bool>());  // strides 3
  for (int64_t t = 1; t + 1 < ids.size(1); ++t) {
    EXPECT_TRUE(torch::equal((ids.select(1, t + 1) - ids.select(1, t)).remainder(16), stride));
  }
  EXPECT_EQ(MakeSyntheticDataset({/*vocab=*/1, /*seq_len=*/4, /*seed=*/0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSyntheticDataset({/*vocab=*/4, /*seq_len=*/4, /*seed=*/0, /*strides=*/4})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DataTest, ByteTextWindowsComeFromTheFile) {
  const std::string path = testing::TempDir() + "/tandem_bytes.txt";
  const std::string text = "the quick brown fox jumps over the lazy dog";
  std::ofstream(path) << text;
  auto data = MakeByteTextDataset(path, /*seq_len=*/8, /*seed=*/1);
  ASSERT_TRUE(data.ok()) << data.status();
  auto batch = (*data)->Samples(0, 0, 4);
  ASSERT_TRUE(batch.ok());
  for (int64_t i = 0; i < 4; ++i) {
    std::string window;
    for (int64_t t = 0; t < 8; ++t) window += static_cast<char>(batch->inputs[i][t].item<int64_t>());
    window += static_cast<char>(batch->targets[i][7].item<int64_t>());
    EXPECT_NE(text.find(window), std::string::npos) << window;
  }
  EXPECT_EQ(MakeByteTextDataset(path, /*seq_len=*/100, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto missing = MakeByteTextDataset(path + ".missing", 8, 1).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(".missing"), std::string::npos);
  std::remove(path.c_str());
}

TEST(GptTest, SameSeedSameParametersAndExpectedShapes) {
  const GptConfig config = SmallGpt(/*layers=*/3, /*hidden=*/32);
  const LayeredModel a = BuildGpt(config, 9), b = BuildGpt(config, 9), c = BuildGpt(config, 10);
  ASSERT_EQ(a.num_layers(), 5);
  EXPECT_EQ(a.layer_names.front(), "embedding");
  EXPECT_EQ(a.layer_names.back(), "head");
  const auto pa = a.NamedParameters(0, 5), pb = b.NamedParameters(0, 5),
             pc = c.NamedParameters(0, 5);
  ASSERT_EQ(pa.size(), pb.size());
  bool any_different = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
    if (pa[i].second.numel() > 32 && !torch::equal(pa[i].second, pc[i].second)) {
      any_different = true;
    }
  }
  EXPECT_TRUE(any_different);
  auto ids = torch::zeros({2, 12}, torch::kLong);
  EXPECT_EQ(a.Forward(ids, 0, 5).sizes().vec(), (std::vector<int64_t>{2, 12, 16}));
  EXPECT_EQ(a.Forward(ids, 0, 1).sizes().vec(), (std::vector<int64_t>{2, 12, 32}));

  GptConfig bad = config;
  bad.heads = 5;
  EXPECT_EQ(ValidateGptConfig(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GptModelSpec(bad).Build(1).status().code(), absl::StatusCode::kInvalidArgument);
}

// A rank that builds only its own layers gets them bit for bit as a whole-model build does,
// allocates nothing for the others, and builds any other layer equal to the whole build's on
// demand (elastic re-formation, a stage moved).
TEST(LayerByLayerTest, OwnLayersEqualTheWholeBuildAndNothingElseIsAllocated) {
  const GptConfig config = SmallGpt(/*layers=*/6, /*hidden=*/32);
  const LayeredModel whole = BuildGpt(config, 9);
  auto part = GptModelSpec(config).BuildLayers(9, /*first=*/2, /*end=*/4);
  ASSERT_TRUE(part.ok()) << part.status();
  ASSERT_EQ(part->num_layers(), whole.num_layers());
  EXPECT_EQ(part->layer_names, whole.layer_names);
  EXPECT_EQ(part->layer_costs, whole.layer_costs);
  for (int layer = 0; layer < whole.num_layers(); ++layer) {
    EXPECT_EQ(part->HasLayer(layer), layer == 2 || layer == 3) << layer;
  }
  const auto want = whole.NamedParameters(2, 4), got = part->NamedParameters(2, 4);
  ASSERT_EQ(want.size(), got.size());
  ASSERT_FALSE(want.empty());
  int64_t block_bytes = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].first, got[i].first);
    EXPECT_TRUE(torch::equal(want[i].second, got[i].second)) << want[i].first;
    block_bytes += want[i].second.numel() * kFloatBytes;
  }
  EXPECT_EQ(part->BuiltParameterBytes(), block_bytes);
  EXPECT_LT(part->BuiltParameterBytes(), whole.BuiltParameterBytes() / 2);

  // The description alone allocates no parameters; its clones are built on demand and equal
  // the whole build's layers, whatever was built before them.
  auto description = GptModelSpec(config).BuildLayers(9, 0, 0);
  ASSERT_TRUE(description.ok()) << description.status();
  EXPECT_EQ(description->BuiltParameterBytes(), 0);
  for (int layer : {7, 0, 4}) {
    auto built = description->CloneLayers(layer, layer + 1, torch::kCPU);
    ASSERT_TRUE(built.ok()) << built.status();
    const auto a = NamedLayerParameters(*built, layer), b = whole.NamedParameters(layer, layer + 1);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
    }
  }
  EXPECT_EQ(GptModelSpec(config).BuildLayers(9, 3, 9).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LayerByLayerTest, SpecsFromLayerBuildersAndTheirErrors) {
  auto linear = [] { return torch::nn::AnyModule(torch::nn::Linear(3, 3)); };
  auto mse = [](const torch::Tensor& y, const torch::Tensor& t) { return (y - t).pow(2).mean(); };
  ModelSpec spec = LayerByLayerSpec("mlp", {"a", "b", "c"}, {linear, linear, linear}, mse);
  auto whole = spec.Build(4);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto last = spec.BuildLayers(4, 2, 3);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(torch::equal(whole->NamedParameters(2, 3)[0].second,
                           last->NamedParameters(2, 3)[0].second));
  // Each layer has its own seed: equal builders give different layers.
  EXPECT_FALSE(torch::equal(whole->NamedParameters(0, 1)[0].second,
                            whole->NamedParameters(1, 2)[0].second));
  ModelSpec missing = LayerByLayerSpec("mlp", {"a", "b"}, {linear}, mse);
  EXPECT_EQ(missing.Build(4).status().code(), absl::StatusCode::kInvalidArgument);
  auto partial = missing.BuildLayers(4, 0, 1);
  ASSERT_TRUE(partial.ok()) << partial.status();
  auto unbuildable = partial->CloneLayers(1, 2, torch::kCPU);
  EXPECT_EQ(unbuildable.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unbuildable.status().message().find("layer 1 (b)"), std::string::npos)
      << unbuildable.status();
}

TEST(GptTest, AttentionIsCausal) {
  const LayeredModel model = BuildGpt(SmallGpt());
  auto ids = torch::randint(0, 16, {1, 12}, torch::kLong);
  auto changed = ids.clone();
  changed[0][11] = (ids[0][11].item<int64_t>() + 1) % 16;  // only the last token differs
  torch::NoGradGuard no_grad;
  const auto out = model.Forward(ids, 0, model.num_layers());
  const auto out_changed = model.Forward(changed, 0, model.num_layers());
  EXPECT_TRUE(torch::allclose(out.narrow(1, 0, 11), out_changed.narrow(1, 0, 11)));
  EXPECT_FALSE(torch::allclose(out.narrow(1, 11, 1), out_changed.narrow(1, 11, 1)));
}

TEST(ReferenceTest, SyntheticTaskLossFallsClearly) {
  const GptConfig config = SmallGpt(/*layers=*/2, /*hidden=*/32);
  ReferenceOptions options;
  options.global_batch = 16;
  options.steps = 60;
  options.optimizer.kind = OptimizerKind::kAdamW;
  options.lr.base_lr = 1e-2;
  options.lr.warmup_steps = 5;
  auto result = TrainReference(BuildGpt(config), *SyntheticFor(config), options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->losses.size(), 60u);
  const double initial = result->losses.front();
  double final_loss = 0;
  for (int i = 55; i < 60; ++i) final_loss += result->losses[i] / 5;
  EXPECT_NEAR(initial, std::log(16.0), 0.3);
  EXPECT_LT(final_loss, 0.5 * initial) << "initial " << initial << " final " << final_loss;
  // Below ln(strides): beyond bigram statistics, the model attends to find each stride.
  EXPECT_LT(final_loss, std::log(3.0)) << final_loss;
  EXPECT_DOUBLE_EQ(result->learning_rates[0], LearningRateAt(options.lr, 0));
  EXPECT_DOUBLE_EQ(result->learning_rates[0], 2e-3);
}

TEST(ReferenceTest, AccumulationSlicesGiveTheWholeBatchResult) {
  const GptConfig config = SmallGpt();
  ReferenceOptions options;
  options.global_batch = 8;
  options.steps = 4;
  options.optimizer.momentum = 0.9;
  options.lr.base_lr = 0.05;
  options.clip_norm = 0.5;
  const LayeredModel model = BuildGpt(config);
  const auto data = SyntheticFor(config);
  auto whole = TrainReference(model, *data, options);
  options.accumulation_slices = 4;
  auto sliced = TrainReference(model, *data, options);
  ASSERT_TRUE(whole.ok() && sliced.ok());
  for (size_t i = 0; i < whole->losses.size(); ++i) {
    EXPECT_NEAR(sliced->losses[i], whole->losses[i], 1e-5 * whole->losses[i]);
    EXPECT_NEAR(sliced->grad_norms[i], whole->grad_norms[i], 1e-5 * whole->grad_norms[i]);
  }
  EXPECT_GT(whole->grad_norms[0], options.clip_norm);  // so clipping was exercised
  for (size_t i = 0; i < whole->parameters.size(); ++i) {
    EXPECT_TRUE(torch::allclose(sliced->parameters[i].second, whole->parameters[i].second,
                                /*rtol=*/1e-5, /*atol=*/1e-6))
        << whole->parameters[i].first;
  }
  // The model passed in is untouched.
  EXPECT_TRUE(torch::equal(model.NamedParameters(0, 1)[0].second,
                           BuildGpt(config).NamedParameters(0, 1)[0].second));
}

// Two stages stepped with plain SGD by hand through their ParameterViews follow the reference
// trainer's SGD over several iterations: the single-rank version of the engine's acceptance.
TEST(ReferenceTest, StagesSteppedByHandFollowTheReference) {
  const GptConfig config = SmallGpt();
  const LayeredModel model = BuildGpt(config);
  const auto data = SyntheticFor(config);
  constexpr int kSteps = 4;
  constexpr double kLearningRate = 0.1;
  constexpr int kMicrobatches = 2;
  constexpr int64_t kMicrobatchSize = 3;
  ReferenceOptions options;
  options.global_batch = kMicrobatches * kMicrobatchSize;
  options.steps = kSteps;
  options.lr.base_lr = kLearningRate;
  auto reference = TrainReference(model, *data, options);
  ASSERT_TRUE(reference.ok()) << reference.status();

  std::vector<std::unique_ptr<TorchStage>> stages;
  for (auto [first, end] : {std::pair<int, int>{0, 2}, {2, 4}}) {
    TorchStageOptions stage_options;
    stage_options.first_layer = first;
    stage_options.end_layer = end;
    stage_options.microbatches = kMicrobatches;
    stage_options.microbatch_size = kMicrobatchSize;
    auto stage = TorchStage::Create(model, data, stage_options);
    ASSERT_TRUE(stage.ok()) << stage.status();
    stages.push_back(*std::move(stage));
  }
  for (int step = 0; step < kSteps; ++step) {
    for (auto& stage : stages) ASSERT_TRUE(stage->BeginIteration(step).ok());
    for (int m = 0; m < kMicrobatches; ++m) {
      auto activation = stages[0]->Forward(m, {});
      ASSERT_TRUE(activation.ok());
      ASSERT_TRUE(stages[1]->Forward(m, *activation).ok());
      auto grad = stages[1]->Backward(m, {});
      ASSERT_TRUE(grad.ok());
      ASSERT_TRUE(stages[0]->Backward(m, *grad).ok());
    }
    EXPECT_NEAR(stages[1]->IterationLoss(), reference->losses[step],
                1e-5 * reference->losses[step])
        << "step " << step;
    for (auto& stage : stages) {
      for (const ParameterView& view : stage->Parameters()) {
        float* value = static_cast<float*>(view.value.data);
        const float* grad = static_cast<const float*>(view.grad.data);
        for (int64_t i = 0; i < view.value.count; ++i) {
          value[i] -= static_cast<float>(kLearningRate) * grad[i];
        }
      }
    }
  }
  size_t compared = 0;
  for (const auto& stage : stages) {
    for (const auto& [name, parameter] : stage->named_parameters()) {
      for (const auto& [reference_name, expected] : reference->parameters) {
        if (reference_name != name) continue;
        const double scale = expected.abs().max().item<double>();
        EXPECT_LT((parameter - expected).abs().max().item<double>(), 1e-5 * scale) << name;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, reference->parameters.size());
}

TEST(ProfilerTest, RetainedBytesCountWhatABodyKeeps) {
  torch::Tensor kept;
  auto bytes = MeasureRetainedBytes([&] {
    kept = torch::ones({1000}, torch::kFloat32);
    auto temporary = torch::ones({5000}, torch::kFloat32);
    (void)temporary;
  });
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 1000 * kFloatBytes);
}

TEST(ProfilerTest, TinyGptProfileIsValidAndConsistent) {
  const GptConfig config = SmallGpt(/*layers=*/2, /*hidden=*/32);
  const LayeredModel model = BuildGpt(config);
  const auto data = SyntheticFor(config);
  ProfilerOptions options;
  options.microbatch_size = 2;
  options.warmup = 1;
  options.repeats = 3;
  auto profile = ProfileModel(model, *data, options);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_TRUE(pipeline::ValidateProfile(*profile).ok()) << pipeline::ValidateProfile(*profile);
  ASSERT_EQ(profile->layers.size(), 4u);
  EXPECT_EQ(profile->microbatch_size, 2);
  EXPECT_EQ(profile->device, "cpu");
  const int64_t h = config.hidden, v = config.vocab, s = config.seq_len, b = 2;
  const double activation = static_cast<double>(b * s * h * kFloatBytes);
  const auto& embedding = profile->layers[0];
  const auto& block = profile->layers[1];
  const auto& head = profile->layers[3];
  EXPECT_EQ(embedding.name, "embedding");
  EXPECT_DOUBLE_EQ(embedding.parameter_bytes, static_cast<double>((v + s) * h * kFloatBytes));
  // Two LayerNorms (4H), q/k/v without bias (3H^2), output (H^2 + H), MLP (8H^2 + 5H).
  EXPECT_DOUBLE_EQ(block.parameter_bytes,
                   static_cast<double>((12 * h * h + 10 * h) * kFloatBytes));
  EXPECT_DOUBLE_EQ(head.parameter_bytes, static_cast<double>((2 * h + h * v) * kFloatBytes));
  EXPECT_DOUBLE_EQ(block.optimizer_state_bytes, 2 * block.parameter_bytes);
  EXPECT_DOUBLE_EQ(block.output_activation_bytes, activation);
  EXPECT_DOUBLE_EQ(block.recompute_stashed_bytes, activation);
  EXPECT_DOUBLE_EQ(embedding.recompute_stashed_bytes, static_cast<double>(b * s * 8));
  EXPECT_DOUBLE_EQ(embedding.backward_input_seconds, 0.0);  // token ids have no gradient
  EXPECT_GT(block.backward_input_seconds, 0);
  EXPECT_NEAR(block.backward_input_seconds + block.backward_weight_seconds,
              block.backward_seconds, 1e-9);
  for (const auto& layer : profile->layers) {
    EXPECT_GT(layer.forward_seconds, 0) << layer.name;
    EXPECT_GT(layer.backward_seconds, 0) << layer.name;
    EXPECT_DOUBLE_EQ(layer.recompute_seconds, layer.forward_seconds);
    EXPECT_GT(layer.optimizer_seconds, 0) << layer.name;  // every GPT layer has parameters
  }
  // A block keeps several [b, S, H] activations, its attention scores and its MLP's 4H
  // activations: well above its output, and growing with the micro-batch.
  EXPECT_GT(block.stashed_activation_bytes, 4 * activation);
  options.microbatch_size = 4;
  auto larger = ProfileModel(model, *data, options);
  ASSERT_TRUE(larger.ok());
  EXPECT_NEAR(larger->layers[1].stashed_activation_bytes, 2 * block.stashed_activation_bytes,
              0.1 * block.stashed_activation_bytes);

  const std::string path = testing::TempDir() + "/tandem_profile.json";
  ASSERT_TRUE(pipeline::WriteProfileFile(*profile, path).ok());
  auto read = pipeline::ReadProfileFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, *profile);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem::runtime::libtorch
