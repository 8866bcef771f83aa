// Llama and GPT-2 (runtime/torch/llama.h, gpt2.h) against the reference implementation,
// Hugging Face transformers: hf_reference.py builds tiny random models (grouped-query
// attention, tied and untied heads, Llama 3 rope scaling, biases, GPT-2 variants), saves them
// with save_pretrained and records logits, loss and gradients on fixed tokens. tandem's models
// load the same weights by name and must compute the same, run whole in one process (tied
// weights shared) and in contiguous groups of layers as pipeline stages run them (each group
// built alone, its input detached, the tied copies' gradients summed). Skipped, with the
// reason, when python3 cannot import transformers and torch.
#include <sys/wait.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/json_util.h"
#include "formats/safetensors.h"
#include "gtest/gtest.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/llama.h"
#include "runtime/torch/lm_parts.h"
#include "runtime/torch/model.h"

namespace tandem::runtime::libtorch {
namespace {

using formats::DataType;
using formats::SafetensorsFile;

constexpr double kOutputTolerance = 1e-5;    // logits and loss, relative
constexpr double kGradientTolerance = 1e-4;  // each parameter's gradient, relative
constexpr int64_t kSequenceLength = 16;      // hf_reference.py's LENGTH

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, got);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// The reference models, made once for the whole program (in a temporary folder removed at
// exit): the folder, or why there is none.
struct Reference {
  std::string folder;
  std::string unavailable;  // non-empty: skip, with this reason
  std::string failed;       // non-empty: the script failed (a test failure, not a skip)
};

const Reference& References() {
  static const Reference* reference = [] {
    auto* made = new Reference;
    const CommandResult probe =
        RunCommand("python3 -c 'import torch, transformers, safetensors'");
    if (probe.exit_code != 0) {
      made->unavailable = absl::StrCat(
          "python3 cannot import torch, transformers and safetensors (exit ", probe.exit_code,
          "); install them (CPU torch) to compare against Hugging Face transformers: ",
          probe.output.substr(0, 400));
      return made;
    }
    char pattern[] = "/tmp/tandem_hf_models_XXXXXX";
    if (::mkdtemp(pattern) == nullptr) {
      made->failed = "cannot make a temporary folder";
      return made;
    }
    made->folder = pattern;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(References().folder, ignored);
    });
    const CommandResult written = RunCommand(
        absl::StrCat("python3 '", TANDEM_HF_REFERENCE_SCRIPT, "' '", made->folder, "'"));
    if (written.exit_code != 0) {
      made->failed = absl::StrCat("hf_reference.py failed (exit ", written.exit_code,
                                  "): ", written.output);
    }
    return made;
  }();
  return *reference;
}

#define REQUIRE_REFERENCE()                                          \
  do {                                                               \
    const Reference& ref = References();                             \
    if (!ref.unavailable.empty()) GTEST_SKIP() << ref.unavailable;   \
    ASSERT_TRUE(ref.failed.empty()) << ref.failed;                   \
  } while (false)

torch::Tensor ReadTensor(const SafetensorsFile& file, const std::string& name) {
  auto info = file.Info(name);
  if (!info.ok()) throw std::runtime_error(std::string(info.status().message()));
  const formats::TensorInfo& tensor = **info;
  if (tensor.data_type == DataType::kInt64) {
    torch::Tensor out = torch::empty(tensor.shape, torch::kLong);
    auto bytes = file.Bytes(name);
    if (!bytes.ok()) throw std::runtime_error(std::string(bytes.status().message()));
    std::memcpy(out.data_ptr(), bytes->data(), bytes->size());
    return out;
  }
  torch::Tensor out = torch::empty(tensor.shape, torch::kFloat);
  const absl::Status read = file.ReadAsFloat32(name, out.data_ptr<float>(), out.numel());
  if (!read.ok()) throw std::runtime_error(std::string(read.message()));
  return out;
}

// max |a - b| / max |b|.
double RelativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  const double difference = (a - b).abs().max().item<double>();
  return scale > 0 ? difference / scale : difference;
}

// One reference case as tandem builds it.
struct HfCase {
  std::string name;
  ModelSpec spec;
  TiedWeights tied;
  std::function<absl::StatusOr<std::string>(absl::string_view)> hf_name;
  // Where a parameter stored fused lies in its key's tensor (Phi-3); null: none is.
  std::function<std::optional<LlamaFusedRows>(absl::string_view)> hf_rows;
  int layers = 0;  // tandem layers (blocks + 2)

  // The checkpoint's tensor `key_tensor` cut to parameter `name`'s rows when it is stored fused.
  torch::Tensor Part(const std::string& name, const torch::Tensor& key_tensor, int64_t rows) const {
    if (!hf_rows) return key_tensor;
    const std::optional<LlamaFusedRows> fused = hf_rows(name);
    if (!fused) return key_tensor;
    // Rows of the key's tensor with every dimension but the last flattened.
    return key_tensor.reshape({-1, key_tensor.size(-1)}).narrow(0, fused->first_row, rows);
  }
};

// The cases of families newer than the transformers the tests run (Qwen3's, Qwen3-MoE's, OLMo
// 2's, Gemma 3's) come from tests/data/hf_recent, written by hf_recent_reference.py under
// transformers 4.51.3; the others from hf_reference.py's folder.
bool RecentCase(const std::string& case_name) {
  return case_name.rfind("qwen3", 0) == 0 || case_name.rfind("olmo2", 0) == 0 ||
         case_name.rfind("gemma3", 0) == 0 || case_name.rfind("phi3_partial", 0) == 0 ||
         case_name.rfind("glm4", 0) == 0;
}

std::string CaseFolder(const std::string& case_name) {
  return absl::StrCat(RecentCase(case_name) ? TANDEM_HF_RECENT_DATA : References().folder, "/",
                      case_name);
}

absl::StatusOr<Json> ReadConfig(const std::string& case_name) {
  return ReadJsonFile(CaseFolder(case_name) + "/config.json");
}

HfCase LlamaCase(const std::string& name, GptAttention attention,
                 const std::function<void(LlamaConfig&)>& change = {}) {
  auto json = ReadConfig(name);
  EXPECT_TRUE(json.ok()) << json.status();
  auto config = LlamaConfigFromJson(*json);
  EXPECT_TRUE(config.ok()) << config.status();
  config->seq_len = kSequenceLength;
  config->attention = attention;
  if (change) change(*config);
  HfCase c;
  c.name = name;
  c.spec = LlamaModelSpec(*config);
  c.tied = LlamaTiedWeights(*config);
  c.hf_name = [config = *config](absl::string_view tandem) { return LlamaHfName(config, tandem); };
  c.hf_rows = [config = *config](absl::string_view tandem) { return LlamaHfRows(config, tandem); };
  c.layers = static_cast<int>(config->layers) + 2;
  return c;
}

HfCase Gpt2Case(const std::string& name, GptAttention attention) {
  auto json = ReadConfig(name);
  EXPECT_TRUE(json.ok()) << json.status();
  auto config = Gpt2ConfigFromJson(*json);
  EXPECT_TRUE(config.ok()) << config.status();
  config->seq_len = kSequenceLength;
  config->attention = attention;
  HfCase c;
  c.name = name;
  c.spec = Gpt2ModelSpec(*config);
  c.tied = Gpt2TiedWeights(*config);
  c.hf_name = [config = *config](absl::string_view tandem) { return Gpt2HfName(config, tandem); };
  c.layers = static_cast<int>(config->layers) + 2;
  return c;
}

// The owner of a tied copy ("" for a parameter that is not one).
std::string OwnerOf(const HfCase& c, const std::string& name) {
  for (const TiedParameter& pair : c.tied.parameters) {
    if (pair.copy == name) return pair.owner;
  }
  return "";
}

struct Comparison {
  double logits = 0, loss = 0, gradients = 0;  // largest relative differences
  std::string worst_gradient;
};

// Builds `c` as stages [boundaries[i], boundaries[i + 1]), each from its own layers alone,
// with the checkpoint's weights; runs forward and backward of the reference tokens as a
// pipeline would (each stage's input detached, its gradient sent back); compares with the
// reference. One stage holding the whole model shares its tied weights.
Comparison Compare(const HfCase& c, const std::vector<int>& boundaries) {
  const std::string folder = CaseFolder(c.name);
  auto weights = SafetensorsFile::Open(folder + "/model.safetensors");
  auto expected = SafetensorsFile::Open(folder + "/reference.safetensors");
  EXPECT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(expected.ok()) << expected.status();
  if (!weights.ok() || !expected.ok()) return {};
  const bool whole = boundaries.size() == 2;

  std::vector<LayeredModel> stages;
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  for (size_t s = 0; s + 1 < boundaries.size(); ++s) {
    auto stage = c.spec.BuildLayers(/*seed=*/11, boundaries[s], boundaries[s + 1]);
    EXPECT_TRUE(stage.ok()) << stage.status();
    if (!stage.ok()) return {};
    for (int layer = 0; layer < c.layers; ++layer) {
      const bool mine = layer >= boundaries[s] && layer < boundaries[s + 1];
      EXPECT_EQ(stage->HasLayer(layer), mine) << "stage " << s << " layer " << layer;
    }
    // The checkpoint's tensors by name; a tied copy (absent from a tied checkpoint) takes its
    // owner's.
    for (auto& [name, parameter] : stage->NamedParameters(boundaries[s], boundaries[s + 1])) {
      const std::string owner = OwnerOf(c, name);
      auto key = c.hf_name(owner.empty() ? name : owner);
      EXPECT_TRUE(key.ok()) << key.status();
      if (!key.ok()) return {};
      const torch::Tensor value = c.Part(name, ReadTensor(**weights, *key), parameter.size(0));
      EXPECT_EQ(value.sizes(), parameter.sizes()) << name << " <- " << *key;
      torch::NoGradGuard no_grad;
      parameter.copy_(value);
    }
    if (whole && c.tied.share) {
      const absl::Status shared = c.tied.share(stage->layers, 0);
      EXPECT_TRUE(shared.ok()) << shared;
    }
    for (auto& named : stage->NamedParameters(boundaries[s], boundaries[s + 1])) {
      parameters.push_back(named);
    }
    stages.push_back(*std::move(stage));
  }
  if (whole && !c.tied.parameters.empty()) {
    // Shared: the copy is no parameter of its own any more.
    for (const auto& named : parameters) EXPECT_NE(named.first, c.tied.parameters[0].copy);
  }

  const torch::Tensor ids = ReadTensor(**expected, "input_ids");
  const torch::Tensor targets = ReadTensor(**expected, "targets");
  std::vector<torch::Tensor> inputs, outputs;
  torch::Tensor x = ids;
  for (size_t s = 0; s < stages.size(); ++s) {
    if (s > 0) x = x.detach().requires_grad_(true);
    inputs.push_back(x);
    x = stages[s].Forward(x, boundaries[s], boundaries[s + 1]);
    outputs.push_back(x);
  }
  const torch::Tensor loss = stages.back().loss(x, targets);
  loss.backward();
  for (size_t s = stages.size() - 1; s > 0; --s) outputs[s - 1].backward(inputs[s].grad());

  Comparison result;
  result.logits = RelativeDifference(x.detach(), ReadTensor(**expected, "logits"));
  result.loss = RelativeDifference(loss.detach(), ReadTensor(**expected, "loss"));
  std::map<std::string, torch::Tensor> gradients;
  for (const auto& [name, parameter] : parameters) {
    EXPECT_TRUE(parameter.grad().defined()) << name;
    if (parameter.grad().defined()) gradients[name] = parameter.grad();
  }
  // Tied copies held apart: what the runtime must sum.
  for (const TiedParameter& pair : c.tied.parameters) {
    if (gradients.count(pair.copy) == 0 || gradients.count(pair.owner) == 0) continue;
    const torch::Tensor sum = gradients[pair.owner] + gradients[pair.copy];
    gradients[pair.owner] = sum;
    gradients[pair.copy] = sum;
  }
  for (const auto& [name, gradient] : gradients) {
    const std::string owner = OwnerOf(c, name);
    auto key = c.hf_name(owner.empty() ? name : owner);
    if (!key.ok()) continue;
    const double difference = RelativeDifference(
        gradient, c.Part(name, ReadTensor(**expected, "grad." + *key), gradient.size(0)));
    if (difference >= result.gradients) {
      result.gradients = difference;
      result.worst_gradient = name;
    }
  }
  return result;
}

void ExpectEqualToTransformers(const HfCase& c, const std::vector<int>& boundaries) {
  const Comparison comparison = Compare(c, boundaries);
  const std::string where =
      absl::StrCat(c.name, " stages at [", absl::StrJoin(boundaries, ", "), "]");
  EXPECT_LE(comparison.logits, kOutputTolerance) << where;
  EXPECT_LE(comparison.loss, kOutputTolerance) << where;
  EXPECT_LE(comparison.gradients, kGradientTolerance)
      << where << ": worst " << comparison.worst_gradient;
  std::cout << where << ": max relative difference logits " << comparison.logits << ", loss "
            << comparison.loss << ", gradients " << comparison.gradients << " ("
            << comparison.worst_gradient << ")\n";
}

// Every way of cutting 4 layers (2 blocks) into contiguous stages that a test here runs.
const std::vector<std::vector<int>> kSplits = {
    {0, 4}, {0, 1, 4}, {0, 2, 4}, {0, 3, 4}, {0, 1, 3, 4}, {0, 1, 2, 3, 4}};

class HfModelsTest : public ::testing::TestWithParam<GptAttention> {};

