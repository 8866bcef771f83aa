#include "runtime/torch/gpt.h"

#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/version.h>
#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "runtime/torch/deferred_linear.h"
#include "runtime/torch/fused_layer_norm.h"
#include "runtime/torch/fused_ops.h"
#include "runtime/torch/kv_cache.h"
#include "runtime/torch/lm_parts.h"
#include "runtime/torch/precision.h"
#include "runtime/torch/tensor_parallel.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr int64_t kMlpExpansion = 4;

void InitLinear(torch::nn::Linear& linear, double std) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(linear->weight, /*mean=*/0.0, std);
  if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
}

torch::nn::LayerNorm MakeLayerNorm(int64_t hidden) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}));
}

// A linear layer's product with a deferrable weight gradient (zero-bubble's W pass).
torch::Tensor Apply(const torch::nn::Linear& linear, const torch::Tensor& x) {
  return DeferrableLinear(x, linear->weight, linear->bias);
}

// A linear layer holding `weight` (and `bias`, if defined): the shard of a full layer.
torch::nn::Linear ShardLinear(const torch::Tensor& weight, const torch::Tensor& bias) {
  torch::nn::Linear linear(
      torch::nn::LinearOptions(weight.size(1), weight.size(0)).bias(bias.defined()));
  torch::NoGradGuard no_grad;
  linear->weight.copy_(weight);
  if (bias.defined()) linear->bias.copy_(bias);
  return linear;
}

// Layer 0: token + learned position embeddings.
class GptEmbeddingImpl : public torch::nn::Cloneable<GptEmbeddingImpl>, public IncrementalLayer {
 public:
  explicit GptEmbeddingImpl(const GptConfig& config) : config_(config) { reset(); }

  void reset() override {
    token = register_module("token", torch::nn::Embedding(config_.vocab, config_.hidden));
    position = register_module("position", torch::nn::Embedding(config_.seq_len, config_.hidden));
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(token->weight, 0.0, config_.init_std);
    torch::nn::init::normal_(position->weight, 0.0, config_.init_std);
  }

  // Keeps this rank's rows of the token embedding (vocabulary-parallel); the position
  // embedding stays whole.
  void ShardForTensorParallel(const TensorParallel& tp) {
    const int64_t rows = tp.ShardSize(config_.vocab);
    torch::nn::Embedding shard(rows, config_.hidden);
    {
      torch::NoGradGuard no_grad;
      shard->weight.copy_(token->weight.narrow(0, tp.ShardBegin(config_.vocab), rows));
    }
    token = replace_module("token", shard);
    tp_ = tp;
  }

