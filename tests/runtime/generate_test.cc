// Text generation (runtime/torch/generate.h, kv_cache.h, `tandem generate`):
//   * the incremental forward of gpt, gpt2 and llama (prompt in one pass, then position by
//     position, then several at once) equals their whole-sequence forward;
//   * greedy and sampled tokens with the key/value cache equal those without it; the same seed
//     gives the same tokens, another seed others; sampled tokens lie in the top k;
//   * `tandem generate --init-from` gives the tokens transformers' greedy generate gives on the
//     same weights (llama with grouped-query attention, tied llama, gpt2, gpt2 with attention
//     scaled by layer, and a gpt2 prompted with text through a tokenizer.json), with and
//     without the cache (generate_reference.py; skipped, with the reason, where python3
//     cannot import transformers and torch);
//   * `tandem generate --checkpoint` on checkpoints `tandem train` wrote over two pipeline
//     stages: a gpt's tokens equal a greedy loop over the whole forward of a model holding the
//     checkpoint's tensors; a llama's and a gpt2's equal transformers' on the folder
//     `tandem checkpoint export` writes;
//   * bad input exits 2 with one line.
// The path of the tandem program is the first argument.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>
#include <torch/utils.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint.h"
#include "runtime/torch/generate.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/kv_cache.h"
#include "runtime/torch/llama.h"
#include "tests/support/command.h"
#include "tests/support/checkpoint_parameters.h"
#include "tests/support/python_reference.h"