TEST_P(HfModelsTest, LlamaWithGroupedQueryAttentionEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("llama_gqa", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, TiedLlamaWithLlama3RopeScalingEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("llama_tied_rope_scaling", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  EXPECT_EQ(c.tied.parameters[0],
            (TiedParameter{"layers.0.embed_tokens.weight", "layers.3.lm_head.weight"}));
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, LlamaWithBiasesAndHeadDimEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("llama_bias_head_dim", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, MistralWithASlidingWindowAsLongAsTheSequenceEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("mistral_window", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, MistralWithAWindowShorterThanTheSequenceEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("mistral_short_window", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, Gemma2WithAWindowOnEveryOtherBlockEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("gemma2_short_window", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, TiedQwen2WithQueryKeyValueBiasesEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("qwen2_tied", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, TiedGemmaWithMultiQueryAttentionEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("gemma_tied", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, Gemma2WithSoftCapsAndSandwichNormsEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("gemma2_softcap", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, MixtralWithFourExpertsTwoATokenEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("mixtral_experts", GetParam());
  EXPECT_TRUE(c.tied.parameters.empty());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, TiedMixtralWithOneExpertATokenAndAWindowEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("mixtral_top1_window", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, Qwen2MoeWithASharedExpertAndADenseBlockEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("qwen2_moe_shared", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, TiedQwen2MoeSparseEverySecondBlockEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("qwen2_moe_step2", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

// The experts' load-balancing loss (router_aux_loss_coef 0.5) joins the gradients as
// transformers' does; with one block its loss, pooled over all blocks' routers, is the block's.
TEST_P(HfModelsTest, ExpertsLoadBalancingLossGradientsEqualTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"mixtral_aux", "qwen2_moe_aux"}) {
    SCOPED_TRACE(name);
    const HfCase c =
        LlamaCase(name, GetParam(), [](LlamaConfig& config) { config.router_aux_loss_coef = 0.5; });
    for (const auto& split : std::vector<std::vector<int>>{{0, 3}, {0, 1, 3}, {0, 2, 3}}) {
      ExpectEqualToTransformers(c, split);
    }
  }
}

TEST_P(HfModelsTest, GraniteWithItsMultipliersEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("granite_multipliers", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, TiedGraniteWithBiasesAndUnitMultipliersEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("granite_tied_bias", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

// GraniteMoE: Granite's multipliers, Mixtral's experts stored fused ([experts, 2 x units,
// hidden] and [experts, hidden, units]), its router renamed.
TEST_P(HfModelsTest, GraniteMoeWithFusedExpertsEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("granitemoe_experts", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

// Phi-3's checkpoint fuses q/k/v and gate/up: each product is its rows of the fused tensor,
// and its gradient those rows of the fused gradient.
TEST_P(HfModelsTest, Phi3WithAWindowShorterThanTheSequenceEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("phi3_window", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, Phi3WithGroupedQueryAttentionEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("phi3_gqa", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

// LongRoPE past the original context and within it; computed with the other factors (or none)
// the logits are far from transformers'.
TEST_P(HfModelsTest, Phi3WithLongRopeEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"phi3_longrope", "phi3_longrope_short"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
    const HfCase flipped = LlamaCase(name, GetParam(), [](LlamaConfig& config) {
      std::swap(config.long_rope->short_factor, config.long_rope->long_factor);
    });
    EXPECT_GT(Compare(flipped, {0, 4}).logits, 100 * kOutputTolerance);
    const HfCase plain =
        LlamaCase(name, GetParam(), [](LlamaConfig& config) { config.long_rope.reset(); });
    EXPECT_GT(Compare(plain, {0, 4}).logits, 100 * kOutputTolerance);
  }
}

TEST_P(HfModelsTest, Gpt2EqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = Gpt2Case("gpt2", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

TEST_P(HfModelsTest, Gpt2VariantsEqualTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = Gpt2Case("gpt2_untied_variants", GetParam());
  EXPECT_TRUE(c.tied.parameters.empty());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

INSTANTIATE_TEST_SUITE_P(Attention, HfModelsTest,
                         ::testing::Values(GptAttention::kExplicit, GptAttention::kFused),
                         [](const auto& info) { return std::string(GptAttentionName(info.param)); });

// The comparison can fail: without Llama 3's scaling (or with a wrong weight) the logits move
// far beyond the tolerance.
TEST(HfModelsSensitivityTest, WrongRopeOrWeightsAreFarFromTransformers) {
  REQUIRE_REFERENCE();
  const HfCase unscaled = LlamaCase("llama_tied_rope_scaling", GptAttention::kExplicit,
                                    [](LlamaConfig& config) { config.rope_scaling.reset(); });
  EXPECT_GT(Compare(unscaled, {0, 4}).logits, 1000 * kOutputTolerance);
  const HfCase theta = LlamaCase("llama_gqa", GptAttention::kExplicit,
                                 [](LlamaConfig& config) { config.rope_theta = 500000; });
  EXPECT_GT(Compare(theta, {0, 4}).logits, 1000 * kOutputTolerance);
  // Each of Gemma 2's departures from Llama shows: either soft cap left out, the scores
  // divided by sqrt(head_dim), the norms' weights taken as scales rather than offsets.
  const std::vector<std::pair<const char*, std::function<void(LlamaConfig&)>>> gemma2_changes = {
      {"no attention cap", [](LlamaConfig& config) { config.attn_logit_softcapping = 0; }},
      {"no final cap", [](LlamaConfig& config) { config.final_logit_softcapping = 0; }},
      {"head_dim scaling", [](LlamaConfig& config) { config.query_pre_attn_scalar = 0; }},
      {"tanh GELU", [](LlamaConfig& config) { config.hidden_act = "gelu_pytorch_tanh"; }}};
  for (const auto& [what, change] : gemma2_changes) {
    SCOPED_TRACE(what);
    const HfCase changed = LlamaCase("gemma2_softcap", GptAttention::kExplicit, change);
    // tanh's GELU is within 3e-4 of the exact one on these activations: 30 tolerances.
    EXPECT_GT(Compare(changed, {0, 4}).logits, 10 * kOutputTolerance);
  }
  // The windows show: computed in full, Mistral's and Gemma 2's are far from transformers.
  for (const char* name : {"mistral_short_window", "gemma2_short_window"}) {
    SCOPED_TRACE(name);
    const HfCase full = LlamaCase(name, GptAttention::kExplicit,
                                  [](LlamaConfig& config) { config.sliding_window = 0; });
    EXPECT_GT(Compare(full, {0, 4}).logits, 100 * kOutputTolerance);
  }
  // Mixtral's routing shows: three experts a token instead of two, or the window left out.
  const HfCase three = LlamaCase("mixtral_experts", GptAttention::kExplicit,
                                 [](LlamaConfig& config) { config.experts_per_token = 3; });
  EXPECT_GT(Compare(three, {0, 4}).logits, 100 * kOutputTolerance);
  const HfCase unwindowed = LlamaCase("mixtral_top1_window", GptAttention::kExplicit,
                                      [](LlamaConfig& config) { config.sliding_window = 0; });
  EXPECT_GT(Compare(unwindowed, {0, 4}).logits, 100 * kOutputTolerance);
  // Without the load-balancing loss the router's gradients are far from transformers'.
  for (const char* name : {"mixtral_aux", "qwen2_moe_aux"}) {
    SCOPED_TRACE(name);
    const HfCase unbalanced = LlamaCase(name, GptAttention::kExplicit);
    EXPECT_GT(Compare(unbalanced, {0, 3}).gradients, 100 * kGradientTolerance);
  }
  // Qwen2-MoE's probabilities: renormalised where they are not, and the reverse.
  for (const char* name : {"qwen2_moe_shared", "qwen2_moe_step2"}) {
    SCOPED_TRACE(name);
    const HfCase flipped = LlamaCase(name, GptAttention::kExplicit, [](LlamaConfig& config) {
      config.normalize_top_k = !config.normalize_top_k;
    });
    EXPECT_GT(Compare(flipped, {0, 4}).logits, 100 * kOutputTolerance);
  }
  const HfCase as_llama = LlamaCase("gemma_tied", GptAttention::kExplicit,
                                    [](LlamaConfig& config) { config.model_type = "llama"; });
  EXPECT_GT(Compare(as_llama, {0, 4}).logits, 1000 * kOutputTolerance);
}

// OLMo: layer norms (the mean subtracted) that hold no weights, and the query, key and value
// products clamped; without the clamp the logits are far from transformers'.
TEST_P(HfModelsTest, OlmoWithClippedProductsAndParameterFreeNormsEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("olmo_clip", GetParam());
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  const HfCase unclipped =
      LlamaCase("olmo_clip", GetParam(), [](LlamaConfig& config) { config.clip_qkv = 0; });
  EXPECT_GT(Compare(unclipped, {0, 4}).logits, 100 * kOutputTolerance);
}

TEST_P(HfModelsTest, TiedOlmoEqualsTransformers) {
  REQUIRE_REFERENCE();
  const HfCase c = LlamaCase("olmo_tied", GetParam());
  ASSERT_EQ(c.tied.parameters.size(), 1u);
  for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
}

// OLMoE: q_norm and k_norm over every head's query and key together (their weights perturbed
// and their gradients compared like every other), then OLMo's clamp, and experts routed as
// Qwen2-MoE's without a shared expert.
TEST_P(HfModelsTest, OlmoeWithQueryAndKeyNormsAndExpertsEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"olmoe_experts", "olmoe_tied_norm_topk"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
}

// StarCoder 2: layer norms with weights and biases, a plain GELU MLP, biases on every product
// (or none), Mistral's window; as RMSNorms, or with a gated MLP, the logits are far off.
TEST_P(HfModelsTest, Starcoder2WithLayerNormsAndAPlainMlpEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"starcoder2_window", "starcoder2_tied_nobias"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase unwindowed = LlamaCase("starcoder2_window", GptAttention::kExplicit,
                                      [](LlamaConfig& config) { config.sliding_window = 0; });
  EXPECT_GT(Compare(unwindowed, {0, 4}).logits, 100 * kOutputTolerance);
}

// Phi: one layer norm for the attention and the MLP, both added to the block's input; part of
// each head rotated; gelu_new; biases everywhere, the LM head's too. Rotating every feature, or
// adding the MLP after the attention as Llama does, is far off.
TEST_P(HfModelsTest, PhiWithParallelAttentionAndPartialRotationEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"phi_partial", "phi_tied_three_quarters"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase whole_rotation =
      LlamaCase("phi_partial", GptAttention::kExplicit,
                [](LlamaConfig& config) { config.partial_rotary_factor = 1; });
  EXPECT_GT(Compare(whole_rotation, {0, 4}).logits, 100 * kOutputTolerance);
  const HfCase exact_gelu = LlamaCase("phi_partial", GptAttention::kExplicit,
                                      [](LlamaConfig& config) { config.hidden_act = "gelu"; });
  EXPECT_GT(Compare(exact_gelu, {0, 4}).logits, 0.0);
}

// GPT-NeoX: one query/key/value product with each head's rows in turn, part of each head
// rotated, the attention and the MLP side by side on their own norms (or, sequential, one after
// the other), biases. Computing the parallel blocks as sequential ones is far off.
TEST_P(HfModelsTest, GptNeoxWithPerHeadFusedProductsEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"gpt_neox_parallel", "gpt_neox_sequential_tied"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase sequential =
      LlamaCase("gpt_neox_parallel", GptAttention::kExplicit,
                [](LlamaConfig& config) { config.parallel_residual = false; });
  EXPECT_GT(Compare(sequential, {0, 4}).logits, 100 * kOutputTolerance);
}

// StableLM: Llama's computation with layer norms with biases and part of each head rotated,
// side by side on one norm or sequential. Rotating every feature of a head is far off.
TEST_P(HfModelsTest, StableLmWithLayerNormsAndPartialRotationEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"stablelm_parallel", "stablelm_sequential_tied"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase whole_rotation =
      LlamaCase("stablelm_parallel", GptAttention::kExplicit,
                [](LlamaConfig& config) { config.partial_rotary_factor = 1; });
  EXPECT_GT(Compare(whole_rotation, {0, 4}).logits, 100 * kOutputTolerance);
}

// GPT-J: Phi's block with the first rotary_dim features of each head rotated by pairs of
// neighbours. Rotating every feature instead of the first four is far off.
TEST_P(HfModelsTest, GptJWithInterleavedRotationEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"gptj_rotary4", "gptj_tied_full"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase whole_rotation = LlamaCase("gptj_rotary4", GptAttention::kExplicit,
                                          [](LlamaConfig& config) { config.rotary_dims = 8; });
  EXPECT_GT(Compare(whole_rotation, {0, 4}).logits, 100 * kOutputTolerance);
}

// Cohere: weight-only layer norms, the attention and the MLP side by side, every feature rotated
// by pairs of neighbours, the logits scaled. Without the scale the logits are far off.
TEST_P(HfModelsTest, CohereWithCenteredNormsAndScaledLogitsEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"cohere_bias", "cohere_tied"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase unscaled = LlamaCase("cohere_bias", GptAttention::kExplicit,
                                    [](LlamaConfig& config) { config.logit_scale = 1; });
  EXPECT_GT(Compare(unscaled, {0, 4}).logits, 100 * kOutputTolerance);
}

// Command R+: each query and key head normalised apart (use_qk_norm), with grouped-query
// attention (the perturbed weights differ per head, so a norm shared by the heads shows).
// StableLM 2 12B's qk_layernorm: the same norms, stored as a LayerNorm without bias per head
// (q_layernorm.norms.<h>.weight).
TEST_P(HfModelsTest, CohereWithQueryAndKeyNormsPerHeadEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"cohere_qk_norm", "stablelm_qk_layernorm"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
}

// GLM-4: the first half of each head rotated by pairs of neighbours, q/k/v biases, the gate and
// up products read as rows of gate_up_proj. Rotating every feature is far off.
TEST_P(HfModelsTest, GlmWithHalfRotationAndFusedGateUpEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"glm_gqa", "glm_tied_nobias"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase whole_rotation = LlamaCase("glm_gqa", GptAttention::kExplicit,
                                          [](LlamaConfig& config) { config.rotary_dims = 8; });
  EXPECT_GT(Compare(whole_rotation, {0, 4}).logits, 100 * kOutputTolerance);
}

// Falcon: one query_key_value product with each key/value group's query rows, then its key and
// value rows (one group: Falcon-7B's multi_query; two: new_decoder_architecture; one per head:
// sequential here), the attention and the MLP side by side on one norm or on two (ln_attn,
// ln_mlp), or sequential. Exact GELU in place of gelu_new shows (2e-4 here: 20 tolerances).
TEST_P(HfModelsTest, FalconWithGroupedFusedProductsEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"falcon_multi_query", "falcon_groups_two_norms", "falcon_groups_one_norm",
                           "falcon_sequential"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase exact_gelu = LlamaCase("falcon_groups_one_norm", GptAttention::kExplicit,
                                      [](LlamaConfig& config) { config.hidden_act = "gelu"; });
  EXPECT_GT(Compare(exact_gelu, {0, 4}).logits, 10 * kOutputTolerance);
}

// Nemotron: layer norms scaling by 1 + the weight with a bias, squared ReLU without a gate, part
// of each head rotated. Rotating every feature, or GELU in place of the squared ReLU, is far off.
TEST_P(HfModelsTest, NemotronWithOffsetLayerNormsAndSquaredReluEqualsTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"nemotron_gqa", "nemotron_bias_tied"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase whole_rotation = LlamaCase(
      "nemotron_gqa", GptAttention::kExplicit,
      [](LlamaConfig& config) { config.partial_rotary_factor = 1.0; });
  EXPECT_GT(Compare(whole_rotation, {0, 4}).logits, 100 * kOutputTolerance);
  const HfCase gelu = LlamaCase("nemotron_gqa", GptAttention::kExplicit,
                                [](LlamaConfig& config) { config.hidden_act = "gelu"; });
  EXPECT_GT(Compare(gelu, {0, 4}).logits, 100 * kOutputTolerance);
}

// Qwen3 (tests/data/hf_recent, transformers 4.51.3): q_norm and k_norm, an RMSNorm of each
// query and key head with one weight for all heads, before the rotation; an explicit head_dim
// (16, not hidden / heads), and attention_bias on q/k/v and o_proj. Needs no Python: the
// reference is kept in the tree.
TEST_P(HfModelsTest, Qwen3WithNormsOfEachHeadEqualsTransformers) {
  for (const char* name : {"qwen3_head_dim", "qwen3_tied_bias"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
}

// Qwen3-MoE: Qwen3's attention with Qwen2-MoE's experts without the shared one, probabilities
// as they are or renormalised, a dense first block (mlp_only_layers), and the load-balancing
// loss in the gradients.
TEST_P(HfModelsTest, Qwen3MoeWithExpertsEqualsTransformers) {
  for (const char* name : {"qwen3_moe_experts", "qwen3_moe_dense_norm_topk"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  const HfCase aux = LlamaCase("qwen3_moe_aux", GetParam(),
                               [](LlamaConfig& config) { config.router_aux_loss_coef = 0.5; });
  for (const auto& split : std::vector<std::vector<int>>{{0, 3}, {0, 1, 3}, {0, 2, 3}}) {
    ExpectEqualToTransformers(aux, split);
  }
}

// OLMo 2 (tests/data/hf_recent, transformers 4.51.3): norms after the attention and the MLP
// only, q_norm and k_norm over the whole query and key products, the padding row; tied with
// attention_bias and a head_dim that is not hidden / heads.
TEST_P(HfModelsTest, Olmo2WithNormsAfterEachBranchEqualsTransformers) {
  for (const char* name : {"olmo2_gqa", "olmo2_tied_bias"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
}

// Gemma 3 (tests/data/hf_recent, transformers 4.51.3): a local block (a window shorter than
// the sequence, masked, at rope_local_base_freq) beside a global one, query and key norms of
// each head scaling by 1 + their weight, Gemma 2's sandwich norms; and with soft-capped logits,
// multi-query attention, untied.
TEST_P(HfModelsTest, Gemma3WithLocalAndGlobalBlocksEqualsTransformers) {
  for (const char* name : {"gemma3_local_global", "gemma3_softcap", "gemma3_multimodal"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
  // The local block's own rotary base matters: at the global base the logits move.
  const HfCase one_base = LlamaCase("gemma3_local_global", GetParam(), [](LlamaConfig& config) {
    config.rope_local_theta = config.rope_theta;
  });
  EXPECT_GT(Compare(one_base, {0, 4}).logits, 1e-3);
}

// Rotary scaling other than Llama 3's: YaRN with the factor as given (transformers 4.46 and 4.51
// agree there) and linear, against the test environment's transformers.
TEST_P(HfModelsTest, YarnAndLinearRotaryScalingEqualTransformers) {
  REQUIRE_REFERENCE();
  for (const char* name : {"llama_yarn", "qwen2_linear"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
}

// YaRN with an original context (the factor max_position_embeddings over it, as transformers
// 4.51 reads it: 4 here, not the file's 8), Gemma 3's linear scaling of its global blocks only,
// and Phi-4-mini's LongRoPE over a partial rotation (tests/data/hf_recent). Without the scaling
// the logits move.
TEST_P(HfModelsTest, RecentRotaryScalingEqualsTransformers) {
  for (const char* name : {"qwen3_yarn", "gemma3_linear", "phi3_partial_longrope"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
    const HfCase unscaled = LlamaCase(name, GetParam(), [](LlamaConfig& config) {
      config.rope_scaling.reset();
      config.long_rope.reset();
    });
    EXPECT_GT(Compare(unscaled, {0, 4}).logits, 1e-4);
  }
}

// GLM-4-0414 (tests/data/hf_recent, transformers 4.51.3): GLM's fused gate/up product and
// rotation by pairs of neighbours over part of an explicit head_dim, with four norms a block
// named post_self_attn_layernorm, post_attention_layernorm (the MLP's input) and
// post_mlp_layernorm.
TEST_P(HfModelsTest, Glm4WithFourNormsABlockEqualsTransformers) {
  for (const char* name : {"glm4_bias", "glm4_tied_nobias"}) {
    SCOPED_TRACE(name);
    const HfCase c = LlamaCase(name, GetParam());
    for (const auto& split : kSplits) ExpectEqualToTransformers(c, split);
  }
}

// The comparison sees Qwen3's norms: the same weights in Llama's blocks (no q_norm and k_norm,
// every other weight loaded) give logits far from transformers'.
TEST(HfModelsSensitivityTest, Qwen3WithoutItsHeadNormsIsFarFromTransformers) {
  EXPECT_LE(Compare(LlamaCase("qwen3_head_dim", GptAttention::kExplicit), {0, 4}).logits,
            kOutputTolerance);
  const HfCase without = LlamaCase("qwen3_head_dim", GptAttention::kExplicit,
                                   [](LlamaConfig& config) { config.model_type = "llama"; });
  EXPECT_GT(Compare(without, {0, 4}).logits, 1e-3);
}

// Every parameter of case `name` maps to a key of its checkpoint and back; every key of the
// checkpoint is a parameter.
void ExpectParametersAndKeysCorrespond(const std::string& name) {
  const bool llama = name.rfind("gpt2", 0) != 0;
  auto json = ReadConfig(name);
  ASSERT_TRUE(json.ok()) << json.status();
  std::function<absl::StatusOr<std::string>(absl::string_view)> to_hf, to_tandem;
  std::function<std::optional<LlamaFusedRows>(absl::string_view)> rows_of = [](absl::string_view) {
    return std::nullopt;
  };
  ModelSpec spec;
  if (llama) {
    auto config = LlamaConfigFromJson(*json);
    ASSERT_TRUE(config.ok()) << config.status();
    spec = LlamaModelSpec(*config);
    to_hf = [c = *config](absl::string_view n) { return LlamaHfName(c, n); };
    to_tandem = [c = *config](absl::string_view n) { return LlamaTandemName(c, n); };
    rows_of = [c = *config](absl::string_view n) { return LlamaHfRows(c, n); };
  } else {
    auto config = Gpt2ConfigFromJson(*json);
    ASSERT_TRUE(config.ok()) << config.status();
    spec = Gpt2ModelSpec(*config);
    to_hf = [c = *config](absl::string_view n) { return Gpt2HfName(c, n); };
    to_tandem = [c = *config](absl::string_view n) { return Gpt2TandemName(c, n); };
  }
  auto model = spec.Build(/*seed=*/1);
  ASSERT_TRUE(model.ok()) << model.status();
  auto file = SafetensorsFile::Open(CaseFolder(name) + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> mapped;
  int64_t fused_rows = 0;  // of the parameters stored fused, which tile their keys' rows
  for (const auto& [parameter, tensor] : model->NamedParameters(0, model->num_layers())) {
    auto key = to_hf(parameter);
    ASSERT_TRUE(key.ok()) << key.status();
    auto back = to_tandem(*key);
    ASSERT_TRUE(back.ok()) << back.status();
    const std::optional<LlamaFusedRows> rows = rows_of(parameter);
    if (rows) {
      // A fused key names its first part; the part's rows lie within the key's tensor.
      EXPECT_EQ(rows_of(*back)->first_row, 0) << parameter;
      EXPECT_EQ(to_hf(*back).value_or(""), *key) << parameter;
      auto info = (*file)->Info(*key);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ((*info)->shape, rows->key_shape) << parameter;
      // Rows of the key's tensor with every dimension but the last flattened.
      const int64_t key_rows = std::accumulate(rows->key_shape.begin(), rows->key_shape.end() - 1,
                                               int64_t{1}, std::multiplies<int64_t>());
      EXPECT_LE(rows->first_row + tensor.size(0), key_rows) << parameter;
      fused_rows += tensor.size(0);
    } else {
      EXPECT_EQ(*back, parameter);
    }
    if ((*file)->Contains(*key) && std::find(mapped.begin(), mapped.end(), *key) == mapped.end()) {
      mapped.push_back(*key);
    }
  }
  if (name.rfind("phi3", 0) == 0) {
    // Per block: qkv_proj (4 + 2 + 2 heads of 8) and gate_up_proj (2 x 64 units).
    EXPECT_EQ(fused_rows, 2 * ((4 + 2 + 2) * 8 + 2 * 64));
    EXPECT_FALSE(to_tandem("model.layers.0.self_attn.k_proj.weight").ok());
  } else if (name.rfind("glm", 0) == 0) {
    // Per block: gate_up_proj (2 x 64 units); q/k/v_proj stored apart.
    EXPECT_EQ(fused_rows, 2 * 2 * 64);
    EXPECT_TRUE(to_tandem("model.layers.0.self_attn.k_proj.weight").ok());
    EXPECT_FALSE(to_tandem("model.layers.0.mlp.up_proj.weight").ok());
  } else if (name == "granitemoe_experts") {
    // Per block and expert (4 of them, 16 units): w1 and w3 (16 rows each), w2 (32 rows).
    EXPECT_EQ(fused_rows, 2 * 4 * (16 + 16 + 32));
    EXPECT_FALSE(to_tandem("model.layers.0.block_sparse_moe.experts.1.w2.weight").ok());
    EXPECT_FALSE(to_tandem("model.layers.0.block_sparse_moe.gate.weight").ok());
  } else {
    EXPECT_EQ(fused_rows, 0);
  }
  std::sort(mapped.begin(), mapped.end());
  std::vector<std::string> keys = (*file)->TensorNamesSorted();
  // A Gemma 3 multimodal checkpoint's vision tower and projector are no parameters of tandem's.
  keys.erase(std::remove_if(keys.begin(), keys.end(),
                            [&](const std::string& key) {
                              return name == "gemma3_multimodal" &&
                                     (absl::StartsWith(key, "vision_tower.") ||
                                      absl::StartsWith(key, "multi_modal_projector."));
                            }),
             keys.end());
  EXPECT_EQ(mapped, keys);
  EXPECT_FALSE(to_hf("layers.1.no_such.weight").ok());
  EXPECT_FALSE(to_tandem("model.layers.99.mlp.up_proj.weight").ok());
  if (!llama) return;
  // LlamaBlockParameters, which the checkpoint layout lists, names every block parameter
  // the model holds, with its shape, and no other.
  auto config = LlamaConfigFromJson(*json);
  ASSERT_TRUE(config.ok()) << config.status();
  std::map<std::string, std::vector<int64_t>> held, listed;
  for (const auto& [parameter, tensor] : model->NamedParameters(1, config->layers + 1)) {
    held[parameter] = tensor.sizes().vec();
  }
  for (int64_t block = 0; block < config->layers; ++block) {
    for (const auto& [parameter, shape] : LlamaBlockParameters(*config, block)) {
      listed[absl::StrCat("layers.", block + 1, ".", parameter)] = shape;
    }
  }
  EXPECT_EQ(held, listed);
}

TEST(HfNamesTest, ParametersAndCheckpointKeysCorrespond) {
  REQUIRE_REFERENCE();
  for (const std::string name :
       {"llama_gqa", "llama_tied_rope_scaling", "llama_bias_head_dim", "mistral_window",
        "qwen2_tied", "gemma_tied", "gemma2_softcap", "mistral_short_window", "gemma2_short_window",
        "mixtral_experts", "mixtral_top1_window", "qwen2_moe_shared", "qwen2_moe_step2",
        "mixtral_aux", "qwen2_moe_aux", "granite_multipliers", "granite_tied_bias", "phi3_window",
        "phi3_gqa", "phi3_longrope", "phi3_longrope_short", "granitemoe_experts", "olmo_clip",
        "olmo_tied", "olmoe_experts", "olmoe_tied_norm_topk", "starcoder2_window",
        "starcoder2_tied_nobias", "phi_partial", "phi_tied_three_quarters", "gpt_neox_parallel",
        "gpt_neox_sequential_tied", "stablelm_parallel", "stablelm_sequential_tied", "gptj_rotary4",
        "gptj_tied_full", "cohere_bias", "cohere_tied", "cohere_qk_norm", "stablelm_qk_layernorm",
        "glm_gqa", "glm_tied_nobias", "falcon_multi_query", "falcon_groups_two_norms",
        "falcon_groups_one_norm", "falcon_sequential", "nemotron_gqa", "nemotron_bias_tied",
        "llama_yarn", "qwen2_linear", "gpt2", "gpt2_untied_variants"}) {
    SCOPED_TRACE(name);
    ExpectParametersAndKeysCorrespond(name);
  }
  Gpt2Config gpt2;
  gpt2.layers = 2;
  auto old_style = Gpt2TandemName(gpt2, "h.1.attn.c_attn.weight");
  ASSERT_TRUE(old_style.ok()) << old_style.status();
  EXPECT_EQ(*old_style, "layers.2.attn.c_attn.weight");
  EXPECT_FALSE(Gpt2TandemName(gpt2, "h.1.attn.bias").ok());  // a mask buffer, no parameter
}

TEST(HfNamesTest, Qwen3ParametersAndCheckpointKeysCorrespond) {
  for (const std::string name :
       {"qwen3_head_dim", "qwen3_tied_bias", "qwen3_moe_experts", "qwen3_moe_dense_norm_topk",
        "qwen3_moe_aux", "olmo2_gqa", "olmo2_tied_bias", "gemma3_local_global", "gemma3_softcap",
        "qwen3_yarn", "gemma3_linear", "phi3_partial_longrope", "gemma3_multimodal", "glm4_bias",
        "glm4_tied_nobias"}) {
    SCOPED_TRACE(name);
    ExpectParametersAndKeysCorrespond(name);
  }
}

// ---- Config files: what is refused, and how ------------------------------------------------

void ExpectRefused(const absl::Status& status, const std::string& mentions) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(mentions), std::string::npos) << status;
}

TEST(LlamaConfigTest, ReadsLlama3ConfigAndRefusesWhatItDoesNotImplement) {
  const Json llama32 = Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
    "pretraining_tp": 1, "use_cache": true, "attention_dropout": 0.0,
    "initializer_range": 0.02})");
  auto config = LlamaConfigFromJson(llama32);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->vocab, 128256);
  EXPECT_EQ(config->kv_heads, 8);
  EXPECT_EQ(config->HeadDim(), 64);
  EXPECT_TRUE(config->tie_word_embeddings);
  ASSERT_TRUE(config->rope_scaling.has_value());
  EXPECT_EQ(config->rope_scaling->factor, 32.0);
  EXPECT_EQ(config->rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=16 H=2048 A=32 KV=8 I=8192 S=32 V=128256 hd=64 rope=500000 "
            "llama3-scaling=32/1/4/8192 tied");
  // PaLM's count for Llama 3.2 1B at S=32: 6 * (16 * (2*2048*2048 + 2*2048*512 + 3*2048*8192)
  // + 2048 * 128256) + 12 * 16 * 2048 * 32.
  EXPECT_DOUBLE_EQ(LlamaTrainingFlopsPerToken(*config),
                   6.0 * (16.0 * (2.0 * 2048 * 2048 + 2.0 * 2048 * 512 + 3.0 * 2048 * 8192) +
                          2048.0 * 128256) +
                       12.0 * 16 * 2048 * 32);

  auto with = [&](const char* field, const Json& value) {
    Json changed = llama32;
    changed[field] = value;
    return LlamaConfigFromJson(changed).status();
  };
  ExpectRefused(with("hidden_act", "gelu"), "hidden_act");
  ExpectRefused(with("model_type", "deepseek_v3"), "model_type");
  ExpectRefused(with("num_key_value_heads", 5), "num_key_value_heads");
  ExpectRefused(with("partial_rotary_factor", 0.5), "partial_rotary_factor");
  ExpectRefused(with("rope_scaling", Json::parse(R"({"rope_type": "dynamic", "factor": 4})")),
                "dynamic");
  ExpectRefused(with("rope_scaling", Json::parse(R"({"rope_type": "yarn", "factor": 0.5})")),
                "yarn");
  ExpectRefused(with("rope_scaling", Json::parse(R"({"rope_type": "linear"})")), "factor");
  ExpectRefused(with("rope_scaling", Json::parse(R"({"rope_type": "llama3", "factor": 4})")),
                "low_freq_factor");
  ExpectRefused(with("tie_word_embeddings", "yes"), "tie_word_embeddings");
  ExpectRefused(with("vocab_size", 0), "vocab_size");
  EXPECT_EQ(LlamaConfigFromJson(Json::array()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // YaRN as transformers 4.51 reads it: the factor given, or max_position_embeddings over the
  // original context where one is given; the attention factor 0.1 ln(factor) + 1 unless given,
  // or DeepSeek's ratio of mscales.
  Json yarn = llama32;
  yarn["rope_scaling"] = Json::parse(R"({"rope_type": "yarn", "factor": 4.0})");
  config = LlamaConfigFromJson(yarn);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling->type, "yarn");
  EXPECT_EQ(config->rope_scaling->factor, 4.0);
  EXPECT_EQ(config->rope_scaling->original_max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(config->RotaryScale(), 0.1 * std::log(4.0) + 1.0);
  yarn["rope_scaling"] = Json::parse(
      R"({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768})");
  config = LlamaConfigFromJson(yarn);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling->factor, 4.0);
  yarn["rope_scaling"] =
      Json::parse(R"({"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5})");
  config = LlamaConfigFromJson(yarn);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_DOUBLE_EQ(config->RotaryScale(),
                   (0.1 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0));
  EXPECT_EQ(DescribeLlama(*config).find("yarn-scaling=4/131072/32/1/") != std::string::npos, true)
      << DescribeLlama(*config);
  // Biases are supported; nulls take the defaults.
  EXPECT_TRUE(with("attention_bias", true).ok());
  EXPECT_TRUE(with("rope_scaling", nullptr).ok());
  EXPECT_TRUE(with("head_dim", nullptr).ok());
}

TEST(LlamaConfigTest, ReadsMistralAndQwen2ConfigsAsTheirFamiliesDefineThem) {
  // Mistral 7B v0.1's config.json.
  const Json mistral = Json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 32000})");
  auto config = LlamaConfigFromJson(mistral);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "mistral");
  EXPECT_EQ(config->sliding_window, 4096);
  EXPECT_FALSE(config->QkvBias());
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=32 H=4096 A=32 KV=8 I=14336 S=32 V=32000 rope=10000 window=4096 "
            "family=mistral");
  // Mistral's window is masked in every block: sequences may be longer.
  config->seq_len = 32768;
  EXPECT_TRUE(ValidateLlamaConfig(*config).ok());
  EXPECT_EQ(config->WindowOfBlock(0), 4096);
  EXPECT_EQ(config->WindowOfBlock(31), 4096);
  EXPECT_EQ(config->MaxPositions(), 32768);
  Json unwindowed = mistral;
  unwindowed["sliding_window"] = nullptr;  // Mistral 7B v0.2 and later
  config = LlamaConfigFromJson(unwindowed);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window, 0);
  // A Mistral has no biases, whatever a field says.
  unwindowed["attention_bias"] = true;
  EXPECT_FALSE(LlamaConfigFromJson(unwindowed)->QkvBias());
  unwindowed["sliding_window"] = 0;
  ExpectRefused(LlamaConfigFromJson(unwindowed).status(), "sliding_window");
  // Absent fields take MistralConfig's defaults, and Qwen2's Qwen2Config's.
  const Json mistral_sparse = Json::parse(R"({"model_type": "mistral", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 100})");
  config = LlamaConfigFromJson(mistral_sparse);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->intermediate, 14336);
  EXPECT_EQ(config->kv_heads, 8);
  EXPECT_EQ(config->max_position_embeddings, 131072);
  EXPECT_EQ(config->sliding_window, 4096);
  Json qwen_sparse = mistral_sparse;
  qwen_sparse["model_type"] = "qwen2";
  qwen_sparse.erase("vocab_size");
  qwen_sparse["num_attention_heads"] = 32;  // Qwen2Config's 32 key/value heads divide them
  config = LlamaConfigFromJson(qwen_sparse);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kv_heads, 32);
  EXPECT_EQ(config->vocab, 151936);
  EXPECT_EQ(config->intermediate, 22016);
  EXPECT_EQ(config->max_position_embeddings, 32768);
  EXPECT_EQ(config->sliding_window, 0);

  // Qwen2.5 0.5B's config.json.
  const Json qwen = Json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
    "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
  config = LlamaConfigFromJson(qwen);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "qwen2");
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_FALSE(config->attention_bias);
  EXPECT_EQ(config->sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(config->HeadDim(), 64);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=24 H=896 A=14 KV=2 I=4864 S=32 V=151936 rope=1e+06 tied qkv-bias "
            "family=qwen2");
  // Biases on q/k/v only: o_proj has none.
  config->layers = 1;
  config->vocab = 16;
  config->hidden = 28;
  config->heads = 2;
  config->kv_heads = 2;
  config->intermediate = 8;
  auto model = LlamaModelSpec(*config).Build(/*seed=*/1);
  ASSERT_TRUE(model.ok()) << model.status();
  std::set<std::string> names;
  for (const auto& named : model->NamedParameters(0, 3)) names.insert(named.first);
  EXPECT_EQ(names.count("layers.1.self_attn.q_proj.bias"), 1u);
  EXPECT_EQ(names.count("layers.1.self_attn.v_proj.bias"), 1u);
  EXPECT_EQ(names.count("layers.1.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(names.count("layers.1.mlp.down_proj.bias"), 0u);
  Json windowed = qwen;
  windowed["use_sliding_window"] = true;
  config = LlamaConfigFromJson(windowed);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window, 32768);
  // Qwen2's window is computed in full: it bounds the sequence.
  EXPECT_EQ(config->WindowOfBlock(0), 0);
  windowed["sliding_window"] = 4096;
  config = LlamaConfigFromJson(windowed);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->MaxPositions(), 4096);
  config->seq_len = 4096;
  EXPECT_TRUE(ValidateLlamaConfig(*config).ok());
  config->seq_len = 4097;
  ExpectRefused(ValidateLlamaConfig(*config), "sliding window (4096 tokens) of qwen2");
}

TEST(LlamaConfigTest, ReadsMixtralConfigsAsTheirFamilyDefinesThem) {
  // Mixtral 8x7B v0.1's config.json (mistralai/Mixtral-8x7B-v0.1).
  const Json mixtral = Json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})");
  auto config = LlamaConfigFromJson(mixtral);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Moe());
  EXPECT_EQ(config->experts, 8);
  EXPECT_EQ(config->experts_per_token, 2);
  EXPECT_EQ(config->sliding_window, 0);
  EXPECT_FALSE(config->QkvBias());
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=32 H=4096 A=32 KV=8 I=14336 S=32 V=32000 rope=1e+06 experts=8/2 "
            "family=mixtral");
  // A token passes through 2 of the 8 experts and the router: 6 * (32 * (2*4096*4096 +
  // 2*4096*1024 + 2*3*4096*14336 + 4096*8) + 4096*32000) + 12 * 32 * 4096 * 32, about 12.9
  // billion parameters' worth of its 46.7 billion.
  EXPECT_DOUBLE_EQ(LlamaTrainingFlopsPerToken(*config),
                   6.0 * (32.0 * (2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 2.0 * 3.0 * 4096 * 14336 +
                                  4096.0 * 8) +
                          4096.0 * 32000) +
                       12.0 * 32 * 4096 * 32);
  // Absent fields take MixtralConfig's defaults (not LlamaConfig's), and its attention takes
  // hidden / heads whatever head_dim says; a window is masked, as Mistral's.
  const Json sparse = Json::parse(R"({"model_type": "mixtral", "hidden_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 100, "head_dim": 8,
      "sliding_window": 16})");
  config = LlamaConfigFromJson(sparse);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->experts, 8);
  EXPECT_EQ(config->experts_per_token, 2);
  EXPECT_EQ(config->intermediate, 14336);
  EXPECT_EQ(config->kv_heads, 8);
  EXPECT_EQ(config->rope_theta, 1e6);
  EXPECT_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_EQ(config->max_position_embeddings, 131072);
  EXPECT_EQ(config->HeadDim(), 16);
  EXPECT_EQ(config->WindowOfBlock(1), 16);

  auto with = [&](const char* field, const Json& value) {
    Json bad = mixtral;
    bad[field] = value;
    return LlamaConfigFromJson(bad).status();
  };
  ExpectRefused(with("output_router_logits", true), "output_router_logits");
  ExpectRefused(with("router_jitter_noise", 0.01), "router_jitter_noise");
  ExpectRefused(with("num_experts_per_tok", 9), "num_experts_per_tok");
  ExpectRefused(with("num_experts_per_tok", 0), "num_experts_per_tok");
  ExpectRefused(with("num_local_experts", 0), "num_local_experts");
  ExpectRefused(with("hidden_act", "gelu"), "hidden_act");
  // Experts belong to Mixtral: a Llama description with them is refused.
  config = LlamaConfigFromJson(mixtral);
  config->model_type = "llama";
  ExpectRefused(ValidateLlamaConfig(*config), "num_local_experts");

  // The block holds the router and each expert's three matrices, and no MLP.
  LlamaConfig tiny = *LlamaConfigFromJson(sparse);
  tiny.intermediate = 8;
  tiny.kv_heads = 4;
  tiny.experts = 3;
  tiny.seq_len = 8;
  auto model = LlamaModelSpec(tiny).Build(/*seed=*/1);
  ASSERT_TRUE(model.ok()) << model.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : model->NamedParameters(0, 4)) {
    shapes[name] = tensor.sizes().vec();
  }
  EXPECT_EQ(shapes["layers.1.block_sparse_moe.gate.weight"], (std::vector<int64_t>{3, 128}));
  EXPECT_EQ(shapes["layers.2.block_sparse_moe.experts.2.w1.weight"],
            (std::vector<int64_t>{8, 128}));
  EXPECT_EQ(shapes["layers.2.block_sparse_moe.experts.2.w2.weight"],
            (std::vector<int64_t>{128, 8}));
  EXPECT_EQ(shapes.count("layers.1.block_sparse_moe.experts.3.w1.weight"), 0u);
  EXPECT_EQ(shapes.count("layers.1.mlp.up_proj.weight"), 0u);
  EXPECT_EQ(shapes.size(), 3u + 2u * (2 + 4 + 1 + 3 * 3));
}

// Configs of Qwen3-8B's and Qwen3-30B-A3B's sizes (their config.json as published): head_dim
// 128 beside hidden / heads, no biases, q_norm and k_norm with the family; Qwen3-MoE's 128
// experts of 768 units, 8 a token, renormalised, no shared expert.
TEST(LlamaConfigTest, ReadsQwen3ConfigsAsTheirFamiliesDefineThem) {
  const Json qwen3 = Json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
  auto config = LlamaConfigFromJson(qwen3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Qwen3());
  EXPECT_TRUE(config->HeadNorms());
  EXPECT_FALSE(config->head_qk_norms);  // Cohere's and StableLM's flag
  EXPECT_FALSE(config->QkvBias());
  EXPECT_FALSE(config->attention_bias);
  EXPECT_EQ(config->HeadDim(), 128);
  EXPECT_EQ(config->sliding_window, 0);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=36 H=4096 A=32 KV=8 I=12288 S=32 V=151936 hd=128 rope=1e+06 family=qwen3");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.self_attn.q_norm.weight").value_or(""),
            "model.layers.0.self_attn.q_norm.weight");
  const auto parameters = LlamaBlockParameters(*config, 0);
  const auto k_norm = std::find_if(parameters.begin(), parameters.end(), [](const auto& p) {
    return p.first == "self_attn.k_norm.weight";
  });
  ASSERT_NE(k_norm, parameters.end());
  EXPECT_EQ(k_norm->second, std::vector<int64_t>{128});
  // Qwen3Config's defaults.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "qwen3"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->HeadDim(), 128);
  EXPECT_EQ(config->kv_heads, 32);
  EXPECT_EQ(config->vocab, 151936);
  EXPECT_EQ(config->rms_norm_eps, 1e-6);
  // attention_bias: every attention product's, o_proj's too (Qwen2's are q/k/v only).
  Json biased = qwen3;
  biased["attention_bias"] = true;
  config = LlamaConfigFromJson(biased);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->attention_bias);
  EXPECT_FALSE(config->mlp_bias);
  // A window with use_sliding_window, as Qwen2's.
  Json windowed = qwen3;
  windowed["use_sliding_window"] = true;
  windowed["sliding_window"] = 4096;
  config = LlamaConfigFromJson(windowed);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->MaxPositions(), 4096);
  Json bad = qwen3;
  bad["rope_scaling"] = Json::parse(R"({"rope_type": "dynamic", "factor": 4.0})");
  ExpectRefused(LlamaConfigFromJson(bad).status(), "rope_scaling type \"dynamic\"");
  // Qwen3's long context: YaRN over its original 32768 positions (the factor their ratio).
  Json long_context = qwen3;
  long_context["max_position_embeddings"] = 131072;
  long_context["rope_scaling"] = Json::parse(
      R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})");
  config = LlamaConfigFromJson(long_context);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling->factor, 4.0);
  EXPECT_EQ(config->rope_scaling->original_max_position_embeddings, 32768);

  const Json qwen3_moe = Json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
  config = LlamaConfigFromJson(qwen3_moe);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Qwen3());
  EXPECT_EQ(config->experts, 128);
  EXPECT_EQ(config->experts_per_token, 8);
  EXPECT_EQ(config->ExpertUnits(), 768);
  EXPECT_EQ(config->shared_expert_intermediate, 0);
  EXPECT_TRUE(config->normalize_top_k);
  EXPECT_TRUE(config->SparseBlock(47));
  EXPECT_EQ(config->HeadDim(), 128);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=48 H=2048 A=32 KV=4 I=6144 S=32 V=151936 hd=128 rope=1e+06 experts=128/8 "
            "expert-units=768 family=qwen3_moe");
  // Qwen3MoeConfig's defaults: head_dim hidden / heads, probabilities as they are.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "qwen3_moe"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->HeadDim(), 64);
  EXPECT_EQ(config->experts, 128);
  EXPECT_FALSE(config->normalize_top_k);
  bad = qwen3_moe;
  bad["output_router_logits"] = true;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "output_router_logits");
  bad = qwen3_moe;
  bad["moe_intermediate_size"] = 0;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "moe_intermediate_size");
}

// A config of OLMo-2-1124-7B's sizes (its config.json as published): no input norm, norms after
// each branch, q_norm and k_norm over the whole products, its padding row.
TEST(LlamaConfigTest, ReadsOlmo2ConfigsAsOlmo2ConfigDefinesThem) {
  const Json olmo2 = Json::parse(R"({
    "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "olmo2", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 500000, "tie_word_embeddings": false,
    "torch_dtype": "float32", "use_cache": true, "vocab_size": 100352})");
  auto config = LlamaConfigFromJson(olmo2);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Olmo2());
  EXPECT_TRUE(config->PostNormsOnly());
  EXPECT_TRUE(config->QkNorms());
  EXPECT_FALSE(config->HeadNorms());
  EXPECT_FALSE(config->LayerNormWithoutParameters());
  EXPECT_EQ(config->clip_qkv, 0.0);
  EXPECT_EQ(config->pad_token_id, 100277);
  EXPECT_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=32 H=4096 A=32 KV=32 I=11008 S=32 V=100352 rope=500000 family=olmo2");
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, shape] : LlamaBlockParameters(*config, 0)) shapes[name] = shape;
  EXPECT_EQ(shapes.count("input_layernorm.weight"), 0u);
  EXPECT_EQ(shapes.count("pre_feedforward_layernorm.weight"), 0u);
  EXPECT_EQ(shapes.at("post_feedforward_layernorm.weight"), std::vector<int64_t>{4096});
  EXPECT_EQ(shapes.at("self_attn.k_norm.weight"), std::vector<int64_t>{4096});
  // Olmo2Config's defaults: padding row 1.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "olmo2"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->pad_token_id, 1);
  EXPECT_EQ(config->vocab, 50304);
  EXPECT_EQ(config->kv_heads, 32);
  Json bad = olmo2;
  bad["rope_scaling"] = Json::parse(R"({"rope_type": "dynamic", "factor": 2.0})");
  ExpectRefused(LlamaConfigFromJson(bad).status(), "rope_scaling");
}

