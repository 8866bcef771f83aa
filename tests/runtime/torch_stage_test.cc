// TorchStage on one process: a GPT cut into stages and driven micro-batch by micro-batch with
// tensors passed by hand must give the loss and gradients of the whole model on the global
// batch (the single-rank core of the multi-rank equivalence test), with and without
// recomputation, with full or split (zero-bubble) backward, and with data-parallel replicas.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/autograd.h>

#include "gtest/gtest.h"
#include "runtime/torch/data.h"
#include "runtime/torch/deferred_linear.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/model.h"
#include "runtime/torch/precision.h"
#include "runtime/torch/torch_stage.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr double kRelativeTolerance = 1e-5;
constexpr uint64_t kModelSeed = 7;
constexpr int64_t kIteration = 3;

GptConfig TinyGpt() {
  GptConfig config;
  config.vocab = 16;
  config.layers = 4;
  config.hidden = 32;
  config.heads = 4;
  config.seq_len = 12;
  return config;
}

struct Fixture {
  LayeredModel model;
  std::shared_ptr<Dataset> data;
};

Fixture MakeFixture() {
  Fixture fixture;
  auto model = GptModelSpec(TinyGpt()).Build(kModelSeed);
  EXPECT_TRUE(model.ok()) << model.status();
  fixture.model = *std::move(model);
  SyntheticTaskOptions task;
  task.vocab = TinyGpt().vocab;
  task.seq_len = TinyGpt().seq_len;
  task.seed = 11;
  auto data = MakeSyntheticDataset(task);
  EXPECT_TRUE(data.ok()) << data.status();
  fixture.data = *std::move(data);
  return fixture;
}

// Loss and gradients of the whole model on samples [0, global_batch) of kIteration.
struct WholeModelResult {
  double loss = 0;
  std::map<std::string, torch::Tensor> grads;
};

WholeModelResult WholeModel(const Fixture& fixture, int64_t global_batch) {
  WholeModelResult result;
  auto batch = fixture.data->Samples(kIteration, 0, global_batch);
  EXPECT_TRUE(batch.ok());
  const auto named = fixture.model.NamedParameters(0, fixture.model.num_layers());
  std::vector<torch::Tensor> parameters;
  for (const auto& item : named) parameters.push_back(item.second);
  torch::Tensor loss = fixture.model.loss(
      fixture.model.Forward(batch->inputs, 0, fixture.model.num_layers()), batch->targets);
  const auto grads = torch::autograd::grad({loss}, parameters);
  result.loss = loss.item<double>();
  for (size_t i = 0; i < named.size(); ++i) result.grads[named[i].first] = grads[i];
  return result;
}

// max |a - b| / max(|b|) over a tensor: the relative error of the tests.
double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected) {
  const double scale = std::max(expected.abs().max().item<double>(), 1e-12);
  return (actual - expected).abs().max().item<double>() / scale;
}

enum class BackwardMode { kFull, kSplit };

struct PipelineSetup {
  std::vector<std::pair<int, int>> cuts;  // stage layer ranges
  std::vector<int> recompute_layers;
  int data_parallel = 1;
  int microbatches = 4;
  int64_t microbatch_size = 2;
  BackwardMode backward = BackwardMode::kFull;
  Precision precision = Precision::kFloat32;
};

struct PipelineResult {
  double loss = 0;  // summed IterationLoss over replicas
  std::map<std::string, torch::Tensor> grads;  // summed over replicas
  std::vector<std::vector<std::unique_ptr<TorchStage>>> stages;  // [replica][stage]
};