namespace tandem::runtime::libtorch {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;
using testing::RunCommand;

std::string g_tandem;  // the tandem program
constexpr int64_t kVocab = 40;

// ---- Models built here ------------------------------------------------------------------------

GenerationModel Frozen(const ModelSpec& spec, std::string description, int64_t vocab,
                       int64_t max_positions) {
  GenerationModel out;
  auto built = spec.Build(/*seed=*/5);
  EXPECT_TRUE(built.ok()) << built.status();
  out.model = *std::move(built);
  if (out.model.tied_weights.share) {
    EXPECT_TRUE(out.model.tied_weights.share(out.model.layers, 0).ok());
  }
  for (auto& layer : out.model.layers) {
    for (torch::Tensor& p : layer.ptr()->parameters()) p.requires_grad_(false);
  }
  out.description = std::move(description);
  out.vocab = vocab;
  out.max_positions = max_positions;
  return out;
}

struct ModelCase {
  std::string name;
  std::function<GenerationModel()> make;
};

// A two-block Llama of 40 positions with wide initial values, which the cases below change.
LlamaConfig TinyLlama() {
  LlamaConfig c;
  c.vocab = kVocab;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.intermediate = 64;
  c.seq_len = 40;
  c.max_position_embeddings = 40;
  c.init_std = 0.3;
  return c;
}

GenerationModel FrozenLlama(const LlamaConfig& c) {
  return Frozen(LlamaModelSpec(c), DescribeLlama(c), c.vocab, c.max_position_embeddings);
}

// Wide initial values, so that the logits differ by more than rounding.
std::vector<ModelCase> ModelCases() {
  return {
      {"gpt",
       [] {
         GptConfig c;
         c.vocab = kVocab;
         c.layers = 2;
         c.hidden = 32;
         c.heads = 4;
         c.seq_len = 40;
         c.init_std = 0.3;
         return Frozen(GptModelSpec(c), DescribeGpt(c), c.vocab, c.seq_len);
       }},
      {"gpt2",
       [] {
         Gpt2Config c;
         c.vocab = kVocab;
         c.layers = 2;
         c.hidden = 32;
         c.heads = 4;
         c.positions = 40;
         c.seq_len = 40;
         c.scale_attn_by_inverse_layer_idx = true;
         c.init_std = 0.3;
         return Frozen(Gpt2ModelSpec(c), DescribeGpt2(c), c.vocab, c.positions);
       }},
      {"llama",
       [] {
         LlamaConfig c = TinyLlama();
         c.rope_theta = 10000;
         c.tie_word_embeddings = true;
         return FrozenLlama(c);
       }},
      // Gemma 2's soft caps and sandwich norms in the incremental forward.
      {"gemma2",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "gemma2";
         c.hidden_act = "gelu_pytorch_tanh";
         c.query_pre_attn_scalar = 12;
         c.attn_logit_softcapping = 2.0;
         c.final_logit_softcapping = 5.0;
         c.head_dim = 16;
         c.sliding_window = 5;  // masked in the first block: 12 positions run past it
         return FrozenLlama(c);
       }},
      // Mixtral's experts route each new token alone.
      {"mixtral",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "mixtral";
         c.experts = 4;
         c.experts_per_token = 2;
         c.intermediate = 32;
         return FrozenLlama(c);
       }},
      // Qwen2-MoE's shared expert and its gate, a dense block after a sparse one.
      {"qwen2_moe",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "qwen2_moe";
         c.qkv_bias = true;
         c.experts = 3;
         c.experts_per_token = 2;
         c.expert_intermediate = 16;
         c.shared_expert_intermediate = 24;
         c.normalize_top_k = false;
         c.dense_blocks = {1};
         c.intermediate = 32;
         return FrozenLlama(c);
       }},
      // Granite's multipliers in the incremental forward: the embedding, each residual
      // branch, the scores and the logits.
      {"granite",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "granite";
         c.embedding_multiplier = 3.0;
         c.residual_multiplier = 0.5;
         c.attention_multiplier = 0.2;
         c.logits_scaling = 4.0;
         return FrozenLlama(c);
       }},
      // OLMo's weightless layer norms and clamped query, key and value products in the
      // incremental forward (the cache keeps the clamped keys and values).
      {"olmo",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "olmo";
         c.clip_qkv = 0.5;
         return FrozenLlama(c);
       }},
      // OLMoE's q_norm and k_norm before the clamp, and its experts, in the incremental
      // forward.
      {"olmoe",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "olmoe";
         c.clip_qkv = 0.5;
         c.experts = 4;
         c.experts_per_token = 2;
         c.normalize_top_k = false;
         return FrozenLlama(c);
       }},
      // StarCoder 2's layer norms with biases, plain MLP and window in the incremental
      // forward.
      {"starcoder2",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "starcoder2";
         c.hidden_act = "gelu_pytorch_tanh";
         c.attention_bias = true;
         c.mlp_bias = true;
         c.sliding_window = 5;
         return FrozenLlama(c);
       }},
      // Phi's attention and MLP side by side and its partial rotation in the incremental
      // forward (the cached keys rotated in part).
      {"phi",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "phi";
         c.hidden_act = "gelu_new";
         c.attention_bias = true;
         c.mlp_bias = true;
         c.partial_rotary_factor = 0.5;
         return FrozenLlama(c);
       }},
      // GPT-NeoX's per-head fused query/key/value rows and two norms side by side in the
      // incremental forward.
      {"gpt_neox",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "gpt_neox";
         c.kv_heads = c.heads;
         c.hidden_act = "gelu";
         c.attention_bias = true;
         c.mlp_bias = true;
         c.partial_rotary_factor = 0.25;
         c.parallel_residual = true;
         return FrozenLlama(c);
       }},
      // GPT-J: pairs of neighbours rotated in the cached keys, the LM head's bias.
      {"gptj",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "gptj";
         c.kv_heads = c.heads;
         c.hidden_act = "gelu_new";
         c.mlp_bias = true;
         c.rotary_dims = 4;
         return FrozenLlama(c);
       }},
      // Cohere: weight-only layer norms, pairs of neighbours rotated, the logits scaled.
      {"cohere",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "cohere";
         c.logit_scale = 0.5;
         c.head_qk_norms = true;
         return FrozenLlama(c);
       }},
      // GLM: half of each head rotated by pairs of neighbours in the cached keys.
      {"glm",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "glm";
         c.qkv_bias = true;
         c.rotary_dims = 4;
         return FrozenLlama(c);
       }},
      // Nemotron's offset layer norms, squared ReLU and half rotation in the incremental forward.
      {"nemotron",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "nemotron";
         c.hidden_act = "relu2";
         c.partial_rotary_factor = 0.5;
         return FrozenLlama(c);
       }},
      // Falcon's grouped query_key_value rows (2 groups of 2 heads) and a norm for each branch
      // in the incremental forward.
      {"falcon",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "falcon";
         c.hidden_act = "gelu";
         c.attention_bias = true;
         c.mlp_bias = true;
         c.parallel_residual = true;
         c.branch_norms = true;
         return FrozenLlama(c);
       }},
      // StableLM side by side on one layer norm, a quarter of each head rotated.
      {"stablelm",
       [] {
         LlamaConfig c = TinyLlama();
         c.model_type = "stablelm";
         c.qkv_bias = true;
         c.partial_rotary_factor = 0.25;
         c.parallel_residual = true;
         c.head_qk_norms = true;
         return FrozenLlama(c);
       }},
  };
}