// gemma-3-1b-pt's config.json as published: five local blocks (a window of 512 at base 10000)
// to one global (base 1e6), query and key norms, no soft caps, tied.
TEST(LlamaConfigTest, ReadsGemma3ConfigsAsGemma3TextConfigDefinesThem) {
  const Json gemma3 = Json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 262144})");
  auto config = LlamaConfigFromJson(gemma3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Gemma3());
  EXPECT_TRUE(config->Gemma());
  EXPECT_TRUE(config->SandwichNorms());
  EXPECT_TRUE(config->HeadNorms());
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->attn_logit_softcapping, 0.0);
  EXPECT_EQ(config->final_logit_softcapping, 0.0);
  EXPECT_EQ(config->WindowOfBlock(0), 512);
  EXPECT_EQ(config->WindowOfBlock(4), 512);
  EXPECT_EQ(config->WindowOfBlock(5), 0);  // the sixth block is global
  EXPECT_EQ(config->WindowOfBlock(11), 0);
  EXPECT_EQ(config->WindowOfBlock(25), 512);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=26 H=1152 A=4 KV=1 I=6912 S=32 V=262144 hd=256 rope=1e+06 tied window=512 "
            "window-pattern=6 local-rope=10000 act=gelu_pytorch_tanh qscale=256 "
            "family=gemma3_text");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.self_attn.q_norm.weight").value_or(""),
            "model.layers.0.self_attn.q_norm.weight");
  // Gemma3TextConfig's defaults: every sixth block global, no caps, tied, padding row 0.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "gemma3_text"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window_pattern, 6);
  EXPECT_EQ(config->rope_local_theta, 10000.0);
  EXPECT_EQ(config->query_pre_attn_scalar, 256.0);
  EXPECT_EQ(config->pad_token_id, 0);
  Json bad = gemma3;
  bad["rope_scaling"] = Json::parse(R"({"rope_type": "dynamic", "factor": 8.0})");
  ExpectRefused(LlamaConfigFromJson(bad).status(), "dynamic");
  // Gemma 3 4B's and larger's linear scaling of the global blocks.
  Json scaled = gemma3;
  scaled["rope_scaling"] = Json::parse(R"({"rope_type": "linear", "factor": 8.0})");
  config = LlamaConfigFromJson(scaled);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling->type, "linear");
  bad = gemma3;
  bad["attn_logit_softcapping"] = 50.0;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "attn_logit_softcapping");
  // Gemma 3 4B's checkpoint (Gemma3ForConditionalGeneration, its config.json as published): the
  // language model of text_config, Gemma3TextConfig's defaults for what it leaves out, its
  // tensors under language_model.
  const Json gemma3_4b = Json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                    "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1152, "image_size": 896,
    "intermediate_size": 4304, "model_type": "siglip_vision_model", "num_attention_heads": 16,
    "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}})");
  config = LlamaConfigFromJson(gemma3_4b);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Gemma3Multimodal());
  EXPECT_TRUE(config->Gemma3());
  EXPECT_EQ(config->heads, 8);
  EXPECT_EQ(config->kv_heads, 4);
  EXPECT_EQ(config->HeadDim(), 256);
  EXPECT_EQ(config->vocab, 262208);
  EXPECT_EQ(config->rope_scaling->type, "linear");
  EXPECT_EQ(config->WindowOfBlock(0), 1024);
  EXPECT_EQ(LlamaHfName(*config, "layers.3.self_attn.q_norm.weight").value_or(""),
            "language_model.model.layers.2.self_attn.q_norm.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.0.embed_tokens.weight").value_or(""),
            "language_model.model.embed_tokens.weight");
  Json no_text = gemma3_4b;
  no_text.erase("text_config");
  ExpectRefused(LlamaConfigFromJson(no_text).status(), "text_config");
  Json bad_text = gemma3_4b;
  bad_text["text_config"]["hidden_activation"] = "relu";
  ExpectRefused(LlamaConfigFromJson(bad_text).status(), "(config.json: text_config)");
  // The pattern is Gemma 3's only.
  LlamaConfig llama;
  llama.sliding_window_pattern = 6;
  ExpectRefused(ValidateLlamaConfig(llama), "sliding_window_pattern");
}

