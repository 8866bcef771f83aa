#include "runtime/torch/hf_weights.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "formats/safetensors.h"
#include "runtime/checkpoint.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/llama.h"
#include "runtime/torch/model.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr char kParameterPrefix[] = "param:";  // stage_checkpoint.cc's parameter tensors
constexpr char kConfigFileName[] = "config.json";
// What transformers' configs default to and what `tandem train` uses without --hf-config.
constexpr double kDefaultNormEpsilon = 1e-5;
constexpr double kDefaultInitializerRange = 0.02;
constexpr size_t kNamesShown = 4;  // keys listed in one message

// "a, b, c, d and 3 more".
std::string ListSome(const std::vector<std::string>& names) {
  const size_t shown = std::min(names.size(), kNamesShown);
  std::string text = absl::StrJoin(names.begin(), names.begin() + shown, ", ");
  if (names.size() > shown) absl::StrAppend(&text, " and ", names.size() - shown, " more");
  return text;
}

void AddTensor(HfLayout& layout, std::string key, std::string name,
               std::vector<int64_t> shape) {
  HfTensor& tensor = layout.tensors.emplace_back();
  tensor.key = std::move(key);
  tensor.name = std::move(name);
  tensor.shape = std::move(shape);
}

// The copies of `tied`: copy -> owner.
std::map<std::string, std::string> CopiesOf(const TiedWeights& tied) {
  std::map<std::string, std::string> copies;
  for (const TiedParameter& pair : tied.parameters) copies[pair.copy] = pair.owner;
  return copies;
}

// The key the mapping gives `name` (always one: the layouts below list the names the mappings
// know); `name` itself otherwise, which then shows as missing from any folder.
std::string KeyOf(const absl::StatusOr<std::string>& key, const std::string& name) {
  return key.ok() ? *key : name;
}

}  // namespace

const HfTensor* HfLayout::Find(absl::string_view name) const {
  auto copy = tied_copies.find(std::string(name));
  const std::string wanted = copy != tied_copies.end() ? copy->second : std::string(name);
  for (const HfTensor& tensor : tensors) {
    if (tensor.name == wanted) return &tensor;
  }
  return nullptr;
}

HfLayout LlamaHfLayout(const LlamaConfig& config) {
  HfLayout layout;
  layout.model = DescribeLlama(config);
  const int64_t h = config.hidden;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    AddTensor(layout, KeyOf(LlamaHfName(config, name), name), name, std::move(shape));
    if (const std::optional<LlamaFusedRows> rows = LlamaHfRows(config, name)) {
      layout.tensors.back().first_row = rows->first_row;
      layout.tensors.back().key_shape = rows->key_shape;
    }
  };
  add("layers.0.embed_tokens.weight", {config.vocab, h});
  for (int64_t block = 0; block < config.layers; ++block) {
    for (auto& [name, shape] : LlamaBlockParameters(config, block)) {
      add(absl::StrCat("layers.", block + 1, ".", name), std::move(shape));
    }
  }
  const std::string head = absl::StrCat("layers.", config.layers + 1, ".");
  if (!config.LayerNormWithoutParameters()) add(head + "norm.weight", {h});
  if (config.LayerNormWithBias()) add(head + "norm.bias", {h});
  layout.tied_copies = CopiesOf(LlamaTiedWeights(config));
  if (layout.tied_copies.count(head + "lm_head.weight") == 0) {
    add(head + "lm_head.weight", {config.vocab, h});
  }
  // Phi's LM head bias is its own even where the weight is tied.
  if (config.HeadBias()) add(head + "lm_head.bias", {config.vocab});
  layout.tandem_name = [config](absl::string_view key) { return LlamaTandemName(config, key); };
  if (config.Gemma3Multimodal()) {
    // Gemma 3's vision tower and projector: no part of the language model.
    layout.ignored = [](absl::string_view key) {
      return absl::StartsWith(key, "vision_tower.") ||
             absl::StartsWith(key, "multi_modal_projector.");
    };
  }
  if (config.NeoX() || config.GptJ()) {
    // The buffers older GPT-NeoX and GPT-J checkpoints (Pythia's, GPT-J-6B's) hold in each
    // block: the causal mask, its fill value and (GPT-NeoX's) the rotary frequencies
    // (transformers ignores them on load).
    const bool neox = config.NeoX();
    layout.ignored = [neox](absl::string_view key) {
      if (!absl::ConsumePrefix(&key, neox ? "gpt_neox.layers." : "transformer.h.")) return false;
      const size_t dot = key.find('.');
      int block = 0;
      if (dot == absl::string_view::npos || !absl::SimpleAtoi(key.substr(0, dot), &block)) {
        return false;
      }
      const absl::string_view rest = key.substr(dot + 1);
      if (!neox) return rest == "attn.bias" || rest == "attn.masked_bias";
      return rest == "attention.bias" || rest == "attention.masked_bias" ||
             rest == "attention.rotary_emb.inv_freq";
    };
  }
  return layout;
}

HfLayout Gpt2HfLayout(const Gpt2Config& config) {
  HfLayout layout;
  layout.model = DescribeGpt2(config);
  const int64_t h = config.hidden, inner = config.Inner();
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    AddTensor(layout, KeyOf(Gpt2HfName(config, name), name), name, std::move(shape));
  };
  add("layers.0.wte.weight", {config.vocab, h});
  add("layers.0.wpe.weight", {config.positions, h});
  for (int64_t block = 1; block <= config.layers; ++block) {
    const std::string p = absl::StrCat("layers.", block, ".");
    add(p + "ln_1.weight", {h});
    add(p + "ln_1.bias", {h});
    // Conv1D: weight [in, out].
    add(p + "attn.c_attn.weight", {h, 3 * h});
    add(p + "attn.c_attn.bias", {3 * h});
    add(p + "attn.c_proj.weight", {h, h});
    add(p + "attn.c_proj.bias", {h});
    add(p + "ln_2.weight", {h});
    add(p + "ln_2.bias", {h});
    add(p + "mlp.c_fc.weight", {h, inner});
    add(p + "mlp.c_fc.bias", {inner});
    add(p + "mlp.c_proj.weight", {inner, h});
    add(p + "mlp.c_proj.bias", {h});
  }
  const std::string head = absl::StrCat("layers.", config.layers + 1, ".");
  add(head + "ln_f.weight", {h});
  add(head + "ln_f.bias", {h});
  layout.tied_copies = CopiesOf(Gpt2TiedWeights(config));
  if (layout.tied_copies.count(head + "lm_head.weight") == 0) {
    add(head + "lm_head.weight", {config.vocab, h});
  }
  layout.tandem_name = [config](absl::string_view key) { return Gpt2TandemName(config, key); };
  // The causal-mask buffers older GPT-2 checkpoints hold (transformers ignores them on load).
  layout.ignored = [](absl::string_view key) {
    absl::ConsumePrefix(&key, "transformer.");
    if (!absl::ConsumePrefix(&key, "h.")) return false;
    const size_t dot = key.find('.');
    int block = 0;
    if (dot == absl::string_view::npos || !absl::SimpleAtoi(key.substr(0, dot), &block)) {
      return false;
    }
    const absl::string_view rest = key.substr(dot + 1);
    return rest == "attn.bias" || rest == "attn.masked_bias";
  };
  return layout;
}