// Runs one iteration: all forwards (GPipe order), then all backwards in reverse, passing
// tensors between stages by hand as the engine would.
PipelineResult RunPipeline(const Fixture& fixture, const PipelineSetup& setup) {
  PipelineResult result;
  for (int d = 0; d < setup.data_parallel; ++d) {
    std::vector<std::unique_ptr<TorchStage>> replica;
    for (const auto& [first, end] : setup.cuts) {
      TorchStageOptions options;
      options.first_layer = first;
      options.end_layer = end;
      options.recompute_layers = setup.recompute_layers;
      options.data_parallel_index = d;
      options.data_parallel = setup.data_parallel;
      options.microbatches = setup.microbatches;
      options.microbatch_size = setup.microbatch_size;
      options.precision = setup.precision;
      auto stage = TorchStage::Create(fixture.model, fixture.data, options);
      EXPECT_TRUE(stage.ok()) << stage.status();
      EXPECT_TRUE((*stage)->BeginIteration(kIteration).ok());
      replica.push_back(*std::move(stage));
    }
    const int num_stages = static_cast<int>(replica.size());
    for (int m = 0; m < setup.microbatches; ++m) {
      std::vector<Tensor> activations;
      for (int s = 0; s < num_stages; ++s) {
        auto out = replica[s]->Forward(m, activations);
        EXPECT_TRUE(out.ok()) << out.status();
        activations = *std::move(out);
      }
      EXPECT_TRUE(activations.empty());
    }
    for (int m = setup.microbatches - 1; m >= 0; --m) {
      std::vector<Tensor> grads;
      for (int s = num_stages - 1; s >= 0; --s) {
        auto in = setup.backward == BackwardMode::kFull ? replica[s]->Backward(m, grads)
                                                        : replica[s]->BackwardInput(m, grads);
        EXPECT_TRUE(in.ok()) << in.status();
        grads = *std::move(in);
      }
      EXPECT_TRUE(grads.empty());
    }
    if (setup.backward == BackwardMode::kSplit) {
      for (int s = 0; s < num_stages; ++s) {
        for (int m = 0; m < setup.microbatches; ++m) {
          EXPECT_TRUE(replica[s]->BackwardWeight(m).ok());
        }
      }
    }
    for (auto& stage : replica) {
      EXPECT_EQ(stage->stashed_microbatches(), 0);
      EXPECT_TRUE(stage->FinishGradients().ok());  // as the engine does before reading them
      if (stage->is_last()) result.loss += stage->IterationLoss();
      for (const auto& [name, parameter] : stage->named_parameters()) {
        auto it = result.grads.find(name);
        if (it == result.grads.end()) {
          result.grads[name] = parameter.grad().clone();
        } else {
          it->second += parameter.grad();
        }
      }
    }
    result.stages.push_back(std::move(replica));
  }
  return result;
}

void ExpectMatchesWholeModel(const Fixture& fixture, const PipelineSetup& setup) {
  const int64_t global_batch = setup.data_parallel * setup.microbatches * setup.microbatch_size;
  const WholeModelResult expected = WholeModel(fixture, global_batch);
  const PipelineResult actual = RunPipeline(fixture, setup);
  EXPECT_NEAR(actual.loss, expected.loss, kRelativeTolerance * std::abs(expected.loss));
  ASSERT_EQ(actual.grads.size(), expected.grads.size());
  for (const auto& [name, grad] : expected.grads) {
    ASSERT_EQ(actual.grads.count(name), 1u) << name;
    EXPECT_LT(RelativeError(actual.grads.at(name), grad), kRelativeTolerance) << name;
  }
}

const std::vector<std::pair<int, int>> kThreeStages = {{0, 2}, {2, 4}, {4, 6}};

// One stage of the whole model (layers [0, 6)) with micro-batches of 2 samples.
TorchStageOptions WholeModelStage(int microbatches) {
  TorchStageOptions options;
  options.first_layer = 0;
  options.end_layer = 6;
  options.microbatches = microbatches;
  options.microbatch_size = 2;
  return options;
}

TEST(TorchStageTest, StagesGiveTheWholeModelsLossAndGradients) {
  const Fixture fixture = MakeFixture();
  ASSERT_EQ(fixture.model.num_layers(), 6);
  PipelineSetup setup;
  setup.cuts = kThreeStages;
  ExpectMatchesWholeModel(fixture, setup);
}

TEST(TorchStageTest, DataParallelReplicasSumToTheGlobalBatchGradient) {
  const Fixture fixture = MakeFixture();
  PipelineSetup setup;
  setup.cuts = {{0, 3}, {3, 6}};
  setup.data_parallel = 2;
  setup.microbatches = 2;
  ExpectMatchesWholeModel(fixture, setup);
}