// GLM-4-9B-0414's config.json as published: half of each 128-feature head rotated, q/k/v biases,
// its padding row and norm epsilon.
TEST(LlamaConfigTest, ReadsGlm4ConfigsAsGlm4ConfigDefinesThem) {
  const Json glm4 = Json::parse(R"({
    "architectures": ["Glm4ForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 13696,
    "max_position_embeddings": 32768, "model_type": "glm4", "num_attention_heads": 32,
    "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 151552})");
  auto config = LlamaConfigFromJson(glm4);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Glm4());
  EXPECT_TRUE(config->SandwichNorms());
  EXPECT_TRUE(config->InterleavedRotary());
  EXPECT_TRUE(config->FusedGateUp());
  EXPECT_FALSE(config->Gemma());
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_FALSE(config->attention_bias);
  EXPECT_EQ(config->HeadDim(), 128);
  EXPECT_EQ(config->RotaryDim(), 64);
  EXPECT_EQ(config->pad_token_id, 151329);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, shape] : LlamaBlockParameters(*config, 0)) shapes[name] = shape;
  for (const char* norm : {"input_layernorm", "post_self_attn_layernorm",
                           "post_attention_layernorm", "post_mlp_layernorm"}) {
    EXPECT_EQ(shapes.count(absl::StrCat(norm, ".weight")), 1u) << norm;
  }
  EXPECT_EQ(shapes.count("pre_feedforward_layernorm.weight"), 0u);
  EXPECT_EQ(LlamaHfName(*config, "layers.1.mlp.up_proj.weight").value_or(""),
            "model.layers.0.mlp.gate_up_proj.weight");
  // Glm4Config's defaults.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "glm4"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->partial_rotary_factor, 0.5);
  EXPECT_EQ(config->pad_token_id, 151329);
  EXPECT_TRUE(config->qkv_bias);
}

