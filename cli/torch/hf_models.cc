#include "cli/torch/hf_models.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/torch/model_flags.h"
#include "cli/torch/model_registry.h"
#include "common/json_util.h"
#include "common/status.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/hf_weights.h"
#include "runtime/torch/llama.h"
#include "runtime/torch/token_data.h"

ABSL_FLAG(std::string, hf_config, "",
          "llama, gpt2: a Hugging Face config.json to take the model's sizes from (then "
          "--layers, --hidden, --heads, --kv-heads and --intermediate are not used, --vocab "
          "must be 0 or the file's vocab_size, and --seq-len, the tokens per sample, must not "
          "exceed its max_position_embeddings or n_positions); empty: sizes from those flags. "
          "checkpoint export: the config.json to write (it must describe the checkpoint's "
          "model); empty: the one tandem train recorded in the checkpoint (from its "
          "--hf-config or --init-from), else written from the checkpoint's model description");
ABSL_FLAG(std::string, init_from, "",
          "llama, gpt2: a Hugging Face model folder to start from (config.json with "
          "model.safetensors, or with shards and model.safetensors.index.json; llama takes "
          "model_type llama, mistral, qwen2, gemma, gemma2, mixtral, qwen2_moe, granite, "
          "granitemoe, phi3, olmo, olmoe, starcoder2, phi, gpt_neox, stablelm, gptj, cohere, "
          "glm, glm4, falcon, nemotron, qwen3, qwen3_moe, olmo2, gemma3_text and gemma3): "
          "the sizes come "
          "from its config.json, as with --hf-config (then left empty), and each rank reads the "
          "weights of the layers it builds, converted to float32; empty: random initial "
          "weights");
ABSL_FLAG(int, kv_heads, 0,
          "llama: key/value heads of grouped-query attention (must divide --heads); 0: "
          "as many as --heads");
ABSL_FLAG(int, intermediate, 0,
          "llama: SwiGLU units of each block's MLP; 0: 8/3 * --hidden rounded up to a "
          "multiple of 32");
ABSL_FLAG(int, experts, 0,
          "llama: a mixture of experts in each block instead of its MLP, as Mixtral's "
          "(the model is then transformers' MixtralForCausalLM): this many experts of "
          "--intermediate units each; 0: a dense MLP");
ABSL_FLAG(double, moe_aux_loss_coef, 0,
          "llama with experts (--experts, or a mixtral, qwen2_moe, granitemoe, olmoe or qwen3_moe "
          "config.json): "
          "each sparse "
          "block's load-balancing loss (transformers' load_balancing_loss_func of its router) "
          "times this joins the gradients, as Megatron-LM's --moe-aux-loss-coeff (which is this "
          "times experts per token); the reported loss stays the language model's; 0: none");
ABSL_FLAG(int, experts_per_token, 2,
          "llama with --experts: the experts each token is routed to (top-k of the router's "
          "softmax, renormalised)");

ABSL_DECLARE_FLAG(int, expert_parallel);  // a training flag (train_options.cc)
ABSL_DECLARE_FLAG(int, expert_parallel_replicas);  // a training flag (train_options.cc)