TEST(TorchStageTest, RecomputationGivesTheSameResults) {
  const Fixture fixture = MakeFixture();
  PipelineSetup setup;
  setup.cuts = kThreeStages;
  // Layer 1 recomputed inside stage 0, layers 2-3 (all of stage 1) and the head with its loss.
  setup.recompute_layers = {1, 2, 3, 5};
  ExpectMatchesWholeModel(fixture, setup);

  const PipelineResult stashed = RunPipeline(fixture, [&] {
    PipelineSetup plain = setup;
    plain.recompute_layers.clear();
    return plain;
  }());
  const PipelineResult recomputed = RunPipeline(fixture, setup);
  const auto segments = recomputed.stages[0][0]->segments();
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[0], (std::pair<std::pair<int, int>, bool>{{0, 1}, false}));
  EXPECT_EQ(segments[1], (std::pair<std::pair<int, int>, bool>{{1, 2}, true}));
  EXPECT_EQ(recomputed.stages[0][2]->segments().size(), 2u);
  for (const auto& [name, grad] : stashed.grads) {
    EXPECT_LT(RelativeError(recomputed.grads.at(name), grad), 1e-6) << name;
  }
  EXPECT_NEAR(recomputed.loss, stashed.loss, 1e-7);
}

TEST(TorchStageTest, SplitBackwardEqualsFullBackward) {
  const Fixture fixture = MakeFixture();
  PipelineSetup setup;
  setup.cuts = kThreeStages;
  setup.backward = BackwardMode::kSplit;
  ExpectMatchesWholeModel(fixture, setup);
  setup.recompute_layers = {2, 5};
  ExpectMatchesWholeModel(fixture, setup);
}

// Under bf16 autocast (CPU autocast here) the split backward computes the same bfloat16
// products as the full one: W works from the bfloat16 input B kept.
TEST(TorchStageTest, Bf16SplitBackwardEqualsBf16FullBackward) {
  const Fixture fixture = MakeFixture();
  PipelineSetup setup;
  setup.cuts = kThreeStages;
  setup.precision = Precision::kBFloat16;
  const PipelineResult full = RunPipeline(fixture, setup);
  setup.backward = BackwardMode::kSplit;
  const PipelineResult split = RunPipeline(fixture, setup);
  EXPECT_EQ(split.loss, full.loss);
  ASSERT_EQ(split.grads.size(), full.grads.size());
  for (const auto& [name, grad] : full.grads) {
    EXPECT_GT(grad.abs().max().item<double>(), 0.0) << name;
    EXPECT_LT(RelativeError(split.grads.at(name), grad), 1e-6) << name;
  }
  // And it is bfloat16 arithmetic: the float32 pipeline's gradients differ by more than
  // float32 rounding.
  setup.precision = Precision::kFloat32;
  const PipelineResult fp32 = RunPipeline(fixture, setup);
  EXPECT_GT(RelativeError(full.grads.at("layers.2.mlp_in.weight"),
                          fp32.grads.at("layers.2.mlp_in.weight")),
            1e-4);
}