// ---- In -------------------------------------------------------------------------------------

HfWeights::~HfWeights() = default;

absl::StatusOr<std::shared_ptr<const HfWeights>> HfWeights::Open(const std::string& folder,
                                                                 HfLayout layout) {
  std::shared_ptr<HfWeights> weights(new HfWeights());
  weights->folder_ = folder;
  TANDEM_ASSIGN_OR_RETURN(weights->files_, formats::SafetensorsFolder::Open(folder));
  const std::string& model = layout.model;
  // The key set, from the index (or the single file's header) alone: the folder's key of each
  // of the layout's (the same, or another spelling of it).
  std::vector<std::string> extra, tied_extra;
  std::map<std::string, std::string> folder_key;  // layout key -> the folder's
  for (const std::string& key : weights->files_->TensorNames()) {
    if (layout.ignored && layout.ignored(key)) continue;
    absl::StatusOr<std::string> name = layout.tandem_name(key);
    const HfTensor* tensor = name.ok() ? layout.Find(*name) : nullptr;
    if (!name.ok() || tensor == nullptr) {
      extra.push_back(absl::StrCat("'", key, "'"));
      continue;
    }
    if (layout.tied_copies.count(*name) > 0) {
      tied_extra.push_back(absl::StrCat("'", key, "'"));
      continue;
    }
    auto [it, added] = folder_key.emplace(tensor->key, key);
    if (!added) {
      return absl::InvalidArgumentError(absl::StrCat(folder, ": tensors '", it->second, "' and '",
                                                     key, "' are both parameter '", *name,
                                                     "' of ", model));
    }
  }
  if (!tied_extra.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        folder, ": holds ", ListSome(tied_extra), ", which ", model,
        " does not use: its config ties the LM head to the token embedding "
        "(tie_word_embeddings), so the embedding's tensor initialises both"));
  }
  if (!extra.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        folder, ": holds ", extra.size(), " tensor(s) that ", model, " does not use: ",
        ListSome(extra), " (does config.json describe these weights?)"));
  }
  std::vector<std::string> missing;
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const HfTensor& tensor = layout.tensors[t];
    auto found = folder_key.find(tensor.key);
    if (found != folder_key.end()) {
      weights->key_of_.emplace(tensor.name, Source{found->second, t});
    } else if (tensor.first_row == 0) {  // a fused key once, for its first part
      missing.push_back(absl::StrCat("'", tensor.key, "'"));
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(folder, ": ", missing.size(),
                                                   " tensor(s) of ", model, " missing: ",
                                                   ListSome(missing)));
  }
  // Shapes and dtypes, from the shards' headers (a shard is mapped, its data not read).
  for (const HfTensor& tensor : layout.tensors) {
    const std::string& key = weights->key_of_.at(tensor.name).key;
    TANDEM_ASSIGN_OR_RETURN(const formats::TensorInfo info, weights->files_->Info(key));
    if (info.shape != tensor.KeyShape()) {
      return absl::InvalidArgumentError(
          absl::StrCat(folder, ": tensor '", key, "' has shape ", ShapeString(info.shape), ", ",
                       model, " needs ", ShapeString(tensor.KeyShape()),
                       " (does config.json describe these weights?)"));
    }
    if (!formats::ConvertsToFloat32(info.data_type)) {
      return absl::InvalidArgumentError(absl::StrCat(
          folder, ": tensor '", key, "' is ", formats::DataTypeName(info.data_type),
          "; tandem reads F32, BF16, F16 and F64 weights"));
    }
  }
  weights->layout_ = std::move(layout);
  return std::shared_ptr<const HfWeights>(std::move(weights));
}

absl::Status HfWeights::ReadParameter(absl::string_view name, float* out, int64_t count) const {
  auto copy = layout_.tied_copies.find(std::string(name));
  const std::string owner = copy != layout_.tied_copies.end() ? copy->second : std::string(name);
  auto source = key_of_.find(owner);
  if (source == key_of_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(folder_, ": '", name, "' is not a parameter of ",
                                                   layout_.model));
  }
  const std::string& key = source->second.key;
  {
    absl::MutexLock lock(&mutex_);
    read_.insert(key);
  }
  const HfTensor* tensor = &layout_.tensors[source->second.tensor];
  if (tensor->key_shape.empty()) return files_->ReadAsFloat32(key, out, count);
  // Rows of a fused tensor. A 3-dimensional one ([experts, rows, columns]) is read an expert at
  // a time: the part's rows lie within one.
  const std::vector<int64_t>& whole = tensor->key_shape;
  const int64_t rows = tensor->shape[0];
  if (whole.size() == 2) {
    return files_->ReadSliceAsFloat32(
        key, formats::TensorSlice{0, tensor->first_row, tensor->first_row + rows}, out, count);
  }
  const int64_t per_expert = whole[1], expert = tensor->first_row / per_expert;
  const int64_t first = tensor->first_row % per_expert;
  if (whole.size() != 3 || first + rows > per_expert || count != rows * whole[2]) {
    return absl::InternalError(absl::StrCat(folder_, ": parameter '", name, "' is no rows of ", key,
                                            " ", ShapeString(whole)));
  }
  const formats::TensorSlice one{0, expert, expert + 1};
  if (rows == per_expert) return files_->ReadSliceAsFloat32(key, one, out, count);
  std::vector<float> staged(static_cast<size_t>(per_expert * whole[2]));
  TANDEM_RETURN_IF_ERROR(
      files_->ReadSliceAsFloat32(key, one, staged.data(), static_cast<int64_t>(staged.size())));
  std::copy_n(staged.begin() + first * whole[2], count, out);
  return absl::OkStatus();
}

std::vector<std::string> HfWeights::KeysRead() const {
  absl::MutexLock lock(&mutex_);
  return std::vector<std::string>(read_.begin(), read_.end());
}

namespace {

absl::Status LoadLayer(const HfWeights& weights, const torch::nn::AnyModule& module, int layer) {
  torch::NoGradGuard no_grad;
  for (auto& [name, parameter] : NamedLayerParameters({module}, layer)) {
    const HfTensor* tensor = weights.layout().Find(name);
    if (tensor == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights.folder(), ": parameter '", name, "' of layer ", layer, " has no tensor in ",
          weights.layout().model, "'s checkpoint layout"));
    }
    if (parameter.sizes().vec() != tensor->shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights.folder(), ": tensor '", tensor->key, "' is ", ShapeString(tensor->shape),
          ", parameter '", name, "' ", ShapeString(parameter.sizes().vec())));
    }
    if (parameter.is_contiguous() && parameter.scalar_type() == torch::kFloat &&
        parameter.device().is_cpu()) {
      TANDEM_RETURN_IF_ERROR(
          weights.ReadParameter(name, parameter.data_ptr<float>(), parameter.numel()));
      continue;
    }
    torch::Tensor staged = torch::empty(tensor->shape, torch::kFloat);
    TANDEM_RETURN_IF_ERROR(weights.ReadParameter(name, staged.data_ptr<float>(), staged.numel()));
    parameter.copy_(staged);
  }
  return absl::OkStatus();
}

}  // namespace