namespace tandem::cli {
namespace {

using runtime::libtorch::Gpt2Config;
using runtime::libtorch::LlamaConfig;

// Where the config.json comes from, for messages: "--hf-config PATH", "--init-from FOLDER".
std::string ConfigSource() {
  const std::string folder = absl::GetFlag(FLAGS_init_from);
  if (!folder.empty()) return absl::StrCat("--init-from ", folder);
  return absl::StrCat("--hf-config ", absl::GetFlag(FLAGS_hf_config));
}

// The config.json of --init-from's folder or --hf-config, or nothing when both are empty.
absl::StatusOr<std::optional<Json>> ConfigFileFromFlags() {
  const std::string folder = absl::GetFlag(FLAGS_init_from);
  std::string path = absl::GetFlag(FLAGS_hf_config);
  if (!folder.empty()) {
    if (!path.empty()) {
      return absl::InvalidArgumentError(
          "--init-from takes the model's config from its folder's config.json; drop "
          "--hf-config");
    }
    path = absl::StrCat(folder, "/config.json");
  }
  if (path.empty()) return std::nullopt;
  auto json = ReadJsonFile(path);
  if (!json.ok()) return Annotate(json.status(), folder.empty() ? "--hf-config" : "--init-from");
  return std::optional<Json>(*std::move(json));
}

}  // namespace

absl::StatusOr<std::optional<nlohmann::json>> HfConfigOfRun() { return ConfigFileFromFlags(); }

namespace {

// With --init-from, `spec` starts every layer it builds from the folder's weights (checked
// against `layout` now, from the folder's index and headers).
absl::Status InitializeFromFlags(runtime::libtorch::HfLayout layout,
                                 runtime::libtorch::ModelSpec* spec) {
  const std::string folder = absl::GetFlag(FLAGS_init_from);
  if (folder.empty()) return absl::OkStatus();
  auto weights = runtime::libtorch::HfWeights::Open(folder, std::move(layout));
  if (!weights.ok()) return Annotate(weights.status(), "--init-from");
  runtime::libtorch::InitializeFromHfWeights(*std::move(weights), spec);
  return absl::OkStatus();
}

absl::StatusOr<runtime::libtorch::GptAttention> AttentionFromFlags() {
  auto attention = runtime::libtorch::ParseGptAttention(absl::GetFlag(FLAGS_attention));
  if (!attention.ok()) return Annotate(attention.status(), "--attention");
  return *attention;
}

// What both decoder models make alike: the flags' data set, the spec (its layers read from
// --init-from's folder when given), the description and figures, and the activation estimate:
// float32, `block_floats_per_token` floats per token and block besides two [heads, S, S]
// attention tensors, three copies of the logits on the last stage.
absl::StatusOr<ModelAndData> DecoderModel(int64_t vocab, int64_t seq_len, int64_t heads,
                                          double block_floats_per_token,
                                          runtime::libtorch::ModelSpec spec,
                                          runtime::libtorch::HfLayout layout,
                                          std::string description, double flops_per_token,
                                          uint64_t seed) {
  ModelAndData result;
  TANDEM_ASSIGN_OR_RETURN(result.data, DataFromFlags(vocab, seq_len, seed));
  TANDEM_ASSIGN_OR_RETURN(result.validation, ValidationDataFromFlags(vocab, seq_len, seed));
  result.spec = std::move(spec);
  TANDEM_RETURN_IF_ERROR(InitializeFromFlags(std::move(layout), &result.spec));
  result.description = std::move(description);
  result.tokens_per_sample = seq_len;
  result.training_flops_per_token = flops_per_token;
  result.minimum_activation_bytes = [=](int64_t microbatch_size, int layers, bool last) {
    const double b = static_cast<double>(microbatch_size);
    const double s = static_cast<double>(seq_len);
    const double per_layer = 4 * b * s * (block_floats_per_token + 2.0 * heads * s);
    const double logits = 4 * 3 * b * s * vocab;
    return per_layer * layers + (last ? logits : 0);
  };
  return result;
}

absl::StatusOr<ModelAndData> MakeLlama(const ModelRequest& request) {
  LlamaConfig config;
  TANDEM_ASSIGN_OR_RETURN(std::optional<Json> file, ConfigFileFromFlags());
  if (file.has_value()) {
    auto parsed = runtime::libtorch::LlamaConfigFromJson(*file);
    if (!parsed.ok()) {
      return Annotate(parsed.status(), ConfigSource());
    }
    config = *parsed;
  } else {
    config.layers = absl::GetFlag(FLAGS_layers);
    config.hidden = absl::GetFlag(FLAGS_hidden);
    config.heads = absl::GetFlag(FLAGS_heads);
    const int kv_heads = absl::GetFlag(FLAGS_kv_heads);
    config.kv_heads = kv_heads == 0 ? config.heads : kv_heads;
    const int intermediate = absl::GetFlag(FLAGS_intermediate);
    constexpr int64_t kMultiple = 32;
    const int64_t swiglu = (8 * config.hidden + 2) / 3;  // 8/3 * hidden, rounded up
    config.intermediate =
        intermediate != 0 ? intermediate : (swiglu + kMultiple - 1) / kMultiple * kMultiple;
    config.max_position_embeddings = absl::GetFlag(FLAGS_seq_len);
    if (absl::GetFlag(FLAGS_experts) != 0) {
      config.model_type = "mixtral";
      config.experts = absl::GetFlag(FLAGS_experts);
      config.experts_per_token = absl::GetFlag(FLAGS_experts_per_token);
    }
  }
  config.seq_len = absl::GetFlag(FLAGS_seq_len);
  config.router_aux_loss_coef = absl::GetFlag(FLAGS_moe_aux_loss_coef);
  // The experts' flags named in their own words (the config's checks name its fields).
  if (!file.has_value() && config.Moe() &&
      (config.experts_per_token < 1 || config.experts_per_token > config.experts)) {
    return absl::InvalidArgumentError(absl::StrCat("--experts-per-token ", config.experts_per_token,
                                                   " must be between 1 and --experts (",
                                                   config.experts, ")"));
  }
  const int expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
  if (expert_parallel != 1 && !config.Moe()) {
    return absl::InvalidArgumentError(
        "--expert-parallel places experts: it needs a model with experts (--experts, or a "
        "mixtral, qwen2_moe, granitemoe, olmoe or qwen3_moe config.json)");
  }
  if (expert_parallel > 1 && config.experts % expert_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--expert-parallel ", expert_parallel,
                                                   " does not divide the model's ", config.experts,
                                                   " experts"));
  }
  const int expert_replicas = absl::GetFlag(FLAGS_expert_parallel_replicas);
  if (expert_replicas != 1 && !config.Moe()) {
    return absl::InvalidArgumentError(
        "--expert-parallel-replicas spreads experts: it needs a model with experts (--experts, "
        "or a mixtral, qwen2_moe, granitemoe, olmoe or qwen3_moe config.json)");
  }
  if (expert_replicas > 1 &&
      config.experts % (static_cast<int64_t>(std::max(1, expert_parallel)) * expert_replicas) !=
          0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-parallel-replicas ", expert_replicas,
        expert_parallel > 1 ? absl::StrCat(" x --expert-parallel ", expert_parallel) : "",
        " does not divide the model's ", config.experts, " experts"));
  }
  if (config.router_aux_loss_coef != 0 && !config.Moe()) {
    return absl::InvalidArgumentError(
        "--moe-aux-loss-coef needs a model with experts (--experts, or a mixtral, qwen2_moe, "
        "granitemoe, olmoe or qwen3_moe config.json)");
  }
  TANDEM_ASSIGN_OR_RETURN(config.attention, AttentionFromFlags());
  TANDEM_ASSIGN_OR_RETURN(config.vocab, VocabularyFromFlags(file.has_value() ? config.vocab : 0));
  if (absl::Status valid = runtime::libtorch::ValidateLlamaConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model flags: ", valid.message()));
  }
  // Per block: the block's input and its two normalised copies, the attention output, and
  // the gate, up and product of the MLP (Mixtral: of each expert a token reaches, with its
  // copy of the token, and the router's scores).
  const double h = static_cast<double>(config.hidden);
  const double units = static_cast<double>(config.intermediate);
  const double shared = static_cast<double>(config.shared_expert_intermediate);
  const double feedforward =
      config.Moe()
          ? std::max(3.0 * units, static_cast<double>(config.experts_per_token) *
                                          (3.0 * static_cast<double>(config.ExpertUnits()) + h) +
                                      static_cast<double>(config.experts) +
                                      (shared > 0 ? 3.0 * shared + 1.0 : 0.0))
          : 3.0 * units;
  return DecoderModel(config.vocab, config.seq_len, config.heads, 4.0 * h + feedforward,
                      runtime::libtorch::LlamaModelSpec(config),
                      runtime::libtorch::LlamaHfLayout(config),
                      runtime::libtorch::DescribeLlama(config),
                      runtime::libtorch::LlamaTrainingFlopsPerToken(config), request.seed);
}

