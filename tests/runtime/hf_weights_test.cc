// Hugging Face weights in and out (runtime/torch/hf_weights.h), against transformers:
// hf_weights_reference.py saves tiny random Llama (grouped-query attention, tied and untied,
// bfloat16, sharded) and GPT-2 models; `tandem train --init-from` must start from them (its
// first loss equal to transformers' on the same batch), `tandem checkpoint export` must write
// folders transformers loads without a warning and with tandem's loss, and importing then
// exporting must give the same bytes. Layouts, descriptions and every refusal are checked in
// C++ without Python. The path of the tandem program is the first argument. Tests that need
// transformers are skipped, with the reason, when python3 cannot import it and torch.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "formats/safetensors.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint.h"
#include "runtime/stage_checkpoint.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/hf_weights.h"
#include "runtime/torch/llama.h"
#include "runtime/torch/model.h"
#include "tests/support/command.h"
#include "tests/support/checkpoint_parameters.h"
#include "tests/support/python_reference.h"
#include "tests/support/train_cli.h"

namespace tandem::runtime::libtorch {
namespace {

namespace fs = std::filesystem;
using formats::SafetensorsFile;
using formats::SafetensorsFolder;
using testing::Outcome;
using testing::RunCommand;

std::string g_tandem;  // the tandem program
constexpr double kLossTolerance = 1e-5;  // relative
constexpr int64_t kSeqLen = 16;
constexpr uint64_t kSeed = 7;
// tandem train's batch in these tests, and the flags that give it.
constexpr int64_t kGlobalBatch = 4;
constexpr char kBatchFlags[] = " --global-batch 4 --microbatches 2 --schedule 1f1b";

std::string Python() { return "python3"; }

// ---- The reference folders -------------------------------------------------------------------

using Reference = tandem::testing::PythonReference;

const Reference& References() {
  static const Reference* reference = new Reference(
      tandem::testing::MakePythonReference("torch, transformers, safetensors", TANDEM_HF_WEIGHTS_SCRIPT, "hf_weights"));
  return *reference;
}

#define REQUIRE_REFERENCE() TANDEM_REQUIRE_PYTHON_REFERENCE(References())

std::string Case(const std::string& name) { return absl::StrCat(References().folder, "/", name); }

// A fresh folder for one test's files, removed at the end of the test.
class Scratch {
 public:
  Scratch() {
    path_ = (fs::temp_directory_path() /
             absl::StrCat("tandem_hf_weights_test_", ::getpid(), "_",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    RemoveAll(path_).IgnoreError();
    fs::create_directories(path_);
  }
  ~Scratch() { RemoveAll(path_).IgnoreError(); }
  std::string operator/(const std::string& name) const { return absl::StrCat(path_, "/", name); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- Helpers ----------------------------------------------------------------------------------

// Samples [0, count) of `iteration` of the synthetic task `tandem train` trains on.
Batch SyntheticBatch(int64_t vocab, int64_t iteration, int64_t count) {
  SyntheticTaskOptions task;
  task.vocab = vocab;
  task.seq_len = kSeqLen;
  task.seed = kSeed;
  auto data = MakeSyntheticDataset(task);
  EXPECT_TRUE(data.ok()) << data.status();
  auto batch = (*data)->Samples(iteration, 0, count);
  EXPECT_TRUE(batch.ok()) << batch.status();
  return *batch;
}

void WriteTokens(const std::string& path, const Batch& batch) {
  const torch::Tensor inputs = batch.inputs.to(torch::kLong).contiguous();
  const torch::Tensor targets = batch.targets.to(torch::kLong).contiguous();
  auto tensor = [](const char* name, const torch::Tensor& t) {
    formats::TensorToWrite w;
    w.name = name;
    w.data_type = formats::DataType::kInt64;
    w.shape = t.sizes().vec();
    w.bytes = absl::Span<const uint8_t>(static_cast<const uint8_t*>(t.data_ptr()),
                                        static_cast<size_t>(t.numel()) * sizeof(int64_t));
    return w;
  };
  const std::vector<formats::TensorToWrite> tensors = {tensor("input_ids", inputs),
                                                       tensor("targets", targets)};
  const absl::Status written = formats::WriteSafetensorsFile(path, tensors);
  ASSERT_TRUE(written.ok()) << written;
}

// What transformers makes of a folder: from_pretrained's report and the loss on `tokens`.
struct HfLoad {
  double loss = NAN;
  Json report;
  std::string output;
};

HfLoad TransformersLoss(const std::string& folder, const std::string& tokens) {
  HfLoad load;
  const Outcome o = RunCommand(absl::StrCat(Python(), " '", TANDEM_HF_WEIGHTS_SCRIPT, "' loss '",
                                            folder, "' '", tokens, "'"));
  load.output = o.output;
  EXPECT_EQ(o.exit_status, 0) << o.output;
  for (absl::string_view line : absl::StrSplit(o.output, '\n')) {
    if (!absl::StartsWith(line, "{\"loss\"")) continue;
    load.report = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (load.report.is_object()) load.loss = load.report["loss"].get<double>();
  }
  EXPECT_FALSE(std::isnan(load.loss)) << o.output;
  return load;
}

// No missing, unexpected or mismatched key and nothing logged while loading.
void ExpectCleanLoad(const HfLoad& load) {
  ASSERT_TRUE(load.report.is_object()) << load.output;
  EXPECT_TRUE(load.report["missing"].empty()) << load.report.dump();
  EXPECT_TRUE(load.report["unexpected"].empty()) << load.report.dump();
  EXPECT_TRUE(load.report["mismatched"].empty()) << load.report.dump();
  EXPECT_TRUE(load.report["log"].empty()) << load.report.dump();
}

double Relative(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

// The loss of the first iteration (1: the log counts from 1) in a --log-json log.
double FirstLoss(const std::string& log) {
  for (const Json& line : testing::ReadJsonLines(log)) {
    if (!line.contains("event") && line["iteration"].get<int>() == 1) {
      return line["loss"].get<double>();
    }
  }
  ADD_FAILURE() << log << ": no iteration 1";
  return NAN;
}

// `tandem train` on `ranks` ranks: as many pipeline stages, or ranks / tensor_parallel stages
// of tensor-parallel groups.
std::string Train(int ranks, const std::string& flags, int tensor_parallel = 1) {
  const std::string program =
      ranks == 1 ? absl::StrCat(g_tandem, " train")
                 : absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe",
                                " --bind-to none -np ", ranks, " ", g_tandem, " train");
  const std::string layout =
      tensor_parallel > 1 ? absl::StrCat(" --stages ", ranks / tensor_parallel,
                                         " --tensor-parallel ", tensor_parallel)
                          : absl::StrCat(" --stages ", ranks);
  return absl::StrCat(program, flags, kBatchFlags, layout, " --seq-len ", kSeqLen, " --seed ",
                      kSeed);
}

std::string ModelOf(const std::string& root) {
  auto folder = ResolveCheckpoint(root);
  EXPECT_TRUE(folder.ok()) << folder.status();
  auto manifest = ReadManifest(*folder);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return manifest.ok() ? manifest->model : "";
}

// A model of the checkpoint's description with the checkpoint's parameters (a tied copy the
// checkpoint does not hold takes its owner's values).
absl::StatusOr<LayeredModel> ModelFromCheckpoint(const std::string& root) {
  const std::string model = ModelOf(root);
  ModelSpec spec;
  if (absl::StartsWith(model, "llama")) {
    TANDEM_ASSIGN_OR_RETURN(LlamaConfig config, LlamaConfigFromDescription(model));
    spec = LlamaModelSpec(config);
  } else {
    TANDEM_ASSIGN_OR_RETURN(Gpt2Config config, Gpt2ConfigFromDescription(model));
    spec = Gpt2ModelSpec(config);
  }
  TANDEM_ASSIGN_OR_RETURN(LayeredModel built, spec.Build(/*seed=*/1));
  const std::map<std::string, ShardTensor> saved = testing::CheckpointParameters(root);
  std::map<std::string, std::string> owner;
  for (const TiedParameter& pair : built.tied_weights.parameters) owner[pair.copy] = pair.owner;
  torch::NoGradGuard no_grad;
  for (auto& [name, parameter] : built.NamedParameters(0, built.num_layers())) {
    auto it = saved.find(name);
    if (it == saved.end() && owner.count(name) > 0) it = saved.find(owner[name]);
    if (it == saved.end()) return absl::NotFoundError(absl::StrCat("no parameter ", name));
    if (it->second.count != parameter.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": another size"));
    }
    std::memcpy(parameter.data_ptr<float>(), it->second.bytes.data(), it->second.bytes.size());
  }
  return built;
}

double TandemLoss(const LayeredModel& model, const Batch& batch) {
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = model.Forward(batch.inputs, 0, model.num_layers());
  return model.loss(logits, batch.targets).item<double>();
}

// Tensors of a Hugging Face folder (single file or shards) by key, as raw bytes with shape.
struct RawTensor {
  formats::DataType type;
  std::vector<int64_t> shape;
  std::string bytes;
  bool operator==(const RawTensor& o) const {
    return type == o.type && shape == o.shape && bytes == o.bytes;
  }
};

std::map<std::string, RawTensor> FolderTensors(const std::string& folder) {
  std::map<std::string, RawTensor> out;
  auto files = SafetensorsFolder::Open(folder);
  EXPECT_TRUE(files.ok()) << files.status();
  if (!files.ok()) return out;
  for (const std::string& key : (*files)->TensorNames()) {
    auto info = (*files)->Info(key);
    auto bytes = (*files)->Bytes(key);
    EXPECT_TRUE(info.ok() && bytes.ok()) << key;
    if (!info.ok() || !bytes.ok()) continue;
    out[key] = RawTensor{info->data_type, info->shape,
                         std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size())};
  }
  return out;
}

// ---- Layouts and descriptions (no Python) -----------------------------------------------------

LlamaConfig SmallLlama() {
  LlamaConfig config;
  config.vocab = 64;
  config.layers = 2;
  config.hidden = 32;
  config.heads = 4;
  config.kv_heads = 2;
  config.intermediate = 64;
  config.seq_len = kSeqLen;
  config.max_position_embeddings = kSeqLen;
  return config;
}

Gpt2Config SmallGpt2() {
  Gpt2Config config;
  config.vocab = 64;
  config.layers = 2;
  config.hidden = 32;
  config.heads = 4;
  config.positions = 32;
  config.seq_len = kSeqLen;
  return config;
}

// The layout lists each parameter the built model has, with its shape; a tied copy maps to the
// owner's tensor and is not listed itself.
void ExpectLayoutMatchesModel(const HfLayout& layout, const ModelSpec& spec) {
  SCOPED_TRACE(layout.model);
  auto model = spec.Build(/*seed=*/1);
  ASSERT_TRUE(model.ok()) << model.status();
  size_t owned = 0, parts = 0;  // parameters, those stored fused
  std::set<std::string> keys, fused_keys;
  for (const auto& [name, parameter] : model->NamedParameters(0, model->num_layers())) {
    const HfTensor* tensor = layout.Find(name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(tensor->shape, parameter.sizes().vec()) << name;
    if (layout.tied_copies.count(name) > 0) {
      EXPECT_NE(tensor->name, name);
      continue;
    }
    ++owned;
    EXPECT_EQ(tensor->name, name);
    auto back = layout.tandem_name(tensor->key);
    ASSERT_TRUE(back.ok()) << back.status();
    // A fused key (Phi-3) names its first part.
    const HfTensor* first = layout.Find(*back);
    ASSERT_NE(first, nullptr) << *back;
    EXPECT_EQ(first->key, tensor->key);
    EXPECT_EQ(first->first_row, 0);
    if (tensor->key_shape.empty()) EXPECT_EQ(*back, name);
    keys.insert(tensor->key);
    if (!tensor->key_shape.empty()) {
      ++parts;
      fused_keys.insert(tensor->key);
    }
  }
  EXPECT_EQ(layout.tensors.size(), owned);
  EXPECT_EQ(keys.size(), owned - parts + fused_keys.size());
  EXPECT_EQ(layout.tied_copies.size(), model->tied_weights.parameters.size());
}

TEST(HfLayoutTest, ListsEveryParameterOfTheModelWithItsShape) {
  LlamaConfig llama = SmallLlama();
  ExpectLayoutMatchesModel(LlamaHfLayout(llama), LlamaModelSpec(llama));
  llama.tie_word_embeddings = true;
  ExpectLayoutMatchesModel(LlamaHfLayout(llama), LlamaModelSpec(llama));
  llama.tie_word_embeddings = false;
  llama.kv_heads = 4;
  llama.head_dim = 16;
  llama.attention_bias = true;
  llama.mlp_bias = true;
  ExpectLayoutMatchesModel(LlamaHfLayout(llama), LlamaModelSpec(llama));
  llama.model_type = "gemma2";  // two more norms per block
  llama.mlp_bias = false;
  ExpectLayoutMatchesModel(LlamaHfLayout(llama), LlamaModelSpec(llama));
  llama = SmallLlama();
  llama.model_type = "mixtral";  // a router and three experts for the MLP
  llama.experts = 3;
  llama.experts_per_token = 2;
  ExpectLayoutMatchesModel(LlamaHfLayout(llama), LlamaModelSpec(llama));
  llama.model_type = "qwen2_moe";  // and a shared expert; the second block dense
  llama.expert_intermediate = 16;
  llama.shared_expert_intermediate = 8;
  llama.dense_blocks = {1};
  ExpectLayoutMatchesModel(LlamaHfLayout(llama), LlamaModelSpec(llama));
  // Phi-3: q/k/v and gate/up are consecutive rows of one key each; GraniteMoE: each expert's
  // w1 and w3 the halves of its rows of input_linear, its w2 its rows of output_linear. The
  // parts of a key tile its rows (every dimension but the last flattened).
  for (const char* fused : {"phi3", "granitemoe"}) {
    SCOPED_TRACE(fused);
    llama = SmallLlama();
    llama.model_type = fused;
    if (llama.model_type == "granitemoe") {
      llama.experts = 3;
      llama.experts_per_token = 2;
      llama.attention_multiplier = 0.25;
    }
    const HfLayout layout = LlamaHfLayout(llama);
    ExpectLayoutMatchesModel(layout, LlamaModelSpec(llama));
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> rows_of_key;
    for (const HfTensor& t : layout.tensors) {
      if (t.key_shape.empty()) continue;
      rows_of_key[t.key].emplace_back(t.first_row, t.shape[0]);
      EXPECT_EQ(t.key_shape.back(), t.shape[1]) << t.name;
    }
    EXPECT_EQ(rows_of_key.size(), 2u * static_cast<size_t>(llama.layers));
    for (auto& [key, rows] : rows_of_key) {
      std::sort(rows.begin(), rows.end());
      int64_t next = 0;
      for (const auto& [first, count] : rows) {
        EXPECT_EQ(first, next) << key;
        next = first + count;
      }
      const HfTensor* part = nullptr;
      for (const HfTensor& t : layout.tensors) {
        if (t.key == key) part = &t;
      }
      ASSERT_NE(part, nullptr);
      EXPECT_EQ(next * part->key_shape.back(), ShapeElements(part->key_shape)) << key;
    }
  }
  Gpt2Config gpt2 = SmallGpt2();
  ExpectLayoutMatchesModel(Gpt2HfLayout(gpt2), Gpt2ModelSpec(gpt2));
  gpt2.tie_word_embeddings = false;
  gpt2.inner = 48;
  ExpectLayoutMatchesModel(Gpt2HfLayout(gpt2), Gpt2ModelSpec(gpt2));
  // GPT-2's attention-mask buffers of older checkpoints are ignored, nothing else.
  const HfLayout layout = Gpt2HfLayout(gpt2);
  EXPECT_TRUE(layout.ignored("h.0.attn.bias"));
  EXPECT_TRUE(layout.ignored("transformer.h.1.attn.masked_bias"));
  EXPECT_FALSE(layout.ignored("transformer.h.1.attn.c_attn.bias"));
  EXPECT_FALSE(layout.ignored("transformer.wte.weight"));
}

TEST(HfDescriptionTest, DescriptionsReadBackIntoTheirConfigs) {
  std::vector<LlamaConfig> llamas(21, SmallLlama());
  llamas[1].tie_word_embeddings = true;
  llamas[1].rope_theta = 500000;
  llamas[2].head_dim = 16;
  llamas[2].attention_bias = true;
  llamas[2].mlp_bias = true;
  llamas[3].rope_scaling = LlamaRopeScaling{4.0, 1.0, 4.0, 32};
  llamas[4].model_type = "mistral";
  llamas[4].sliding_window = 16;
  llamas[5].model_type = "qwen2";
  llamas[5].qkv_bias = true;
  llamas[5].rope_theta = 1e6;
  llamas[6].model_type = "gemma";
  llamas[6].hidden_act = "gelu";
  llamas[6].tie_word_embeddings = true;
  llamas[7].model_type = "gemma2";
  llamas[7].hidden_act = "gelu_pytorch_tanh";
  llamas[7].query_pre_attn_scalar = 12.5;
  llamas[7].attn_logit_softcapping = 50;
  llamas[7].final_logit_softcapping = 30;
  llamas[7].sliding_window = 16;
  llamas[8].model_type = "mixtral";
  llamas[8].experts = 4;
  llamas[8].experts_per_token = 2;
  llamas[8].sliding_window = 8;
  llamas[9].model_type = "qwen2_moe";
  llamas[9].qkv_bias = true;
  llamas[9].experts = 4;
  llamas[9].experts_per_token = 3;
  llamas[9].expert_intermediate = 16;
  llamas[9].shared_expert_intermediate = 24;
  llamas[9].normalize_top_k = false;
  llamas[9].sparse_step = 2;
  llamas[9].dense_blocks = {0, 3};
  llamas[10].model_type = "granite";
  llamas[10].embedding_multiplier = 12;
  llamas[10].residual_multiplier = 0.22;
  llamas[10].attention_multiplier = 0.0078125;
  llamas[10].logits_scaling = 16;
  llamas[11].model_type = "phi3";
  llamas[11].sliding_window = 2047;
  llamas[12].model_type = "olmo";
  llamas[12].clip_qkv = 8;
  llamas[12].attention_bias = true;
  llamas[13].model_type = "phi";
  llamas[13].hidden_act = "gelu_new";
  llamas[13].attention_bias = true;
  llamas[13].mlp_bias = true;
  llamas[13].partial_rotary_factor = 0.75;  // 6 of 8 features
  llamas[14].model_type = "gpt_neox";
  llamas[14].kv_heads = llamas[14].heads;
  llamas[14].hidden_act = "gelu";
  llamas[14].mlp_bias = true;
  llamas[14].partial_rotary_factor = 0.25;
  llamas[14].parallel_residual = true;
  llamas[15].model_type = "stablelm";
  llamas[15].qkv_bias = true;
  llamas[15].partial_rotary_factor = 0.5;
  llamas[15].parallel_residual = true;
  llamas[16].model_type = "gptj";
  llamas[16].kv_heads = llamas[16].heads;
  llamas[16].hidden_act = "gelu_new";
  llamas[16].mlp_bias = true;
  llamas[16].rotary_dims = 4;
  llamas[17].model_type = "cohere";
  llamas[17].tie_word_embeddings = true;
  llamas[17].logit_scale = 0.0625;
  llamas[17].head_qk_norms = true;
  llamas[18].model_type = "glm";
  llamas[18].qkv_bias = true;
  llamas[18].rotary_dims = 4;
  llamas[19].model_type = "falcon";
  llamas[19].hidden_act = "gelu";
  llamas[19].attention_bias = true;
  llamas[19].mlp_bias = true;
  llamas[19].parallel_residual = true;
  llamas[19].branch_norms = true;
  llamas[20].model_type = "nemotron";
  llamas[20].hidden_act = "relu2";
  llamas[20].partial_rotary_factor = 0.5;
  llamas[20].mlp_bias = true;
  for (const LlamaConfig& config : llamas) {
    const std::string text = absl::StrCat(DescribeLlama(config), " seed=3");
    auto read = LlamaConfigFromDescription(text);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(DescribeLlama(*read), DescribeLlama(config));
    EXPECT_EQ(read->model_type, config.model_type);
    EXPECT_EQ(read->sliding_window, config.sliding_window);
    EXPECT_EQ(read->QkvBias(), config.QkvBias());
    EXPECT_EQ(read->hidden_act, config.hidden_act);
    EXPECT_EQ(read->ScoreDivisor(), config.ScoreDivisor());
    EXPECT_EQ(read->attn_logit_softcapping, config.attn_logit_softcapping);
    EXPECT_EQ(read->final_logit_softcapping, config.final_logit_softcapping);
    EXPECT_EQ(read->HeadDim(), config.HeadDim());
    EXPECT_EQ(read->RotaryDim(), config.RotaryDim());
    EXPECT_EQ(read->ParallelBlock(), config.ParallelBlock());
    EXPECT_EQ(read->logit_scale, config.logit_scale);
    EXPECT_EQ(read->experts, config.experts);
    EXPECT_EQ(read->experts_per_token, config.experts_per_token);
    EXPECT_EQ(read->ExpertUnits(), config.ExpertUnits());
    EXPECT_EQ(read->shared_expert_intermediate, config.shared_expert_intermediate);
    EXPECT_EQ(read->normalize_top_k, config.normalize_top_k);
    EXPECT_EQ(read->sparse_step, config.sparse_step);
    EXPECT_EQ(read->dense_blocks, config.dense_blocks);
    EXPECT_EQ(read->embedding_multiplier, config.embedding_multiplier);
    EXPECT_EQ(read->residual_multiplier, config.residual_multiplier);
    EXPECT_EQ(read->attention_multiplier, config.attention_multiplier);
    EXPECT_EQ(read->logits_scaling, config.logits_scaling);
    EXPECT_EQ(read->WindowOfBlock(1), config.WindowOfBlock(1));
    EXPECT_EQ(read->rms_norm_eps, 1e-5);
    EXPECT_EQ(read->max_position_embeddings, config.seq_len);
  }
  std::vector<Gpt2Config> gpt2s(3, SmallGpt2());
  gpt2s[1].tie_word_embeddings = false;
  gpt2s[1].inner = 48;
  gpt2s[2].activation = "gelu";
  gpt2s[2].scale_attn_by_inverse_layer_idx = true;
  gpt2s[2].scale_attn_weights = false;
  for (const Gpt2Config& config : gpt2s) {
    auto read = Gpt2ConfigFromDescription(DescribeGpt2(config));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(DescribeGpt2(*read), DescribeGpt2(config));
  }
  // LongRoPE's factors are not in the description: named, and (export) --hf-config advised.
  auto long_rope = LlamaConfigFromDescription(
      "llama L=2 H=32 A=4 KV=2 I=64 S=16 V=64 rope=10000 longrope=8/0123abcd family=phi3");
  EXPECT_EQ(long_rope.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(long_rope.status().message().find("LongRoPE factors"), std::string::npos)
      << long_rope.status();
  auto unknown = LlamaConfigFromDescription("llama L=2 H=32 A=4 KV=2 I=64 S=16 V=64 rope=10000 "
                                            "sliding-window=8");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("sliding-window=8"), std::string::npos)
      << unknown.status();
  EXPECT_FALSE(LlamaConfigFromDescription("gpt L=2 H=32").ok());
  // A family tandem does not know, Gemma 3 without its pattern of local blocks, and a Qwen2
  // window (computed in full) the sequence does not fit; a Mistral's window is masked, so the
  // sequence may exceed it.
  EXPECT_FALSE(
      LlamaConfigFromDescription("llama L=2 H=32 A=4 KV=2 I=64 S=16 V=64 rope=10000 family=llama4")
          .ok());
  auto no_pattern =
      LlamaConfigFromDescription("llama L=2 H=32 A=4 KV=2 I=64 S=16 V=64 rope=10000 family=gemma3");
  EXPECT_NE(no_pattern.status().message().find("sliding_window_pattern"), std::string::npos)
      << no_pattern.status();
  EXPECT_FALSE(LlamaConfigFromDescription(
                   "llama L=2 H=32 A=4 KV=2 I=64 S=16 V=64 rope=10000 window=8 family=qwen2")
                   .ok());
  EXPECT_TRUE(LlamaConfigFromDescription(
                  "llama L=2 H=32 A=4 KV=2 I=64 S=16 V=64 rope=10000 window=8 family=mistral")
                  .ok());
  EXPECT_FALSE(Gpt2ConfigFromDescription("gpt2 L=2 H=32 A=4 S=16 V=64").ok());  // no P=
}

// ---- Import (C++) -----------------------------------------------------------------------------

absl::StatusOr<LlamaConfig> CaseLlamaConfig(const std::string& name) {
  TANDEM_ASSIGN_OR_RETURN(Json json, ReadJsonFile(Case(name) + "/config.json"));
  TANDEM_ASSIGN_OR_RETURN(LlamaConfig config, LlamaConfigFromJson(json));
  config.seq_len = kSeqLen;
  return config;
}

// Each parameter equals the folder's tensor (converted to float32).
void ExpectParametersEqualFolder(const LayeredModel& model, int first, int end,
                                 const HfLayout& layout, const std::string& folder) {
  auto files = SafetensorsFolder::Open(folder);
  ASSERT_TRUE(files.ok()) << files.status();
  for (const auto& [name, parameter] : model.NamedParameters(first, end)) {
    const HfTensor* tensor = layout.Find(name);
    ASSERT_NE(tensor, nullptr) << name;
    torch::Tensor expected = torch::empty(tensor->shape, torch::kFloat);
    ASSERT_TRUE((*files)->ReadAsFloat32(tensor->key, expected.data_ptr<float>(),
                                        expected.numel()).ok());
    EXPECT_TRUE(torch::equal(parameter, expected)) << name << " <- " << tensor->key;
  }
}

TEST(HfImportTest, EachLayerReadsItsOwnTensorsOnlyConvertedToFloat32) {
  REQUIRE_REFERENCE();
  for (const std::string name : {"llama_sharded", "llama_bf16"}) {
    SCOPED_TRACE(name);
    auto config = CaseLlamaConfig(name);
    ASSERT_TRUE(config.ok()) << config.status();
    const HfLayout layout = LlamaHfLayout(*config);
    auto weights = HfWeights::Open(Case(name), layout);
    ASSERT_TRUE(weights.ok()) << weights.status();
    EXPECT_TRUE((*weights)->KeysRead().empty());  // the checks read headers only
    ModelSpec spec = LlamaModelSpec(*config);
    InitializeFromHfWeights(*weights, &spec);
    // Block 0 alone (layer 1), as a pipeline stage builds it.
    auto stage = spec.BuildLayers(/*seed=*/3, 1, 2);
    ASSERT_TRUE(stage.ok()) << stage.status();
    std::vector<std::string> block0;
    for (const HfTensor& t : layout.tensors) {
      if (absl::StartsWith(t.key, "model.layers.0.")) block0.push_back(t.key);
    }
    std::sort(block0.begin(), block0.end());
    EXPECT_EQ((*weights)->KeysRead(), block0);
    ExpectParametersEqualFolder(*stage, 1, 2, layout, Case(name));
    // The rest, built later by the model's builder (as CloneLayers does), reads the rest.
    auto rest = stage->CloneLayers(0, stage->num_layers(), torch::kCPU);
    ASSERT_TRUE(rest.ok()) << rest.status();
    EXPECT_EQ((*weights)->KeysRead().size(), layout.tensors.size());
  }
  // bfloat16 weights are llama_gqa's rounded: the conversion is exact.
  auto bf16 = SafetensorsFile::Open(Case("llama_bf16") + "/model.safetensors");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  auto info = (*bf16)->Info("model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ((*info)->data_type, formats::DataType::kBfloat16);
}

TEST(HfImportTest, TiedHeadStartsFromTheEmbedding) {
  REQUIRE_REFERENCE();
  auto config = CaseLlamaConfig("llama_tied");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->tie_word_embeddings);
  auto weights = HfWeights::Open(Case("llama_tied"), LlamaHfLayout(*config));
  ASSERT_TRUE(weights.ok()) << weights.status();
  ModelSpec spec = LlamaModelSpec(*config);
  InitializeFromHfWeights(*weights, &spec);
  const int head = static_cast<int>(config->layers) + 1;
  auto stage = spec.BuildLayers(/*seed=*/3, head, head + 1);
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_EQ((*weights)->KeysRead(),
            (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
  ExpectParametersEqualFolder(*stage, head, head + 1, (*weights)->layout(), Case("llama_tied"));
}

// Writes `tensors` (raw) as <folder>/model.safetensors with `config` beside it.
void WriteFolder(const std::string& folder, const std::map<std::string, RawTensor>& tensors,
                 const std::string& config_from) {
  fs::create_directories(folder);
  fs::copy_file(config_from, folder + "/config.json", fs::copy_options::overwrite_existing);
  std::vector<formats::TensorToWrite> out;
  for (const auto& [key, t] : tensors) {
    formats::TensorToWrite w;
    w.name = key;
    w.data_type = t.type;
    w.shape = t.shape;
    w.bytes = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(t.bytes.data()),
                                        t.bytes.size());
    out.push_back(w);
  }
  const absl::Status written =
      formats::WriteSafetensorsFile(folder + "/model.safetensors", out, {{"format", "pt"}});
  ASSERT_TRUE(written.ok()) << written;
}

void ExpectOpenRefused(const std::string& folder, const HfLayout& layout,
                       const std::vector<std::string>& mentions) {
  auto opened = HfWeights::Open(folder, layout);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument) << opened.status();
  for (const std::string& m : mentions) {
    EXPECT_NE(opened.status().message().find(m), std::string::npos) << opened.status();
  }
}

TEST(HfImportTest, MissingExtraMisShapedAndUnreadableTensorsAreRefusedNamingTheKey) {
  REQUIRE_REFERENCE();
  Scratch scratch;
  auto config = CaseLlamaConfig("llama_gqa");
  ASSERT_TRUE(config.ok()) << config.status();
  const HfLayout layout = LlamaHfLayout(*config);
  const std::map<std::string, RawTensor> good = FolderTensors(Case("llama_gqa"));
  const std::string config_file = Case("llama_gqa") + "/config.json";

  std::map<std::string, RawTensor> missing = good;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  WriteFolder(scratch / "missing", missing, config_file);
  ExpectOpenRefused(scratch / "missing", layout,
                    {"missing", "'model.layers.1.mlp.up_proj.weight'", scratch / "missing"});

  std::map<std::string, RawTensor> extra = good;
  extra["model.layers.2.mlp.up_proj.weight"] = good.at("model.layers.1.mlp.up_proj.weight");
  WriteFolder(scratch / "extra", extra, config_file);
  ExpectOpenRefused(scratch / "extra", layout,
                    {"does not use", "'model.layers.2.mlp.up_proj.weight'"});

  std::map<std::string, RawTensor> shaped = good;
  RawTensor& k = shaped.at("model.layers.0.self_attn.k_proj.weight");
  ASSERT_EQ(k.shape, (std::vector<int64_t>{16, 32}));
  k.shape = {32, 16};
  WriteFolder(scratch / "shaped", shaped, config_file);
  ExpectOpenRefused(scratch / "shaped", layout,
                    {"'model.layers.0.self_attn.k_proj.weight'", "[32, 16]", "[16, 32]"});

  std::map<std::string, RawTensor> integers = good;
  RawTensor& norm = integers.at("model.norm.weight");
  norm.type = formats::DataType::kInt32;
  WriteFolder(scratch / "integers", integers, config_file);
  ExpectOpenRefused(scratch / "integers", layout, {"'model.norm.weight'", "I32"});

  // A tied model uses the embedding for the head: a separate lm_head.weight is not used.
  auto tied = CaseLlamaConfig("llama_tied");
  ASSERT_TRUE(tied.ok()) << tied.status();
  std::map<std::string, RawTensor> with_head = FolderTensors(Case("llama_tied"));
  with_head["lm_head.weight"] = with_head.at("model.embed_tokens.weight");
  WriteFolder(scratch / "tied", with_head, Case("llama_tied") + "/config.json");
  ExpectOpenRefused(scratch / "tied", LlamaHfLayout(*tied),
                    {"'lm_head.weight'", "tie_word_embeddings"});

  // Phi-3's fused tensors: missing, named once; of another shape, named with the whole
  // shape; the unfused products in their place, not used.
  auto phi3 = CaseLlamaConfig("phi3");
  ASSERT_TRUE(phi3.ok()) << phi3.status();
  const HfLayout phi3_layout = LlamaHfLayout(*phi3);
  const std::map<std::string, RawTensor> phi3_good = FolderTensors(Case("phi3"));
  const std::string phi3_config = Case("phi3") + "/config.json";
  std::map<std::string, RawTensor> no_qkv = phi3_good;
  no_qkv.erase("model.layers.1.self_attn.qkv_proj.weight");
  WriteFolder(scratch / "no_qkv", no_qkv, phi3_config);
  ExpectOpenRefused(scratch / "no_qkv", phi3_layout,
                    {"1 tensor(s)", "missing: 'model.layers.1.self_attn.qkv_proj.weight'"});
  std::map<std::string, RawTensor> short_gate_up = phi3_good;
  RawTensor& gate_up = short_gate_up.at("model.layers.0.mlp.gate_up_proj.weight");
  ASSERT_EQ(gate_up.shape, (std::vector<int64_t>{128, 32}));
  gate_up.shape = {64, 32};  // one half's rows
  gate_up.bytes.resize(gate_up.bytes.size() / 2);
  WriteFolder(scratch / "short_gate_up", short_gate_up, phi3_config);
  ExpectOpenRefused(scratch / "short_gate_up", phi3_layout,
                    {"'model.layers.0.mlp.gate_up_proj.weight'", "[64, 32]", "[128, 32]"});
  std::map<std::string, RawTensor> unfused = phi3_good;
  unfused["model.layers.0.self_attn.q_proj.weight"] =
      good.at("model.layers.0.self_attn.q_proj.weight");
  WriteFolder(scratch / "unfused", unfused, phi3_config);
  ExpectOpenRefused(scratch / "unfused", phi3_layout,
                    {"does not use", "'model.layers.0.self_attn.q_proj.weight'"});

  // A parameter the folder's tensor does not fit is refused when its layer is built (a model
  // whose spec does not match the layout it was opened with).
  auto weights = HfWeights::Open(Case("llama_gqa"), layout);
  ASSERT_TRUE(weights.ok()) << weights.status();
  LlamaConfig wider = *config;
  wider.intermediate = 96;
  ModelSpec spec = LlamaModelSpec(wider);
  InitializeFromHfWeights(*weights, &spec);
  auto built = spec.BuildLayers(/*seed=*/1, 1, 2);
  EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument) << built.status();
  EXPECT_NE(built.status().message().find("'model.layers.0.mlp."), std::string::npos)
      << built.status();
}

// ---- Import through `tandem train --init-from` ------------------------------------------------

struct ImportCase {
  std::string name;
  std::string model;  // --model
  int ranks = 1;
  int tensor_parallel = 1;
  std::string flags;  // more flags
};

TEST(HfImportTest, TrainInitFromStartsAtTransformersLoss) {
  REQUIRE_REFERENCE();
  Scratch scratch;
  const Batch batch = SyntheticBatch(/*vocab=*/64, /*iteration=*/0, kGlobalBatch);
  WriteTokens(scratch / "tokens.safetensors", batch);
  for (const ImportCase& c :
       {ImportCase{"llama_gqa", "llama"}, ImportCase{"llama_tied", "llama"},
        ImportCase{"gpt2", "gpt2"}, ImportCase{"llama_bf16", "llama"},
        ImportCase{"llama_sharded", "llama", /*ranks=*/2},
        // Tensor parallelism 2: each rank reads the whole tensors of its layers and keeps its
        // slices; with sequence parallelism the norms see half the tokens each.
        ImportCase{"llama_gqa", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"llama_tied", "llama", /*ranks=*/2, /*tensor_parallel=*/2,
                   " --sequence-parallel"},
        ImportCase{"gpt2", "gpt2", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"gpt2", "gpt2", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // Gemma's norms and scaled embedding; Gemma 2's soft caps and sandwich norms, whole, on
        // two stages and tensor- and sequence-parallel (each norm on half the tokens).
        ImportCase{"gemma", "llama"}, ImportCase{"gemma2", "llama"},
        // Gemma's one key/value head (Gemma-2B's multi-query attention) over two ranks: k_proj
        // and v_proj whole on both, with and without sequence parallelism.
        ImportCase{"gemma", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"gemma", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        ImportCase{"gemma2", "llama", /*ranks=*/2},
        ImportCase{"gemma2", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // A window (8) shorter than the sequence (16), masked; with sequence parallelism each
        // rank's attention sees the gathered sequence.
        ImportCase{"mistral_short", "llama"},
        ImportCase{"mistral_short", "llama", /*ranks=*/2, /*tensor_parallel=*/2,
                   " --sequence-parallel"},
        // Mixtral's experts: whole, on two stages, and each expert split over two ranks
        // (with sequence parallelism the router's scores gathered).
        ImportCase{"mixtral", "llama"}, ImportCase{"mixtral", "llama", /*ranks=*/2},
        ImportCase{"mixtral", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"mixtral", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // Expert parallelism: each rank keeps two of the four experts whole.
        ImportCase{"mixtral", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --expert-parallel 2"},
        // Qwen2-MoE's shared expert and a dense block, whole and tensor-parallel.
        ImportCase{"qwen2_moe", "llama"},
        ImportCase{"qwen2_moe", "llama", /*ranks=*/2, /*tensor_parallel=*/2,
                   " --sequence-parallel"},
        // Granite's multipliers, whole and tensor- and sequence-parallel.
        ImportCase{"granite", "llama"},
        ImportCase{"granite", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // Phi-3's fused q/k/v and gate/up, each product read as its rows: whole, on two stages,
        // and split over two ranks (each rank's heads and units of every part).
        ImportCase{"phi3", "llama"}, ImportCase{"phi3", "llama", /*ranks=*/2},
        ImportCase{"phi3", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // LongRoPE's long factors and scaled cos and sin, whole and with each rank's
        // attention over the gathered sequence.
        ImportCase{"phi3_longrope", "llama"},
        ImportCase{"phi3_longrope", "llama", /*ranks=*/2, /*tensor_parallel=*/2,
                   " --sequence-parallel"},
        // GraniteMoE's fused experts, each expert's w1 and w3 read as its rows: whole, on two
        // stages, each expert split over two ranks and each rank holding two whole experts.
        ImportCase{"granitemoe", "llama"}, ImportCase{"granitemoe", "llama", /*ranks=*/2},
        ImportCase{"granitemoe", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"granitemoe", "llama", /*ranks=*/2, /*tensor_parallel=*/2,
                   " --expert-parallel 2"},
        // OLMo's weightless layer norms and clamped q/k/v: whole, on two stages, and split over
        // two ranks with sequence parallelism (no norm weight to share).
        ImportCase{"olmo", "llama"}, ImportCase{"olmo", "llama", /*ranks=*/2},
        ImportCase{"olmo", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // OLMoE's query and key norms and experts: whole, on two stages, and split over two
        // ranks (each normalising its heads by the group's sum of squares) with sequence
        // parallelism and with each rank holding two whole experts.
        ImportCase{"olmoe", "llama"}, ImportCase{"olmoe", "llama", /*ranks=*/2},
        ImportCase{"olmoe", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        ImportCase{"olmoe", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --expert-parallel 2"},
        // StarCoder 2's layer norms (weights and biases) and plain MLP: whole, on two stages, and
        // split over two ranks with sequence parallelism (the norms' biases shared too).
        ImportCase{"starcoder2", "llama"}, ImportCase{"starcoder2", "llama", /*ranks=*/2},
        ImportCase{"starcoder2", "llama", /*ranks=*/2, /*tensor_parallel=*/2,
                   " --sequence-parallel"},
        // Phi's attention and MLP side by side on one norm, its partial rotation and the LM
        // head's bias: whole, on two stages, and split over two ranks (the head's bias by
        // vocabulary rows) with sequence parallelism.
        ImportCase{"phi", "llama"}, ImportCase{"phi", "llama", /*ranks=*/2},
        ImportCase{"phi", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // GPT-NeoX's per-head fused query/key/value rows (the buffers of older checkpoints
        // skipped): whole, on two stages, and split over two ranks by heads with sequence
        // parallelism (both norms shared).
        ImportCase{"gpt_neox", "llama"}, ImportCase{"gpt_neox", "llama", /*ranks=*/2},
        ImportCase{"gpt_neox", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // StableLM's layer norms with biases, partial rotation and q/k/v biases: whole, on two
        // stages, and split over two ranks with sequence parallelism.
        ImportCase{"stablelm", "llama"}, ImportCase{"stablelm", "llama", /*ranks=*/2},
        ImportCase{"stablelm", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // GPT-J's pairs of neighbours rotated, its LM head's bias and the mask buffers of its
        // older checkpoints skipped: whole, on two stages, and over two ranks with sequence
        // parallelism.
        ImportCase{"gptj", "llama"}, ImportCase{"gptj", "llama", /*ranks=*/2},
        ImportCase{"gptj", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // Cohere's weight-only layer norms, pairs of neighbours rotated and scaled logits:
        // whole, on two stages, and over two ranks with sequence parallelism (the norms'
        // weights shared, no bias).
        ImportCase{"cohere", "llama"}, ImportCase{"cohere", "llama", /*ranks=*/2},
        ImportCase{"cohere", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // GLM's half rotation by pairs of neighbours and gate_up_proj read as rows: whole, on
        // two stages, and over two ranks with sequence parallelism.
        ImportCase{"glm", "llama"}, ImportCase{"glm", "llama", /*ranks=*/2},
        ImportCase{"glm", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // Falcon's query_key_value of 2 key/value groups, split by groups; ln_attn and ln_mlp:
        // whole, on two stages, and over two ranks with sequence parallelism.
        ImportCase{"falcon", "llama"}, ImportCase{"falcon", "llama", /*ranks=*/2},
        ImportCase{"falcon", "llama", /*ranks=*/2, /*tensor_parallel=*/2, " --sequence-parallel"},
        // Nemotron's offset layer norms and squared ReLU: whole, on two stages, and over two
        // ranks with sequence parallelism (the norms' weights and biases shared).
        ImportCase{"nemotron", "llama"}, ImportCase{"nemotron", "llama", /*ranks=*/2},
        ImportCase{"nemotron", "llama", /*ranks=*/2, /*tensor_parallel=*/2,
                   " --sequence-parallel"}}) {
    const std::string label = absl::StrCat(c.name, c.tensor_parallel > 1 ? "_tp" : "",
                                           c.flags.empty()                               ? ""
                                           : c.flags.find("expert") != std::string::npos ? "_ep"
                                                                                         : "_sp");
    SCOPED_TRACE(label);
    const std::string log = scratch / (label + ".jsonl");
    const Outcome o = RunCommand(Train(c.ranks,
                                       absl::StrCat(" --model ", c.model, " --init-from ",
                                                    Case(c.name), c.flags,
                                                    " --steps 1 --log-json ", log),
                                       c.tensor_parallel));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    const double tandem = FirstLoss(log);
    const HfLoad hf = TransformersLoss(Case(c.name), scratch / "tokens.safetensors");
    EXPECT_LE(Relative(tandem, hf.loss), kLossTolerance) << tandem << " vs " << hf.loss;
    std::cout << label << " (" << c.ranks << " rank(s)): tandem's first loss " << tandem
              << ", transformers' " << hf.loss << ", relative difference "
              << Relative(tandem, hf.loss) << "\n";
  }
  // The comparison can fail: randomly initialised, the same model starts elsewhere.
  const std::string log = scratch / "random.jsonl";
  const Outcome o = RunCommand(Train(1, absl::StrCat(" --model llama --hf-config ",
                                                     Case("llama_gqa"), "/config.json",
                                                     " --steps 1 --log-json ", log)));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  const HfLoad hf = TransformersLoss(Case("llama_gqa"), scratch / "tokens.safetensors");
  EXPECT_GT(Relative(FirstLoss(log), hf.loss), 1000 * kLossTolerance);
}

TEST(HfImportTest, TrainInitFromRefusesBadFoldersWithOneClearLine) {
  REQUIRE_REFERENCE();
  Scratch scratch;
  // An unsupported config.
  fs::create_directories(scratch / "gelu");
  fs::copy_file(Case("llama_gqa") + "/model.safetensors", scratch / "gelu/model.safetensors");
  auto json = ReadJsonFile(Case("llama_gqa") + "/config.json");
  ASSERT_TRUE(json.ok());
  (*json)["hidden_act"] = "gelu";
  ASSERT_TRUE(WriteFileAtomically(scratch / "gelu/config.json", json->dump()).ok());
  Outcome o = RunCommand(Train(1, absl::StrCat(" --model llama --init-from ", scratch / "gelu",
                                               " --steps 1")));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--init-from"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("hidden_act"), std::string::npos) << o.output;
  // A Qwen2 whose sliding window (8) is shorter than the sequence (16): tandem computes
  // Qwen2's attention in full, which would not compute it.
  fs::create_directories(scratch / "window");
  fs::copy_file(Case("qwen2_tied") + "/model.safetensors", scratch / "window/model.safetensors");
  json = ReadJsonFile(Case("qwen2_tied") + "/config.json");
  ASSERT_TRUE(json.ok());
  (*json)["use_sliding_window"] = true;
  (*json)["sliding_window"] = 8;
  ASSERT_TRUE(WriteFileAtomically(scratch / "window/config.json", json->dump()).ok());
  o = RunCommand(
      Train(1, absl::StrCat(" --model llama --init-from ", scratch / "window", " --steps 1")));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("exceeds the sliding window (8 tokens)"), std::string::npos) << o.output;
  // A missing tensor.
  std::map<std::string, RawTensor> tensors = FolderTensors(Case("gpt2"));
  tensors.erase("transformer.h.1.mlp.c_fc.bias");
  WriteFolder(scratch / "missing", tensors, Case("gpt2") + "/config.json");
  o = RunCommand(Train(1, absl::StrCat(" --model gpt2 --init-from ", scratch / "missing",
                                       " --steps 1")));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("'transformer.h.1.mlp.c_fc.bias'"), std::string::npos) << o.output;
  // A Llama folder for gpt2.
  o = RunCommand(Train(1, absl::StrCat(" --model gpt2 --init-from ", Case("llama_gqa"),
                                       " --steps 1")));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("model_type"), std::string::npos) << o.output;
  // Both sources of the config.
  o = RunCommand(Train(1, absl::StrCat(" --model llama --init-from ", Case("llama_gqa"),
                                       " --hf-config ", Case("llama_gqa"), "/config.json",
                                       " --steps 1")));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("drop --hf-config"), std::string::npos) << o.output;
  // The experts' flags, named: more experts a token than experts; a balancing loss without
  // experts.
  o = RunCommand(Train(1,
                       " --model llama --layers 2 --hidden 32 --heads 4 --vocab 64"
                       " --experts 3 --experts-per-token 5 --steps 1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--experts-per-token 5 must be between 1 and --experts (3)"),
            std::string::npos)
      << o.output;
  o = RunCommand(Train(1, absl::StrCat(" --model llama --init-from ", Case("llama_gqa"),
                                       " --moe-aux-loss-coef 0.01 --steps 1")));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--moe-aux-loss-coef needs a model with experts"), std::string::npos)
      << o.output;
}

// ---- Export ---------------------------------------------------------------------------------

std::string Export(const std::string& checkpoint, const std::string& out,
                   const std::string& flags = "") {
  return absl::StrCat(g_tandem, " checkpoint export --format safetensors ", checkpoint, " ", out,
                      flags);
}

// Removes from `checkpoint`'s manifest the config.json tandem train records there (as
// checkpoints written before it did lack it): an export then writes config.json from the model
// description.
void DropRecordedConfig(const std::string& checkpoint) {
  auto dir = ResolveCheckpoint(checkpoint);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto manifest = ReadManifest(*dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  manifest->run.erase("hf_config");
  const absl::Status written = WriteManifest(*dir, *manifest);
  ASSERT_TRUE(written.ok()) << written;
}

struct ExportCase {
  std::string name;
  int ranks = 1;
  std::string train_flags;
  std::string export_flags;
  int tensor_parallel = 1;
};

TEST(HfExportTest, TransformersLoadsTheExportWithoutWarningsAndTandemsLoss) {
  REQUIRE_REFERENCE();
  Scratch scratch;
  const Batch held_out = SyntheticBatch(/*vocab=*/64, /*iteration=*/1000, /*count=*/8);
  WriteTokens(scratch / "held_out.safetensors", held_out);
  const std::string training = " --steps 5 --optimizer adamw --lr 1e-2 --checkpoint-dir ";
  for (const ExportCase& c :
       {// Sizes from flags, two stages (two shards); config.json from the description.
        ExportCase{"llama_flags", 2,
                   " --model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2"
                   " --intermediate 64 --vocab 64",
                   ""},
        // Tied GPT-2 from flags: the embedding written once.
        ExportCase{"gpt2_flags", 1, " --model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64",
                   ""},
        // The same on two stages: the head's copy trained apart, saved and written once.
        ExportCase{"gpt2_two_stages", 2,
                   " --model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64", ""},
        // Tied Llama started from a folder, exported with its config.json.
        ExportCase{"llama_tied_init", 1,
                   absl::StrCat(" --model llama --init-from ", Case("llama_tied")),
                   absl::StrCat(" --hf-config ", Case("llama_tied"), "/config.json")},
        // Mistral started from a folder on two stages, exported with its config.json.
        ExportCase{"mistral_init", 2, absl::StrCat(" --model llama --init-from ", Case("mistral")),
                   absl::StrCat(" --hf-config ", Case("mistral"), "/config.json")},
        // Tied Qwen2 (q/k/v biases) started from a folder, its config.json written from the
        // checkpoint's description (family=qwen2).
        ExportCase{"qwen2_tied_init", 1,
                   absl::StrCat(" --model llama --init-from ", Case("qwen2_tied")), ""},
        // Gemma 2 on two stages, its config.json written from the description (soft caps,
        // query_pre_attn_scalar, window, family=gemma2).
        ExportCase{"gemma2_init", 2, absl::StrCat(" --model llama --init-from ", Case("gemma2")),
                   ""},
        // Mixtral from flags (--experts), its config.json written from the description.
        ExportCase{"mixtral_flags", 2,
                   " --model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2"
                   " --intermediate 32 --experts 4 --experts-per-token 2 --vocab 64",
                   ""},
        // Qwen2-MoE started from a folder, its config.json written from the description
        // (experts, shared expert, the dense block).
        ExportCase{"qwen2_moe_init", 1,
                   absl::StrCat(" --model llama --init-from ", Case("qwen2_moe")), ""},
        // Granite started from a folder, its config.json (the multipliers) written from the
        // description.
        ExportCase{"granite_init", 1, absl::StrCat(" --model llama --init-from ", Case("granite")),
                   ""},
        // Phi-3 on two stages, its q/k/v and gate/up written fused again, its config.json
        // from the description (the window, no padding row).
        ExportCase{"phi3_init", 2, absl::StrCat(" --model llama --init-from ", Case("phi3")), ""},
        // GraniteMoE on two stages, its experts written fused again, its config.json from the
        // description (experts and multipliers).
        ExportCase{"granitemoe_init", 2,
                   absl::StrCat(" --model llama --init-from ", Case("granitemoe")), ""},
        // OLMo on two stages: no norm weights written, its config.json (clip_qkv, biases) from
        // the description.
        ExportCase{"olmo_init", 2, absl::StrCat(" --model llama --init-from ", Case("olmo")), ""},
        // OLMoE on two stages: q_norm and k_norm written, its config.json (experts, clip_qkv)
        // from the description.
        ExportCase{"olmoe_init", 2, absl::StrCat(" --model llama --init-from ", Case("olmoe")), ""},
        // StarCoder 2 on two stages: the norms' biases and c_fc/c_proj written, its config.json
        // (norm_epsilon, use_bias, the window, the activation) from the description.
        ExportCase{"starcoder2_init", 2,
                   absl::StrCat(" --model llama --init-from ", Case("starcoder2")), ""},
        // Phi on two stages: self_attn.dense, final_layernorm and the LM head's bias written,
        // its config.json (layer_norm_eps, partial_rotary_factor, gelu_new) from the
        // description.
        ExportCase{"phi_init", 2, absl::StrCat(" --model llama --init-from ", Case("phi")), ""},
        // GPT-NeoX on two stages: gpt_neox.* and embed_out written (no buffers), its
        // config.json (rotary_pct, rotary_emb_base, use_parallel_residual) from the
        // description.
        ExportCase{"gpt_neox_init", 2,
                   absl::StrCat(" --model llama --init-from ", Case("gpt_neox")), ""},
        // StableLM on two stages: its config.json (use_qkv_bias, partial_rotary_factor,
        // layer_norm_eps) from the description.
        ExportCase{"stablelm_init", 2,
                   absl::StrCat(" --model llama --init-from ", Case("stablelm")), ""},
        // GPT-J on two stages: transformer.* and the LM head's bias written, its config.json
        // (n_embd and the other names, rotary_dim) from the description.
        ExportCase{"gptj_init", 2, absl::StrCat(" --model llama --init-from ", Case("gptj")), ""},
        // Cohere on two stages: its config.json (logit_scale, layer_norm_eps) from the
        // description.
        ExportCase{"cohere_init", 2, absl::StrCat(" --model llama --init-from ", Case("cohere")),
                   ""},
        // GLM on two stages: gate_up_proj written fused again, its config.json (head_dim for
        // the rotation, attention_bias) from the description.
        ExportCase{"glm_init", 2, absl::StrCat(" --model llama --init-from ", Case("glm")), ""},
        // Falcon on two stages, tied: transformer.* written, its config.json's layout
        // (new_decoder_architecture, num_kv_heads, bias) from the description.
        ExportCase{"falcon_init", 2, absl::StrCat(" --model llama --init-from ", Case("falcon")),
                   ""},
        // Nemotron on two stages: up_proj and down_proj, the norms' biases, norm_eps and
        // partial_rotary_factor written.
        ExportCase{"nemotron_init", 2,
                   absl::StrCat(" --model llama --init-from ", Case("nemotron")), ""},
        // GPT-2 trained tensor- and sequence-parallel: the checkpoint holds whole tensors.
        ExportCase{"gpt2_tensor_parallel", 2,
                   " --model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64"
                   " --sequence-parallel",
                   "", /*tensor_parallel=*/2}}) {
    SCOPED_TRACE(c.name);
    const std::string checkpoint = scratch / (c.name + "_ckpt");
    const std::string out = scratch / (c.name + "_hf");
    Outcome o =
        RunCommand(Train(c.ranks, c.train_flags + training + checkpoint, c.tensor_parallel));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    // The families' config.json as written from their descriptions (ExportWritesTheRecorded
    // ConfigJson checks the config.json a checkpoint records).
    DropRecordedConfig(checkpoint);
    o = RunCommand(Export(checkpoint, out, c.export_flags));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    EXPECT_NE(o.output.find("exported"), std::string::npos) << o.output;
    EXPECT_NE(o.output.find(c.export_flags.empty() ? "config.json from the model description"
                                                   : "config.json from --hf-config"),
              std::string::npos)
        << o.output;
    EXPECT_TRUE(fs::exists(out + "/config.json"));
    EXPECT_TRUE(fs::exists(out + "/model.safetensors"));

    // Every tensor as the checkpoint holds it, under transformers' key.
    const std::map<std::string, ShardTensor> saved = testing::CheckpointParameters(checkpoint);
    const std::map<std::string, RawTensor> written = FolderTensors(out);
    auto file = SafetensorsFile::Open(out + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->Metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
    const std::string model = ModelOf(checkpoint);
    const bool llama = absl::StartsWith(model, "llama");
    HfLayout layout;
    if (llama) {
      auto config = LlamaConfigFromDescription(model);
      ASSERT_TRUE(config.ok()) << config.status();
      layout = LlamaHfLayout(*config);
    } else {
      auto config = Gpt2ConfigFromDescription(model);
      ASSERT_TRUE(config.ok()) << config.status();
      layout = Gpt2HfLayout(*config);
    }
    // A key's bytes are its parameter's, or (Phi-3's fused keys) its parameters' one after
    // another.
    size_t fused = 0;
    for (const auto& [key, tensor] : written) {
      std::string expected;
      int parts = 0;
      for (const HfTensor& t : layout.tensors) {
        if (t.key != key) continue;
        ASSERT_EQ(saved.count(t.name), 1u) << key << " " << t.name;
        expected += saved.at(t.name).bytes;
        ++parts;
      }
      ASSERT_GT(parts, 0) << key;
      fused += parts > 1;
      EXPECT_EQ(tensor.bytes, expected) << key;
      EXPECT_EQ(tensor.type, formats::DataType::kFloat32);
    }
    // qkv_proj and gate_up_proj, input_linear and output_linear, in 2 blocks.
    EXPECT_EQ(fused, c.name == "phi3_init" || c.name == "granitemoe_init" ? 4u
                     : c.name == "glm_init"                               ? 2u
                                                                          : 0u);
    const bool untied =
        c.name == "llama_flags" || c.name == "mistral_init" || c.name == "mixtral_flags" ||
        c.name == "qwen2_moe_init" || c.name == "granite_init" || c.name == "phi3_init" ||
        c.name == "granitemoe_init" || c.name == "olmo_init" || c.name == "olmoe_init" ||
        c.name == "starcoder2_init" || c.name == "phi_init" || c.name == "stablelm_init" ||
        c.name == "gptj_init" || c.name == "cohere_init" || c.name == "glm_init" ||
        c.name == "nemotron_init";
    EXPECT_EQ(written.count("lm_head.weight"), untied ? 1u : 0u);
    if (c.name == "falcon_init") {
      EXPECT_EQ(written.count("transformer.word_embeddings.weight"), 1u);
      EXPECT_EQ(written.count("transformer.h.1.ln_mlp.bias"), 1u);
      EXPECT_EQ(written.count("transformer.h.1.self_attention.query_key_value.bias"), 1u);
    }
    if (c.name == "gpt_neox_init") {
      EXPECT_EQ(written.count("embed_out.weight"), 1u);
      EXPECT_EQ(written.count("gpt_neox.final_layer_norm.bias"), 1u);
      EXPECT_EQ(written.count("gpt_neox.layers.1.attention.query_key_value.weight"), 1u);
      EXPECT_EQ(written.count("gpt_neox.layers.1.attention.bias"), 0u);
    }
    EXPECT_EQ(written.count("lm_head.bias"),
              c.name == "phi_init" || c.name == "gptj_init" ? 1u : 0u);
    if (c.name == "phi_init") {
      EXPECT_EQ(written.count("model.final_layernorm.bias"), 1u);
      EXPECT_EQ(written.count("model.layers.1.self_attn.dense.bias"), 1u);
      EXPECT_EQ(written.count("model.layers.1.post_attention_layernorm.weight"), 0u);
    }
    // OLMo's norms hold no weights: none written (a Llama's are).
    if (c.name == "olmo_init" || c.name == "granite_init") {
      const bool olmo = c.name == "olmo_init";
      EXPECT_EQ(written.count("model.norm.weight"), olmo ? 0u : 1u);
      EXPECT_EQ(written.count("model.layers.1.input_layernorm.weight"), olmo ? 0u : 1u);
      EXPECT_EQ(written.count("model.layers.0.post_attention_layernorm.weight"), olmo ? 0u : 1u);
    }

    // transformers loads it without a word and computes tandem's loss.
    const HfLoad hf = TransformersLoss(out, scratch / "held_out.safetensors");
    ExpectCleanLoad(hf);
    auto trained = ModelFromCheckpoint(checkpoint);
    ASSERT_TRUE(trained.ok()) << trained.status();
    const double tandem = TandemLoss(*trained, held_out);
    EXPECT_LE(Relative(tandem, hf.loss), kLossTolerance) << tandem << " vs " << hf.loss;
    std::cout << c.name << ": tandem's held-out loss " << tandem << ", transformers' "
              << hf.loss << ", relative difference " << Relative(tandem, hf.loss) << "\n";
  }
  // A Qwen2 exported from its description is one for transformers: q/k/v biases, no head_dim.
  auto qwen2 = ReadJsonFile(scratch / "qwen2_tied_init_hf/config.json");
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_EQ((*qwen2)["model_type"], "qwen2");
  EXPECT_EQ((*qwen2)["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ((*qwen2)["use_sliding_window"], false);
  EXPECT_FALSE(qwen2->contains("head_dim"));
  // So is a Gemma 2: its caps, scalar and window as the folder had them.
  auto gemma2 = ReadJsonFile(scratch / "gemma2_init_hf/config.json");
  ASSERT_TRUE(gemma2.ok()) << gemma2.status();
  EXPECT_EQ((*gemma2)["architectures"][0], "Gemma2ForCausalLM");
  EXPECT_EQ((*gemma2)["attn_logit_softcapping"], 1.0);
  EXPECT_EQ((*gemma2)["final_logit_softcapping"], 2.0);
  EXPECT_EQ((*gemma2)["query_pre_attn_scalar"], 12.0);
  EXPECT_EQ((*gemma2)["sliding_window"], 32);
  EXPECT_EQ((*gemma2)["hidden_activation"], "gelu_pytorch_tanh");
  // And a Mixtral: its experts, no load-balancing loss.
  auto mixtral = ReadJsonFile(scratch / "mixtral_flags_hf/config.json");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ((*mixtral)["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ((*mixtral)["num_local_experts"], 4);
  EXPECT_EQ((*mixtral)["num_experts_per_tok"], 2);
  EXPECT_EQ((*mixtral)["output_router_logits"], false);
  auto qwen2_moe = ReadJsonFile(scratch / "qwen2_moe_init_hf/config.json");
  ASSERT_TRUE(qwen2_moe.ok()) << qwen2_moe.status();
  EXPECT_EQ((*qwen2_moe)["architectures"][0], "Qwen2MoeForCausalLM");
  EXPECT_EQ((*qwen2_moe)["shared_expert_intermediate_size"], 32);
  EXPECT_EQ((*qwen2_moe)["mlp_only_layers"], Json::parse("[1]"));
  // A Granite's multipliers, a Phi-3's window and (none in the description) padding row.
  auto granite = ReadJsonFile(scratch / "granite_init_hf/config.json");
  ASSERT_TRUE(granite.ok()) << granite.status();
  EXPECT_EQ((*granite)["architectures"][0], "GraniteForCausalLM");
  EXPECT_EQ((*granite)["embedding_multiplier"], 3.0);
  EXPECT_EQ((*granite)["residual_multiplier"], 0.5);
  EXPECT_EQ((*granite)["attention_multiplier"], 0.2);
  EXPECT_EQ((*granite)["logits_scaling"], 4.0);
  auto granitemoe = ReadJsonFile(scratch / "granitemoe_init_hf/config.json");
  ASSERT_TRUE(granitemoe.ok()) << granitemoe.status();
  EXPECT_EQ((*granitemoe)["architectures"][0], "GraniteMoeForCausalLM");
  EXPECT_EQ((*granitemoe)["num_local_experts"], 4);
  EXPECT_EQ((*granitemoe)["logits_scaling"], 3.0);
  auto olmo = ReadJsonFile(scratch / "olmo_init_hf/config.json");
  ASSERT_TRUE(olmo.ok()) << olmo.status();
  EXPECT_EQ((*olmo)["architectures"][0], "OlmoForCausalLM");
  EXPECT_EQ((*olmo)["clip_qkv"], 0.3);
  // The description holds no padding row (as for Phi-3 and Gemma): none, not OlmoConfig's 1.
  EXPECT_TRUE((*olmo)["pad_token_id"].is_null());
  EXPECT_EQ((*olmo)["attention_bias"], true);
  EXPECT_FALSE(olmo->contains("rms_norm_eps"));
  auto olmoe = ReadJsonFile(scratch / "olmoe_init_hf/config.json");
  ASSERT_TRUE(olmoe.ok()) << olmoe.status();
  EXPECT_EQ((*olmoe)["architectures"][0], "OlmoeForCausalLM");
  EXPECT_EQ((*olmoe)["num_experts"], 4);
  EXPECT_EQ((*olmoe)["num_experts_per_tok"], 2);
  EXPECT_EQ((*olmoe)["norm_topk_prob"], false);
  EXPECT_EQ((*olmoe)["clip_qkv"], 0.5);
  auto starcoder2 = ReadJsonFile(scratch / "starcoder2_init_hf/config.json");
  ASSERT_TRUE(starcoder2.ok()) << starcoder2.status();
  EXPECT_EQ((*starcoder2)["architectures"][0], "Starcoder2ForCausalLM");
  EXPECT_EQ((*starcoder2)["use_bias"], true);
  EXPECT_EQ((*starcoder2)["sliding_window"], 6);
  EXPECT_EQ((*starcoder2)["hidden_act"], "gelu_pytorch_tanh");
  EXPECT_EQ((*starcoder2)["norm_epsilon"], 1e-5);
  EXPECT_FALSE(starcoder2->contains("rms_norm_eps"));
  auto phi = ReadJsonFile(scratch / "phi_init_hf/config.json");
  ASSERT_TRUE(phi.ok()) << phi.status();
  EXPECT_EQ((*phi)["architectures"][0], "PhiForCausalLM");
  EXPECT_EQ((*phi)["partial_rotary_factor"], 0.5);
  EXPECT_EQ((*phi)["hidden_act"], "gelu_new");
  EXPECT_EQ((*phi)["layer_norm_eps"], 1e-5);
  EXPECT_EQ((*phi)["qk_layernorm"], false);
  EXPECT_FALSE(phi->contains("rms_norm_eps"));
  auto neox = ReadJsonFile(scratch / "gpt_neox_init_hf/config.json");
  ASSERT_TRUE(neox.ok()) << neox.status();
  EXPECT_EQ((*neox)["architectures"][0], "GPTNeoXForCausalLM");
  EXPECT_EQ((*neox)["rotary_pct"], 0.5);
  EXPECT_EQ((*neox)["rotary_emb_base"], 10000.0);
  EXPECT_EQ((*neox)["use_parallel_residual"], true);
  EXPECT_EQ((*neox)["hidden_act"], "gelu");
  EXPECT_FALSE(neox->contains("num_key_value_heads"));
  auto stablelm = ReadJsonFile(scratch / "stablelm_init_hf/config.json");
  ASSERT_TRUE(stablelm.ok()) << stablelm.status();
  EXPECT_EQ((*stablelm)["architectures"][0], "StableLmForCausalLM");
  EXPECT_EQ((*stablelm)["use_qkv_bias"], true);
  EXPECT_EQ((*stablelm)["partial_rotary_factor"], 0.25);
  EXPECT_EQ((*stablelm)["use_parallel_residual"], false);
  EXPECT_FALSE(stablelm->contains("attention_bias"));
  auto gptj = ReadJsonFile(scratch / "gptj_init_hf/config.json");
  ASSERT_TRUE(gptj.ok()) << gptj.status();
  EXPECT_EQ((*gptj)["architectures"][0], "GPTJForCausalLM");
  EXPECT_EQ((*gptj)["n_embd"], 32);
  EXPECT_EQ((*gptj)["rotary_dim"], 4);
  EXPECT_EQ((*gptj)["activation_function"], "gelu_new");
  EXPECT_FALSE(gptj->contains("hidden_size"));
  auto cohere = ReadJsonFile(scratch / "cohere_init_hf/config.json");
  ASSERT_TRUE(cohere.ok()) << cohere.status();
  EXPECT_EQ((*cohere)["architectures"][0], "CohereForCausalLM");
  EXPECT_EQ((*cohere)["logit_scale"], 0.25);
  EXPECT_EQ((*cohere)["use_qk_norm"], true);
  auto glm = ReadJsonFile(scratch / "glm_init_hf/config.json");
  ASSERT_TRUE(glm.ok()) << glm.status();
  EXPECT_EQ((*glm)["architectures"][0], "GlmForCausalLM");
  EXPECT_EQ((*glm)["head_dim"], 8);
  EXPECT_EQ((*glm)["attention_bias"], true);
  auto falcon = ReadJsonFile(scratch / "falcon_init_hf/config.json");
  ASSERT_TRUE(falcon.ok()) << falcon.status();
  EXPECT_EQ((*falcon)["architectures"][0], "FalconForCausalLM");
  EXPECT_EQ((*falcon)["new_decoder_architecture"], true);
  EXPECT_EQ((*falcon)["num_kv_heads"], 2);
  EXPECT_EQ((*falcon)["num_ln_in_parallel_attn"], 2);
  EXPECT_EQ((*falcon)["bias"], true);
  auto nemotron = ReadJsonFile(scratch / "nemotron_init_hf/config.json");
  ASSERT_TRUE(nemotron.ok()) << nemotron.status();
  EXPECT_EQ((*nemotron)["architectures"][0], "NemotronForCausalLM");
  EXPECT_EQ((*nemotron)["hidden_act"], "relu2");
  EXPECT_EQ((*nemotron)["partial_rotary_factor"], 0.5);
  EXPECT_EQ((*nemotron)["attention_bias"], true);
  auto phi3 = ReadJsonFile(scratch / "phi3_init_hf/config.json");
  ASSERT_TRUE(phi3.ok()) << phi3.status();
  EXPECT_EQ((*phi3)["architectures"][0], "Phi3ForCausalLM");
  EXPECT_EQ((*phi3)["sliding_window"], 8);
  EXPECT_TRUE((*phi3)["pad_token_id"].is_null());
  // The config written from --hf-config keeps the file's fields.
  auto config = ReadJsonFile(scratch / "llama_tied_init_hf/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["initializer_range"], 0.1);
  EXPECT_EQ((*config)["torch_dtype"], "float32");
}

// A model trained from a config.json (--init-from) records it in its checkpoints: the export
// writes it back with every field, those the description lacks included (GLM's padding row 3,
// its norm epsilon), and `tandem generate` reads its end-of-text ids from it. A run whose flags
// change the model's description (a Mixtral with --moe-aux-loss-coef) exports from the
// description instead.
TEST(HfExportTest, ExportWritesTheRecordedConfigJson) {
  REQUIRE_REFERENCE();
  Scratch scratch;
  const std::string checkpoint = scratch / "glm_ckpt", out = scratch / "glm_hf";
  Outcome o = RunCommand(Train(1, absl::StrCat(" --model llama --init-from ", Case("glm"),
                                               " --steps 1 --checkpoint-dir ", checkpoint)));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  o = RunCommand(Export(checkpoint, out, ""));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("config.json from the config.json recorded in the checkpoint"),
            std::string::npos)
      << o.output;
  auto original = ReadJsonFile(Case("glm") + "/config.json");
  ASSERT_TRUE(original.ok()) << original.status();
  auto written = ReadJsonFile(out + "/config.json");
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ((*written)["pad_token_id"], 3);
  (*original)["torch_dtype"] = "float32";  // what the export writes
  EXPECT_EQ(*written, *original);
  // transformers loads it without a word and computes tandem's loss.
  const Batch held_out = SyntheticBatch(/*vocab=*/64, /*iteration=*/1000, /*count=*/8);
  WriteTokens(scratch / "held_out.safetensors", held_out);
  const HfLoad hf = TransformersLoss(out, scratch / "held_out.safetensors");
  ExpectCleanLoad(hf);
  auto trained = ModelFromCheckpoint(checkpoint);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_LE(Relative(TandemLoss(*trained, held_out), hf.loss), kLossTolerance);
  // The description alone loses the padding row.
  DropRecordedConfig(checkpoint);
  const std::string from_description = scratch / "glm_described_hf";
  o = RunCommand(Export(checkpoint, from_description, ""));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  auto described = ReadJsonFile(from_description + "/config.json");
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_TRUE((*described)["pad_token_id"].is_null());

  const std::string mixtral = scratch / "mixtral_ckpt";
  o = RunCommand(
      Train(1, absl::StrCat(" --model llama --init-from ", Case("mixtral"),
                            " --moe-aux-loss-coef 0.01 --steps 1 --checkpoint-dir ", mixtral)));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  o = RunCommand(Export(mixtral, scratch / "mixtral_hf", ""));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("config.json from the model description"), std::string::npos) << o.output;
}

TEST(HfExportTest, ImportThenExportGivesTheSameBytes) {
  REQUIRE_REFERENCE();
  Scratch scratch;
  for (const ImportCase& c :
       {ImportCase{"llama_gqa", "llama"}, ImportCase{"llama_tied", "llama"},
        ImportCase{"gpt2", "gpt2"}, ImportCase{"llama_sharded", "llama", /*ranks=*/2},
        ImportCase{"gemma2", "llama", /*ranks=*/2}, ImportCase{"mixtral", "llama", /*ranks=*/2},
        ImportCase{"qwen2_moe", "llama", /*ranks=*/2}, ImportCase{"granite", "llama"},
        ImportCase{"phi3", "llama", /*ranks=*/2}, ImportCase{"phi3_longrope", "llama"},
        ImportCase{"granitemoe", "llama", /*ranks=*/2}, ImportCase{"olmo", "llama", /*ranks=*/2},
        ImportCase{"olmoe", "llama", /*ranks=*/2},
        // Read as shards of two ranks (the query and key norms too), written whole.
        ImportCase{"olmoe", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        // One key/value head held whole by both ranks, written once.
        ImportCase{"gemma", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"starcoder2", "llama", /*ranks=*/2},
        ImportCase{"starcoder2", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"phi", "llama", /*ranks=*/2},
        ImportCase{"phi", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"gpt_neox", "llama", /*ranks=*/2},
        ImportCase{"gpt_neox", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"stablelm", "llama", /*ranks=*/2},
        ImportCase{"stablelm", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"gptj", "llama", /*ranks=*/2},
        ImportCase{"gptj", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"cohere", "llama", /*ranks=*/2},
        ImportCase{"cohere", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"glm", "llama", /*ranks=*/2},
        ImportCase{"glm", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"falcon", "llama", /*ranks=*/2},
        ImportCase{"falcon", "llama", /*ranks=*/2, /*tensor_parallel=*/2},
        ImportCase{"nemotron", "llama", /*ranks=*/2},
        ImportCase{"nemotron", "llama", /*ranks=*/2, /*tensor_parallel=*/2}}) {
    const std::string label = absl::StrCat(c.name, c.tensor_parallel > 1 ? "_tp" : "");
    SCOPED_TRACE(label);
    const std::string checkpoint = scratch / (label + "_ckpt");
    const std::string out = scratch / (label + "_hf");
    // One step at learning rate 0 changes nothing.
    Outcome o = RunCommand(
        Train(c.ranks,
              absl::StrCat(" --model ", c.model, " --init-from ", Case(c.name),
                           " --steps 1 --optimizer sgd --lr 0", " --checkpoint-dir ", checkpoint),
              c.tensor_parallel));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    o = RunCommand(Export(checkpoint, out, absl::StrCat(" --hf-config ", Case(c.name),
                                                        "/config.json")));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    std::map<std::string, RawTensor> original = FolderTensors(Case(c.name));
    // The buffers the GPT-NeoX case holds as older checkpoints do are no parameters: read past
    // and not written.
    for (auto it = original.begin(); it != original.end();) {
      const bool buffer = absl::EndsWith(it->first, ".attention.bias") ||
                          absl::EndsWith(it->first, ".attn.bias") ||
                          absl::EndsWith(it->first, ".attn.masked_bias") ||
                          absl::EndsWith(it->first, ".attention.masked_bias") ||
                          absl::EndsWith(it->first, ".attention.rotary_emb.inv_freq");
      it = buffer ? original.erase(it) : std::next(it);
    }
    const std::map<std::string, RawTensor> exported = FolderTensors(out);
    ASSERT_EQ(original.size(), exported.size());
    size_t same = 0;
    for (const auto& [key, tensor] : original) {
      auto it = exported.find(key);
      ASSERT_NE(it, exported.end()) << key;
      EXPECT_TRUE(it->second == tensor) << key;
      same += it->second == tensor;
    }
    std::cout << label << ": " << same << " of " << original.size()
              << " tensors bit-identical after import and export\n";
  }
}

// Qwen3, Qwen3-MoE, OLMo 2 and Gemma 3, from the folders transformers 4.51.3 wrote into
// tests/data/hf_recent (the Python the tests run has an older transformers; hf_models_test compares
// the computation with those folders' logits and gradients): `--init-from` starts every layout at
// the same loss, importing then exporting gives the same bytes, and the config.json an export
// writes from the model description (none recorded) reads back as the same model. Needs no Python.
TEST(HfExportTest, RecentFamiliesImportThenExportGiveTheSameBytesOnEveryLayout) {
  Scratch scratch;
  std::map<std::string, double> first_loss;  // by case
  for (const ImportCase& c :
       {ImportCase{"qwen3_head_dim", "llama"}, ImportCase{"qwen3_head_dim", "llama", 2},
        ImportCase{"qwen3_head_dim", "llama", 2, 2, " --sequence-parallel"},
        ImportCase{"qwen3_tied_bias", "llama"}, ImportCase{"qwen3_tied_bias", "llama", 2, 2},
        ImportCase{"qwen3_moe_experts", "llama"}, ImportCase{"qwen3_moe_experts", "llama", 2},
        ImportCase{"qwen3_moe_experts", "llama", 2, 2, " --expert-parallel 2"},
        ImportCase{"qwen3_moe_dense_norm_topk", "llama", 2, 2, " --sequence-parallel"},
        ImportCase{"olmo2_gqa", "llama"}, ImportCase{"olmo2_gqa", "llama", 2},
        ImportCase{"olmo2_gqa", "llama", 2, 2, " --sequence-parallel"},
        ImportCase{"olmo2_tied_bias", "llama", 2, 2, " --sequence-parallel"},
        ImportCase{"gemma3_local_global", "llama"}, ImportCase{"gemma3_local_global", "llama", 2},
        ImportCase{"gemma3_local_global", "llama", 2, 2, " --sequence-parallel"},
        ImportCase{"gemma3_softcap", "llama", 2, 2},
        // Rotary scaling written back as it was read: YaRN's original context, linear.
        ImportCase{"qwen3_yarn", "llama", 2, 2, " --sequence-parallel"},
        ImportCase{"gemma3_linear", "llama", 2},
        ImportCase{"phi3_partial_longrope", "llama", 2, 2, " --sequence-parallel"},
        // Gemma 3 4B's kind: the language model read from under language_model., the vision
        // tower read past; exported as the text model.
        ImportCase{"gemma3_multimodal", "llama"},
        ImportCase{"gemma3_multimodal", "llama", 2, 2, " --sequence-parallel"},
        ImportCase{"glm4_bias", "llama"},
        ImportCase{"glm4_bias", "llama", 2, 2, " --sequence-parallel"},
        ImportCase{"glm4_tied_nobias", "llama", 2}}) {
    const std::string folder = absl::StrCat(TANDEM_TEST_DATA_DIR, "/hf_recent/", c.name);
    const std::string label =
        absl::StrCat(c.name, "_", c.ranks, "_", c.tensor_parallel, c.flags.empty() ? "" : "_flags");
    SCOPED_TRACE(label);
    const std::string checkpoint = scratch / (label + "_ckpt");
    const std::string out = scratch / (label + "_hf");
    const std::string log = scratch / (label + ".jsonl");
    // One step at learning rate 0 changes nothing.
    Outcome o =
        RunCommand(Train(c.ranks,
                         absl::StrCat(" --model ", c.model, " --init-from ", folder, c.flags,
                                      " --steps 1 --optimizer sgd --lr 0", " --checkpoint-dir ",
                                      checkpoint, " --log-json ", log),
                         c.tensor_parallel));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    const double loss = FirstLoss(log);
    if (first_loss.count(c.name) == 0) first_loss[c.name] = loss;
    EXPECT_LE(Relative(loss, first_loss[c.name]), kLossTolerance)
        << loss << " vs " << first_loss[c.name] << " on the first layout";
    // LongRoPE's factors are not in the description: that export needs the recorded config.
    if (c.name.find("longrope") == std::string::npos) DropRecordedConfig(checkpoint);
    o = RunCommand(Export(checkpoint, out));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    // A Gemma 3 multimodal checkpoint exports as its text model: the language model's tensors
    // without their language_model. prefix, the vision tower's and projector's left out.
    const bool multimodal = c.name == "gemma3_multimodal";
    std::map<std::string, RawTensor> original;
    for (auto& [key, tensor] : FolderTensors(folder)) {
      absl::string_view name = key;
      if (multimodal && !absl::ConsumePrefix(&name, "language_model.")) continue;
      original[std::string(name)] = tensor;
    }
    const std::map<std::string, RawTensor> exported = FolderTensors(out);
    ASSERT_EQ(original.size(), exported.size());
    for (const auto& [key, tensor] : original) {
      auto it = exported.find(key);
      ASSERT_NE(it, exported.end()) << key;
      EXPECT_TRUE(it->second == tensor) << key;
    }
    auto written = ReadJsonFile(out + "/config.json");
    auto source = ReadJsonFile(folder + "/config.json");
    ASSERT_TRUE(written.ok() && source.ok());
    EXPECT_EQ((*written)["architectures"],
              multimodal ? Json::array({"Gemma3ForCausalLM"}) : (*source)["architectures"]);
    auto written_config = LlamaConfigFromJson(*written);
    auto source_config = LlamaConfigFromJson(*source);
    ASSERT_TRUE(written_config.ok()) << written_config.status();
    ASSERT_TRUE(source_config.ok()) << source_config.status();
    if (multimodal) source_config->model_type = "gemma3_text";
    // The training run's sequence, not the file's, is what the description records.
    written_config->seq_len = source_config->seq_len;
    EXPECT_EQ(DescribeLlama(*written_config), DescribeLlama(*source_config));
    std::cout << label << ": first loss " << loss << ", " << original.size()
              << " tensors bit-identical after import and export\n";
  }
}

// A checkpoint of `layout`'s model written directly (as SaveShards does), with `change` applied
// to its parameter states first.
void WriteCheckpoint(const std::string& dir, const std::string& model, const ModelSpec& spec,
                     bool with_shapes,
                     const std::function<void(std::vector<ParameterState>&)>& change = {}) {
  auto built = spec.Build(/*seed=*/5);
  ASSERT_TRUE(built.ok()) << built.status();
  std::vector<ParameterState> states;
  for (const auto& [name, parameter] : built->NamedParameters(0, built->num_layers())) {
    ParameterState p;
    p.name = name;
    const torch::Tensor values = parameter.detach().contiguous();
    p.value.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
    if (with_shapes) p.shape = values.sizes().vec();
    states.push_back(std::move(p));
  }
  if (change) change(states);
  ASSERT_TRUE(EnsureDirectory(dir).ok());
  CheckpointManifest manifest;
  manifest.model = model;
  manifest.plan = Json::object();
  auto record = WriteShard(dir, ShardOf(0, 0, built->num_layers(), states));
  ASSERT_TRUE(record.ok()) << record.status();
  manifest.shards.push_back(*record);
  ASSERT_TRUE(WriteManifest(dir, manifest).ok());
}

TEST(HfExportTest, ShardsWithoutShapesExportWithTheLayoutsAndShardedOutputHasAnIndex) {
  Scratch scratch;
  const LlamaConfig config = SmallLlama();
  const std::string model = absl::StrCat(DescribeLlama(config), " seed=5");
  WriteCheckpoint(scratch / "flat", model, LlamaModelSpec(config), /*with_shapes=*/false);
  HfExportOptions options;
  options.max_shard_bytes = 20000;
  auto exported = ExportCheckpointToHf(scratch / "flat", scratch / "out", options);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_GT(exported->files.size(), 3u);
  EXPECT_EQ(exported->files.front(), "config.json");
  EXPECT_EQ(exported->files.back(), "model.safetensors.index.json");
  const std::map<std::string, RawTensor> written = FolderTensors(scratch / "out");
  EXPECT_EQ(written.size(), LlamaHfLayout(config).tensors.size());
  EXPECT_EQ(written.at("model.layers.0.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{16, 32}));
  auto json = ReadJsonFile(scratch / "out/config.json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["num_key_value_heads"], 2);
  EXPECT_EQ((*json)["rms_norm_eps"], 1e-5);
  EXPECT_EQ((*json)["max_position_embeddings"], kSeqLen);
}

TEST(HfExportTest, BadCheckpointsAndOutputsAreRefusedLeavingNothingBehind) {
  Scratch scratch;
  const LlamaConfig config = SmallLlama();
  const std::string model = DescribeLlama(config);
  auto expect_refused = [&](const std::string& checkpoint, const std::string& out,
                            const std::string& mentions, const HfExportOptions& options = {}) {
    auto exported = ExportCheckpointToHf(checkpoint, out, options);
    ASSERT_FALSE(exported.ok()) << mentions;
    EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument) << exported.status();
    EXPECT_NE(exported.status().message().find(mentions), std::string::npos)
        << exported.status();
    for (const auto& entry : fs::directory_iterator(scratch.path())) {
      EXPECT_FALSE(absl::StrContains(entry.path().filename().string(), ".export-"))
          << entry.path() << " left behind";
    }
  };
  WriteCheckpoint(scratch / "good", model, LlamaModelSpec(config), /*with_shapes=*/true);
  // A folder that holds something.
  fs::create_directories(scratch / "full");
  ASSERT_TRUE(WriteFileAtomically(scratch / "full/notes.txt", "mine").ok());
  expect_refused(scratch / "good", scratch / "full", "is not empty");
  EXPECT_TRUE(fs::exists(scratch / "full/notes.txt"));
  // A parameter missing, one too many, one of another shape.
  WriteCheckpoint(scratch / "missing", model, LlamaModelSpec(config), true,
                  [](std::vector<ParameterState>& s) { s.erase(s.begin() + 3); });
  expect_refused(scratch / "missing", scratch / "out", "holds no parameter");
  WriteCheckpoint(scratch / "extra", model, LlamaModelSpec(config), true,
                  [](std::vector<ParameterState>& s) {
                    s.push_back(s.back());
                    s.back().name = "layers.1.mlp.extra.weight";
                  });
  expect_refused(scratch / "extra", scratch / "out", "'layers.1.mlp.extra.weight'");
  WriteCheckpoint(scratch / "shaped", model, LlamaModelSpec(config), true,
                  [](std::vector<ParameterState>& s) {
                    for (ParameterState& p : s) {
                      if (p.name == "layers.0.embed_tokens.weight") p.shape = {32, 64};
                    }
                  });
  expect_refused(scratch / "shaped", scratch / "out", "[32, 64]");
  // A config.json of another model.
  HfExportOptions other;
  other.hf_config = scratch / "other.json";
  Json wider = {{"model_type", "llama"}, {"vocab_size", 64}, {"hidden_size", 32},
                {"intermediate_size", 96}, {"num_hidden_layers", 2},
                {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                {"max_position_embeddings", 64}};
  ASSERT_TRUE(WriteFileAtomically(other.hf_config, wider.dump()).ok());
  expect_refused(scratch / "good", scratch / "out", "I=96", other);
  // A model export does not know.
  WriteCheckpoint(scratch / "gpt", "gpt L=2 H=32", LlamaModelSpec(config), true);
  expect_refused(scratch / "gpt", scratch / "out", "llama and gpt2 models only");
  EXPECT_FALSE(fs::exists(scratch / "out"));
  // The good one goes into an empty folder.
  fs::create_directories(scratch / "empty");
  auto exported = ExportCheckpointToHf(scratch / "good", scratch / "empty/");
  EXPECT_TRUE(exported.ok()) << exported.status();
  EXPECT_TRUE(fs::exists(scratch / "empty/model.safetensors"));
}

TEST(HfExportTest, CommandLineNeedsTheFormatAndPrintsShapes) {
  Scratch scratch;
  const LlamaConfig config = SmallLlama();
  WriteCheckpoint(scratch / "ckpt", DescribeLlama(config), LlamaModelSpec(config), true);
  Outcome o = RunCommand(absl::StrCat(g_tandem, " checkpoint export ", scratch / "ckpt", " ",
                                      scratch / "out"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--format safetensors"), std::string::npos) << o.output;
  EXPECT_FALSE(fs::exists(scratch / "out"));
  o = RunCommand(Export(scratch / "ckpt", scratch / "out"));
  EXPECT_EQ(o.exit_status, 0) << o.output;
  o = RunCommand(absl::StrCat(g_tandem, " checkpoint inspect ", scratch / "ckpt"));
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("param:layers.1.self_attn.k_proj.weight"), std::string::npos)
      << o.output;
  EXPECT_NE(o.output.find("[16, 32]"), std::string::npos) << o.output;
  // A flag of another subcommand would be ignored: refused, naming where it belongs.
  o = RunCommand(absl::StrCat(g_tandem, " checkpoint inspect ", scratch / "ckpt", " --hf-config ",
                              scratch / "out/config.json"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--hf-config applies to `tandem checkpoint export`, not `inspect`"),
            std::string::npos)
      << o.output;
  o = RunCommand(absl::StrCat(g_tandem, " checkpoint export --format safetensors ",
                              scratch / "ckpt", " ", scratch / "again", " --tolerance 0.1"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("--tolerance applies to `tandem checkpoint diff`"), std::string::npos)
      << o.output;
  EXPECT_FALSE(fs::exists(scratch / "again"));
}

}  // namespace
}  // namespace tandem::runtime::libtorch

int main(int argc, char** argv) {
  return tandem::testing::RunTestsWithProgramPath(argc, argv, "PATH_TO_TANDEM",
                                                  &tandem::runtime::libtorch::g_tandem);
}