  // ids: int64 [b, S'] with S' <= seq_len.
  torch::Tensor forward(torch::Tensor ids) {
    const auto positions = torch::arange(
        ids.size(1), torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    if (!tp_.enabled()) return token(ids) + position(positions);
    // Ids outside this rank's rows look up zeros; the sum over the group is the full lookup.
    const int64_t rows = token->weight.size(0);
    const auto local = ids - tp_.ShardBegin(config_.vocab);
    const auto mine = local.ge(0).logical_and(local.lt(rows));
    const auto found = token(local.clamp(0, rows - 1)) * mine.unsqueeze(-1).to(torch::kFloat);
    if (tp_.sequence_split()) {
      // Summed and split along the sequence at once; this rank adds its tokens' positions.
      const int64_t length = ids.size(1) / tp_.size;
      const torch::Tensor table = SharedOverTheSequence({position->weight}, tp_)[0];
      return ReduceScatterToSequenceParallel(found, tp_) +
             torch::embedding(table, positions.narrow(0, tp_.rank * length, length));
    }
    return ReduceFromTensorParallel(found, tp_) + position(positions);
  }

  // ids [b, n] at positions [start, start + n), start + n <= seq_len.
  torch::Tensor ForwardIncremental(const torch::Tensor& ids, int64_t start,
                                   KeyValueCache& /*cache*/) override {
    if (tp_.enabled()) throw std::logic_error("gpt: incremental decoding of a shard");
    const auto positions =
        torch::arange(start, start + ids.size(1),
                      torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    return token(ids) + position(positions);
  }

  torch::nn::Embedding token{nullptr}, position{nullptr};

 private:
  GptConfig config_;
  TensorParallel tp_;
};
TORCH_MODULE(GptEmbedding);

// Layers 1..N: pre-LN transformer block with causal self-attention and a GELU MLP.
class GptBlockImpl : public torch::nn::Cloneable<GptBlockImpl>, public IncrementalLayer {
 public:
  explicit GptBlockImpl(const GptConfig& config)
      : config_(config),
        fused_(config.attention == GptAttention::kFused ||
               (config.attention == GptAttention::kAuto && FusedAttentionByDefault())) {
    reset();
  }

  void reset() override {
    const int64_t hidden = config_.hidden;
    attention_norm = register_module("attention_norm", MakeLayerNorm(hidden));
    // No bias: softmax ignores a key bias (its gradient is exactly zero, so AdamW would move
    // it by rounding noise alone), and query/value biases go with it, as in PaLM and LLaMA.
    qkv = register_module(
        "qkv", torch::nn::Linear(torch::nn::LinearOptions(hidden, 3 * hidden).bias(false)));
    attention_out = register_module("attention_out", torch::nn::Linear(hidden, hidden));
    mlp_norm = register_module("mlp_norm", MakeLayerNorm(hidden));
    mlp_in = register_module("mlp_in", torch::nn::Linear(hidden, kMlpExpansion * hidden));
    mlp_out = register_module("mlp_out", torch::nn::Linear(kMlpExpansion * hidden, hidden));
    const double residual_std =
        config_.init_std / std::sqrt(2.0 * static_cast<double>(config_.layers));
    InitLinear(qkv, config_.init_std);
    InitLinear(attention_out, residual_std);
    InitLinear(mlp_in, config_.init_std);
    InitLinear(mlp_out, residual_std);
  }

  // Megatron's split: q/k/v and the MLP's first matrix by output features (this rank's heads
  // and hidden units), the output projections by input features; layer norms and the biases
  // added after the reductions stay whole.
  void ShardForTensorParallel(const TensorParallel& tp) {
    const int64_t hidden = config_.hidden, head_dim = hidden / config_.heads;
    const int64_t local = tp.ShardSize(config_.heads) * head_dim;
    const int64_t first = tp.rank * local;
    torch::Tensor qkv_rows;
    {
      torch::NoGradGuard no_grad;
      qkv_rows = torch::cat({qkv->weight.narrow(0, first, local),
                             qkv->weight.narrow(0, hidden + first, local),
                             qkv->weight.narrow(0, 2 * hidden + first, local)});
    }
    const int64_t units = tp.ShardSize(kMlpExpansion * hidden);
    const int64_t first_unit = tp.rank * units;
    qkv = replace_module("qkv", ShardLinear(qkv_rows, torch::Tensor()));
    attention_out = replace_module(
        "attention_out",
        ShardLinear(attention_out->weight.narrow(1, first, local), attention_out->bias));
    mlp_in = replace_module("mlp_in", ShardLinear(mlp_in->weight.narrow(0, first_unit, units),
                                                  mlp_in->bias.narrow(0, first_unit, units)));
    mlp_out = replace_module(
        "mlp_out", ShardLinear(mlp_out->weight.narrow(1, first_unit, units), mlp_out->bias));
    tp_ = tp;
  }

  torch::Tensor forward(torch::Tensor x) {
    if (tp_.sequence_split()) return ForwardSequenceParallel(x);
    if (tp_.enabled()) return ForwardTensorParallel(x);
    if (x.is_cuda() && FusedKernelsEnabled()) return ForwardFused(x);
    const int64_t batch = x.size(0), length = x.size(1), hidden = x.size(2);
    const int64_t heads = config_.heads, head_dim = hidden / heads;
    // [b, S, 3H] -> [3, b, A, S, hd]
    const auto qkv_heads = Apply(qkv, attention_norm(x))
                               .view({batch, length, 3, heads, head_dim})
                               .permute({2, 0, 3, 1, 4});
    // unbind, not three selects: its gradient is one stack, where each select's would be a
    // zero-filled tensor of the whole [3, b, A, S, hd] and two more passes to sum them.
    const std::vector<torch::Tensor> split = qkv_heads.unbind(0);
    const torch::Tensor& query = split[0];
    const torch::Tensor& key = split[1];
    const torch::Tensor& value = split[2];
    torch::Tensor attended;
    if (fused_) {
#if TORCH_VERSION_MAJOR >= 2
      attended = at::scaled_dot_product_attention(query, key, value, /*attn_mask=*/{},
                                                  /*dropout_p=*/0.0, /*is_causal=*/true);
#else
      attended = std::get<0>(at::_scaled_dot_product_attention(
          query, key, value, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*need_attn_weights=*/false,
          /*is_causal=*/true));
#endif
    } else {
      auto scores = torch::matmul(query, key.transpose(-2, -1)) /
                    std::sqrt(static_cast<double>(head_dim));
      const auto future = torch::ones({length, length},
                                      torch::TensorOptions().dtype(torch::kBool).device(x.device()))
                              .triu(/*diagonal=*/1);
      scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
      attended = torch::matmul(torch::softmax(scores, /*dim=*/-1), value);
    }
    x = x + Apply(attention_out, attended.transpose(1, 2).reshape({batch, length, hidden}));
    return x + Apply(mlp_out, torch::gelu(Apply(mlp_in, mlp_norm(x))));
  }

  // forward() for positions [start, start + n) with the keys and values of the earlier ones
  // in `cache` (explicit attention).
  torch::Tensor ForwardIncremental(const torch::Tensor& input, int64_t start,
                                   KeyValueCache& cache) override {
    if (tp_.enabled()) throw std::logic_error("gpt: incremental decoding of a shard");
    const int64_t batch = input.size(0), length = input.size(1), hidden = input.size(2);
    const int64_t heads = config_.heads, head_dim = hidden / heads;
    const std::vector<torch::Tensor> split = Apply(qkv, attention_norm(input))
                                                 .view({batch, length, 3, heads, head_dim})
                                                 .permute({2, 0, 3, 1, 4})
                                                 .unbind(0);
    const auto [keys, values] = cache.Append(split[1], split[2]);
    const torch::Tensor attended = CachedCausalAttention(
        split[0], keys, values, start, std::sqrt(static_cast<double>(head_dim)));
    const torch::Tensor x =
        input + Apply(attention_out, attended.transpose(1, 2).reshape({batch, length, hidden}));
    return x + Apply(mlp_out, torch::gelu(Apply(mlp_in, mlp_norm(x))));
  }

  torch::nn::LayerNorm attention_norm{nullptr}, mlp_norm{nullptr};
  torch::nn::Linear qkv{nullptr}, attention_out{nullptr}, mlp_in{nullptr}, mlp_out{nullptr};

 private:
  // forward() with the fused kernels (fused_layer_norm.h): each layer norm writes its output
  // in the products' type (bf16 under autocast) in the pass that reads its input, and the
  // attention's residual add is the MLP's layer norm's first step.
  torch::Tensor ForwardFused(const torch::Tensor& x) {
    const int64_t batch = x.size(0), length = x.size(1), hidden = x.size(2);
    const int64_t heads = config_.heads, head_dim = hidden / heads;
    const torch::ScalarType type = AutocastMatmulType(x.device()).value_or(x.scalar_type());
    const ResidualNorm first =
        ResidualLayerNorm(x, torch::Tensor(), attention_norm->weight, attention_norm->bias,
                          attention_norm->options.eps(), type);
    const std::vector<torch::Tensor> split = Apply(qkv, first.normed)
                                                 .view({batch, length, 3, heads, head_dim})
                                                 .permute({2, 0, 3, 1, 4})
                                                 .unbind(0);
    const torch::Tensor attended = Attend(split[0], split[1], split[2], head_dim);
    const ResidualNorm second = ResidualLayerNorm(
        x, Apply(attention_out, attended.transpose(1, 2).reshape({batch, length, hidden})),
        mlp_norm->weight, mlp_norm->bias, mlp_norm->options.eps(), type);
    return second.sum + Apply(mlp_out, torch::gelu(Apply(mlp_in, second.normed)));
  }

  torch::Tensor Attend(const torch::Tensor& query, const torch::Tensor& key,
                       const torch::Tensor& value, int64_t head_dim) const {
    if (fused_) {
#if TORCH_VERSION_MAJOR >= 2
      return at::scaled_dot_product_attention(query, key, value, /*attn_mask=*/{},
                                              /*dropout_p=*/0.0, /*is_causal=*/true);
#else
      return std::get<0>(at::_scaled_dot_product_attention(
          query, key, value, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*need_attn_weights=*/false,
          /*is_causal=*/true));
#endif
    }
    const int64_t length = query.size(-2);
    auto scores = torch::matmul(query, key.transpose(-2, -1)) /
                  std::sqrt(static_cast<double>(head_dim));
    const auto future =
        torch::ones({length, length},
                    torch::TensorOptions().dtype(torch::kBool).device(query.device()))
            .triu(/*diagonal=*/1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    return torch::matmul(torch::softmax(scores, /*dim=*/-1), value);
  }

  // This rank's heads and hidden units; the row-parallel products are summed over the group
  // before their biases are added.
  torch::Tensor ForwardTensorParallel(torch::Tensor x) {
    const int64_t batch = x.size(0), length = x.size(1), hidden = x.size(2);
    const int64_t head_dim = hidden / config_.heads;
    const int64_t heads = tp_.ShardSize(config_.heads), local = heads * head_dim;
    const auto qkv_heads = Apply(qkv, CopyToTensorParallel(attention_norm(x), tp_))
                               .view({batch, length, 3, heads, head_dim})
                               .permute({2, 0, 3, 1, 4});
    const std::vector<torch::Tensor> split = qkv_heads.unbind(0);  // one stack backward
    const auto attended = Attend(split[0], split[1], split[2], head_dim);
    const auto projected =
        DeferrableLinear(attended.transpose(1, 2).reshape({batch, length, local}),
                         attention_out->weight, torch::Tensor());
    x = x + (ReduceFromTensorParallel(projected, tp_) + attention_out->bias);
    const auto units = torch::gelu(Apply(mlp_in, CopyToTensorParallel(mlp_norm(x), tp_)));
    return x + (ReduceFromTensorParallel(DeferrableLinear(units, mlp_out->weight, {}), tp_) +
                mlp_out->bias);
  }

  // x: this rank's S/t tokens [b, S/t, H]. The layer norms and residual adds run on them; the
  // split products see the whole sequence (gathered before, reduce-scattered after).
  torch::Tensor ForwardSequenceParallel(torch::Tensor x) {
    const std::vector<torch::Tensor> shared = SharedOverTheSequence(
        {attention_norm->weight, attention_norm->bias, attention_out->bias, mlp_norm->weight,
         mlp_norm->bias, mlp_out->bias},
        tp_);
    const int64_t batch = x.size(0), hidden = x.size(2);
    const int64_t head_dim = hidden / config_.heads;
    const int64_t heads = tp_.ShardSize(config_.heads), local = heads * head_dim;
    // The column-parallel products take the whole sequence but keep only this rank's tokens
    // of their inputs for the backward (LinearOverGatheredSequence).
    const int64_t length = x.size(1) * tp_.size;
    const auto qkv_heads =
        LinearOverGatheredSequence(LayerNormWith(attention_norm, x, shared[0], shared[1]),
                                   qkv->weight, qkv->bias, tp_)
            .view({batch, length, 3, heads, head_dim})
            .permute({2, 0, 3, 1, 4});
    const std::vector<torch::Tensor> split = qkv_heads.unbind(0);  // one stack backward
    const auto attended = Attend(split[0], split[1], split[2], head_dim);
    const auto projected =
        DeferrableLinear(attended.transpose(1, 2).reshape({batch, length, local}),
                         attention_out->weight, torch::Tensor());
    x = x + (ReduceScatterToSequenceParallel(projected, tp_) + shared[2]);
    const auto units = torch::gelu(LinearOverGatheredSequence(
        LayerNormWith(mlp_norm, x, shared[3], shared[4]), mlp_in->weight, mlp_in->bias, tp_));
    return x + (ReduceScatterToSequenceParallel(DeferrableLinear(units, mlp_out->weight, {}),
                                                tp_) +
                shared[5]);
  }

  GptConfig config_;
  bool fused_ = false;
  TensorParallel tp_;
};
TORCH_MODULE(GptBlock);

// Layer N + 1: final LayerNorm and LM head.
class GptHeadImpl : public torch::nn::Cloneable<GptHeadImpl>, public IncrementalLayer {
 public:
  explicit GptHeadImpl(const GptConfig& config) : config_(config) { reset(); }

  void reset() override {
    norm = register_module("norm", MakeLayerNorm(config_.hidden));
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(torch::nn::LinearOptions(config_.hidden, config_.vocab).bias(false)));
    InitLinear(lm_head, config_.init_std);
  }

  // This rank's vocabulary rows of the LM head: the output is its shard of the logits.
  void ShardForTensorParallel(const TensorParallel& tp) {
    lm_head = replace_module(
        "lm_head", ShardLinear(lm_head->weight.narrow(0, tp.ShardBegin(config_.vocab),
                                                      tp.ShardSize(config_.vocab)),
                               torch::Tensor()));
    tp_ = tp;
  }

  torch::Tensor forward(torch::Tensor x) {
    if (tp_.sequence_split()) {
      // This rank's tokens normalised, then the whole sequence through its vocabulary rows.
      const std::vector<torch::Tensor> shared =
          SharedOverTheSequence({norm->weight, norm->bias}, tp_);
      return LinearOverGatheredSequence(LayerNormWith(norm, x, shared[0], shared[1]),
                                        lm_head->weight, lm_head->bias, tp_);
    }
    if (tp_.enabled()) return Apply(lm_head, CopyToTensorParallel(norm(x), tp_));
    if (x.is_cuda() && FusedKernelsEnabled()) {
      const torch::ScalarType type = AutocastMatmulType(x.device()).value_or(x.scalar_type());
      return DeferrableLinearPadded(
          ResidualLayerNorm(x, torch::Tensor(), norm->weight, norm->bias, norm->options.eps(),
                            type)
              .normed,
          lm_head->weight, torch::Tensor());
    }
    return Apply(lm_head, norm(x));
  }

  torch::Tensor ForwardIncremental(const torch::Tensor& x, int64_t /*start*/,
                                   KeyValueCache& /*cache*/) override {
    if (tp_.enabled()) throw std::logic_error("gpt: incremental decoding of a shard");
    return Apply(lm_head, norm(x));
  }

  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  GptConfig config_;
  TensorParallel tp_;
};
TORCH_MODULE(GptHead);

}  // namespace

const char* GptAttentionName(GptAttention attention) {
  switch (attention) {
    case GptAttention::kAuto: return "auto";
    case GptAttention::kExplicit: return "explicit";
    case GptAttention::kFused: return "fused";
  }
  return "auto";
}

absl::StatusOr<GptAttention> ParseGptAttention(absl::string_view name) {
  for (GptAttention a : {GptAttention::kAuto, GptAttention::kExplicit, GptAttention::kFused}) {
    if (name == GptAttentionName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown attention '", name, "' (known: auto, explicit, fused)"));
}

bool FusedAttentionByDefault() { return TORCH_VERSION_MAJOR >= 2; }

double GptTrainingFlopsPerToken(const GptConfig& config) {
  const double h = static_cast<double>(config.hidden);
  const double layers = static_cast<double>(config.layers);
  // Per block: q/k/v 3h^2, output projection h^2, MLP 2 * 4h^2 = 12h^2; the LM head h * vocab.
  const double matmul_parameters = layers * 12.0 * h * h + h * static_cast<double>(config.vocab);
  return 6.0 * matmul_parameters + 12.0 * layers * h * static_cast<double>(config.seq_len);
}

absl::Status ValidateGptConfig(const GptConfig& config) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab", config.vocab},
                                                   {"layers", config.layers},
                                                   {"hidden", config.hidden},
                                                   {"heads", config.heads},
                                                   {"seq_len", config.seq_len}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpt: ", field, " must be positive, got ", value));
    }
  }
  if (config.hidden % config.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpt: hidden (", config.hidden,
                                                   ") must be divisible by heads (",
                                                   config.heads, ")"));
  }
  if (!(config.init_std > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt: init_std must be positive, got ", config.init_std));
  }
  return absl::OkStatus();
}