absl::StatusOr<ModelAndData> MakeGpt2(const ModelRequest& request) {
  Gpt2Config config;
  TANDEM_ASSIGN_OR_RETURN(std::optional<Json> file, ConfigFileFromFlags());
  if (file.has_value()) {
    auto parsed = runtime::libtorch::Gpt2ConfigFromJson(*file);
    if (!parsed.ok()) {
      return Annotate(parsed.status(), ConfigSource());
    }
    config = *parsed;
  } else {
    config.layers = absl::GetFlag(FLAGS_layers);
    config.hidden = absl::GetFlag(FLAGS_hidden);
    config.heads = absl::GetFlag(FLAGS_heads);
    config.positions = absl::GetFlag(FLAGS_seq_len);
  }
  config.seq_len = absl::GetFlag(FLAGS_seq_len);
  if (absl::GetFlag(FLAGS_expert_parallel) != 1 ||
      absl::GetFlag(FLAGS_expert_parallel_replicas) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(absl::GetFlag(FLAGS_expert_parallel) != 1
                                                       ? "--expert-parallel places"
                                                       : "--expert-parallel-replicas spreads",
                                                   " experts: gpt2 has none"));
  }
  TANDEM_ASSIGN_OR_RETURN(config.attention, AttentionFromFlags());
  TANDEM_ASSIGN_OR_RETURN(config.vocab, VocabularyFromFlags(file.has_value() ? config.vocab : 0));
  if (absl::Status valid = runtime::libtorch::ValidateGpt2Config(config); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model flags: ", valid.message()));
  }
  // As the GPT's: [b, s, h] tensors and the MLP's units per block.
  return DecoderModel(config.vocab, config.seq_len, config.heads,
                      4.0 * config.hidden + 1.0 * config.Inner(),
                      runtime::libtorch::Gpt2ModelSpec(config),
                      runtime::libtorch::Gpt2HfLayout(config),
                      runtime::libtorch::DescribeGpt2(config),
                      runtime::libtorch::Gpt2TrainingFlopsPerToken(config), request.seed);
}

}  // namespace