std::vector<int64_t> Prompt() { return {3, 17, 17, 8, 30, 1, 12}; }

TEST(GenerateTest, IncrementalForwardEqualsTheWholeForward) {
  torch::NoGradGuard no_grad;
  for (const ModelCase& c : ModelCases()) {
    SCOPED_TRACE(c.name);
    GenerationModel m = c.make();
    torch::manual_seed(1);
    const torch::Tensor ids = torch::randint(0, kVocab, {2, 12}, torch::kLong);
    const torch::Tensor whole = m.model.Forward(ids, 0, m.model.num_layers());
    // Positions [0, 7) at once, then 7 alone, then [8, 12) at once.
    std::vector<KeyValueCache> caches(m.model.num_layers());
    for (KeyValueCache& cache : caches) cache.capacity = 12;
    std::vector<torch::Tensor> parts;
    int64_t start = 0;
    for (const int64_t n : {7, 1, 4}) {
      torch::Tensor x = ids.narrow(1, start, n);
      for (int layer = 0; layer < m.model.num_layers(); ++layer) {
        IncrementalLayer* incremental = AsIncremental(m.model.layers[layer]);
        ASSERT_NE(incremental, nullptr) << m.model.layer_names[layer];
        x = incremental->ForwardIncremental(x, start, caches[layer]);
      }
      parts.push_back(x);
      start += n;
    }
    const torch::Tensor pieces = torch::cat(parts, 1);
    ASSERT_EQ(pieces.sizes(), whole.sizes());
    const double scale = whole.abs().max().item<double>();
    const double difference = (pieces - whole).abs().max().item<double>();
    EXPECT_GT(scale, 0.5);
    EXPECT_LT(difference, 1e-5 * scale) << "largest |logit| " << scale;
    // The blocks hold every position; the embedding and the head keep nothing.
    for (size_t layer = 0; layer < caches.size(); ++layer) {
      const bool block = layer > 0 && layer + 1 < caches.size();
      EXPECT_EQ(caches[layer].length, block ? 12 : 0) << "layer " << layer;
    }
  }
}

std::vector<int64_t> Tokens(GenerationModel& m, const GenerateOptions& options) {
  auto generated = Generate(m, Prompt(), options);
  EXPECT_TRUE(generated.ok()) << generated.status();
  return generated.ok() ? generated->tokens : std::vector<int64_t>();
}

TEST(GenerateTest, CachedTokensEqualUncachedGreedyAndSampled) {
  for (const ModelCase& c : ModelCases()) {
    SCOPED_TRACE(c.name);
    GenerationModel m = c.make();
    GenerateOptions options;
    options.max_new_tokens = 30;
    const std::vector<int64_t> greedy = Tokens(m, options);
    ASSERT_EQ(greedy.size(), 30u);
    options.use_cache = false;
    EXPECT_EQ(Tokens(m, options), greedy);

    options.temperature = 1.0;
    options.seed = 7;
    const std::vector<int64_t> sampled = Tokens(m, options);
    options.use_cache = true;
    EXPECT_EQ(Tokens(m, options), sampled);
    EXPECT_EQ(Tokens(m, options), sampled) << "the same seed, the same tokens";
    EXPECT_NE(sampled, greedy);
    options.seed = 8;
    EXPECT_NE(Tokens(m, options), sampled) << "another seed, other tokens";
    options.top_k = 5;
    const std::vector<int64_t> top5 = Tokens(m, options);
    options.use_cache = false;
    EXPECT_EQ(Tokens(m, options), top5);
    options.top_k = 1;
    EXPECT_EQ(Tokens(m, options), greedy) << "top-k 1 is greedy";
  }
}