// Under autocast a DeferrableLinear keeps the bfloat16 copies it computed with, as autograd's
// linear keeps autocast's: the float32 input may change after the forward (it is not kept),
// and the gradients are those of autocast's linear.
TEST(DeferrableLinearTest, AutocastKeepsTheComputeCopiesNotTheFloat32Input) {
  torch::manual_seed(5);
  const torch::Tensor x0 = torch::randn({3, 5, 16});
  const torch::Tensor w0 = torch::randn({12, 16});
  const torch::Tensor b0 = torch::randn({12});
  const torch::Tensor upstream = torch::randn({3, 5, 12}).to(torch::kBFloat16);
  struct Run {
    torch::Tensor x, w, b, y;
  };
  auto run = [&](bool deferrable) {
    Run r{x0.clone().requires_grad_(true), w0.clone().requires_grad_(true),
          b0.clone().requires_grad_(true), {}};
    {
      AutocastGuard autocast(torch::kCPU, Precision::kBFloat16);
      r.y = deferrable ? DeferrableLinear(r.x, r.w, r.b) : at::linear(r.x, r.w, r.b);
    }
    {
      torch::NoGradGuard no_grad;
      r.x.add_(1.0);  // the float32 input changes; the kept bfloat16 copy does not
    }
    r.y.backward(upstream);
    return r;
  };
  const Run got = run(/*deferrable=*/true);
  const Run want = run(/*deferrable=*/false);
  EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(got.y, want.y));
  EXPECT_EQ(got.x.grad().scalar_type(), torch::kFloat32);
  EXPECT_EQ(got.w.grad().scalar_type(), torch::kFloat32);
  // Same bfloat16 operands; the products' summation order may differ.
  EXPECT_LT(RelativeError(got.x.grad(), want.x.grad()), 1e-2);
  EXPECT_LT(RelativeError(got.w.grad(), want.w.grad()), 1e-2);
  EXPECT_LT(RelativeError(got.b.grad(), want.b.grad()), 1e-2);
}

// A weight computed from a parameter (not a leaf) has no .grad to write into: inside a scope,
// deferred or not, its gradient goes back through autograd to the parameter, as outside one.
TEST(DeferrableLinearTest, WeightsThatAreNotParametersGetTheirGradientsThroughAutograd) {
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({4, 6});
  const torch::Tensor upstream = torch::randn({4, 5});
  const torch::Tensor w0 = torch::randn({5, 6});
  auto gradient = [&](int mode) {  // 0: no scope, 1: a scope, 2: a deferring scope
    const torch::Tensor w = w0.clone().requires_grad_(true);
    const torch::Tensor y = DeferrableLinear(x, w * 2.0, torch::Tensor());
    DeferredWeightGrads deferred;
    {
      std::optional<LinearGradScope> scope;
      if (mode > 0) scope.emplace(nullptr, mode == 2 ? &deferred : nullptr);
      y.backward(upstream);
    }
    EXPECT_TRUE(deferred.empty());
    return w.grad();
  };
  const torch::Tensor want = gradient(0);
  ASSERT_TRUE(want.defined());
  EXPECT_LT(RelativeError(want, 2.0 * upstream.t().mm(x)), 1e-6);
  for (int mode : {1, 2}) {
    const torch::Tensor got = gradient(mode);
    ASSERT_TRUE(got.defined()) << "mode " << mode;
    EXPECT_TRUE(torch::equal(got, want)) << "mode " << mode;
  }
}