TEST(LlamaConfigTest, ReadsQwen2MoeConfigsAsTheirFamilyDefinesThem) {
  // A config.json of Qwen1.5-MoE-A2.7B's layout and sizes.
  const Json qwen_moe = Json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "num_attention_heads": 16,
    "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
    "norm_topk_prob": false, "output_router_logits": false, "router_aux_loss_coef": 0.001})");
  auto config = LlamaConfigFromJson(qwen_moe);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_EQ(config->experts, 60);
  EXPECT_EQ(config->ExpertUnits(), 1408);
  EXPECT_FALSE(config->normalize_top_k);
  EXPECT_TRUE(config->SparseBlock(0));
  EXPECT_TRUE(config->SparseBlock(23));
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=24 H=2048 A=16 KV=16 I=5632 S=32 V=151936 rope=1e+06 qkv-bias experts=60/4 "
            "expert-units=1408 shared-units=5632 topk=raw family=qwen2_moe");
  // Per block and token: 4 experts' 3 matrices, the router, the shared expert and its gate.
  const double block = 2.0 * 2048 * 2048 + 2.0 * 2048 * 2048 + 4.0 * 3 * 2048 * 1408 + 2048.0 * 60 +
                       3.0 * 2048 * 5632 + 2048.0;
  EXPECT_DOUBLE_EQ(LlamaTrainingFlopsPerToken(*config),
                   6.0 * (24 * block + 2048.0 * 151936) + 12.0 * 24 * 2048 * 32);
  // Dense blocks: every second (decoder_sparse_step 2: 1-based indices 2, 4, ... sparse) and
  // those mlp_only_layers names.
  Json stepped = qwen_moe;
  stepped["decoder_sparse_step"] = 2;
  stepped["mlp_only_layers"] = Json::parse("[5, 3]");
  config = LlamaConfigFromJson(stepped);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->SparseBlock(0));
  EXPECT_TRUE(config->SparseBlock(1));
  EXPECT_FALSE(config->SparseBlock(3));
  EXPECT_FALSE(config->SparseBlock(5));
  EXPECT_TRUE(config->SparseBlock(7));
  EXPECT_NE(DescribeLlama(*config).find(" sparse-step=2 dense=3,5 "), std::string::npos)
      << DescribeLlama(*config);
  // The parameters follow: a dense block's MLP, a sparse block's experts.
  config->layers = 2;
  config->vocab = 16;
  config->hidden = 32;
  config->heads = 4;
  config->kv_heads = 4;
  config->intermediate = 16;
  config->expert_intermediate = 8;
  config->shared_expert_intermediate = 12;
  config->experts = 3;
  config->experts_per_token = 2;
  auto model = LlamaModelSpec(*config).Build(/*seed=*/1);
  ASSERT_TRUE(model.ok()) << model.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : model->NamedParameters(0, 4)) {
    shapes[name] = tensor.sizes().vec();
  }
  EXPECT_EQ(shapes["layers.1.mlp.up_proj.weight"], (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(shapes.count("layers.1.mlp.gate.weight"), 0u);
  EXPECT_EQ(shapes["layers.2.mlp.gate.weight"], (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(shapes["layers.2.mlp.experts.2.down_proj.weight"], (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(shapes["layers.2.mlp.shared_expert.up_proj.weight"], (std::vector<int64_t>{12, 32}));
  EXPECT_EQ(shapes["layers.2.mlp.shared_expert_gate.weight"], (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(shapes.count("layers.2.mlp.up_proj.weight"), 0u);
  for (const auto& [name, shape] : shapes) {
    auto key = LlamaHfName(*config, name);
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_EQ(*LlamaTandemName(*config, *key), name);
  }
  EXPECT_FALSE(LlamaHfName(*config, "layers.1.mlp.gate.weight").ok());

  auto with = [&](const char* field, const Json& value) {
    Json bad = qwen_moe;
    bad[field] = value;
    return LlamaConfigFromJson(bad).status();
  };
  ExpectRefused(with("output_router_logits", true), "output_router_logits");
  ExpectRefused(with("mlp_only_layers", "3"), "mlp_only_layers");
  ExpectRefused(with("decoder_sparse_step", 0), "decoder_sparse_step");
  ExpectRefused(with("moe_intermediate_size", 0), "moe_intermediate_size");
  ExpectRefused(with("num_experts_per_tok", 61), "num_experts_per_tok");
}

TEST(Gpt2ConfigTest, ReadsGpt2ConfigAndRefusesWhatItDoesNotImplement) {
  const Json gpt2 = Json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": true, "summary_type": "cls_index", "summary_use_proj": true,
    "vocab_size": 50257})");
  auto config = Gpt2ConfigFromJson(gpt2);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->hidden, 768);
  EXPECT_EQ(config->Inner(), 3072);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(DescribeGpt2(*config), "gpt2 L=12 H=768 A=12 S=32 V=50257 P=1024");
  auto with = [&](const char* field, const Json& value) {
    Json changed = gpt2;
    changed[field] = value;
    return Gpt2ConfigFromJson(changed).status();
  };
  ExpectRefused(with("activation_function", "quick_gelu"), "activation_function");
  ExpectRefused(with("add_cross_attention", true), "add_cross_attention");
  ExpectRefused(with("n_head", 7), "n_head");
  ExpectRefused(with("model_type", "gpt_neo"), "model_type");
}

TEST(LlamaConfigTest, ReadsGemmaConfigsAsTheirFamiliesDefineThem) {
  // Gemma 2 9B's config.json (google/gemma-2-9b-it).
  const Json gemma2 = Json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "sliding_window_size": 4096, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0", "use_cache": true, "vocab_size": 256000})");
  auto config = LlamaConfigFromJson(gemma2);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Gemma());
  EXPECT_TRUE(config->SandwichNorms());
  EXPECT_TRUE(config->tie_word_embeddings);  // Gemma2Config's default: the file omits it
  EXPECT_EQ(config->pad_token_id, 0);
  EXPECT_EQ(config->HeadDim(), 256);
  EXPECT_EQ(config->sliding_window, 4096);
  EXPECT_DOUBLE_EQ(config->ScoreDivisor(), 16.0);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=42 H=3584 A=16 KV=8 I=14336 S=32 V=256000 hd=256 rope=10000 tied "
            "window=4096 act=gelu_pytorch_tanh qscale=256 attn-softcap=50 final-softcap=30 "
            "family=gemma2");
  // Gemma 2 27B divides by sqrt(144); null caps are none.
  Json changed = gemma2;
  changed["query_pre_attn_scalar"] = 144;
  changed["attn_logit_softcapping"] = nullptr;
  changed["final_logit_softcapping"] = nullptr;
  config = LlamaConfigFromJson(changed);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_DOUBLE_EQ(config->ScoreDivisor(), 12.0);
  EXPECT_EQ(config->attn_logit_softcapping, 0);
  EXPECT_EQ(config->final_logit_softcapping, 0);
  // Absent fields take Gemma2Config's defaults.
  Json sparse = Json::parse(R"({"model_type": "gemma2", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100})");
  config = LlamaConfigFromJson(sparse);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->query_pre_attn_scalar, 224);
  EXPECT_EQ(config->attn_logit_softcapping, 50);
  EXPECT_EQ(config->final_logit_softcapping, 30);
  EXPECT_EQ(config->hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(config->max_position_embeddings, 8192);
  // Gemma (1): the window, caps and scalar are Gemma 2's only; hidden_act is ignored, as
  // transformers ignores it.
  Json gemma = sparse;
  gemma["model_type"] = "gemma";
  gemma["hidden_act"] = "gelu";
  gemma["sliding_window"] = 16;
  config = LlamaConfigFromJson(gemma);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->SandwichNorms());
  EXPECT_EQ(config->hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(config->sliding_window, 0);
  EXPECT_EQ(config->attn_logit_softcapping, 0);
  EXPECT_EQ(config->ScoreDivisor(), std::sqrt(32.0));
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=2 H=64 A=2 KV=1 I=128 S=32 V=100 hd=32 rope=10000 tied "
            "act=gelu_pytorch_tanh family=gemma");
  gemma["hidden_activation"] = "gelu";
  EXPECT_EQ(LlamaConfigFromJson(gemma)->hidden_act, "gelu");

  auto with = [&](const char* field, const Json& value) {
    Json bad = gemma2;
    bad[field] = value;
    return LlamaConfigFromJson(bad).status();
  };
  ExpectRefused(with("hidden_activation", "relu"), "hidden_activation");
  ExpectRefused(with("rope_scaling", Json::parse(R"({"rope_type": "linear", "factor": 2})")),
                "rope_scaling");
  ExpectRefused(with("attn_logit_softcapping", -1.0), "attn_logit_softcapping");
  ExpectRefused(with("query_pre_attn_scalar", "x"), "query_pre_attn_scalar");
  // Gemma 2's window on every other block, from the first: masked, so sequences may be longer.
  config = LlamaConfigFromJson(gemma2);
  EXPECT_EQ(config->WindowOfBlock(0), 4096);
  EXPECT_EQ(config->WindowOfBlock(1), 0);
  EXPECT_EQ(config->WindowOfBlock(40), 4096);
  config->seq_len = 8192;
  EXPECT_TRUE(ValidateLlamaConfig(*config).ok());

  // The norms of a Gemma start at zero (scale 1); Gemma 2 has two more per block.
  auto model = LlamaModelSpec(*LlamaConfigFromJson(sparse)).Build(/*seed=*/1);
  ASSERT_TRUE(model.ok()) << model.status();
  std::set<std::string> names;
  for (const auto& [name, tensor] : model->NamedParameters(0, 4)) {
    names.insert(name);
    if (name.find("norm") != std::string::npos) {
      EXPECT_EQ(tensor.abs().max().item<float>(), 0.0f) << name;
    }
  }
  EXPECT_EQ(names.count("layers.1.pre_feedforward_layernorm.weight"), 1u);
  EXPECT_EQ(names.count("layers.2.post_feedforward_layernorm.weight"), 1u);
  EXPECT_EQ(names.count("layers.1.mlp.down_proj.bias"), 0u);
}