void InitializeFromHfWeights(std::shared_ptr<const HfWeights> weights, ModelSpec* spec) {
  spec->build_layer = [build = spec->build_layer, weights = std::move(weights)](int layer) {
    torch::nn::AnyModule module = build(layer);
    const absl::Status loaded = LoadLayer(*weights, module, layer);
    if (!loaded.ok()) throw std::invalid_argument(std::string(loaded.message()));
    return module;
  };
}

// ---- Model descriptions ---------------------------------------------------------------------

namespace {

// The description's tokens after the family name, without " seed=N"; InvalidArgument when it
// is not of `family`.
absl::StatusOr<std::vector<std::string>> DescriptionTokens(absl::string_view description,
                                                           absl::string_view family) {
  std::vector<std::string> tokens = absl::StrSplit(description, ' ', absl::SkipEmpty());
  if (tokens.empty() || tokens[0] != family) {
    return absl::InvalidArgumentError(
        absl::StrCat("model description '", description, "' is not of ", family));
  }
  tokens.erase(tokens.begin());
  std::vector<std::string> kept;
  for (std::string& token : tokens) {
    if (!absl::StartsWith(token, "seed=")) kept.push_back(std::move(token));
  }
  return kept;
}

absl::Status Unreadable(absl::string_view description, absl::string_view token) {
  return absl::InvalidArgumentError(absl::StrCat("cannot read '", token,
                                                 "' of the model description '", description,
                                                 "'"));
}

// The description `written` read back must give `description` again: nothing was dropped.
absl::Status CheckReadBack(absl::string_view description, const std::string& written) {
  if (written == WithoutSeed(description)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the model description '",
                                                 WithoutSeed(description), "' reads back as '",
                                                 written, "'"));
}

// " dense=0,5": block indices.
bool ReadBlocks(const std::string& value, std::vector<int64_t>* blocks) {
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    int64_t block = 0;
    if (!absl::SimpleAtoi(part, &block)) return false;
    blocks->push_back(block);
  }
  return true;
}

// " experts=8/2": experts and experts_per_token.
bool ReadExperts(const std::string& value, LlamaConfig* config) {
  const std::vector<std::string> parts = absl::StrSplit(value, '/');
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], &config->experts) &&
         absl::SimpleAtoi(parts[1], &config->experts_per_token);
}

}  // namespace

absl::StatusOr<LlamaConfig> LlamaConfigFromDescription(absl::string_view description) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                          DescriptionTokens(description, "llama"));
  LlamaConfig config;
  config.rms_norm_eps = kDefaultNormEpsilon;
  config.init_std = kDefaultInitializerRange;
  config.head_dim = 0;
  config.rope_scaling.reset();
  // "key=value" tokens by their key, and the words that set a flag.
  const std::map<std::string, int64_t*> integers = {
      {"L", &config.layers},
      {"H", &config.hidden},
      {"A", &config.heads},
      {"KV", &config.kv_heads},
      {"I", &config.intermediate},
      {"S", &config.seq_len},
      {"V", &config.vocab},
      {"hd", &config.head_dim},
      {"window", &config.sliding_window},
      {"expert-units", &config.expert_intermediate},
      {"shared-units", &config.shared_expert_intermediate},
      {"sparse-step", &config.sparse_step},
      {"window-pattern", &config.sliding_window_pattern},
      {"rotary-dims", &config.rotary_dims}};
  const std::map<std::string, double*> numbers = {
      {"rope", &config.rope_theta},
      {"local-rope", &config.rope_local_theta},
      {"qscale", &config.query_pre_attn_scalar},
      {"attn-softcap", &config.attn_logit_softcapping},
      {"final-softcap", &config.final_logit_softcapping},
      {"aux-loss", &config.router_aux_loss_coef},
      {"embedding-mult", &config.embedding_multiplier},
      {"residual-mult", &config.residual_multiplier},
      {"attention-mult", &config.attention_multiplier},
      {"logits-scaling", &config.logits_scaling},
      {"clip-qkv", &config.clip_qkv},
      {"logit-scale", &config.logit_scale},
      {"rotary", &config.partial_rotary_factor}};
  const std::map<std::string, std::pair<bool*, bool>> words = {
      {"tied", {&config.tie_word_embeddings, true}},
      {"attention-bias", {&config.attention_bias, true}},
      {"qkv-bias", {&config.qkv_bias, true}},
      {"mlp-bias", {&config.mlp_bias, true}},
      {"parallel-residual", {&config.parallel_residual, true}},
      {"branch-norms", {&config.branch_norms, true}},
      {"qk-norm", {&config.head_qk_norms, true}},
      {"topk=raw", {&config.normalize_top_k, false}}};
  std::set<std::string> seen;
  for (const std::string& token : tokens) {
    const size_t equals = token.find('=');
    const std::string key = token.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : token.substr(equals + 1);
    seen.insert(key);
    bool ok = true;
    if (auto word = words.find(token); word != words.end()) {
      *word->second.first = word->second.second;
    } else if (equals == std::string::npos) {
      ok = false;
    } else if (auto integer = integers.find(key); integer != integers.end()) {
      ok = absl::SimpleAtoi(value, integer->second);
    } else if (auto number = numbers.find(key); number != numbers.end()) {
      ok = absl::SimpleAtod(value, number->second);
    } else if (key == "llama3-scaling") {
      const std::vector<std::string> parts = absl::StrSplit(value, '/');
      LlamaRopeScaling scaling;
      ok = parts.size() == 4 && absl::SimpleAtod(parts[0], &scaling.factor) &&
           absl::SimpleAtod(parts[1], &scaling.low_freq_factor) &&
           absl::SimpleAtod(parts[2], &scaling.high_freq_factor) &&
           absl::SimpleAtoi(parts[3], &scaling.original_max_position_embeddings);
      config.rope_scaling = scaling;
    } else if (key == "linear-scaling") {
      LlamaRopeScaling scaling;
      scaling.type = "linear";
      ok = absl::SimpleAtod(value, &scaling.factor);
      config.rope_scaling = scaling;
    } else if (key == "yarn-scaling") {
      const std::vector<std::string> parts = absl::StrSplit(value, '/');
      LlamaRopeScaling scaling;
      scaling.type = "yarn";
      ok = parts.size() == 5 && absl::SimpleAtod(parts[0], &scaling.factor) &&
           absl::SimpleAtoi(parts[1], &scaling.original_max_position_embeddings) &&
           absl::SimpleAtod(parts[2], &scaling.beta_fast) &&
           absl::SimpleAtod(parts[3], &scaling.beta_slow) &&
           absl::SimpleAtod(parts[4], &scaling.attention_factor);
      config.rope_scaling = scaling;
    } else if (key == "longrope") {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model description '", description,
          "' does not hold the LongRoPE factors of its rotary embeddings (longrope=)"));
    } else if (key == "family") {
      config.model_type = value;
    } else if (key == "act") {
      config.hidden_act = value;
    } else if (key == "experts") {
      ok = ReadExperts(value, &config);
    } else if (key == "dense") {
      ok = ReadBlocks(value, &config.dense_blocks);
    } else {
      ok = false;
    }
    if (!ok) return Unreadable(description, token);
  }
  for (const char* required : {"L", "H", "A", "KV", "I", "S", "V"}) {
    if (seen.count(required) == 0) return Unreadable(description, absl::StrCat(required, "="));
  }
  // As `tandem train` sets it without --hf-config.
  config.max_position_embeddings = config.seq_len;
  TANDEM_RETURN_IF_ERROR(CheckReadBack(description, DescribeLlama(config)));
  TANDEM_RETURN_IF_ERROR(ValidateLlamaConfig(config));
  return config;
}