// A product padded to a multiple of 64 output features (the LM head over GPT-2's 50,257
// words on a GPU; run here on the CPU): its output, the input's gradient and the weight's and
// bias's gradients equal the plain layer's, with the gradient given as a view of a padded
// buffer (what the fused loss hands back: widened in place, garbage in its padding ignored) or
// as a contiguous tensor (copied padded), outside a scope, inside one, and deferred to W.
TEST(DeferrableLinearTest, PaddedProductsEqualThePlainLayer) {
  torch::manual_seed(11);
  constexpr int64_t kRows = 6, kIn = 8, kOut = 101, kPadded = 128;
  const torch::Tensor x0 = torch::randn({2, kRows / 2, kIn});
  const torch::Tensor w0 = torch::randn({kOut, kIn});
  const torch::Tensor b0 = torch::randn({kOut});
  const torch::Tensor upstream = torch::randn({2, kRows / 2, kOut});
  struct Result {
    torch::Tensor y, x_grad, w_grad, b_grad;
  };
  // mode 0: no scope, 1: a scope, 2: a deferring scope; strided: the gradient as a padded view.
  auto run = [&](bool padded, bool with_bias, int mode, bool strided) {
    const torch::Tensor x = x0.clone().requires_grad_(true);
    const torch::Tensor w = w0.clone().requires_grad_(true);
    const torch::Tensor b = with_bias ? b0.clone().requires_grad_(true) : torch::Tensor();
    if (mode > 0) {
      w.mutable_grad() = torch::zeros_like(w);
      if (with_bias) b.mutable_grad() = torch::zeros_like(b);
    }
    const torch::Tensor y = padded ? DeferrableLinearPaddedTo(x, w, b, 64)
                                   : DeferrableLinear(x, w, b);
    torch::Tensor grad = upstream;
    if (strided) {
      // NaN beyond the gradient: the padding must be zeroed before the products read it.
      torch::Tensor buffer =
          torch::full({2, kRows / 2, kPadded}, std::numeric_limits<float>::quiet_NaN());
      buffer.narrow(2, 0, kOut).copy_(upstream);
      grad = buffer.narrow(2, 0, kOut);
    }
    DeferredWeightGrads deferred;
    {
      std::optional<LinearGradScope> scope;
      if (mode > 0) scope.emplace(nullptr, mode == 2 ? &deferred : nullptr);
      y.backward(grad);
    }
    EXPECT_EQ(deferred.empty(), mode != 2);
    deferred.Apply();
    return Result{y.detach(), x.grad(), w.grad(), with_bias ? b.grad() : torch::Tensor()};
  };
  for (const bool with_bias : {false, true}) {
    const Result want = run(/*padded=*/false, with_bias, 0, false);
    for (int mode : {0, 1, 2}) {
      for (const bool strided : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "bias " << with_bias << " mode " << mode
                                          << " strided " << strided);
        const Result got = run(/*padded=*/true, with_bias, mode, strided);
        EXPECT_EQ(got.y.stride(1), kPadded) << "rows not padded";
        EXPECT_LT(RelativeError(got.y, want.y), 1e-5);
        EXPECT_LT(RelativeError(got.x_grad, want.x_grad), 1e-5);
        EXPECT_LT(RelativeError(got.w_grad, want.w_grad), 1e-5);
        if (with_bias) {
          EXPECT_LT(RelativeError(got.b_grad, want.b_grad), 1e-5);
        }
      }
    }
  }
}

// Zero-bubble's split computes each weight gradient once: BackwardInput leaves the linear
// layers' weight gradients to BackwardWeight (which runs no autograd: it works after the graph
// is gone) and computes the others (layer norms) at once.
TEST(TorchStageTest, BackwardInputLeavesLinearWeightGradientsToBackwardWeight) {
  const Fixture fixture = MakeFixture();
  const TorchStageOptions options = WholeModelStage(1);
  auto stage = TorchStage::Create(fixture.model, fixture.data, options);
  ASSERT_TRUE(stage.ok()) << stage.status();
  ASSERT_TRUE((*stage)->BeginIteration(kIteration).ok());
  ASSERT_TRUE((*stage)->Forward(0, {}).ok());
  ASSERT_TRUE((*stage)->BackwardInput(0, {}).ok());
  auto grad_norm = [&](const std::string& name) {
    for (const auto& [n, p] : (*stage)->named_parameters()) {
      if (n == name) return p.grad().norm().item<double>();
    }
    ADD_FAILURE() << "no parameter " << name;
    return -1.0;
  };
  EXPECT_EQ(grad_norm("layers.2.mlp_in.weight"), 0.0);
  EXPECT_EQ(grad_norm("layers.2.qkv.weight"), 0.0);
  EXPECT_EQ(grad_norm("layers.5.lm_head.weight"), 0.0);
  EXPECT_GT(grad_norm("layers.2.mlp_norm.weight"), 0.0);
  EXPECT_GT(grad_norm("layers.0.token.weight"), 0.0);
  ASSERT_TRUE((*stage)->BackwardWeight(0).ok());
  EXPECT_GT(grad_norm("layers.2.mlp_in.weight"), 0.0);
  EXPECT_GT(grad_norm("layers.2.qkv.weight"), 0.0);
  EXPECT_GT(grad_norm("layers.5.lm_head.weight"), 0.0);
  EXPECT_EQ((*stage)->stashed_microbatches(), 0);
}