TEST(GenerateTest, SampledTokensLieInTheTopK) {
  torch::NoGradGuard no_grad;
  for (const ModelCase& c : ModelCases()) {
    SCOPED_TRACE(c.name);
    GenerationModel m = c.make();
    GenerateOptions options;
    options.max_new_tokens = 30;
    options.temperature = 2.0;  // flat: without top-k, tokens outside the top 3 are likely
    options.top_k = 3;
    options.seed = 3;
    const std::vector<int64_t> tokens = Tokens(m, options);
    ASSERT_EQ(tokens.size(), 30u);
    std::vector<int64_t> sequence = Prompt();
    for (const int64_t token : tokens) {
      const torch::Tensor ids = torch::tensor(sequence, torch::kLong).view({1, -1});
      const torch::Tensor logits =
          m.model.Forward(ids, 0, m.model.num_layers()).select(1, ids.size(1) - 1)[0];
      const int64_t above = (logits > logits[token]).sum().item<int64_t>();
      EXPECT_LT(above, 3) << "token " << token << " has " << above << " above it";
      sequence.push_back(token);
    }
  }
}

TEST(GenerateTest, RefusesBadInput) {
  GenerationModel m = ModelCases()[0].make();
  GenerateOptions options;
  options.max_new_tokens = 4;
  const auto code = [&](std::vector<int64_t> prompt, const GenerateOptions& o) {
    return Generate(m, prompt, o).status().code();
  };
  EXPECT_EQ(code({1, kVocab}, options), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({-1}, options), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({}, options), absl::StatusCode::kInvalidArgument);
  GenerateOptions long_run = options;
  long_run.max_new_tokens = m.max_positions;  // with the prompt's token: one too many
  EXPECT_EQ(code({1}, long_run), absl::StatusCode::kInvalidArgument);
  long_run.max_new_tokens = m.max_positions - 1;
  EXPECT_EQ(code({1}, long_run), absl::StatusCode::kOk);
  GenerateOptions bad = options;
  bad.temperature = -1;
  EXPECT_EQ(code({1}, bad), absl::StatusCode::kInvalidArgument);
  bad = options;
  bad.temperature = NAN;
  EXPECT_EQ(code({1}, bad), absl::StatusCode::kInvalidArgument);
  bad = options;
  bad.top_k = -2;
  EXPECT_EQ(code({1}, bad), absl::StatusCode::kInvalidArgument);
}

// ---- The command line ---------------------------------------------------------------------------

// A fresh folder for one test's files, removed at the end of the test.
class Scratch {
 public:
  Scratch() {
    path_ = (fs::temp_directory_path() /
             absl::StrCat("tandem_generate_test_", ::getpid(), "_",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return absl::StrCat(path_, "/", name); }

 private:
  std::string path_;
};

std::string Python() { return "python3"; }

using Reference = tandem::testing::PythonReference;

const Reference& References() {
  static const Reference* reference = new Reference(
      tandem::testing::MakePythonReference("torch, transformers, safetensors, tokenizers", TANDEM_GENERATE_SCRIPT, "generate"));
  return *reference;
}

#define REQUIRE_REFERENCE() TANDEM_REQUIRE_PYTHON_REFERENCE(References())

std::string Quoted(const std::string& text) { return absl::StrCat("'", text, "'"); }

// The ids of the `tokens: ` line of `tandem generate`'s output.
std::vector<int64_t> TokensLine(const std::string& output) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::ConsumePrefix(&line, "tokens: ")) continue;
    std::vector<int64_t> ids;
    for (absl::string_view piece : absl::StrSplit(line, ',', absl::SkipEmpty())) {
      int64_t id = 0;
      EXPECT_TRUE(absl::SimpleAtoi(piece, &id)) << line;
      ids.push_back(id);
    }
    return ids;
  }
  ADD_FAILURE() << "no tokens line in: " << output;
  return {};
}