// OLMo 7B's config.json (allenai/OLMo-7B-0424-hf): OlmoConfig's fields, its fixed norm epsilon
// (a file's rms_norm_eps is not read), head_dim hidden / heads, no MLP biases, and OlmoConfig's
// defaults for what is absent (padding row 1, 50304 tokens).
TEST(LlamaConfigTest, ReadsOlmoConfigsAsOlmoConfigDefinesThem) {
  const Json olmo = Json::parse(R"({
    "architectures": ["OlmoForCausalLM"], "model_type": "olmo", "hidden_size": 4096,
    "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 4096, "rope_theta": 10000.0,
    "attention_bias": false, "clip_qkv": 8.0, "pad_token_id": 1, "eos_token_id": 50279,
    "tie_word_embeddings": false, "vocab_size": 50304, "rms_norm_eps": 1e-6, "head_dim": 64,
    "mlp_bias": true})");
  auto config = LlamaConfigFromJson(olmo);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->clip_qkv, 8.0);
  EXPECT_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_EQ(config->HeadDim(), 128);
  EXPECT_FALSE(config->mlp_bias);
  EXPECT_TRUE(config->LayerNormWithoutParameters());
  EXPECT_EQ(config->pad_token_id.value_or(-1), 1);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=32 H=4096 A=32 KV=32 I=11008 S=32 V=50304 rope=10000 clip-qkv=8 "
            "family=olmo");
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "olmo", "hidden_size": 64,
      "num_attention_heads": 4, "clip_qkv": null})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->clip_qkv, 0.0);
  EXPECT_EQ(config->vocab, 50304);
  EXPECT_EQ(config->pad_token_id.value_or(-1), 1);
  Json bad = olmo;
  bad["clip_qkv"] = -1.0;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "clip_qkv must be positive or null, got -1");
}

// OLMoE-1B-7B's config.json (allenai/OLMoE-1B-7B-0924): 64 experts of 1024 units, 8 a token,
// not renormalised, RMSNorms of its own epsilon, q_norm and k_norm, which tensor parallelism
// would split: a shard is refused.
TEST(LlamaConfigTest, ReadsOlmoeConfigsAsOlmoeConfigDefinesThem) {
  const Json olmoe = Json::parse(R"({
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048,
    "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 16, "max_position_embeddings": 4096, "rope_theta": 10000.0,
    "attention_bias": false, "clip_qkv": null, "num_experts": 64, "num_experts_per_tok": 8,
    "norm_topk_prob": false, "output_router_logits": false, "router_aux_loss_coef": 0.01,
    "rms_norm_eps": 1e-05, "pad_token_id": 1, "eos_token_id": 50279, "vocab_size": 50304,
    "tie_word_embeddings": false})");
  auto config = LlamaConfigFromJson(olmoe);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->experts, 64);
  EXPECT_EQ(config->experts_per_token, 8);
  EXPECT_EQ(config->ExpertUnits(), 1024);
  EXPECT_FALSE(config->normalize_top_k);
  EXPECT_EQ(config->shared_expert_intermediate, 0);
  EXPECT_TRUE(config->QkNorms());
  EXPECT_FALSE(config->LayerNormWithoutParameters());
  EXPECT_EQ(config->clip_qkv, 0.0);
  EXPECT_EQ(config->pad_token_id.value_or(-1), 1);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=16 H=2048 A=16 KV=16 I=1024 S=32 V=50304 rope=10000 experts=64/8 topk=raw "
            "family=olmoe");
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "olmoe"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->experts, 64);
  EXPECT_EQ(config->hidden, 2048);
  Json bad = olmoe;
  bad["output_router_logits"] = true;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "output_router_logits");
  bad = olmoe;
  bad["num_experts"] = 0;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "mixtral, granitemoe and olmoe need them");
}

// A config of StarCoder2-3B's sizes: layer norms of epsilon norm_epsilon, use_bias for every
// product, its window, tied (PretrainedConfig's default, absent from the file); the dropouts
// are ignored (tandem computes what transformers computes in eval mode).
TEST(LlamaConfigTest, ReadsStarcoder2ConfigsAsStarcoder2ConfigDefinesThem) {
  const Json starcoder2 = Json::parse(R"({
    "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "hidden_size": 3072,
    "intermediate_size": 12288, "num_hidden_layers": 30, "num_attention_heads": 24,
    "num_key_value_heads": 2, "max_position_embeddings": 16384, "rope_theta": 999999.4420358813,
    "sliding_window": 4096, "norm_epsilon": 1e-05, "use_bias": true,
    "hidden_act": "gelu_pytorch_tanh", "attention_dropout": 0.1, "residual_dropout": 0.1,
    "embedding_dropout": 0.1, "initializer_range": 0.018042, "vocab_size": 49152,
    "bos_token_id": 0, "eos_token_id": 0})");
  auto config = LlamaConfigFromJson(starcoder2);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->LayerNormWithBias());
  EXPECT_TRUE(config->PlainMlp());
  EXPECT_TRUE(config->attention_bias);
  EXPECT_TRUE(config->mlp_bias);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->HeadDim(), 128);
  EXPECT_EQ(config->sliding_window, 4096);
  EXPECT_EQ(config->WindowOfBlock(1), 4096);
  EXPECT_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=30 H=3072 A=24 KV=2 I=12288 S=32 V=49152 rope=999999.4420358813 tied "
            "attention-bias mlp-bias window=4096 act=gelu_pytorch_tanh family=starcoder2");
  // Starcoder2Config's defaults: no window, biases, tied.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "starcoder2"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window, 0);
  EXPECT_EQ(config->vocab, 49152);
  EXPECT_EQ(config->kv_heads, 2);
  EXPECT_TRUE(config->mlp_bias);
  EXPECT_TRUE(config->tie_word_embeddings);
  Json bad = starcoder2;
  bad["hidden_act"] = "relu";
  ExpectRefused(LlamaConfigFromJson(bad).status(), "starcoder2: gelu_pytorch_tanh, gelu and silu");
  bad = starcoder2;
  bad["rope_scaling"] = Json::parse(R"({"rope_type": "dynamic", "factor": 2.0})");
  ExpectRefused(LlamaConfigFromJson(bad).status(), "rope_scaling");
}

// A config of Phi-2's sizes (its config.json as published): layer norms of epsilon
// layer_norm_eps, biases on every product and the LM head (no field), partial_rotary_factor
// 0.4 (32 of 80 features), gelu_new; dropouts ignored (tandem computes what transformers
// computes in eval mode).
TEST(LlamaConfigTest, ReadsPhiConfigsAsPhiConfigDefinesThem) {
  const Json phi2 = Json::parse(R"({
    "architectures": ["PhiForCausalLM"], "model_type": "phi", "attention_dropout": 0.0,
    "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256, "hidden_act": "gelu_new",
    "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 10240,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
    "qk_layernorm": false, "resid_pdrop": 0.1, "rope_scaling": null, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "float16", "use_cache": true,
    "vocab_size": 51200})");
  auto config = LlamaConfigFromJson(phi2);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Phi());
  EXPECT_TRUE(config->ParallelBlock());
  EXPECT_TRUE(config->HeadBias());
  EXPECT_TRUE(config->LayerNormWithBias());
  EXPECT_TRUE(config->PlainMlp());
  EXPECT_TRUE(config->attention_bias);
  EXPECT_TRUE(config->mlp_bias);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->HeadDim(), 80);
  EXPECT_EQ(config->RotaryDim(), 32);
  EXPECT_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_EQ(config->sliding_window, 0);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=32 H=2560 A=32 KV=32 I=10240 S=32 V=51200 rope=10000 attention-bias "
            "mlp-bias act=gelu_new rotary=0.4 family=phi");
  // Its parameters as transformers names them, the LM head's bias among them.
  EXPECT_EQ(LlamaHfName(*config, "layers.1.self_attn.o_proj.weight").value_or(""),
            "model.layers.0.self_attn.dense.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.33.norm.bias").value_or(""), "model.final_layernorm.bias");
  EXPECT_EQ(LlamaHfName(*config, "layers.33.lm_head.bias").value_or(""), "lm_head.bias");
  EXPECT_EQ(LlamaTandemName(*config, "model.layers.31.mlp.fc2.bias").value_or(""),
            "layers.32.mlp.fc2.bias");
  EXPECT_FALSE(LlamaTandemName(*config, "model.layers.0.self_attn.o_proj.weight").ok());
  EXPECT_FALSE(LlamaTandemName(*config, "model.norm.weight").ok());
  // PhiConfig's defaults: Phi-1's sizes, half of each head rotated.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "phi"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->vocab, 51200);
  EXPECT_EQ(config->hidden, 2048);
  EXPECT_EQ(config->layers, 24);
  EXPECT_EQ(config->kv_heads, 32);
  EXPECT_EQ(config->partial_rotary_factor, 0.5);
  EXPECT_EQ(config->hidden_act, "gelu_new");
  Json bad = phi2;
  bad["qk_layernorm"] = true;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "qk_layernorm");
  bad = phi2;
  bad["hidden_act"] = "relu";
  ExpectRefused(LlamaConfigFromJson(bad).status(), "phi: gelu_new, gelu_pytorch_tanh and gelu");
  bad = phi2;
  bad["partial_rotary_factor"] = 0.01;  // no feature rotated
  ExpectRefused(LlamaConfigFromJson(bad).status(), "rotary embeddings need an even number");
  bad = phi2;
  bad["partial_rotary_factor"] = 1.5;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "partial_rotary_factor");
  // Only Phi rotates part of a head.
  Json llama = Json::parse(R"({"model_type": "llama", "partial_rotary_factor": 0.5})");
  ExpectRefused(LlamaConfigFromJson(llama).status(), "partial_rotary_factor");
}

// A config of Pythia-160m's sizes (its config.json as published): rotary_pct 0.25 of 64
// features at rotary_emb_base 10000, layer norms of epsilon layer_norm_eps, the attention and
// the MLP side by side, exact GELU, untied.
TEST(LlamaConfigTest, ReadsGptNeoxConfigsAsGptNeoxConfigDefinesThem) {
  const Json pythia = Json::parse(R"({
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu", "hidden_size": 768, "initializer_range": 0.02,
    "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
    "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
    "torch_dtype": "float16", "use_cache": true, "use_parallel_residual": true,
    "vocab_size": 50304})");
  auto config = LlamaConfigFromJson(pythia);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->NeoX());
  EXPECT_TRUE(config->FusedQkv());
  EXPECT_TRUE(config->ParallelBlock());
  EXPECT_FALSE(config->SharedNorm());
  EXPECT_FALSE(config->HeadBias());
  EXPECT_TRUE(config->attention_bias);
  EXPECT_TRUE(config->mlp_bias);
  EXPECT_EQ(config->kv_heads, 12);
  EXPECT_EQ(config->RotaryDim(), 16);
  EXPECT_EQ(config->rope_theta, 10000);
  EXPECT_EQ(config->hidden_act, "gelu");
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=12 H=768 A=12 KV=12 I=3072 S=32 V=50304 rope=10000 attention-bias mlp-bias "
            "act=gelu rotary=0.25 parallel-residual family=gpt_neox");
  EXPECT_EQ(LlamaHfName(*config, "layers.0.embed_tokens.weight").value_or(""),
            "gpt_neox.embed_in.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.attention.query_key_value.weight").value_or(""),
            "gpt_neox.layers.0.attention.query_key_value.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.13.norm.weight").value_or(""),
            "gpt_neox.final_layer_norm.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.13.lm_head.weight").value_or(""), "embed_out.weight");
  EXPECT_EQ(LlamaTandemName(*config, "gpt_neox.layers.11.mlp.dense_4h_to_h.bias").value_or(""),
            "layers.12.mlp.dense_4h_to_h.bias");
  EXPECT_FALSE(LlamaTandemName(*config, "model.layers.0.mlp.dense_4h_to_h.bias").ok());
  // GPTNeoXConfig's defaults: GPT-NeoX-20B's sizes.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "gpt_neox"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->vocab, 50432);
  EXPECT_EQ(config->hidden, 6144);
  EXPECT_EQ(config->layers, 44);
  EXPECT_EQ(config->heads, 64);
  EXPECT_EQ(config->partial_rotary_factor, 0.25);
  EXPECT_TRUE(config->parallel_residual);
  // Sequential, without attention biases: described so.
  Json sequential = pythia;
  sequential["use_parallel_residual"] = false;
  sequential["attention_bias"] = false;
  config = LlamaConfigFromJson(sequential);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->ParallelBlock());
  EXPECT_FALSE(config->attention_bias);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=12 H=768 A=12 KV=12 I=3072 S=32 V=50304 rope=10000 mlp-bias act=gelu "
            "rotary=0.25 family=gpt_neox");
  // rotary_emb_base is what GPTNeoXConfig reads, over a rope_theta beside it.
  Json base = pythia;
  base["rotary_emb_base"] = 1000000;
  base["rope_theta"] = 10000;
  config = LlamaConfigFromJson(base);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_theta, 1e6);
  Json bad = pythia;
  bad["hidden_act"] = "relu";
  ExpectRefused(LlamaConfigFromJson(bad).status(),
                "gpt_neox: gelu_new, gelu_pytorch_tanh and gelu");
  bad = pythia;
  bad["rotary_pct"] = 0.0;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "partial_rotary_factor");
}