// Each iteration's first gradient is written over the last iteration's (no zero fill): a
// stage's second iteration gives exactly a fresh stage's gradients, and FinishGradients zeroes
// those of parameters that got none (here the linear weights, whose W is not run).
TEST(TorchStageTest, EachIterationStartsItsGradientsAfresh) {
  const Fixture fixture = MakeFixture();
  const TorchStageOptions options = WholeModelStage(2);
  auto grads_of = [](TorchStage& stage) {
    std::map<std::string, torch::Tensor> grads;
    for (const auto& [name, p] : stage.named_parameters()) grads[name] = p.grad().clone();
    return grads;
  };
  auto iterate = [](TorchStage& stage, int64_t iteration, bool split, bool weights) {
    ASSERT_TRUE(stage.BeginIteration(iteration).ok());
    for (int m = 0; m < 2; ++m) ASSERT_TRUE(stage.Forward(m, {}).ok());
    for (int m = 0; m < 2; ++m) {
      ASSERT_TRUE((split ? stage.BackwardInput(m, {}) : stage.Backward(m, {})).ok());
    }
    for (int m = 0; m < 2 && split && weights; ++m) ASSERT_TRUE(stage.BackwardWeight(m).ok());
    ASSERT_TRUE(stage.FinishGradients().ok());
  };
  for (bool split : {false, true}) {
    auto used = TorchStage::Create(fixture.model, fixture.data, options);
    auto fresh = TorchStage::Create(fixture.model, fixture.data, options);
    ASSERT_TRUE(used.ok() && fresh.ok());
    iterate(**used, kIteration - 1, split, /*weights=*/true);
    iterate(**used, kIteration, split, /*weights=*/true);
    iterate(**fresh, kIteration, split, /*weights=*/true);
    const auto want = grads_of(**fresh);
    for (const auto& [name, grad] : grads_of(**used)) {
      EXPECT_GT(grad.abs().max().item<double>(), 0.0) << name;
      EXPECT_TRUE(torch::equal(grad, want.at(name))) << name << (split ? " split" : " full");
    }
  }
  // B without W: the linear layers' weights get no gradient; after a full iteration their old
  // gradients must not survive FinishGradients.
  auto stage = TorchStage::Create(fixture.model, fixture.data, options);
  ASSERT_TRUE(stage.ok());
  iterate(**stage, kIteration - 1, /*split=*/false, /*weights=*/true);
  EXPECT_GT(grads_of(**stage).at("layers.2.mlp_in.weight").abs().max().item<double>(), 0.0);
  iterate(**stage, kIteration, /*split=*/true, /*weights=*/false);
  const auto grads = grads_of(**stage);
  EXPECT_EQ(grads.at("layers.2.mlp_in.weight").abs().max().item<double>(), 0.0);
  EXPECT_EQ(grads.at("layers.2.mlp_in.bias").abs().max().item<double>(), 0.0);
  EXPECT_GT(grads.at("layers.2.mlp_norm.weight").abs().max().item<double>(), 0.0);
  // The stashes of the unfinished micro-batches are the caller's to finish; drop them.
  for (int m = 0; m < 2; ++m) ASSERT_TRUE((*stage)->BackwardWeight(m).ok());
}

TEST(TorchStageTest, LossIsScaledByTheNumberOfMicrobatches) {
  const Fixture fixture = MakeFixture();
  PipelineSetup setup;
  setup.cuts = {{0, 6}};
  setup.data_parallel = 2;
  setup.microbatches = 2;
  const PipelineResult result = RunPipeline(fixture, setup);
  const TorchStage& stage = *result.stages[1][0];
  ASSERT_EQ(stage.microbatch_losses().size(), 2u);
  double unscaled = 0;
  for (const auto& item : stage.microbatch_losses()) unscaled += item.second;
  EXPECT_NEAR(stage.IterationLoss(), unscaled / 4.0, 1e-7);
  EXPECT_GT(unscaled, 1.0);  // about ln(16) for an untrained model
}