std::string Join(const std::vector<int64_t>& ids) { return absl::StrJoin(ids, ","); }

// Qwen3's, Qwen3-MoE's, OLMo 2's and Gemma 3's greedy tokens as transformers 4.51.3's generate()
// made them (tests/data/hf_recent/generate.json, hf_recent_reference.py): with the key/value cache
// and without. Needs no Python.
TEST(GenerateCommandTest, RecentFamiliesGreedyTokensEqualTransformersGenerate) {
  const std::string data = absl::StrCat(TANDEM_TEST_DATA_DIR, "/hf_recent");
  auto reference = ReadJsonFile(data + "/generate.json");
  ASSERT_TRUE(reference.ok()) << reference.status();
  const Json& cases = (*reference)["cases"];
  ASSERT_EQ(cases.size(), 14u);
  for (const Json& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const std::vector<int64_t> prompt = c["prompt"].get<std::vector<int64_t>>();
    const std::vector<int64_t> expected = c["tokens"].get<std::vector<int64_t>>();
    for (const char* cache : {"", " --kv-cache=false"}) {
      SCOPED_TRACE(cache);
      const Outcome o = RunCommand(absl::StrCat(
          g_tandem, " generate --init-from ", Quoted(data + "/" + name), " --max-new-tokens ",
          expected.size(), " --stop-token none --prompt-tokens ", Join(prompt), cache));
      ASSERT_EQ(o.exit_status, 0) << o.output;
      EXPECT_EQ(TokensLine(o.output), expected) << o.output;
    }
  }
}

TEST(GenerateCommandTest, GreedyTokensEqualTransformersGenerate) {
  REQUIRE_REFERENCE();
  auto cases = ReadJsonFile(References().folder + "/cases.json");
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_EQ(cases->size(), 28u);
  for (const Json& c : *cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const std::vector<int64_t> prompt = c["prompt"].get<std::vector<int64_t>>();
    const std::vector<int64_t> expected = c["tokens"].get<std::vector<int64_t>>();
    const std::string folder = absl::StrCat(References().folder, "/", name);
    // The reference ran without end-of-text tokens (all but llama_eos): --stop-token none.
    const bool stops = c.value("stops", false);
    const std::string base =
        absl::StrCat(g_tandem, " generate --init-from ", Quoted(folder), " --max-new-tokens ",
                     stops ? 20 : expected.size(), stops ? "" : " --stop-token none");
    for (const char* cache : {"", " --kv-cache=false"}) {
      SCOPED_TRACE(cache);
      const Outcome o =
          RunCommand(absl::StrCat(base, " --prompt-tokens ", Join(prompt), cache));
      ASSERT_EQ(o.exit_status, 0) << o.output;
      EXPECT_EQ(TokensLine(o.output), expected) << o.output;
    }
    if (stops) {
      // Stopped at the folder's generation_config.json end-of-text token, short of 20.
      ASSERT_GE(expected.size(), 4u);
      EXPECT_LT(expected.size(), 20u);
      const Outcome o = RunCommand(absl::StrCat(base, " --prompt-tokens ", Join(prompt)));
      EXPECT_NE(o.output.find(absl::StrCat("stops after: ")), std::string::npos) << o.output;
      EXPECT_NE(o.output.find("generation_config.json eos_token_id"), std::string::npos)
          << o.output;
      // Told otherwise, it runs on.
      const Outcome on =
          RunCommand(absl::StrCat(base, " --prompt-tokens ", Join(prompt), " --stop-token none"));
      ASSERT_EQ(on.exit_status, 0) << on.output;
      EXPECT_EQ(TokensLine(on.output).size(), 20u) << on.output;
      // A stop token given: up to its first occurrence.
      const Outcome given = RunCommand(
          absl::StrCat(base, " --prompt-tokens ", Join(prompt), " --stop-token 99,", expected[1]));
      ASSERT_EQ(given.exit_status, 0) << given.output;
      const auto first = std::find(expected.begin(), expected.end(), expected[1]);
      EXPECT_EQ(TokensLine(given.output), std::vector<int64_t>(expected.begin(), first + 1))
          << given.output;
      EXPECT_NE(given.output.find(absl::StrCat("stops after: 99,", expected[1], " (--stop-token)")),
                std::string::npos)
          << given.output;
    }
    if (c["text"].is_string()) {
      // The prompt as text: the C++ tokenizer's ids are transformers' prompt (the Llama's
      // with its beginning-of-text token first, from the tokenizer's template).
      const std::string text = c["text"].get<std::string>();
      const Outcome o = RunCommand(absl::StrCat(
          base, " --prompt ", Quoted(text), " --tokenizer ",
          Quoted(absl::StrCat(References().folder, "/", c["tokenizer"].get<std::string>()))));
      ASSERT_EQ(o.exit_status, 0) << o.output;
      EXPECT_EQ(TokensLine(o.output), expected) << o.output;
      EXPECT_NE(o.output.find("text: " + c["shown"].get<std::string>()), std::string::npos)
          << o.output;
      EXPECT_NE(o.output.find(absl::StrCat("prompt: ", prompt.size(), " token(s)")),
                std::string::npos)
          << o.output;
      if (name == "llama_text") {
        // Without --tokenizer, the folder's own tokenizer.json.
        const Outcome own = RunCommand(absl::StrCat(base, " --prompt ", Quoted(text)));
        ASSERT_EQ(own.exit_status, 0) << own.output;
        EXPECT_EQ(TokensLine(own.output), expected) << own.output;
        EXPECT_NE(own.output.find("tokenizer: " + folder + "/tokenizer.json"), std::string::npos)
            << own.output;
      }
    }
  }
}