void RegisterHuggingFaceModels() {
  static const bool registered = [] {
    const absl::Status llama = RegisterModel(
        {.name = "llama",
         .summary = "Llama 3 as transformers' LlamaForCausalLM (RMSNorm, rotary positions, "
                    "grouped-query attention, SwiGLU; Mistral, Qwen2, Gemma, Gemma 2, Granite, "
                    "Phi-3, OLMo, StarCoder 2, Phi, GPT-NeoX, StableLM, GPT-J, Command R, GLM-4, "
                    "GLM-4-0414, Falcon, Nemotron, Qwen3, OLMo 2, Gemma 3, "
                    "Mixtral, Qwen2-MoE, Granite-MoE, OLMoE and Qwen3-MoE from their config.json, "
                    "Mixtral's experts from --experts)",
         .flags = {"hf_config", "init_from", "layers", "hidden", "heads", "kv_heads",
                   "intermediate", "experts", "experts_per_token", "moe_aux_loss_coef", "seq_len",
                   "vocab", "data", "data_format", "valid_data", "attention"},
         .make = MakeLlama});
    const absl::Status gpt2 = RegisterModel(
        {.name = "gpt2",
         .summary = "GPT-2 as transformers' GPT2LMHeadModel (learned positions, LM head tied "
                    "to the token embedding)",
         .flags = {"hf_config", "init_from", "layers", "hidden", "heads", "seq_len", "vocab",
                   "data", "data_format", "valid_data", "attention"},
         .make = MakeGpt2});
    return llama.ok() && gpt2.ok();
  }();
  (void)registered;
}

}  // namespace tandem::cli