TEST(TorchStageTest, ParameterViewsStayFixedAndSeeGradients) {
  const Fixture fixture = MakeFixture();
  TorchStageOptions options;
  options.first_layer = 4;
  options.end_layer = 6;
  options.microbatches = 1;
  options.microbatch_size = 2;
  auto stage = TorchStage::Create(fixture.model, fixture.data, options);
  ASSERT_TRUE(stage.ok()) << stage.status();
  const std::vector<ParameterView> before = (*stage)->Parameters();
  ASSERT_EQ(before.size(), (*stage)->named_parameters().size());
  EXPECT_EQ(before.front().name.rfind("layers.4.", 0), 0u) << before.front().name;

  auto input = (*stage)->NewTensor(TensorMeta{{2, 12, 32}, comm::DataType::kFloat32});
  ASSERT_TRUE(input.ok());
  std::fill_n(static_cast<float*>(input->buffer.data), input->buffer.count, 0.5f);
  for (int64_t iteration = 0; iteration < 2; ++iteration) {
    ASSERT_TRUE((*stage)->BeginIteration(iteration).ok());
    ASSERT_TRUE((*stage)->Forward(0, {*input}).ok());
    auto grads = (*stage)->Backward(0, {});
    ASSERT_TRUE(grads.ok()) << grads.status();
    ASSERT_EQ(grads->size(), 1u);
    EXPECT_EQ((*grads)[0].meta.shape, (std::vector<int64_t>{2, 12, 32}));
  }
  const std::vector<ParameterView> after = (*stage)->Parameters();
  double grad_sum = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].value.data, after[i].value.data);
    EXPECT_EQ(before[i].grad.data, after[i].grad.data);
    const float* grad = static_cast<const float*>(after[i].grad.data);
    for (int64_t j = 0; j < after[i].grad.count; ++j) grad_sum += std::abs(grad[j]);
  }
  EXPECT_GT(grad_sum, 0.0);
  // An in-place update through the view changes the stage's parameter.
  float* value = static_cast<float*>(after[0].value.data);
  value[0] = 42.0f;
  EXPECT_EQ((*stage)->named_parameters()[0].second.flatten()[0].item<float>(), 42.0f);
}

TEST(TorchStageTest, StagesOfTheSameLayersHaveIndependentParameters) {
  const Fixture fixture = MakeFixture();
  TorchStageOptions options;
  options.first_layer = 1;
  options.end_layer = 3;
  auto first = TorchStage::Create(fixture.model, nullptr, options);
  auto second = TorchStage::Create(fixture.model, nullptr, options);
  ASSERT_TRUE(first.ok() && second.ok());
  const torch::Tensor a = (*first)->named_parameters()[0].second;
  const torch::Tensor b = (*second)->named_parameters()[0].second;
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_NE(a.data_ptr(), b.data_ptr());
  {
    torch::NoGradGuard no_grad;
    a.add_(1.0);
  }
  EXPECT_FALSE(torch::equal(a, b));
}