TEST(GenerateCommandTest, AWindowTandemComputesInFullBoundsThePositions) {
  REQUIRE_REFERENCE();
  // Mistral's and Gemma 2's windows are masked (the greedy test runs past them); Qwen2's is
  // computed in full, so it bounds the prompt and new tokens.
  Scratch scratch;
  const std::string source = References().folder + "/qwen2_text";
  const std::string folder = scratch / "qwen2_window";
  fs::create_directories(folder);
  fs::copy_file(source + "/model.safetensors", folder + "/model.safetensors");
  auto json = ReadJsonFile(source + "/config.json");
  ASSERT_TRUE(json.ok()) << json.status();
  (*json)["use_sliding_window"] = true;
  (*json)["sliding_window"] = 12;
  ASSERT_TRUE(WriteFileAtomically(folder + "/config.json", json->dump()).ok());
  const std::string base = absl::StrCat(g_tandem, " generate --init-from ", Quoted(folder),
                                        " --prompt-tokens 7,1,44,2,9 --stop-token none");
  Outcome o = RunCommand(absl::StrCat(base, " --max-new-tokens 7"));
  EXPECT_EQ(o.exit_status, 0) << o.output;
  o = RunCommand(absl::StrCat(base, " --max-new-tokens 8"));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  EXPECT_NE(o.output.find("exceed the 12 positions"), std::string::npos) << o.output;
}

// `tandem train` on two pipeline stages with a checkpoint.
std::string TrainCommand(const std::string& model_flags, const std::string& checkpoint) {
  return absl::StrCat(TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none -np 2 ",
                      g_tandem, " train", model_flags,
                      " --seq-len 16 --steps 4 --optimizer adamw --lr 1e-2 --global-batch 4"
                      " --microbatches 2 --schedule 1f1b --stages 2 --seed 3 --checkpoint-dir ",
                      Quoted(checkpoint));
}