absl::StatusOr<Gpt2Config> Gpt2ConfigFromDescription(absl::string_view description) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                          DescriptionTokens(description, "gpt2"));
  Gpt2Config config;
  config.layer_norm_epsilon = kDefaultNormEpsilon;
  config.init_std = kDefaultInitializerRange;
  std::set<std::string> seen;
  for (const std::string& token : tokens) {
    const size_t equals = token.find('=');
    const std::string key = token.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : token.substr(equals + 1);
    seen.insert(key);
    bool ok = true;
    if (key == "L") ok = absl::SimpleAtoi(value, &config.layers);
    else if (key == "H") ok = absl::SimpleAtoi(value, &config.hidden);
    else if (key == "A") ok = absl::SimpleAtoi(value, &config.heads);
    else if (key == "S") ok = absl::SimpleAtoi(value, &config.seq_len);
    else if (key == "V") ok = absl::SimpleAtoi(value, &config.vocab);
    else if (key == "P") ok = absl::SimpleAtoi(value, &config.positions);
    else if (key == "I") ok = absl::SimpleAtoi(value, &config.inner);
    else if (key == "act") config.activation = value;
    else if (token == "untied") config.tie_word_embeddings = false;
    else if (token == "no-scale") config.scale_attn_weights = false;
    else if (token == "scale-by-layer") config.scale_attn_by_inverse_layer_idx = true;
    else ok = false;
    if (!ok) return Unreadable(description, token);
  }
  for (const char* required : {"L", "H", "A", "S", "V", "P"}) {
    if (seen.count(required) == 0) return Unreadable(description, absl::StrCat(required, "="));
  }
  TANDEM_RETURN_IF_ERROR(CheckReadBack(description, DescribeGpt2(config)));
  TANDEM_RETURN_IF_ERROR(ValidateGpt2Config(config));
  return config;
}

// ---- Out ------------------------------------------------------------------------------------