std::string DescribeGpt(const GptConfig& config) {
  return absl::StrCat("gpt L=", config.layers, " H=", config.hidden, " A=", config.heads,
                      " S=", config.seq_len, " V=", config.vocab);
}

absl::StatusOr<GptConfig> GptConfigFromDescription(absl::string_view description) {
  const std::vector<std::string> tokens = absl::StrSplit(description, ' ', absl::SkipEmpty());
  if (tokens.empty() || tokens[0] != "gpt") {
    return absl::InvalidArgumentError(
        absl::StrCat("model description '", description, "' is not of gpt"));
  }
  GptConfig config;
  std::set<std::string> seen;
  for (size_t i = 1; i < tokens.size(); ++i) {
    const std::string& token = tokens[i];
    if (absl::StartsWith(token, "seed=")) continue;
    const size_t equals = token.find('=');
    const std::string key = token.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : token.substr(equals + 1);
    int64_t* field = key == "L"   ? &config.layers
                     : key == "H" ? &config.hidden
                     : key == "A" ? &config.heads
                     : key == "S" ? &config.seq_len
                     : key == "V" ? &config.vocab
                                  : nullptr;
    if (field == nullptr || !absl::SimpleAtoi(value, field) || !seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot read '", token, "' of the model description '", description, "'"));
    }
  }
  if (seen.size() != 5) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model description '", description, "' lacks one of L=, H=, A=, S=, V="));
  }
  TANDEM_RETURN_IF_ERROR(ValidateGptConfig(config));
  return config;
}