TEST(GenerateCommandTest, GptFromATrainCheckpointEqualsAWholeForwardLoop) {
  Scratch scratch;
  const std::string checkpoint = scratch / "gpt_ckpt";
  Outcome o = RunCommand(TrainCommand(
      " --model gpt --layers 2 --hidden 16 --heads 2 --vocab 16", checkpoint));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  const std::vector<int64_t> prompt = {1, 2, 3, 4};
  o = RunCommand(absl::StrCat(g_tandem, " generate --checkpoint ", Quoted(checkpoint),
                              " --prompt-tokens ", Join(prompt), " --max-new-tokens 12"));
  ASSERT_EQ(o.exit_status, 0) << o.output;
  const std::vector<int64_t> tokens = TokensLine(o.output);
  ASSERT_EQ(tokens.size(), 12u);
  EXPECT_NE(o.output.find("gpt L=2 H=16 A=2 S=16 V=16"), std::string::npos) << o.output;

  // The model from its sizes, the checkpoint's tensors copied in by name; greedy by whole
  // forwards.
  GptConfig config;
  config.vocab = 16;
  config.layers = 2;
  config.hidden = 16;
  config.heads = 2;
  config.seq_len = 16;
  auto model = GptModelSpec(config).Build(/*seed=*/99);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::map<std::string, ShardTensor> saved = testing::CheckpointParameters(checkpoint);
  torch::NoGradGuard no_grad;
  const auto parameters = model->NamedParameters(0, model->num_layers());
  ASSERT_EQ(parameters.size(), saved.size());
  for (const auto& [name, parameter] : parameters) {
    auto it = saved.find(name);
    ASSERT_NE(it, saved.end()) << name;
    ASSERT_EQ(it->second.count, parameter.numel()) << name;
    torch::Tensor values = torch::empty_like(parameter);
    std::memcpy(values.data_ptr<float>(), it->second.bytes.data(), it->second.bytes.size());
    parameter.copy_(values);
  }
  std::vector<int64_t> sequence = prompt;
  std::vector<int64_t> expected;
  for (int step = 0; step < 12; ++step) {
    const torch::Tensor ids = torch::tensor(sequence, torch::kLong).view({1, -1});
    const int64_t next = model->Forward(ids, 0, model->num_layers())
                             .select(1, ids.size(1) - 1)[0]
                             .argmax()
                             .item<int64_t>();
    expected.push_back(next);
    sequence.push_back(next);
  }
  EXPECT_EQ(tokens, expected);

  // Sampling: the same seed, the same tokens.
  const std::string sampled = absl::StrCat(g_tandem, " generate --checkpoint ",
                                           Quoted(checkpoint), " --prompt-tokens 1,2,3"
                                           " --max-new-tokens 12 --temperature 1.5 --top-k 8");
  const Outcome a = RunCommand(sampled + " --seed 11");
  const Outcome b = RunCommand(sampled + " --seed 11");
  ASSERT_EQ(a.exit_status, 0) << a.output;
  ASSERT_EQ(b.exit_status, 0) << b.output;
  EXPECT_EQ(TokensLine(a.output), TokensLine(b.output));
}

TEST(GenerateCommandTest, HfModelsFromATrainCheckpointEqualTransformersOnTheExport) {
  REQUIRE_REFERENCE();
  Scratch scratch;
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
           {"llama", " --model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2"
                     " --intermediate 64 --vocab 64"},
           {"gpt2", " --model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64"}}) {
    SCOPED_TRACE(name);
    const std::string checkpoint = scratch / (name + "_ckpt");
    const std::string exported = scratch / (name + "_hf");
    Outcome o = RunCommand(TrainCommand(flags, checkpoint));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    o = RunCommand(absl::StrCat(g_tandem, " checkpoint export --format safetensors ",
                                Quoted(checkpoint), " ", Quoted(exported)));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    const std::string prompt = "5,9,2,33,33,61";
    const Outcome reference = RunCommand(absl::StrCat(
        Python(), " '", TANDEM_GENERATE_SCRIPT, "' generate ", Quoted(exported), " ", prompt,
        " 10 2>/dev/null"));
    ASSERT_EQ(reference.exit_status, 0) << reference.output;
    std::vector<int64_t> expected;
    for (absl::string_view piece :
         absl::StrSplit(absl::StripAsciiWhitespace(reference.output), ',')) {
      int64_t id = 0;
      ASSERT_TRUE(absl::SimpleAtoi(piece, &id)) << reference.output;
      expected.push_back(id);
    }
    o = RunCommand(absl::StrCat(g_tandem, " generate --checkpoint ", Quoted(checkpoint),
                                " --prompt-tokens ", prompt, " --max-new-tokens 10"));
    ASSERT_EQ(o.exit_status, 0) << o.output;
    EXPECT_EQ(TokensLine(o.output), expected) << o.output;
  }
}