namespace {

// Removes `fields` from the config `json` (those a family's config class does not have).
void EraseFields(Json& json, std::initializer_list<const char*> fields) {
  for (const char* field : fields) json.erase(field);
}

// GPTJConfig's fields: its own names for the sizes (n_embd, n_layer, n_head, n_positions,
// n_inner), rotary_dim, activation_function, layer_norm_epsilon, no dropout.
Json GptJConfigJson(const LlamaConfig& config) {
  return {{"architectures", {"GPTJForCausalLM"}},
          {"model_type", "gptj"},
          {"vocab_size", config.vocab},
          {"n_embd", config.hidden},
          {"n_layer", config.layers},
          {"n_head", config.heads},
          {"n_positions", config.max_position_embeddings},
          {"n_inner", config.intermediate},
          {"rotary_dim", config.RotaryDim()},
          {"activation_function", config.hidden_act},
          {"layer_norm_epsilon", config.rms_norm_eps},
          {"tie_word_embeddings", config.tie_word_embeddings},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", config.init_std},
          {"torch_dtype", "float32"}};
}

// A rope_scaling as transformers writes it (yarn's factor implied by the original context,
// which it reads over the factor given).
Json RopeScalingJson(const LlamaConfig& config) {
  const LlamaRopeScaling& s = *config.rope_scaling;
  if (s.type == "linear") return {{"rope_type", "linear"}, {"factor", s.factor}};
  if (s.type == "yarn") {
    Json json = {{"rope_type", "yarn"},
                 {"factor", s.factor},
                 {"beta_fast", s.beta_fast},
                 {"beta_slow", s.beta_slow},
                 {"attention_factor", s.attention_factor}};
    // An original context of max_position_embeddings is the default, under which transformers
    // takes the factor as given.
    if (s.original_max_position_embeddings != config.max_position_embeddings) {
      json["original_max_position_embeddings"] = s.original_max_position_embeddings;
    }
    return json;
  }
  return {{"rope_type", "llama3"},
          {"factor", s.factor},
          {"low_freq_factor", s.low_freq_factor},
          {"high_freq_factor", s.high_freq_factor},
          {"original_max_position_embeddings", s.original_max_position_embeddings}};
}

// FalconConfig: the layout as FalconDecoderLayer reads it (multi_query for one key/value head,
// new_decoder_architecture for groups or a norm per branch), one `bias`, no alibi, no
// dropout.
Json FalconConfigJson(const LlamaConfig& config) {
  const bool grouped =
      config.branch_norms || (config.kv_heads != 1 && config.kv_heads != config.heads);
  Json json = {
      {"architectures", {"FalconForCausalLM"}},
      {"model_type", "falcon"},
      {"vocab_size", config.vocab},
      {"hidden_size", config.hidden},
      {"ffn_hidden_size", config.intermediate},
      {"num_hidden_layers", config.layers},
      {"num_attention_heads", config.heads},
      {"num_kv_heads", config.kv_heads},
      {"new_decoder_architecture", grouped},
      {"multi_query", config.kv_heads == 1},
      {"parallel_attn", config.parallel_residual},
      {"num_ln_in_parallel_attn", grouped ? Json(config.branch_norms ? 2 : 1) : Json(nullptr)},
      {"bias", config.attention_bias},
      {"alibi", false},
      {"activation", config.hidden_act},
      {"max_position_embeddings", config.max_position_embeddings},
      {"layer_norm_epsilon", config.rms_norm_eps},
      {"rope_theta", config.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"hidden_dropout", 0.0},
      {"attention_dropout", 0.0},
      {"initializer_range", config.init_std},
      {"torch_dtype", "float32"}};
  if (config.rope_scaling) json["rope_scaling"] = RopeScalingJson(config);
  if (config.pad_token_id) json["pad_token_id"] = *config.pad_token_id;
  return json;
}

// Qwen2-MoE's and Qwen3-MoE's expert fields (without Qwen2-MoE's shared expert), no
// load-balancing loss (tandem trains without it).
void WriteQwenExperts(const LlamaConfig& config, Json& json) {
  json["num_experts"] = config.experts;
  json["num_experts_per_tok"] = config.experts_per_token;
  json["moe_intermediate_size"] = config.expert_intermediate;
  json["norm_topk_prob"] = config.normalize_top_k;
  json["decoder_sparse_step"] = config.sparse_step;
  json["mlp_only_layers"] = config.dense_blocks;
  json["output_router_logits"] = false;
}

Json LlamaConfigJson(const LlamaConfig& config) {
  if (config.GptJ()) return GptJConfigJson(config);
  if (config.Falcon()) return FalconConfigJson(config);
  const std::string architecture = config.model_type == "mistral"      ? "MistralForCausalLM"
                                   : config.model_type == "qwen2"      ? "Qwen2ForCausalLM"
                                   : config.model_type == "gemma"      ? "GemmaForCausalLM"
                                   : config.model_type == "gemma2"     ? "Gemma2ForCausalLM"
                                   : config.model_type == "mixtral"    ? "MixtralForCausalLM"
                                   : config.model_type == "qwen2_moe"  ? "Qwen2MoeForCausalLM"
                                   : config.model_type == "granite"    ? "GraniteForCausalLM"
                                   : config.model_type == "granitemoe" ? "GraniteMoeForCausalLM"
                                   : config.model_type == "phi3"       ? "Phi3ForCausalLM"
                                   : config.model_type == "olmo"       ? "OlmoForCausalLM"
                                   : config.model_type == "olmoe"      ? "OlmoeForCausalLM"
                                   : config.model_type == "starcoder2" ? "Starcoder2ForCausalLM"
                                   : config.model_type == "phi"        ? "PhiForCausalLM"
                                   : config.model_type == "gpt_neox"   ? "GPTNeoXForCausalLM"
                                   : config.model_type == "stablelm"   ? "StableLmForCausalLM"
                                   : config.model_type == "cohere"     ? "CohereForCausalLM"
                                   : config.model_type == "glm"        ? "GlmForCausalLM"
                                   : config.model_type == "nemotron"   ? "NemotronForCausalLM"
                                   : config.model_type == "qwen3"      ? "Qwen3ForCausalLM"
                                   : config.model_type == "qwen3_moe"  ? "Qwen3MoeForCausalLM"
                                   : config.model_type == "olmo2"      ? "Olmo2ForCausalLM"
                                   : config.Gemma3()                   ? "Gemma3ForCausalLM"
                                   : config.Glm4()                     ? "Glm4ForCausalLM"
                                                                       : "LlamaForCausalLM";
  Json json = {{"architectures", {architecture}},
               {"model_type", config.model_type},
               {"vocab_size", config.vocab},
               {"hidden_size", config.hidden},
               {"intermediate_size", config.intermediate},
               {"num_hidden_layers", config.layers},
               {"num_attention_heads", config.heads},
               {"num_key_value_heads", config.kv_heads},
               {"head_dim", config.HeadDim()},
               {"hidden_act", "silu"},
               {"max_position_embeddings", config.max_position_embeddings},
               {"rms_norm_eps", config.rms_norm_eps},
               {"rope_theta", config.rope_theta},
               {"rope_scaling", nullptr},
               {"tie_word_embeddings", config.tie_word_embeddings},
               {"attention_bias", config.attention_bias},
               {"mlp_bias", config.mlp_bias},
               {"attention_dropout", 0.0},
               {"initializer_range", config.init_std},
               {"torch_dtype", "float32"}};
  if (config.rope_scaling) json["rope_scaling"] = RopeScalingJson(config);
  if (config.pad_token_id) json["pad_token_id"] = *config.pad_token_id;
  const Json window = config.sliding_window > 0 ? Json(config.sliding_window) : Json(nullptr);
  if (config.model_type == "mistral") {
    // MistralConfig has no biases.
    EraseFields(json, {"attention_bias", "mlp_bias"});
    json["sliding_window"] = window;
  } else if (config.model_type == "mixtral") {
    // MixtralConfig: no biases, head_dim hidden / heads, no load-balancing loss (tandem trains
    // without it).
    EraseFields(json, {"attention_bias", "mlp_bias", "head_dim"});
    json["sliding_window"] = window;
    json["num_local_experts"] = config.experts;
    json["num_experts_per_tok"] = config.experts_per_token;
    json["output_router_logits"] = false;
    json["router_jitter_noise"] = 0.0;
  } else if (config.model_type == "qwen2" || config.model_type == "qwen2_moe") {
    // Qwen2Config and Qwen2MoeConfig: q/k/v biases always, head_dim hidden / heads.
    EraseFields(json, {"attention_bias", "mlp_bias", "head_dim"});
    json["use_sliding_window"] = config.sliding_window > 0;
    json["sliding_window"] = window;
    if (config.model_type == "qwen2_moe") {
      WriteQwenExperts(config, json);
      json["shared_expert_intermediate_size"] = config.shared_expert_intermediate;
    }
  } else if (config.Olmo2()) {
    // Olmo2Config: attention_bias for every attention product, no MLP biases, head_dim only
    // where it is not hidden / heads (kept as an extra field its attention reads), and an
    // absent pad_token_id would read as 1.
    json.erase("mlp_bias");
    if (config.head_dim == 0) json.erase("head_dim");
    json["pad_token_id"] = config.pad_token_id ? Json(*config.pad_token_id) : Json(nullptr);
  } else if (config.Qwen3()) {
    // Qwen3Config and Qwen3MoeConfig: attention_bias for every attention product, no MLP
    // biases, head_dim (Qwen3MoeConfig keeps it as an extra field its attention reads), the
    // window with use_sliding_window; Qwen3-MoE's experts (no shared expert, no load-balancing
    // loss: tandem trains without it).
    json.erase("mlp_bias");
    json["use_sliding_window"] = config.sliding_window > 0;
    json["sliding_window"] = window;
    if (config.model_type == "qwen3_moe") {
      // Absent, Qwen3-MoE's attention takes hidden / heads (as the model does without one).
      if (config.head_dim == 0) json.erase("head_dim");
      WriteQwenExperts(config, json);
    }
  } else if (config.Granite()) {
    // GraniteConfig and GraniteMoeConfig: head_dim hidden / heads, and the multipliers;
    // GraniteMoE's experts (no MLP biases, no load-balancing loss).
    json.erase("head_dim");
    if (config.Moe()) {
      json.erase("mlp_bias");
      json["num_local_experts"] = config.experts;
      json["num_experts_per_tok"] = config.experts_per_token;
      json["output_router_logits"] = false;
    }
    json["embedding_multiplier"] = config.embedding_multiplier;
    json["residual_multiplier"] = config.residual_multiplier;
    json["attention_multiplier"] = config.attention_multiplier;
    json["logits_scaling"] = config.logits_scaling;
  } else if (config.model_type == "phi3") {
    // Phi3Config: no biases, head_dim hidden / heads, no dropout (its resid_pdrop and
    // embd_pdrop), and an absent pad_token_id would read as 32000.
    EraseFields(json, {"attention_bias", "mlp_bias", "head_dim"});
    json["sliding_window"] = window;
    json["original_max_position_embeddings"] = config.max_position_embeddings;
    // Phi-4-mini's (transformers 4.49 and later read it; written only where it is not 1).
    if (config.partial_rotary_factor != 1.0) {
      json["partial_rotary_factor"] = config.partial_rotary_factor;
    }
    json["resid_pdrop"] = 0.0;
    json["embd_pdrop"] = 0.0;
    json["pad_token_id"] = config.pad_token_id ? Json(*config.pad_token_id) : Json(nullptr);
  } else if (config.model_type == "olmo") {
    // OlmoConfig: no MLP biases, no norm epsilon (fixed), head_dim hidden / heads, clip_qkv,
    // and an absent pad_token_id would read as 1.
    EraseFields(json, {"mlp_bias", "rms_norm_eps", "head_dim"});
    json["clip_qkv"] = config.clip_qkv > 0 ? Json(config.clip_qkv) : Json(nullptr);
    json["pad_token_id"] = config.pad_token_id ? Json(*config.pad_token_id) : Json(nullptr);
  } else if (config.model_type == "olmoe") {
    // OlmoeConfig: OLMo's fields with RMSNorms (their epsilon kept) and the experts (no MLP
    // biases, no load-balancing loss: tandem trains without it).
    EraseFields(json, {"mlp_bias", "head_dim"});
    json["clip_qkv"] = config.clip_qkv > 0 ? Json(config.clip_qkv) : Json(nullptr);
    json["pad_token_id"] = config.pad_token_id ? Json(*config.pad_token_id) : Json(nullptr);
    json["num_experts"] = config.experts;
    json["num_experts_per_tok"] = config.experts_per_token;
    json["norm_topk_prob"] = config.normalize_top_k;
    json["output_router_logits"] = false;
  } else if (config.Starcoder2()) {
    // Starcoder2Config: norm_epsilon, one use_bias for every product (and no other bias
    // field), its activation, head_dim hidden / heads, no dropout.
    EraseFields(json, {"attention_bias", "mlp_bias", "rms_norm_eps", "head_dim"});
    json["norm_epsilon"] = config.rms_norm_eps;
    json["use_bias"] = config.attention_bias;
    json["hidden_act"] = config.hidden_act;
    json["sliding_window"] = window;
    json["residual_dropout"] = 0.0;
    json["embedding_dropout"] = 0.0;
  } else if (config.Phi()) {
    // PhiConfig: layer_norm_eps, biases always (no field), its activation and partial
    // rotation, head_dim hidden / heads, no dropout, no query/key norms.
    EraseFields(json, {"attention_bias", "mlp_bias", "rms_norm_eps", "head_dim"});
    json["layer_norm_eps"] = config.rms_norm_eps;
    json["hidden_act"] = config.hidden_act;
    json["partial_rotary_factor"] = config.partial_rotary_factor;
    json["qk_layernorm"] = false;
    json["resid_pdrop"] = 0.0;
    json["embd_pdrop"] = 0.0;
  } else if (config.NeoX()) {
    // GPTNeoXConfig: no key/value groups, layer_norm_eps, rotary_pct and rotary_emb_base (it
    // derives rope_theta and partial_rotary_factor from them), attention_bias (the MLP's
    // always), use_parallel_residual, no dropout.
    EraseFields(json,
                {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "mlp_bias"});
    json["layer_norm_eps"] = config.rms_norm_eps;
    json["hidden_act"] = config.hidden_act;
    json["rotary_pct"] = config.partial_rotary_factor;
    json["rotary_emb_base"] = config.rope_theta;
    json["use_parallel_residual"] = config.parallel_residual;
    json["hidden_dropout"] = 0.0;
  } else if (config.Nemotron()) {
    // NemotronConfig: norm_eps, its activation and partial rotation, attention_bias and
    // mlp_bias; no rope_scaling (transformers' Nemotron ignores it).
    EraseFields(json, {"rms_norm_eps", "rope_scaling"});
    json["norm_eps"] = config.rms_norm_eps;
    json["hidden_act"] = config.hidden_act;
    json["partial_rotary_factor"] = config.partial_rotary_factor;
  } else if (config.Glm4()) {
    // Glm4Config: attention_bias for the q/k/v biases, head_dim and partial_rotary_factor for
    // the attention and the rotation, and an absent pad_token_id would read as 151329.
    EraseFields(json, {"mlp_bias"});
    json["attention_bias"] = config.QkvBias();
    json["partial_rotary_factor"] = config.partial_rotary_factor;
    json["pad_token_id"] = config.pad_token_id ? Json(*config.pad_token_id) : Json(nullptr);
  } else if (config.Glm()) {
    // GlmConfig: attention_bias for the q/k/v biases, head_dim for the rotation (twice the
    // rotated features), and an absent pad_token_id would read as 151329.
    EraseFields(json, {"mlp_bias"});
    json["attention_bias"] = config.QkvBias();
    json["head_dim"] = 2 * config.RotaryDim();
    json["pad_token_id"] = config.pad_token_id ? Json(*config.pad_token_id) : Json(nullptr);
  } else if (config.Cohere()) {
    // CohereConfig: layer_norm_eps, attention_bias (the MLP has none), head_dim hidden /
    // heads, logit_scale, no query/key norms, and an absent pad_token_id would read as 0.
    EraseFields(json, {"mlp_bias", "rms_norm_eps", "head_dim"});
    json["layer_norm_eps"] = config.rms_norm_eps;
    json["logit_scale"] = config.logit_scale;
    json["use_qk_norm"] = config.head_qk_norms;
    json["pad_token_id"] = config.pad_token_id ? Json(*config.pad_token_id) : Json(nullptr);
  } else if (config.StableLm()) {
    // StableLmConfig: layer_norm_eps, use_qkv_bias (o_proj and the MLP have none), head_dim
    // hidden / heads, its partial rotation, use_parallel_residual and qk_layernorm, no
    // dropout.
    EraseFields(json, {"attention_bias", "mlp_bias", "rms_norm_eps", "head_dim"});
    json["layer_norm_eps"] = config.rms_norm_eps;
    json["use_qkv_bias"] = config.QkvBias();
    json["hidden_act"] = config.hidden_act;
    json["partial_rotary_factor"] = config.partial_rotary_factor;
    json["use_parallel_residual"] = config.parallel_residual;
    json["qk_layernorm"] = config.head_qk_norms;
    json["hidden_dropout"] = 0.0;
  } else if (config.Gemma()) {
    // GemmaConfig, Gemma2Config and Gemma3TextConfig: the activation is hidden_activation,
    // the MLP has no biases, and an absent pad_token_id would read as 0; Gemma 3's pattern of
    // local blocks and their rotary base.
    json.erase("mlp_bias");
    json["hidden_act"] = config.hidden_act;
    json["hidden_activation"] = config.hidden_act;
    json["pad_token_id"] = config.pad_token_id ? Json(*config.pad_token_id) : Json(nullptr);
    if (config.Gemma3()) {
      json["sliding_window_pattern"] = config.sliding_window_pattern;
      json["rope_local_base_freq"] = config.rope_local_theta;
    }
    if (config.SandwichNorms()) {
      json["query_pre_attn_scalar"] = config.query_pre_attn_scalar > 0
                                          ? config.query_pre_attn_scalar
                                          : static_cast<double>(config.HeadDim());
      const auto cap = [](double c) { return c > 0 ? Json(c) : Json(nullptr); };
      json["attn_logit_softcapping"] = cap(config.attn_logit_softcapping);
      json["final_logit_softcapping"] = cap(config.final_logit_softcapping);
      // Gemma 2 and 3 need a window: full causal attention over every position is one of
      // max_position_embeddings.
      json["sliding_window"] =
          config.sliding_window > 0 ? config.sliding_window : config.max_position_embeddings;
      json["cache_implementation"] = "hybrid";
    }
  }
  return json;
}

Json Gpt2ConfigJson(const Gpt2Config& config) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", config.vocab},
          {"n_embd", config.hidden},
          {"n_layer", config.layers},
          {"n_head", config.heads},
          {"n_positions", config.positions},
          {"n_ctx", config.positions},
          {"n_inner", config.inner > 0 ? Json(config.inner) : Json(nullptr)},
          {"activation_function", config.activation},
          {"layer_norm_epsilon", config.layer_norm_epsilon},
          {"scale_attn_weights", config.scale_attn_weights},
          {"scale_attn_by_inverse_layer_idx", config.scale_attn_by_inverse_layer_idx},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", config.tie_word_embeddings},
          // tandem trains without dropout.
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", config.init_std},
          {"torch_dtype", "float32"}};
}