// Configs of Falcon-7B's and Falcon-40B's sizes and layouts: one key/value head and the
// attention and the MLP side by side on one norm; new_decoder_architecture with 8 key/value
// groups and a norm for each branch. Both tied, without biases, exact GELU.
TEST(LlamaConfigTest, ReadsFalconConfigsAsFalconConfigDefinesThem) {
  const Json falcon7b = Json::parse(R"({
    "alibi": false, "apply_residual_connection_post_layernorm": false,
    "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0, "bias": false,
    "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "hidden_size": 4544,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
    "multi_query": true, "new_decoder_architecture": false, "num_attention_heads": 71,
    "num_hidden_layers": 32, "parallel_attn": true, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 65024})");
  auto config = LlamaConfigFromJson(falcon7b);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Falcon());
  EXPECT_TRUE(config->FusedQkv());
  EXPECT_TRUE(config->ParallelBlock());
  EXPECT_TRUE(config->SharedNorm());
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_FALSE(config->attention_bias);
  EXPECT_EQ(config->kv_heads, 1);
  EXPECT_EQ(config->HeadDim(), 64);
  EXPECT_EQ(config->intermediate, 4 * 4544);
  EXPECT_EQ(config->hidden_act, "gelu");
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=32 H=4544 A=71 KV=1 I=18176 S=32 V=65024 rope=10000 tied act=gelu "
            "parallel-residual family=falcon");
  EXPECT_EQ(LlamaHfName(*config, "layers.0.embed_tokens.weight").value_or(""),
            "transformer.word_embeddings.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.self_attention.query_key_value.weight").value_or(""),
            "transformer.h.0.self_attention.query_key_value.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.33.norm.bias").value_or(""), "transformer.ln_f.bias");
  EXPECT_EQ(LlamaTandemName(*config, "transformer.h.31.mlp.dense_4h_to_h.weight").value_or(""),
            "layers.32.mlp.dense_4h_to_h.weight");
  Json falcon40b = falcon7b;
  falcon40b["hidden_size"] = 8192;
  falcon40b["num_attention_heads"] = 128;
  falcon40b["num_hidden_layers"] = 60;
  falcon40b["new_decoder_architecture"] = true;
  falcon40b["num_kv_heads"] = 8;
  falcon40b.erase("multi_query");
  config = LlamaConfigFromJson(falcon40b);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kv_heads, 8);
  EXPECT_TRUE(config->branch_norms);
  EXPECT_FALSE(config->SharedNorm());
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=60 H=8192 A=128 KV=8 I=32768 S=32 V=65024 rope=10000 tied act=gelu "
            "parallel-residual branch-norms family=falcon");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.ln_mlp.weight").value_or(""),
            "transformer.h.0.ln_mlp.weight");
  // Falcon 2's: one norm for both branches.
  falcon40b["num_ln_in_parallel_attn"] = 1;
  config = LlamaConfigFromJson(falcon40b);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->SharedNorm());
  // Sequential multi-head attention, with biases; n_embed read for hidden_size.
  Json sequential = falcon7b;
  sequential["multi_query"] = false;
  sequential["parallel_attn"] = false;
  sequential["bias"] = true;
  sequential["ffn_hidden_size"] = 1000;
  sequential.erase("hidden_size");
  sequential["n_embed"] = 4544;
  config = LlamaConfigFromJson(sequential);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kv_heads, 71);
  EXPECT_FALSE(config->ParallelBlock());
  EXPECT_TRUE(config->attention_bias && config->mlp_bias);
  EXPECT_EQ(config->intermediate, 1000);
  // What transformers cannot run, or tandem does not compute, is refused by name.
  Json bad = falcon7b;
  bad["alibi"] = true;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "alibi");
  bad = falcon40b;
  bad["parallel_attn"] = false;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "parallel_attn");
  bad = falcon7b;
  bad["num_ln_in_parallel_attn"] = 2;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "num_ln_in_parallel_attn");
  bad = falcon7b;
  bad["activation"] = "relu";
  ExpectRefused(LlamaConfigFromJson(bad).status(), "falcon: gelu_new, gelu_pytorch_tanh and gelu");
}

// A config of Minitron-4B's sizes: relu2, half of each 128-feature head rotated, 8 key/value
// heads, norm_eps.
TEST(LlamaConfigTest, ReadsNemotronConfigsAsNemotronConfigDefinesThem) {
  const Json minitron = Json::parse(R"({
    "architectures": ["NemotronForCausalLM"], "bos_token_id": 2, "eos_token_id": 3,
    "head_dim": 128, "hidden_act": "relu2", "hidden_size": 3072, "initializer_range": 0.0134,
    "intermediate_size": 9216, "max_position_embeddings": 4096, "model_type": "nemotron",
    "norm_eps": 1e-05, "num_attention_heads": 24, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "partial_rotary_factor": 0.5, "rope_theta": 10000,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 256000})");
  auto config = LlamaConfigFromJson(minitron);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Nemotron());
  EXPECT_TRUE(config->OffsetNorms());
  EXPECT_TRUE(config->LayerNormWithBias());
  EXPECT_TRUE(config->PlainMlp());
  EXPECT_EQ(config->HeadDim(), 128);
  EXPECT_EQ(config->RotaryDim(), 64);
  EXPECT_EQ(config->kv_heads, 8);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=32 H=3072 A=24 KV=8 I=9216 S=32 V=256000 hd=128 rope=10000 act=relu2 "
            "rotary=0.5 family=nemotron");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.mlp.up_proj.weight").value_or(""),
            "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.33.norm.bias").value_or(""), "model.norm.bias");
  EXPECT_FALSE(LlamaTandemName(*config, "model.layers.0.mlp.gate_proj.weight").ok());
  // NemotronConfig's defaults: Nemotron-4 15B's sizes.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "nemotron"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->hidden, 6144);
  EXPECT_EQ(config->hidden_act, "relu2");
  EXPECT_EQ(config->partial_rotary_factor, 0.5);
  Json bad = minitron;
  bad["rope_scaling"] = Json::parse(R"({"rope_type": "linear", "factor": 2.0})");
  ExpectRefused(LlamaConfigFromJson(bad).status(), "rope_scaling");
  bad = minitron;
  bad["hidden_act"] = "relu";
  ExpectRefused(LlamaConfigFromJson(bad).status(), "nemotron: relu2");
  // relu2 is Nemotron's only.
  Json llama = Json::parse(R"({"model_type": "llama", "hidden_act": "relu2"})");
  ExpectRefused(LlamaConfigFromJson(llama).status(), "relu2");
}

// A config of StableLM 2 1.6B's sizes (its config.json as published): q/k/v biases, a quarter
// of each head rotated, sequential, layer norms of epsilon layer_norm_eps.
TEST(LlamaConfigTest, ReadsStableLmConfigsAsStableLmConfigDefinesThem) {
  const Json stablelm2 = Json::parse(R"({
    "architectures": ["StableLmForCausalLM"], "bos_token_id": 100257, "eos_token_id": 100257,
    "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "layer_norm_eps": 1e-05, "max_position_embeddings": 4096,
    "model_type": "stablelm", "num_attention_heads": 32, "num_hidden_layers": 24,
    "num_key_value_heads": 32, "partial_rotary_factor": 0.25, "qk_layernorm": false,
    "rope_scaling": null, "rope_theta": 10000, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "use_parallel_residual": false,
    "use_qkv_bias": true, "vocab_size": 100352})");
  auto config = LlamaConfigFromJson(stablelm2);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->StableLm());
  EXPECT_TRUE(config->LayerNormWithBias());
  EXPECT_FALSE(config->PlainMlp());
  EXPECT_FALSE(config->ParallelBlock());
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_FALSE(config->attention_bias);
  EXPECT_FALSE(config->mlp_bias);
  EXPECT_EQ(config->RotaryDim(), 16);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=24 H=2048 A=32 KV=32 I=5632 S=32 V=100352 rope=10000 qkv-bias rotary=0.25 "
            "family=stablelm");
  EXPECT_EQ(LlamaHfName(*config, "layers.25.norm.bias").value_or(""), "model.norm.bias");
  // StableLmConfig's defaults: StableLM-3B-4E1T's sizes, no biases, sequential.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "stablelm"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->hidden, 2560);
  EXPECT_EQ(config->intermediate, 6912);
  EXPECT_EQ(config->partial_rotary_factor, 0.25);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_FALSE(config->parallel_residual);
  // With use_parallel_residual: one norm, described so.
  Json parallel = stablelm2;
  parallel["use_parallel_residual"] = true;
  config = LlamaConfigFromJson(parallel);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->ParallelBlock());
  EXPECT_TRUE(config->SharedNorm());
  EXPECT_NE(DescribeLlama(*config).find(" parallel-residual"), std::string::npos);
  // StableLM 2 12B's norm of each query and key head.
  Json per_head = stablelm2;
  per_head["qk_layernorm"] = true;
  config = LlamaConfigFromJson(per_head);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->head_qk_norms);
  EXPECT_NE(DescribeLlama(*config).find(" qk-norm"), std::string::npos);
  EXPECT_EQ(LlamaHfName(*config, "layers.1.self_attn.k_layernorm.norms.31.weight").value_or(""),
            "model.layers.0.self_attn.k_layernorm.norms.31.weight");
  // Only GPT-NeoX and StableLM put the attention and the MLP side by side.
  LlamaConfig llama;
  llama.parallel_residual = true;
  ExpectRefused(ValidateLlamaConfig(llama), "use_parallel_residual");
}

// GPT-J-6B's config.json as published: its own names for the sizes, rotary_dim 64 of 256
// features, gelu_new; the task-specific parameters and dropouts ignored.
TEST(LlamaConfigTest, ReadsGptJConfigsAsGptJConfigDefinesThem) {
  const Json gptj = Json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPTJForCausalLM"],
    "attn_pdrop": 0.0, "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256,
    "gradient_checkpointing": false, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_inner": null, "n_layer": 28,
    "n_positions": 2048, "resid_pdrop": 0.0, "rotary": true, "rotary_dim": 64,
    "scale_attn_weights": true, "summary_activation": null, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": true, "summary_type": "cls_index", "summary_use_proj": true,
    "tie_word_embeddings": false, "tokenizer_class": "GPT2Tokenizer", "use_cache": true,
    "vocab_size": 50400})");
  auto config = LlamaConfigFromJson(gptj);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->GptJ());
  EXPECT_TRUE(config->InterleavedRotary());
  EXPECT_TRUE(config->ParallelBlock());
  EXPECT_TRUE(config->SharedNorm());
  EXPECT_TRUE(config->HeadBias());
  EXPECT_FALSE(config->attention_bias);
  EXPECT_TRUE(config->mlp_bias);
  EXPECT_EQ(config->hidden, 4096);
  EXPECT_EQ(config->layers, 28);
  EXPECT_EQ(config->heads, 16);
  EXPECT_EQ(config->kv_heads, 16);
  EXPECT_EQ(config->intermediate, 16384);
  EXPECT_EQ(config->max_position_embeddings, 2048);
  EXPECT_EQ(config->RotaryDim(), 64);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=28 H=4096 A=16 KV=16 I=16384 S=32 V=50400 rope=10000 mlp-bias act=gelu_new "
            "rotary-dims=64 family=gptj");
  EXPECT_EQ(LlamaHfName(*config, "layers.0.embed_tokens.weight").value_or(""),
            "transformer.wte.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.5.attn.out_proj.weight").value_or(""),
            "transformer.h.4.attn.out_proj.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.29.norm.bias").value_or(""), "transformer.ln_f.bias");
  EXPECT_EQ(LlamaHfName(*config, "layers.29.lm_head.bias").value_or(""), "lm_head.bias");
  EXPECT_EQ(LlamaTandemName(*config, "transformer.h.27.ln_1.weight").value_or(""),
            "layers.28.ln_1.weight");
  Json bad = gptj;
  bad["rotary_dim"] = nullptr;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "rotary_dim null");
  bad = gptj;
  bad["rotary_dim"] = 512;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "rotary_dim");
  bad = gptj;
  bad["activation_function"] = "relu";
  ExpectRefused(LlamaConfigFromJson(bad).status(), "activation_function \"relu\"");
}

// A config of Command R's sizes (c4ai-command-r-v01's config.json as published): tied, padding
// row 0, logit_scale 0.0625, rope_theta 8e6, multi-head attention, no biases.
TEST(LlamaConfigTest, ReadsCohereConfigsAsCohereConfigDefinesThem) {
  const Json command_r = Json::parse(R"({
    "architectures": ["CohereForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 5, "eos_token_id": 255001, "hidden_act": "silu", "hidden_size": 8192,
    "initializer_range": 0.02, "intermediate_size": 22528, "layer_norm_eps": 1e-05,
    "logit_scale": 0.0625, "max_position_embeddings": 8192, "model_type": "cohere",
    "num_attention_heads": 64, "num_hidden_layers": 40, "num_key_value_heads": 64,
    "pad_token_id": 0, "rope_theta": 8000000.0, "torch_dtype": "float16",
    "use_cache": true, "use_qk_norm": false, "vocab_size": 256000})");
  auto config = LlamaConfigFromJson(command_r);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Cohere());
  EXPECT_TRUE(config->InterleavedRotary());
  EXPECT_TRUE(config->ParallelBlock());
  EXPECT_TRUE(config->SharedNorm());
  EXPECT_FALSE(config->LayerNormWithBias());
  EXPECT_FALSE(config->HeadBias());
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->pad_token_id, 0);
  EXPECT_EQ(config->logit_scale, 0.0625);
  EXPECT_EQ(config->RotaryDim(), 128);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=40 H=8192 A=64 KV=64 I=22528 S=32 V=256000 rope=8e+06 tied "
            "logit-scale=0.0625 family=cohere");
  // CohereConfig's defaults: tied, padding row 0.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "cohere"})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->pad_token_id, 0);
  EXPECT_EQ(config->vocab, 256000);
  // Command R+'s sizes: grouped-query attention, each query and key head normalised apart.
  Json plus = command_r;
  plus["hidden_size"] = 12288;
  plus["intermediate_size"] = 33792;
  plus["num_attention_heads"] = 96;
  plus["num_key_value_heads"] = 8;
  plus["num_hidden_layers"] = 64;
  plus["rope_theta"] = 75000000.0;
  plus["use_qk_norm"] = true;
  config = LlamaConfigFromJson(plus);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->head_qk_norms);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=64 H=12288 A=96 KV=8 I=33792 S=32 V=256000 rope=7.5e+07 tied "
            "logit-scale=0.0625 qk-norm family=cohere");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.self_attn.k_norm.weight").value_or(""),
            "model.layers.0.self_attn.k_norm.weight");
  Json bad = command_r;
  bad["logit_scale"] = 0;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "logit_scale");
}