// GPT-2's LM head is tied to its token embedding. A stage holding both shares one tensor; the
// stages of a split hold one end each, the head's copy starting as the embedding (drawn from
// another layer's seed, it would differ), and report the pair for the engine to sum.
TEST(TorchStageTest, StagesThatSplitATiedPairStartEqualAndReportIt) {
  Gpt2Config config;
  config.layers = 2;
  config.hidden = 16;
  config.heads = 2;
  config.seq_len = 8;
  config.positions = 8;
  auto model = Gpt2ModelSpec(config).BuildLayers(/*seed=*/5, /*first=*/0, /*end=*/0);
  ASSERT_TRUE(model.ok()) << model.status();
  SyntheticTaskOptions task;
  task.seq_len = 8;
  auto data = MakeSyntheticDataset(task);
  ASSERT_TRUE(data.ok()) << data.status();
  auto make = [&](int first, int end) {
    TorchStageOptions options;
    options.first_layer = first;
    options.end_layer = end;
    return TorchStage::Create(*model, *data, options);
  };
  auto whole = make(0, 4);
  auto first = make(0, 2);
  auto last = make(2, 4);
  ASSERT_TRUE(whole.ok() && first.ok() && last.ok());
  auto named = [](const TorchStage& stage, const std::string& name) {
    for (const auto& [n, tensor] : stage.named_parameters()) {
      if (n == name) return tensor;
    }
    return torch::Tensor();
  };
  const torch::Tensor embedding = named(**first, "layers.0.wte.weight");
  const torch::Tensor head = named(**last, "layers.3.lm_head.weight");
  ASSERT_TRUE(embedding.defined() && head.defined());
  EXPECT_TRUE(torch::equal(embedding, head));
  EXPECT_TRUE(torch::equal(embedding, named(**whole, "layers.0.wte.weight")));
  EXPECT_FALSE(named(**whole, "layers.3.lm_head.weight").defined());  // one tensor
  for (const ParameterView& v : (*whole)->Parameters()) EXPECT_TRUE(v.tied_owner.empty());
  auto tied = [](TorchStage& stage) {
    std::vector<ParameterView> out;
    for (ParameterView& v : stage.Parameters()) {
      if (!v.tied_owner.empty()) out.push_back(v);
    }
    return out;
  };
  const std::vector<ParameterView> owner = tied(**first), copy = tied(**last);
  ASSERT_EQ(owner.size(), 1u);
  ASSERT_EQ(copy.size(), 1u);
  EXPECT_EQ(owner[0].name, "layers.0.wte.weight");
  EXPECT_FALSE(owner[0].is_tied_copy());
  EXPECT_EQ(copy[0].tied_owner, "layers.0.wte.weight");
  EXPECT_TRUE(copy[0].is_tied_copy());
  EXPECT_EQ(copy[0].tied_layers, (std::vector<int>{0, 3}));
  EXPECT_EQ(owner[0].tied_layers, copy[0].tied_layers);
  EXPECT_EQ(owner[0].tied_layer, 0);
  EXPECT_EQ(copy[0].tied_layer, 3);
}

TEST(TorchStageTest, MisuseIsReportedWithCodesAndContext) {
  const Fixture fixture = MakeFixture();
  TorchStageOptions options;
  options.first_layer = 2;
  options.end_layer = 9;
  EXPECT_EQ(TorchStage::Create(fixture.model, fixture.data, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.end_layer = 6;
  EXPECT_EQ(TorchStage::Create(fixture.model, nullptr, options).status().code(),
            absl::StatusCode::kInvalidArgument);  // the last stage needs targets

  options.first_layer = 2;
  options.end_layer = 4;
  options.microbatches = 2;
  options.microbatch_size = 1;
  auto stage = TorchStage::Create(fixture.model, nullptr, options);
  ASSERT_TRUE(stage.ok());
  auto input = (*stage)->NewTensor(TensorMeta{{1, 12, 32}, comm::DataType::kFloat32});
  ASSERT_TRUE(input.ok());
  EXPECT_EQ((*stage)->Forward(0, {*input}).status().code(),
            absl::StatusCode::kFailedPrecondition);  // before BeginIteration
  ASSERT_TRUE((*stage)->BeginIteration(0).ok());
  EXPECT_EQ((*stage)->Backward(0, {}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*stage)->Forward(5, {*input}).status().code(), absl::StatusCode::kInvalidArgument);
  auto ids = (*stage)->NewTensor(TensorMeta{{1, 12}, comm::DataType::kInt64});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*stage)->Forward(0, {*ids}).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*stage)->Forward(0, {*input}).ok());
  auto wrong = (*stage)->NewTensor(TensorMeta{{1, 12, 31}, comm::DataType::kFloat32});
  ASSERT_TRUE(wrong.ok());
  const absl::Status shape = (*stage)->Backward(0, {*wrong}).status();
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("micro-batch 0"), std::string::npos) << shape;
  EXPECT_EQ((*stage)->BackwardWeight(0).code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status pending = (*stage)->BeginIteration(1);
  EXPECT_EQ(pending.code(), absl::StatusCode::kFailedPrecondition);
  auto good = (*stage)->NewTensor(TensorMeta{{1, 12, 32}, comm::DataType::kFloat32});
  ASSERT_TRUE(good.ok());
  std::fill_n(static_cast<float*>(good->buffer.data), good->buffer.count, 1.0f);
  EXPECT_TRUE((*stage)->Backward(0, {*good}).ok());
  EXPECT_TRUE((*stage)->BeginIteration(1).ok());
}

}  // namespace
}  // namespace tandem::runtime::libtorch