struct ExportModel {
  HfLayout layout;
  Json config;
  std::string config_source;
};

// The model an export of `config` writes: Gemma 3's multimodal checkpoints as their text model
// (Gemma3ForCausalLM, gemma3_text), every other as it is.
LlamaConfig ExportedLlama(LlamaConfig config) {
  if (config.Gemma3Multimodal()) config.model_type = "gemma3_text";
  return config;
}

// The layout and config.json of the checkpoint's model `description`, from `file` where given
// (HfConfigOfCheckpoint).
absl::StatusOr<ExportModel> ExportModelOf(const std::string& description,
                                          const std::optional<CheckpointHfConfig>& file) {
  const std::string family = description.substr(0, description.find(' '));
  if (family != "llama" && family != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint holds model '", description,
        "'; export writes Hugging Face folders of llama and gpt2 models only"));
  }
  const bool llama = family == "llama";
  ExportModel out;
  if (!file) {
    out.config_source = "the model description";
    const std::string advice =
        "; pass the model's config.json as --hf-config";
    if (llama) {
      auto config = LlamaConfigFromDescription(description);
      if (!config.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(config.status().message(), advice));
      }
      *config = ExportedLlama(*config);
      out.layout = LlamaHfLayout(*config);
      out.config = LlamaConfigJson(*config);
    } else {
      auto config = Gpt2ConfigFromDescription(description);
      if (!config.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(config.status().message(), advice));
      }
      out.layout = Gpt2HfLayout(*config);
      out.config = Gpt2ConfigJson(*config);
    }
    return out;
  }
  out.config_source = file->source;
  out.config = file->config;
  // The sequence length is no part of config.json: the description's.
  const int64_t seq_len = DescribedSequenceLength(description);
  if (llama) {
    auto config = LlamaConfigFromJson(out.config);
    if (!config.ok()) return Annotate(config.status(), file->source);
    if (seq_len > 0) config->seq_len = seq_len;
    out.layout = LlamaHfLayout(*config);
  } else {
    auto config = Gpt2ConfigFromJson(out.config);
    if (!config.ok()) return Annotate(config.status(), file->source);
    if (seq_len > 0) config->seq_len = seq_len;
    out.layout = Gpt2HfLayout(*config);
  }
  if (out.layout.model != WithoutSeed(description)) {
    return absl::InvalidArgumentError(absl::StrCat(file->source, " describes '", out.layout.model,
                                                   "', the checkpoint holds '",
                                                   WithoutSeed(description), "'"));
  }
  if (llama) {
    auto config = LlamaConfigFromJson(out.config);
    if (config.ok() && config->Gemma3Multimodal()) {
      // Written as its text model: the layout and config.json of Gemma3ForCausalLM.
      if (seq_len > 0) config->seq_len = seq_len;
      *config = ExportedLlama(*config);
      out.layout = LlamaHfLayout(*config);
      out.config = LlamaConfigJson(*config);
      absl::StrAppend(&out.config_source, ", written as its text model (Gemma3ForCausalLM)");
    }
  }
  out.config["torch_dtype"] = "float32";  // what the export writes
  return out;
}