ModelSpec GptModelSpec(const GptConfig& config) {
  ModelSpec spec;
  spec.name = DescribeGpt(config);
  // Layer by layer: a rank builds only the layers of its stages.
  spec.build_layer = [config](int layer) {
    if (layer == 0) return torch::nn::AnyModule(GptEmbedding(config));
    if (layer == config.layers + 1) return torch::nn::AnyModule(GptHead(config));
    return torch::nn::AnyModule(GptBlock(config));
  };
  spec.describe = [config]() {
    if (absl::Status ok = ValidateGptConfig(config); !ok.ok()) {
      throw std::invalid_argument(std::string(ok.message()));
    }
    LayeredModel model;
    model.name = DescribeGpt(config);
    model.layer_names.push_back("embedding");
    for (int64_t block = 0; block < config.layers; ++block) {
      model.layer_names.push_back(absl::StrCat("block", block));
    }
    model.layer_names.push_back("head");
    // Forward FLOPs per token: the embedding's lookups and sum; per block q/k/v, output and
    // MLP products (24h^2) and attention scores and values (4hS); the head's product and
    // its loss's softmax.
    const double h = static_cast<double>(config.hidden);
    model.layer_costs.push_back(2.0 * h);
    model.layer_costs.insert(model.layer_costs.end(), config.layers,
                             24.0 * h * h + 4.0 * h * static_cast<double>(config.seq_len));
    model.layer_costs.push_back((2.0 * h + 5.0) * static_cast<double>(config.vocab));
    // Per token over the blocks and the head: the input gradient of each product costs its
    // forward, attention's backward twice its forward (scores and values), the weight
    // gradients one product per weight.
    const double blocks = static_cast<double>(config.layers);
    const double s_len = static_cast<double>(config.seq_len);
    const double head = 2.0 * h * static_cast<double>(config.vocab);
    model.split_pass_costs = {blocks * (24.0 * h * h + 4.0 * h * s_len) + head,
                              blocks * (24.0 * h * h + 8.0 * h * s_len) + head,
                              blocks * 24.0 * h * h + head};
    model.loss = TokenCrossEntropyLoss;
    model.loss_takes_compute_type = true;
    const int last = static_cast<int>(config.layers) + 1;
    model.shard_for_tensor_parallel = [config, last](std::vector<torch::nn::AnyModule>& layers,
                                                     int first,
                                                     const TensorParallel& tp) -> absl::Status {
      TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(config.heads, "gpt: heads"));
      if (absl::Status vocab = tp.CheckDivisible(config.vocab, "gpt: vocab"); !vocab.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            vocab.message(), ": pad the vocabulary to a multiple of the degree (as Megatron-LM "
            "pads GPT-2's 50257 to 50304, --vocab 50304)"));
      }
      if (tp.sequence_split()) {
        TANDEM_RETURN_IF_ERROR(
            tp.CheckDivisible(config.seq_len, "gpt: the sequence length (sequence parallelism)"));
      }
      return ShardDecoderLayers<GptEmbedding, GptBlock, GptHead>(layers, first, last, tp);
    };
    model.tensor_parallel_loss = VocabParallelCrossEntropy;
    return model;
  };
  return spec;
}

}  // namespace tandem::runtime::libtorch