// The one line on stderr, exit 2.
void ExpectBadInput(const std::string& flags, const std::string& mentions) {
  SCOPED_TRACE(flags);
  const Outcome o = RunCommand(absl::StrCat(g_tandem, " generate", flags));
  EXPECT_EQ(o.exit_status, 2) << o.output;
  const std::vector<std::string> lines = absl::StrSplit(o.output, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 1u) << o.output;
  EXPECT_NE(o.output.find(mentions), std::string::npos) << o.output;
}

TEST(GenerateCommandTest, BadInputExitsTwoWithOneLine) {
  Scratch scratch;
  ExpectBadInput(" --checkpoint /nonexistent/ckpt --prompt-tokens 1,2", "/nonexistent/ckpt");
  ExpectBadInput(" --prompt-tokens 1,2", "--checkpoint");
  ExpectBadInput(" --checkpoint a --init-from b --prompt-tokens 1", "--init-from");
  ExpectBadInput(" --checkpoint a", "--prompt-tokens");
  ExpectBadInput(" --checkpoint a --prompt hello", "--tokenizer");
  ExpectBadInput(" --checkpoint a --prompt-tokens 1,x", "'x'");
  ExpectBadInput(" --checkpoint a --prompt-tokens 1 --temperature -1", "--temperature");
  ExpectBadInput(" --checkpoint a --prompt-tokens 1 --max-new-tokens 0", "--max-new-tokens");
  ExpectBadInput(" --checkpoint a --prompt-tokens 1 --top-k 5",  // greedy: it would do nothing
                 "--top-k 5 applies to sampling (--temperature above 0)");
  ExpectBadInput(absl::StrCat(" --init-from ", Quoted(scratch / "no_tokenizer"), " --prompt hi"),
                 "--prompt TEXT needs --tokenizer FILE");
  ExpectBadInput(" --checkpoint a --prompt-tokens 1 --stop-token 3,x", "--stop-token: 'x'");
  ExpectBadInput(" --checkpoint a --prompt-tokens 1 --stop-token -2", "--stop-token: '-2'");
  ExpectBadInput(" --checkpoint a --prompt hi --tokenizer /nonexistent/tokenizer.json",
                 "/nonexistent/tokenizer.json");
  const std::string unigram = scratch / "unigram.json";
  std::ofstream(unigram) << R"({"normalizer": null, "pre_tokenizer": {"type": "Metaspace",)"
                         << R"( "replacement": "_"}, "decoder": {"type": "Metaspace",)"
                         << R"( "replacement": "_"}, "model": {"type": "Unigram", "vocab": []}})";
  ExpectBadInput(absl::StrCat(" --checkpoint a --prompt hi --tokenizer ", unigram),
                 "the model type Unigram is not supported");

  // Tokens outside the vocabulary and too long a run, on a real checkpoint.
  const std::string checkpoint = scratch / "ckpt";
  const Outcome trained = RunCommand(TrainCommand(
      " --model gpt --layers 1 --hidden 8 --heads 2 --vocab 16", checkpoint));
  ASSERT_EQ(trained.exit_status, 0) << trained.output;
  ExpectBadInput(absl::StrCat(" --checkpoint ", checkpoint, " --prompt-tokens 1,16"),
                 "outside the model's vocabulary");
  ExpectBadInput(absl::StrCat(" --checkpoint ", checkpoint, " --prompt-tokens 1,2"
                              " --max-new-tokens 15"),
                 "16 positions");

  const Outcome help = RunCommand(absl::StrCat(g_tandem, " generate --help"));
  EXPECT_EQ(help.exit_status, 0) << help.output;
  EXPECT_NE(help.output.find("--prompt-tokens"), std::string::npos) << help.output;
  const Outcome listed = RunCommand(absl::StrCat(g_tandem, " --help"));
  EXPECT_NE(listed.output.find("generate"), std::string::npos) << listed.output;
}

}  // namespace
}  // namespace tandem::runtime::libtorch

int main(int argc, char** argv) {
  return tandem::testing::RunTestsWithProgramPath(argc, argv, "PATH_TO_TANDEM",
                                                  &tandem::runtime::libtorch::g_tandem);
}