// `out_folder` without a trailing '/', and the check that it may be written.
absl::StatusOr<std::filesystem::path> OutputFolder(const std::string& out_folder) {
  namespace fs = std::filesystem;
  if (out_folder.empty()) return absl::InvalidArgumentError("the output folder is empty");
  fs::path out = fs::path(out_folder).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(out.string(), ": exists and is not a folder"));
    }
    if (!fs::is_empty(out, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          out.string(), ": exists and is not empty (export writes a new folder)"));
    }
  }
  return out;
}

}  // namespace

std::string WithoutSeed(absl::string_view description) {
  std::vector<std::string> kept;
  for (absl::string_view token : absl::StrSplit(description, ' ', absl::SkipEmpty())) {
    if (!absl::StartsWith(token, "seed=")) kept.emplace_back(token);
  }
  return absl::StrJoin(kept, " ");
}

int64_t DescribedSequenceLength(absl::string_view description) {
  int64_t seq_len = 0;
  for (absl::string_view token : absl::StrSplit(description, ' ')) {
    if (absl::ConsumePrefix(&token, "S=") && !absl::SimpleAtoi(token, &seq_len)) seq_len = 0;
  }
  return seq_len;
}

absl::StatusOr<std::string> DescribeHfConfig(const Json& config, absl::string_view description) {
  const int64_t seq_len = DescribedSequenceLength(description);
  if (absl::StartsWith(description, "llama ")) {
    TANDEM_ASSIGN_OR_RETURN(LlamaConfig llama, LlamaConfigFromJson(config));
    if (seq_len > 0) llama.seq_len = seq_len;
    return DescribeLlama(llama);
  }
  if (absl::StartsWith(description, "gpt2 ")) {
    TANDEM_ASSIGN_OR_RETURN(Gpt2Config gpt2, Gpt2ConfigFromJson(config));
    if (seq_len > 0) gpt2.seq_len = seq_len;
    return DescribeGpt2(gpt2);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "a config.json sizes llama and gpt2 models; the checkpoint holds '", description, "'"));
}