// glm-4-9b-chat-hf's config.json as published: q/k/v biases, the rotation over half of the
// 128-feature heads, its padding row and norm epsilon.
TEST(LlamaConfigTest, ReadsGlmConfigsAsGlmConfigDefinesThem) {
  const Json glm4 = Json::parse(R"({
    "architectures": ["GlmForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 13696,
    "max_position_embeddings": 131072, "model_type": "glm", "num_attention_heads": 32,
    "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
    "rms_norm_eps": 1.5625e-07, "rope_theta": 10000.0, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 151552})");
  auto config = LlamaConfigFromJson(glm4);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Glm());
  EXPECT_TRUE(config->InterleavedRotary());
  EXPECT_TRUE(config->FusedGateUp());
  EXPECT_FALSE(config->FusedCheckpoint());
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_FALSE(config->attention_bias);
  EXPECT_EQ(config->HeadDim(), 128);
  EXPECT_EQ(config->RotaryDim(), 64);
  EXPECT_EQ(config->pad_token_id, 151329);
  EXPECT_EQ(config->rms_norm_eps, 1.5625e-7);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=40 H=4096 A=32 KV=2 I=13696 S=32 V=151552 rope=10000 qkv-bias "
            "rotary-dims=64 family=glm");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.mlp.up_proj.weight").value_or(""),
            "model.layers.0.mlp.gate_up_proj.weight");
  EXPECT_EQ(LlamaHfName(*config, "layers.1.self_attn.v_proj.bias").value_or(""),
            "model.layers.0.self_attn.v_proj.bias");
  Json bad = glm4;
  bad["head_dim"] = 512;  // rotates more features than a head has
  ExpectRefused(LlamaConfigFromJson(bad).status(), "head_dim");
  bad = glm4;
  bad["rope_scaling"] = Json::parse(R"({"rope_type": "linear", "factor": 2.0})");
  ExpectRefused(LlamaConfigFromJson(bad).status(), "rope_scaling");
}

TEST(LlamaConfigTest, ReadsGraniteAndPhi3ConfigsAsTheirFamiliesDefineThem) {
  // A config of Granite 3.0 8B's sizes and multipliers.
  const Json granite = Json::parse(R"({
    "architectures": ["GraniteForCausalLM"], "model_type": "granite", "hidden_size": 4096,
    "intermediate_size": 12800, "num_hidden_layers": 40, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 49155, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true,
    "attention_bias": false, "mlp_bias": false, "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22, "attention_multiplier": 0.0078125, "logits_scaling": 16.0,
    "head_dim": 64})");
  auto config = LlamaConfigFromJson(granite);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->embedding_multiplier, 12.0);
  EXPECT_EQ(config->residual_multiplier, 0.22);
  EXPECT_EQ(config->logits_scaling, 16.0);
  EXPECT_EQ(config->head_dim, 0);                   // Granite's attention takes hidden / heads
  EXPECT_DOUBLE_EQ(config->ScoreDivisor(), 128.0);  // scores times 1/128, not over sqrt(128)
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=40 H=4096 A=32 KV=8 I=12800 S=32 V=49155 rope=10000 tied embedding-mult=12 "
            "residual-mult=0.22 attention-mult=0.0078125 logits-scaling=16 family=granite");
  // Absent multipliers are GraniteConfig's 1: scores are then not scaled at all.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "granite", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->embedding_multiplier, 1.0);
  EXPECT_EQ(config->attention_multiplier, 1.0);
  EXPECT_DOUBLE_EQ(config->ScoreDivisor(), 1.0);
  EXPECT_EQ(config->intermediate, 11008);
  Json bad = granite;
  bad["attention_multiplier"] = 0;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "attention_multiplier");
  bad = granite;
  bad["logits_scaling"] = -1;
  ExpectRefused(LlamaConfigFromJson(bad).status(), "logits_scaling");

  // GraniteMoE: the multipliers and GraniteMoeConfig's 8 experts, 2 a token; its router and
  // experts under their fused keys; transformers' load-balancing loss refused as Mixtral's.
  Json granitemoe = granite;
  granitemoe["model_type"] = "granitemoe";
  granitemoe["intermediate_size"] = 512;
  config = LlamaConfigFromJson(granitemoe);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->experts, 8);
  EXPECT_EQ(config->experts_per_token, 2);
  EXPECT_DOUBLE_EQ(config->ScoreDivisor(), 128.0);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=40 H=4096 A=32 KV=8 I=512 S=32 V=49155 rope=10000 tied experts=8/2 "
            "embedding-mult=12 residual-mult=0.22 attention-mult=0.0078125 logits-scaling=16 "
            "family=granitemoe");
  EXPECT_EQ(LlamaHfName(*config, "layers.2.block_sparse_moe.gate.weight").value_or(""),
            "model.layers.1.block_sparse_moe.router.layer.weight");
  const std::optional<LlamaFusedRows> w3 =
      LlamaHfRows(*config, "layers.2.block_sparse_moe.experts.5.w3.weight");
  ASSERT_TRUE(w3.has_value());
  EXPECT_EQ(w3->first_row, 5 * 1024 + 512);
  EXPECT_EQ(w3->key_shape, (std::vector<int64_t>{8, 1024, 4096}));
  const std::optional<LlamaFusedRows> w2 =
      LlamaHfRows(*config, "layers.2.block_sparse_moe.experts.5.w2.weight");
  ASSERT_TRUE(w2.has_value());
  EXPECT_EQ(w2->first_row, 5 * 4096);
  EXPECT_EQ(w2->key_shape, (std::vector<int64_t>{8, 4096, 512}));
  granitemoe["output_router_logits"] = true;
  ExpectRefused(LlamaConfigFromJson(granitemoe).status(), "output_router_logits");

  // A config of Phi-4's sizes: no window, a padding row, no rope scaling.
  const Json phi3 = Json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 5120,
    "intermediate_size": 17920, "num_hidden_layers": 40, "num_attention_heads": 40,
    "num_key_value_heads": 10, "vocab_size": 100352, "max_position_embeddings": 16384,
    "original_max_position_embeddings": 16384, "rms_norm_eps": 1e-05, "rope_theta": 250000,
    "rope_scaling": null, "sliding_window": null, "pad_token_id": 100349,
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
    "tie_word_embeddings": false})");
  config = LlamaConfigFromJson(phi3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->FusedCheckpoint());
  EXPECT_EQ(config->sliding_window, 0);
  EXPECT_EQ(config->pad_token_id, 100349);
  EXPECT_EQ(DescribeLlama(*config),
            "llama L=40 H=5120 A=40 KV=10 I=17920 S=32 V=100352 rope=250000 family=phi3");
  const std::optional<LlamaFusedRows> v = LlamaHfRows(*config, "layers.3.self_attn.v_proj.weight");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->first_row, 40 * 128 + 10 * 128);
  EXPECT_EQ(v->key_shape, (std::vector<int64_t>{(40 + 2 * 10) * 128, 5120}));
  const std::optional<LlamaFusedRows> up = LlamaHfRows(*config, "layers.40.mlp.up_proj.weight");
  ASSERT_TRUE(up.has_value());
  EXPECT_EQ(up->first_row, 17920);
  EXPECT_FALSE(LlamaHfRows(*config, "layers.3.self_attn.o_proj.weight").has_value());
  EXPECT_FALSE(LlamaHfRows(*config, "layers.41.norm.weight").has_value());
  EXPECT_EQ(LlamaHfName(*config, "layers.1.self_attn.k_proj.weight").value_or(""),
            "model.layers.0.self_attn.qkv_proj.weight");
  // Phi-3 mini 4k's window, masked in every block; absent fields Phi3Config's.
  Json mini = Json::parse(R"({"model_type": "phi3", "sliding_window": 2047})");
  config = LlamaConfigFromJson(mini);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->WindowOfBlock(0), 2047);
  EXPECT_EQ(config->vocab, 32064);
  EXPECT_EQ(config->pad_token_id, 32000);
  EXPECT_EQ(config->intermediate, 8192);
  EXPECT_EQ(config->kv_heads, 32);
  // The 128k models' LongRoPE: a factor per frequency (head_dim 96: 48), the older name "su"
  // read as it; cos and sin scaled by sqrt(1 + ln 32 / ln 4096) for 131072 positions over 4096.
  Json long_context = mini;
  long_context["max_position_embeddings"] = 131072;
  long_context["original_max_position_embeddings"] = 4096;
  long_context["rope_scaling"] = {{"type", "su"},
                                  {"short_factor", std::vector<double>(48, 1.0)},
                                  {"long_factor", std::vector<double>(48, 2.5)}};
  config = LlamaConfigFromJson(long_context);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->long_rope.has_value());
  EXPECT_EQ(config->long_rope->long_factor[47], 2.5);
  EXPECT_EQ(config->long_rope->original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(config->RotaryScale(), std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  const std::string described = DescribeLlama(*config);
  EXPECT_NE(described.find(" longrope=4096/"), std::string::npos) << described;
  // Other factors, another description.
  Json other = long_context;
  other["rope_scaling"]["long_factor"][3] = 2.6;
  EXPECT_NE(DescribeLlama(*LlamaConfigFromJson(other)), described);
  long_context["rope_scaling"]["long_factor"] = std::vector<double>(47, 2.5);
  ExpectRefused(LlamaConfigFromJson(long_context).status(),
                "a factor for each pair of rotated features (48)");
  long_context["rope_scaling"]["type"] = "dynamic";
  ExpectRefused(LlamaConfigFromJson(long_context).status(), "\"dynamic\"");
  // Other families' configs keep every multiplier at 1 and no fused checkpoint.
  config = LlamaConfigFromJson(Json::parse(R"({"model_type": "llama",
      "embedding_multiplier": 12.0})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->embedding_multiplier, 1.0);
  EXPECT_FALSE(config->FusedCheckpoint());
}

TEST(HfModelSpecTest, DescriptionsCostsAndTensorParallelRules) {
  LlamaConfig llama;
  llama.layers = 2;
  llama.hidden = 32;
  llama.heads = 4;
  llama.kv_heads = 2;
  llama.intermediate = 64;
  llama.vocab = 64;
  llama.seq_len = 16;
  auto model = LlamaModelSpec(llama).BuildLayers(/*seed=*/1, 0, 0);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->layer_names,
            (std::vector<std::string>{"embedding", "block0", "block1", "head"}));
  ASSERT_EQ(model->layer_costs.size(), 4u);
  // Per block: 2 * (2*32*32 + 2*32*16 + 3*32*64) products + 4 * 32 * 16 attention.
  EXPECT_DOUBLE_EQ(model->layer_costs[1],
                   2.0 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64) + 4.0 * 32 * 16);
  EXPECT_GT(model->split_pass_costs[1], model->split_pass_costs[0]);
  EXPECT_TRUE(model->shard_for_tensor_parallel);
  // A degree that does not divide the key/value heads of one fused product split by key/value
  // groups (Falcon's) is refused before anything changes; elsewhere k_proj and v_proj are held
  // whole (hf_tensor_parallel_test).
  LlamaConfig falcon = llama;
  falcon.model_type = "falcon";
  falcon.hidden_act = "gelu";
  falcon.parallel_residual = true;
  auto built = LlamaModelSpec(falcon).Build(/*seed=*/1);
  ASSERT_TRUE(built.ok()) << built.status();
  TensorParallel tp;
  tp.size = 4;
  const absl::Status refused = built->shard_for_tensor_parallel(built->layers, 0, tp);
  ExpectRefused(refused, "num_key_value_heads");
  // It says why, and what to choose instead.
  ExpectRefused(refused,
                "query_key_value is split by key/value groups (choose a tensor-parallel degree "
                "that divides 2)");
  // Sequence parallelism needs a sequence that splits.
  LlamaConfig odd = llama;
  odd.seq_len = 15;
  auto odd_model = LlamaModelSpec(odd).Build(/*seed=*/1);
  ASSERT_TRUE(odd_model.ok()) << odd_model.status();
  tp.size = 2;
  tp.sequence_parallel = true;
  ExpectRefused(odd_model->shard_for_tensor_parallel(odd_model->layers, 0, tp),
                "sequence length");

  Gpt2Config gpt2;
  gpt2.layers = 3;
  auto gpt2_model = Gpt2ModelSpec(gpt2).Build(/*seed=*/1);
  ASSERT_TRUE(gpt2_model.ok()) << gpt2_model.status();
  EXPECT_EQ(gpt2_model->num_layers(), 5);
  EXPECT_TRUE(gpt2_model->shard_for_tensor_parallel);
  // GPT-2's own vocabulary (50257 rows) does not split: refused naming it.
  Gpt2Config released = gpt2;
  released.layers = 1;
  released.hidden = 16;
  released.vocab = 50257;
  auto released_model = Gpt2ModelSpec(released).Build(/*seed=*/1);
  ASSERT_TRUE(released_model.ok()) << released_model.status();
  TensorParallel pair;
  pair.size = 2;
  ExpectRefused(released_model->shard_for_tensor_parallel(released_model->layers, 0, pair),
                "vocab_size");
  // Same seed, same parameters, layer by layer.
  auto again = Gpt2ModelSpec(gpt2).BuildLayers(/*seed=*/1, 2, 3);
  ASSERT_TRUE(again.ok());
  const auto whole = gpt2_model->NamedParameters(2, 3);
  const auto alone = again->NamedParameters(2, 3);
  ASSERT_EQ(whole.size(), alone.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(whole[i].first, alone[i].first);
    EXPECT_TRUE(torch::equal(whole[i].second, alone[i].second)) << whole[i].first;
  }
  // Invalid configs are refused when the model is built.
  gpt2.hidden = 30;
  gpt2.heads = 4;
  EXPECT_EQ(Gpt2ModelSpec(gpt2).Build(1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::runtime::libtorch