absl::StatusOr<std::optional<CheckpointHfConfig>> HfConfigOfCheckpoint(
    const std::string& description, const Json& run, const std::string& hf_config) {
  if (!hf_config.empty()) {
    TANDEM_ASSIGN_OR_RETURN(Json config, ReadJsonFile(hf_config));
    return CheckpointHfConfig{std::move(config), absl::StrCat("--hf-config ", hf_config)};
  }
  if (!run.is_object() || !run.contains("hf_config") || !run["hf_config"].is_object()) {
    return std::nullopt;
  }
  const absl::StatusOr<std::string> described = DescribeHfConfig(run["hf_config"], description);
  if (!described.ok() || *described != WithoutSeed(description)) return std::nullopt;
  return CheckpointHfConfig{run["hf_config"], "the config.json recorded in the checkpoint"};
}

absl::StatusOr<HfExportResult> ExportCheckpointToHf(const std::string& checkpoint,
                                                    const std::string& out_folder,
                                                    const HfExportOptions& options) {
  namespace fs = std::filesystem;
  HfExportResult result;
  TANDEM_ASSIGN_OR_RETURN(const fs::path out, OutputFolder(out_folder));
  TANDEM_ASSIGN_OR_RETURN(result.checkpoint, ResolveCheckpoint(checkpoint));
  TANDEM_ASSIGN_OR_RETURN(const CheckpointManifest manifest, ReadManifest(result.checkpoint));
  result.model = manifest.model;
  TANDEM_ASSIGN_OR_RETURN(const std::optional<CheckpointHfConfig> file,
                          HfConfigOfCheckpoint(manifest.model, manifest.run, options.hf_config));
  TANDEM_ASSIGN_OR_RETURN(ExportModel model, ExportModelOf(manifest.model, file));
  result.config_source = model.config_source;

  // The parameters (optimizer state is not exported).
  std::map<std::string, ShardTensor> parameters;
  for (const ShardRecord& record : manifest.shards) {
    TANDEM_ASSIGN_OR_RETURN(CheckpointShard shard, ReadShard(result.checkpoint, record));
    for (ShardTensor& t : shard.tensors) {
      if (!absl::StartsWith(t.name, kParameterPrefix)) continue;
      std::string name = t.name.substr(sizeof(kParameterPrefix) - 1);
      if (parameters.count(name) > 0) {
        return absl::DataLossError(absl::StrCat(result.checkpoint, ": parameter '", name,
                                                "' is in more than one shard"));
      }
      parameters.emplace(std::move(name), std::move(t));
    }
  }
  const HfLayout& layout = model.layout;
  const std::string where = absl::StrCat(result.checkpoint, " (", layout.model, ")");
  std::vector<std::string> extra;
  for (const auto& [name, tensor] : parameters) {
    // A tied copy held apart equals its owner (the runtime keeps them equal): written once.
    if (layout.tied_copies.count(name) == 0 && layout.Find(name) == nullptr) {
      extra.push_back(absl::StrCat("'", name, "'"));
    }
  }
  if (!extra.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": holds ", extra.size(),
                                                   " parameter(s) the model has not: ",
                                                   ListSome(extra)));
  }
  std::vector<formats::TensorToWrite> tensors;
  std::deque<std::string> fused;  // the bytes of keys that several parameters make up
  // The parameters of each key, in the layout's order of keys: the key's parameter, or the
  // parts of a fused key by their rows.
  std::vector<std::vector<const HfTensor*>> keys;
  std::map<std::string, size_t> index_of_key;
  for (const HfTensor& hf : layout.tensors) {
    auto [it, added] = index_of_key.emplace(hf.key, keys.size());
    if (added) keys.emplace_back();
    keys[it->second].push_back(&hf);
  }
  for (std::vector<const HfTensor*>& parts : keys) {
    std::stable_sort(parts.begin(), parts.end(), [](const HfTensor* a, const HfTensor* b) {
      return a->first_row < b->first_row;
    });
    std::vector<const ShardTensor*> held;
    for (const HfTensor* part : parts) {
      const HfTensor& hf = *part;
      auto it = parameters.find(hf.name);
      if (it == parameters.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": holds no parameter '", hf.name, "' (", hf.key, ")"));
      }
      const ShardTensor& t = it->second;
      if (t.dtype != comm::DataType::kFloat32) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": parameter '", hf.name, "' is not float32"));
      }
      if (t.count != ShapeElements(hf.shape) || !ShapesCompatible(t.shape, hf.shape)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": parameter '", hf.name, "' is ", ShapeString(t.shape), " (",
                         t.count, " elements), ", hf.key, " must be ", ShapeString(hf.shape)));
      }
      held.push_back(&t);
    }
    const HfTensor& hf = *parts.front();
    formats::TensorToWrite w;
    w.name = hf.key;
    w.data_type = formats::DataType::kFloat32;
    w.shape = hf.KeyShape();
    absl::string_view bytes = held[0]->bytes;
    if (parts.size() > 1) {  // the parts' rows one after another
      std::string& joined = fused.emplace_back();
      for (const ShardTensor* t : held) joined += t->bytes;
      bytes = joined;
    }
    w.bytes =
        absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (static_cast<int64_t>(bytes.size()) != ShapeElements(w.shape) * 4) {
      return absl::InternalError(absl::StrCat(where, ": the parameters of ", hf.key, " make ",
                                              bytes.size(), " bytes, not ", ShapeString(w.shape),
                                              " in float32"));
    }
    tensors.push_back(std::move(w));
    result.bytes += static_cast<int64_t>(bytes.size());
  }
  result.tensors = static_cast<int64_t>(tensors.size());

  // Everything into a hidden folder beside the output, renamed to it at the end.
  std::error_code ec;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(parent.string(), ": cannot create the folder: ", ec.message()));
  }
  const fs::path partial =
      parent / absl::StrCat(".", out.filename().string(), ".export-", ::getpid());
  RemoveAll(partial.string()).IgnoreError();  // a leftover of an earlier crash
  absl::Status written = [&]() -> absl::Status {
    fs::create_directories(partial, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat(partial.string(), ": cannot create the folder: ", ec.message()));
    }
    TANDEM_RETURN_IF_ERROR(WriteFileAtomically((partial / kConfigFileName).string(),
                                               model.config.dump(2) + "\n"));
    formats::ShardedWriteOptions write;
    write.max_shard_bytes = options.max_shard_bytes;
    TANDEM_ASSIGN_OR_RETURN(const formats::ShardedWriteResult files,
                            formats::WriteShardedSafetensors(partial.string(), tensors, write));
    result.files = {kConfigFileName};
    result.files.insert(result.files.end(), files.files.begin(), files.files.end());
    if (!files.index_file.empty()) result.files.push_back(files.index_file);
    fs::rename(partial, out, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot rename ", partial.string(), " to ",
                                              out.string(), ": ", ec.message()));
    }
    return absl::OkStatus();
  }();
  if (!written.ok()) {
    RemoveAll(partial.string()).IgnoreError();
    return written;
  }
  return result;
}

}  // namespace tandem::runtime::libtorch
