#include "runtime/torch/llama.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>
#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "runtime/torch/auxiliary_loss.h"
#include "runtime/torch/deferred_linear.h"
#include "runtime/torch/fused_layer_norm.h"
#include "runtime/torch/fused_ops.h"
#include "runtime/torch/kv_cache.h"
#include "runtime/torch/parallel_linear.h"
#include "runtime/torch/precision.h"
#include "runtime/torch/tensor_parallel.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr double kPi = 3.14159265358979323846;

bool Fused(const LlamaConfig& config) {
  return config.attention == GptAttention::kFused ||
         (config.attention == GptAttention::kAuto && FusedAttentionByDefault());
}

// The names a family's checkpoints give a block's modules, under which tandem registers them:
// the input norm, the attention, its output product and a plain MLP's two products (Llama's,
// and StarCoder 2's plain MLP, by default). Phi's self_attn.dense is renamed in the mapping
// instead (RenamedKey).
struct ModuleNames {
  const char* input_norm = "input_layernorm";
  const char* attention = "self_attn";
  const char* out_proj = "o_proj";
  const char* mlp_up = "c_fc";
  const char* mlp_down = "c_proj";
  const char* post_norm = "post_attention_layernorm";  // the MLP's norm, where it has its own
};
ModuleNames ModuleNamesOf(const LlamaConfig& config) {
  if (config.Phi()) return {"input_layernorm", "self_attn", "o_proj", "fc1", "fc2"};
  if (config.NeoX()) {
    return {"input_layernorm", "attention", "dense", "dense_h_to_4h", "dense_4h_to_h"};
  }
  if (config.Falcon()) {
    return {config.branch_norms ? "ln_attn" : "input_layernorm",
            "self_attention",
            "dense",
            "dense_h_to_4h",
            "dense_4h_to_h",
            config.branch_norms ? "ln_mlp" : "post_attention_layernorm"};
  }
  if (config.GptJ()) return {"ln_1", "attn", "out_proj", "fc_in", "fc_out"};
  if (config.Nemotron()) return {"input_layernorm", "self_attn", "o_proj", "up_proj", "down_proj"};
  if (config.Glm4()) {
    return {"input_layernorm", "self_attn", "o_proj", "c_fc", "c_proj", "post_self_attn_layernorm"};
  }
  return {};
}

// The names of the norms around the MLP in blocks of four norms (SandwichNorms) and OLMo 2's:
// Gemma 2's, or GLM-4-0414's (whose post_attention_layernorm is the MLP's input norm and whose
// attention's output norm is post_self_attn_layernorm, ModuleNamesOf's post_norm).
struct SandwichNames {
  const char* pre_mlp = "pre_feedforward_layernorm";
  const char* post_mlp = "post_feedforward_layernorm";
};
SandwichNames SandwichNamesOf(const LlamaConfig& config) {
  if (config.Glm4()) return {"post_attention_layernorm", "post_mlp_layernorm"};
  return {};
}

// transformers' LlamaRMSNorm: x / sqrt(mean(x^2) + eps) in float32, times the weight. With
// `offset` Gemma's: times 1 + the weight (zero-initialised) in float32, rounded to x's type
// after the product.
//
// Without `has_weight` OLMo's instead: a layer norm (mean subtracted) without weight or bias,
// in float32, rounded to x's type; `weight` is then undefined.
class RmsNormImpl : public torch::nn::Cloneable<RmsNormImpl> {
 public:
  // `has_bias`: a layer norm with weight and bias (StarCoder 2's nn.LayerNorm) instead;
  // `centered`: Cohere's layer norm with a weight and no bias (CohereLayerNorm: the mean
  // subtracted, divided by the deviation, times the weight, in float32 with its operations).
  RmsNormImpl(int64_t size, double eps, bool offset = false, bool has_weight = true,
              bool has_bias = false, bool centered = false)
      : size_(size),
        eps_(eps),
        offset_(offset),
        has_weight_(has_weight),
        has_bias_(has_bias),
        centered_(centered) {
    reset();
  }
  void reset() override {
    if (!has_weight_) return;
    // Gemma's offset RMSNorm weights start at 0, Nemotron's offset layer norms' at 1 (as
    // transformers leaves nn.LayerNorm's).
    weight = register_parameter(
        "weight", offset_ && !has_bias_ ? torch::zeros({size_}) : torch::ones({size_}));
    if (has_bias_) bias = register_parameter("bias", torch::zeros({size_}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return Normalize(x, weight, bias); }
  // The same with `scale` for the weight and `shift` for the bias (their own, as
  // SharedOverTheSequence returns them; none without a weight or bias).
  torch::Tensor Normalize(const torch::Tensor& x, const torch::Tensor& scale,
                          const torch::Tensor& shift = torch::Tensor()) const {
    const torch::Tensor h = x.to(torch::kFloat);
    if (!has_weight_) return torch::layer_norm(h, {size_}, {}, {}, eps_).to(x.scalar_type());
    if (centered_) {
      const torch::Tensor deviation = h - h.mean(-1, /*keepdim=*/true);
      const torch::Tensor variance = deviation.pow(2).mean(-1, /*keepdim=*/true);
      return (scale.to(torch::kFloat) * (deviation * torch::rsqrt(variance + eps_)))
          .to(x.scalar_type());
    }
    if (has_bias_) {
      // Nemotron's NemotronLayerNorm1P scales by 1 + the weight.
      const torch::Tensor factor =
          offset_ ? scale.to(torch::kFloat) + 1.0 : scale.to(torch::kFloat);
      return torch::layer_norm(h, {size_}, factor, shift.to(torch::kFloat), eps_)
          .to(x.scalar_type());
    }
    const torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
    if (offset_) {
      return (h * torch::rsqrt(variance + eps_) * (1.0 + scale.to(torch::kFloat)))
          .to(x.scalar_type());
    }
    return scale * (h * torch::rsqrt(variance + eps_)).to(x.scalar_type());
  }
  // RMSNorm of features split over `tp`'s group, `whole` of them in all, with this rank's
  // slice of the weight (OLMoE's q_norm and k_norm under tensor parallelism): this rank's sum
  // of squares all-reduced forward and its gradient all-reduced backward, since every rank's
  // output depends on every rank's share.
  torch::Tensor NormalizeSplit(const torch::Tensor& x, int64_t whole,
                               const TensorParallel& tp) const {
    const torch::Tensor h = x.to(torch::kFloat);
    const torch::Tensor squares =
        ReduceFromTensorParallel(CopyToTensorParallel(h.pow(2).sum(-1, /*keepdim=*/true), tp), tp);
    const torch::Tensor variance = squares / static_cast<double>(whole);
    return weight * (h * torch::rsqrt(variance + eps_)).to(x.scalar_type());
  }
  double eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  bool has_bias() const { return has_bias_; }
  torch::Tensor weight, bias;

 private:
  int64_t size_;
  double eps_;
  bool offset_;
  bool has_weight_;
  bool has_bias_;
  bool centered_;
};
TORCH_MODULE(RmsNorm);

// One head's weights of StableLM's per-head norms (norms.<h>.weight).
class HeadWeightImpl : public torch::nn::Cloneable<HeadWeightImpl> {
 public:
  explicit HeadWeightImpl(int64_t size) : size_(size) { reset(); }
  void reset() override { weight = register_parameter("weight", torch::ones({size_})); }
  torch::Tensor weight;

 private:
  int64_t size_;
};
TORCH_MODULE(HeadWeight);

// The norms of each query or key head apart (HeadNorm).
enum class HeadNormKind {
  kCohere,    // CohereLayerNorm [heads, head_dim]: the mean subtracted, each head's own weights
  kStableLm,  // StableLmLayerNormPerHead: the same, a LayerNorm per head (norms.<h>.weight)
  kQwen3,     // Qwen3RMSNorm [head_dim]: an RMSNorm of each head, one weight for all of them
  kGemma3,    // Gemma3RMSNorm [head_dim]: the same scaling by 1 + the weight, in float32
};

// A norm of each query or key head apart, in float32: Cohere's q_norm and k_norm (use_qk_norm;
// CohereLayerNorm of shape [heads, head_dim], one weight tensor: the mean subtracted, divided
// by the deviation, times that head's own weights), StableLM's q_layernorm and k_layernorm
// (qk_layernorm; StableLmLayerNormPerHead: the same computation, a LayerNorm without bias per
// head, norms.<h>.weight), or Qwen3's q_norm and k_norm (Qwen3RMSNorm over head_dim: each head
// divided by its root mean square, times one weight all heads share; Gemma 3's times 1 + that
// weight). Under tensor parallelism a rank normalises its own heads: it keeps their rows of
// Cohere's weight (nothing exchanged), or holds every weight whole (always StableLM's, Qwen3's
// and Gemma 3's; Cohere's key norm where ranks share key heads) and sums their gradients over
// the group (each rank's heads give a part).
class HeadNormImpl : public torch::nn::Cloneable<HeadNormImpl> {
 public:
  HeadNormImpl(int64_t heads, int64_t head_dim, double eps, HeadNormKind kind)
      : heads_(heads), head_dim_(head_dim), eps_(eps), kind_(kind) {
    reset();
  }
  void reset() override {
    if (kind_ == HeadNormKind::kCohere) {
      weight = register_parameter("weight", torch::ones({heads_, head_dim_}));
    } else if (kind_ == HeadNormKind::kQwen3) {
      weight = register_parameter("weight", torch::ones({head_dim_}));
    } else if (kind_ == HeadNormKind::kGemma3) {
      weight = register_parameter("weight", torch::zeros({head_dim_}));
    } else {
      norms = register_module("norms", torch::nn::ModuleList());
      for (int64_t h = 0; h < heads_; ++h) norms->push_back(HeadWeight(head_dim_));
    }
  }
  // This rank normalises heads [begin, begin + count). `whole`: Cohere's weight is held whole
  // too (the key heads of ranks that share them, LlamaAttentionImpl's whole_kv_).
  void ShardForTensorParallel(const TensorParallel& tp, int64_t begin, int64_t count, bool whole) {
    if (kind_ == HeadNormKind::kCohere && !whole) {
      KeepSlice(weight, 0, begin, count);
      return;
    }
    tp_ = tp;
    begin_ = begin;
    count_ = count;
    whole_ = true;
  }
  // product: [b, S, h * head_dim] or [b, S, h, head_dim] for this rank's h heads -> [b, S, h,
  // head_dim].
  torch::Tensor forward(const torch::Tensor& product) {
    const torch::Tensor h =
        product.reshape({product.size(0), product.size(1), -1, head_dim_}).to(torch::kFloat);
    if (kind_ == HeadNormKind::kQwen3 || kind_ == HeadNormKind::kGemma3) {
      const torch::Tensor scale = whole_ ? CopyToTensorParallel(weight, tp_) : weight;
      const torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
      const torch::Tensor normed = h * torch::rsqrt(variance + eps_);
      // Gemma3RMSNorm: (x / rms(x) * (1 + weight)) in float32, then the product's type.
      if (kind_ == HeadNormKind::kGemma3) {
        return (normed * (1.0 + scale.to(torch::kFloat))).to(product.scalar_type());
      }
      // Qwen3RMSNorm: weight * (x / rms(x)) cast back to the product's type.
      return scale * normed.to(product.scalar_type());
    }
    torch::Tensor scale = weight;
    if (kind_ == HeadNormKind::kStableLm) {
      std::vector<torch::Tensor> rows;
      for (const auto& head : *norms) rows.push_back(head->as<HeadWeightImpl>()->weight);
      scale = torch::stack(rows);
    }
    if (whole_) scale = CopyToTensorParallel(scale, tp_).narrow(0, begin_, count_);
    const torch::Tensor deviation = h - h.mean(-1, /*keepdim=*/true);
    const torch::Tensor variance = deviation.pow(2).mean(-1, /*keepdim=*/true);
    return (scale.to(torch::kFloat) * (deviation * torch::rsqrt(variance + eps_)))
        .to(product.scalar_type());
  }
  torch::Tensor weight;                  // Cohere's, Qwen3's, Gemma 3's
  torch::nn::ModuleList norms{nullptr};  // StableLM's

 private:
  int64_t heads_, head_dim_;
  double eps_;
  HeadNormKind kind_;
  TensorParallel tp_;
  // Whole weights (StableLM's always), of which this rank's heads are [begin_, begin_ + count_).
  int64_t begin_ = 0, count_ = heads_;
  bool whole_ = kind_ == HeadNormKind::kStableLm;
};
TORCH_MODULE(HeadNorm);

RmsNorm MakeNorm(const LlamaConfig& config) {
  return RmsNorm(config.hidden, config.rms_norm_eps, /*offset=*/config.OffsetNorms(),
                 /*has_weight=*/!config.LayerNormWithoutParameters(),
                 /*has_bias=*/config.LayerNormWithBias(), /*centered=*/config.Cohere());
}

// OLMo's clip_qkv on a query, key or value product; the product itself without it.
torch::Tensor ClipQkv(const torch::Tensor& product, double clip) {
  return clip > 0 ? product.clamp(-clip, clip) : product;
}

// Gemma 2's soft cap: c * tanh(x / c), or x for c = 0.
torch::Tensor SoftCap(const torch::Tensor& x, double cap) {
  return cap > 0 ? torch::tanh(x / cap) * cap : x;
}

// Causal attention of `query` [b, heads, n, head_dim] at positions [start, start + n) over
// `key` and `value` of positions [0, start + n), as transformers' eager attention computes it
// for Mistral and Gemma 2: scores divided by `divisor`, soft-capped at `cap` (0: not), the
// later positions masked and, with a `window`, those `window` or more positions earlier; the
// softmax in float32.
torch::Tensor ExplicitAttention(const torch::Tensor& query, const torch::Tensor& key,
                                const torch::Tensor& value, int64_t start, double divisor,
                                double cap, int64_t window) {
  const int64_t n = query.size(-2), total = key.size(-2);
  torch::Tensor scores = SoftCap(torch::matmul(query, key.transpose(-2, -1)) / divisor, cap);
  const torch::TensorOptions positions =
      torch::TensorOptions().dtype(torch::kLong).device(query.device());
  const torch::Tensor row = torch::arange(start, start + n, positions).unsqueeze(1);
  const torch::Tensor column = torch::arange(total, positions).unsqueeze(0);
  torch::Tensor hidden = column > row;
  if (window > 0) hidden = hidden.logical_or(column <= row - window);
  scores = scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, /*dim=*/-1, torch::kFloat).to(query.scalar_type()),
                       value);
}

// The MLP's gate activation (LlamaConfig::hidden_act); gelu_new with transformers'
// NewGELUActivation's operations in its order.
torch::Tensor Activate(const torch::Tensor& x, const std::string& activation) {
  if (activation == "gelu_new") {
    return 0.5 * x *
           (1.0 + torch::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * torch::pow(x, 3.0))));
  }
  if (activation == "gelu_pytorch_tanh") return torch::gelu(x, "tanh");
  if (activation == "gelu") return torch::gelu(x);
  if (activation == "relu2") return torch::square(torch::relu(x));  // Nemotron's
  return torch::silu(x);
}

// transformers' inverse frequencies (_compute_default_rope_parameters and, with rope scaling,
// _compute_llama3_parameters; Phi-3's LongRoPE with its long factors or its short ones), in
// float32 with the same operations.
torch::Tensor InverseFrequencies(const LlamaConfig& config, bool long_factors = false) {
  const int64_t dim = config.RotaryDim();  // the rotated features (Phi's partial rotation)
  const torch::Tensor exponents =
      torch::arange(0, dim, 2, torch::TensorOptions().dtype(torch::kLong)).to(torch::kFloat) /
      static_cast<double>(dim);
  const torch::Tensor powers = torch::pow(config.rope_theta, exponents);
  if (config.long_rope) {
    const std::vector<double>& factors =
        long_factors ? config.long_rope->long_factor : config.long_rope->short_factor;
    return 1.0 / (torch::tensor(factors, torch::kDouble).to(torch::kFloat) * powers);
  }
  torch::Tensor inv_freq = 1.0 / powers;
  if (!config.rope_scaling) return inv_freq;
  const LlamaRopeScaling& s = *config.rope_scaling;
  if (s.type == "linear") return inv_freq / s.factor;
  if (s.type == "yarn") {
    // transformers' _compute_yarn_parameters: the dimension at which a frequency turns
    // `rotations` times over the original context, the range between beta_fast's and
    // beta_slow's (floored and ceiled, within [0, dim - 1]), and a ramp over it.
    const double original = static_cast<double>(s.original_max_position_embeddings);
    const auto correction_dim = [&](double rotations) {
      return static_cast<double>(dim) * std::log(original / (rotations * 2 * kPi)) /
             (2 * std::log(config.rope_theta));
    };
    const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // as transformers avoids the singularity
    const torch::Tensor ramp =
        ((torch::arange(dim / 2, torch::TensorOptions().dtype(torch::kFloat)) - low) / (high - low))
            .clamp(0, 1);
    const torch::Tensor extrapolation = 1 - ramp;
    const torch::Tensor interpolation = 1.0 / (s.factor * powers);
    return interpolation * (1 - extrapolation) + inv_freq * extrapolation;
  }
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const torch::Tensor wavelen = 2 * kPi / inv_freq;
  torch::Tensor scaled =
      torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const torch::Tensor smooth =
      (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const torch::Tensor medium =
      (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

// The rotary settings of block `block` (0-based): Gemma 3's local blocks turn at
// rope_local_base_freq without scaling (transformers' rotary_emb_local); every other block at
// the config's.
LlamaConfig RotaryConfigOfBlock(LlamaConfig config, int64_t block) {
  if (config.LocalBlock(block) && config.rope_local_theta > 0) {
    config.rope_theta = config.rope_local_theta;
    config.rope_scaling.reset();
  }
  return config;
}

// x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] for the halves x1, x2; with
// `interleaved` GPT-J's rotate_every_two instead, [-x1, x0, -x3, x2, ...] for the pairs of
// neighbours (cos and sin then hold each angle twice in a row). With cos and sin narrower than
// x (partial rotation), x's first features by them, the others as they are.
torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     bool interleaved = false) {
  const int64_t turned = cos.size(-1), features = x.size(-1);
  if (turned < features) {
    return torch::cat({Rotate(x.narrow(-1, 0, turned), cos, sin, interleaved),
                       x.narrow(-1, turned, features - turned)},
                      -1);
  }
  if (interleaved) {
    using torch::indexing::Slice;
    const torch::Tensor even = x.index({"...", Slice(0, torch::indexing::None, 2)});
    const torch::Tensor odd = x.index({"...", Slice(1, torch::indexing::None, 2)});
    return x * cos + torch::stack({-odd, even}, -1).flatten(-2) * sin;
  }
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

void InitNormal(torch::Tensor& weight, torch::Tensor& bias, double std) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(weight, /*mean=*/0.0, std);
  if (bias.defined()) torch::nn::init::zeros_(bias);
}

// An embedding of `rows` x `hidden` with transformers' padding row (zero, no gradient), if any.
torch::nn::Embedding MakeEmbedding(int64_t rows, int64_t hidden, std::optional<int64_t> padding) {
  torch::nn::EmbeddingOptions options(rows, hidden);
  if (padding) options.padding_idx(*padding);
  return torch::nn::Embedding(options);
}

// Layer 0: the token embedding.
class LlamaEmbeddingImpl : public torch::nn::Cloneable<LlamaEmbeddingImpl>,
                           public IncrementalLayer {
 public:
  explicit LlamaEmbeddingImpl(const LlamaConfig& config)
      : config_(config), pad_(config.pad_token_id) {
    reset();
  }

  void reset() override {
    embed_tokens =
        register_module("embed_tokens", MakeEmbedding(config_.vocab, config_.hidden, pad_));
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(embed_tokens->weight, 0.0, config_.init_std);
    if (pad_) embed_tokens->weight[*pad_].zero_();
  }

  // This rank's vocabulary rows.
  void ShardForTensorParallel(const TensorParallel& tp) {
    const int64_t rows = tp.ShardSize(config_.vocab), begin = tp.ShardBegin(config_.vocab);
    std::optional<int64_t> padding;
    if (pad_ && *pad_ >= begin && *pad_ < begin + rows) padding = *pad_ - begin;
    torch::nn::Embedding shard = MakeEmbedding(rows, config_.hidden, padding);
    {
      torch::NoGradGuard no_grad;
      shard->weight.copy_(embed_tokens->weight.narrow(0, begin, rows));
    }
    embed_tokens = replace_module("embed_tokens", shard);
    tp_ = tp;
  }

  torch::Tensor forward(const torch::Tensor& ids) { return Scaled(Lookup(ids)); }

  torch::Tensor ForwardIncremental(const torch::Tensor& ids, int64_t /*start*/,
                                   KeyValueCache& /*cache*/) override {
    if (tp_.enabled()) throw std::logic_error("llama: incremental decoding of a shard");
    return Scaled(embed_tokens(ids));
  }

  torch::nn::Embedding embed_tokens{nullptr};

 private:
  // Gemma's embedding output times sqrt(hidden), the factor rounded to the output's type (as
  // transformers' normalizer); Granite's times embedding_multiplier.
  torch::Tensor Scaled(const torch::Tensor& x) const {
    if (config_.embedding_multiplier != 1.0) return x * config_.embedding_multiplier;
    if (!config_.Gemma()) return x;
    return x * torch::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden)), x.options());
  }

  torch::Tensor Lookup(const torch::Tensor& ids) {
    if (!tp_.enabled()) return embed_tokens(ids);
    // Ids outside this rank's rows look up zeros; the sum over the group is the full lookup.
    const int64_t rows = embed_tokens->weight.size(0);
    const torch::Tensor local = ids - tp_.ShardBegin(config_.vocab);
    const torch::Tensor mine = local.ge(0).logical_and(local.lt(rows));
    const torch::Tensor found = embed_tokens(local.clamp(0, rows - 1)) *
                                mine.unsqueeze(-1).to(embed_tokens->weight.scalar_type());
    // Under sequence parallelism summed and split along the sequence at once.
    if (tp_.sequence_split()) return ReduceScatterToSequenceParallel(found, tp_);
    return ReduceFromTensorParallel(found, tp_);
  }

  LlamaConfig config_;
  std::optional<int64_t> pad_;
  TensorParallel tp_;
};
TORCH_MODULE(LlamaEmbedding);

// self_attn: q/k/v_proj column-parallel (this rank's query and key/value heads), o_proj
// row-parallel.
class LlamaAttentionImpl : public torch::nn::Cloneable<LlamaAttentionImpl> {
 public:
  // `window`: the block's sliding window (LlamaConfig::WindowOfBlock), 0 for none.
  LlamaAttentionImpl(const LlamaConfig& config, int64_t window) : config_(config), window_(window) {
    reset();
  }

  void reset() override {
    const int64_t hidden = config_.hidden, head_dim = config_.HeadDim();
    const bool bias = config_.QkvBias();
    if (config_.FusedQkv()) {
      // GPT-NeoX's and Falcon's: each key/value group's query rows, then its key and value
      // rows, so that a rank's groups are contiguous rows; dense for o_proj.
      query_key_value = register_module(
          "query_key_value",
          ColumnParallelLinear(hidden, (config_.heads + 2 * config_.kv_heads) * head_dim, bias));
      o_proj = register_module(
          ModuleNamesOf(config_).out_proj,
          RowParallelLinear(config_.heads * head_dim, hidden, config_.attention_bias));
      InitNormal(query_key_value->weight, query_key_value->bias, config_.init_std);
      InitNormal(o_proj->weight, o_proj->bias, config_.init_std);
      return;
    }
    q_proj = register_module("q_proj",
                             ColumnParallelLinear(hidden, config_.heads * head_dim, bias));
    k_proj = register_module("k_proj",
                             ColumnParallelLinear(hidden, config_.kv_heads * head_dim, bias));
    v_proj = register_module("v_proj",
                             ColumnParallelLinear(hidden, config_.kv_heads * head_dim, bias));
    o_proj = register_module(
        ModuleNamesOf(config_).out_proj,
        RowParallelLinear(config_.heads * head_dim, hidden, config_.attention_bias));
    if (config_.QkNorms()) {
      // OLMoE's: over the whole query and key products, every head together.
      q_norm = register_module("q_norm", RmsNorm(config_.heads * head_dim, config_.rms_norm_eps));
      k_norm =
          register_module("k_norm", RmsNorm(config_.kv_heads * head_dim, config_.rms_norm_eps));
    }
    if (config_.HeadNorms()) {
      // Cohere's, StableLM's, Qwen3's and Gemma 3's: each head apart.
      const bool stablelm = config_.StableLm();
      const HeadNormKind kind = stablelm           ? HeadNormKind::kStableLm
                                : config_.Qwen3()  ? HeadNormKind::kQwen3
                                : config_.Gemma3() ? HeadNormKind::kGemma3
                                                   : HeadNormKind::kCohere;
      q_head_norm = register_module(stablelm ? "q_layernorm" : "q_norm",
                                    HeadNorm(config_.heads, head_dim, config_.rms_norm_eps, kind));
      k_head_norm =
          register_module(stablelm ? "k_layernorm" : "k_norm",
                          HeadNorm(config_.kv_heads, head_dim, config_.rms_norm_eps, kind));
    }
    InitNormal(q_proj->weight, q_proj->bias, config_.init_std);
    InitNormal(k_proj->weight, k_proj->bias, config_.init_std);
    InitNormal(v_proj->weight, v_proj->bias, config_.init_std);
    InitNormal(o_proj->weight, o_proj->bias, config_.init_std);
  }

  absl::Status ShardForTensorParallel(const TensorParallel& tp) {
    const int64_t heads = config_.heads, kv_heads = config_.kv_heads;
    whole_kv_ = !config_.FusedQkv() && tp.enabled() && kv_heads % tp.size != 0;
    if (config_.FusedQkv()) {
      TANDEM_RETURN_IF_ERROR(query_key_value->ShardForTensorParallel(tp));
    } else if (whole_kv_) {
      // Fewer key/value heads than ranks, or a number the degree does not divide: k_proj and
      // v_proj stay whole on every rank, which computes the heads its query heads read.
      TANDEM_RETURN_IF_ERROR(q_proj->ShardForTensorParallel(tp));
      const int64_t group = heads / kv_heads, first = tp.ShardBegin(heads);
      const int64_t count = tp.ShardSize(heads);
      kv_begin_ = first / group;
      kv_end_ = (first + count - 1) / group + 1;
      kv_of_head_.clear();
      for (int64_t h = first; h < first + count; ++h) kv_of_head_.push_back(h / group - kv_begin_);
    } else {
      for (ColumnParallelLinear* column : {&q_proj, &k_proj, &v_proj}) {
        TANDEM_RETURN_IF_ERROR((*column)->ShardForTensorParallel(tp));
      }
    }
    TANDEM_RETURN_IF_ERROR(o_proj->ShardForTensorParallel(tp));
    if (config_.QkNorms()) {
      // Each rank's norm weights are those of its heads' features (q/k_proj's rows).
      const int64_t query = config_.heads * config_.HeadDim();
      const int64_t key = config_.kv_heads * config_.HeadDim();
      KeepSlice(q_norm->weight, 0, tp.ShardBegin(query), tp.ShardSize(query));
      KeepSlice(k_norm->weight, 0, tp.ShardBegin(key), tp.ShardSize(key));
    }
    if (config_.HeadNorms()) {
      q_head_norm->ShardForTensorParallel(tp, tp.ShardBegin(heads), tp.ShardSize(heads),
                                          /*whole=*/false);
      if (whole_kv_) {
        k_head_norm->ShardForTensorParallel(tp, kv_begin_, kv_end_ - kv_begin_, /*whole=*/true);
      } else {
        k_head_norm->ShardForTensorParallel(tp, tp.ShardBegin(kv_heads), tp.ShardSize(kv_heads),
                                            /*whole=*/false);
      }
    }
    tp_ = tp;
    return absl::OkStatus();
  }

  // x: the normalised input [b, S, hidden]; cos, sin: [S, head_dim].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    // One CopyToTensorParallel for the three products: one all-reduce backward. o_proj sums
    // its partial products over the group, then adds its whole bias.
    return o_proj(Attend(CopyToTensorParallel(x, tp_), cos, sin));
  }

  // This rank's heads attended, [b, S, local heads * head_dim], before o_proj: `input` is the
  // whole normalised sequence as the group's products take it (copied), or with
  // `sequence_split` this rank's S/t tokens of it, which the products gather (keeping only
  // these for the backward: LinearsOverGatheredSequence).
  torch::Tensor Attend(const torch::Tensor& input, const torch::Tensor& cos,
                       const torch::Tensor& sin, bool sequence_split = false) {
    const int64_t batch = input.size(0), head_dim = config_.HeadDim();
    const int64_t length = input.size(1) * (sequence_split ? tp_.size : 1);
    const int64_t heads = config_.heads / tp_.size;
    const int64_t kv_heads = whole_kv_ ? kv_end_ - kv_begin_ : config_.kv_heads / tp_.size;
    std::vector<torch::Tensor> products = Project(input, sequence_split, heads);
    NormaliseQueryAndKey(products);
    for (torch::Tensor& product : products) product = ClipQkv(product, config_.clip_qkv);
    const auto heads_of = [&](const torch::Tensor& product, int64_t count) {
      return HeadsOf(product, batch, length, count);
    };
    const bool pairs = config_.InterleavedRotary();
    const torch::Tensor query = Rotate(heads_of(products[0], heads), cos, sin, pairs);
    torch::Tensor key = Rotate(heads_of(products[1], kv_heads), cos, sin, pairs);
    torch::Tensor value = heads_of(products[2], kv_heads);
    if (whole_kv_) {  // each query head's key/value head among those this rank computed
      if (!kv_index_.defined() || kv_index_.device() != key.device()) {
        kv_index_ = torch::tensor(kv_of_head_, torch::kLong).to(key.device());
      }
      key = key.index_select(1, kv_index_);
      value = value.index_select(1, kv_index_);
    } else if (heads != kv_heads) {  // grouped-query attention: each key/value head serves a group
      const int64_t group = heads / kv_heads;
      key = key.unsqueeze(2).expand({batch, kv_heads, group, length, head_dim})
                .reshape({batch, heads, length, head_dim});
      value = value.unsqueeze(2).expand({batch, kv_heads, group, length, head_dim})
                  .reshape({batch, heads, length, head_dim});
    }
    // A window shorter than the sequence, or a soft cap, is computed explicitly.
    const bool windowed = window_ > 0 && length > window_;
    const torch::Tensor attended =
        config_.attn_logit_softcapping > 0 || windowed
            ? ExplicitAttention(query, key, value, /*start=*/0, config_.ScoreDivisor(),
                                config_.attn_logit_softcapping, window_)
            : CausalSelfAttention(query, key, value, config_.ScoreDivisor(), Fused(config_));
    return attended.transpose(1, 2).reshape({batch, length, heads * head_dim});
  }

  // forward() (whole, not sharded) for positions [start, start + n) with cos, sin [n,
  // head_dim] of those positions; the cache keeps the kv_heads rotated keys and values.
  torch::Tensor ForwardIncremental(const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin, int64_t start,
                                   KeyValueCache& cache) {
    if (tp_.enabled()) throw std::logic_error("llama: incremental decoding of a shard");
    const int64_t batch = x.size(0), length = x.size(1), head_dim = config_.HeadDim();
    const int64_t heads = config_.heads, kv_heads = config_.kv_heads;
    std::vector<torch::Tensor> products = Project(x, /*sequence_split=*/false, heads);
    NormaliseQueryAndKey(products);
    const auto heads_of = [&](const torch::Tensor& product, int64_t count) {
      return HeadsOf(ClipQkv(product, config_.clip_qkv), batch, length, count);
    };
    const bool pairs = config_.InterleavedRotary();
    const torch::Tensor query = Rotate(heads_of(products[0], heads), cos, sin, pairs);
    auto [key, value] = cache.Append(Rotate(heads_of(products[1], kv_heads), cos, sin, pairs),
                                     heads_of(products[2], kv_heads));
    if (heads != kv_heads) {
      const int64_t group = heads / kv_heads, total = key.size(2);
      key = key.unsqueeze(2).expand({batch, kv_heads, group, total, head_dim})
                .reshape({batch, heads, total, head_dim});
      value = value.unsqueeze(2).expand({batch, kv_heads, group, total, head_dim})
                  .reshape({batch, heads, total, head_dim});
    }
    const bool windowed = window_ > 0 && start + length > window_;
    const torch::Tensor attended =
        config_.attn_logit_softcapping > 0 || windowed
            ? ExplicitAttention(query, key, value, start, config_.ScoreDivisor(),
                                config_.attn_logit_softcapping, window_)
            : CachedCausalAttention(query, key, value, start, config_.ScoreDivisor());
    return o_proj(attended.transpose(1, 2).reshape({batch, length, heads * head_dim}));
  }

  ColumnParallelLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};
  ColumnParallelLinear query_key_value{nullptr};  // GPT-NeoX's instead of q/k/v_proj
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  // OLMoE's (QkNorms)
  HeadNorm q_head_norm{nullptr}, k_head_norm{nullptr};  // Cohere's, StableLM's, Qwen3's, Gemma 3's
  RowParallelLinear o_proj{nullptr};

 private:
  // The query, key and value products of `input` (this rank's `heads` query heads): [b, S,
  // heads * head_dim] each, or from GPT-NeoX's and Falcon's one product [b, S, heads or
  // groups, head_dim] views of its rows per key/value group. `sequence_split` as Attend's.
  std::vector<torch::Tensor> Project(const torch::Tensor& input, bool sequence_split,
                                     int64_t heads) {
    if (config_.FusedQkv()) {
      const torch::Tensor product =
          sequence_split ? LinearsOverGatheredSequence(input, {query_key_value->weight},
                                                       {query_key_value->bias}, tp_)[0]
                         : DeferrableLinear(input, query_key_value->weight, query_key_value->bias);
      const int64_t head_dim = config_.HeadDim();
      const int64_t group = config_.heads / config_.kv_heads, groups = heads / group;
      const int64_t batch = product.size(0), length = product.size(1);
      const torch::Tensor per_group = product.view({batch, length, groups, (group + 2) * head_dim});
      return {per_group.narrow(-1, 0, group * head_dim).reshape({batch, length, heads, head_dim}),
              per_group.narrow(-1, group * head_dim, head_dim),
              per_group.narrow(-1, (group + 1) * head_dim, head_dim)};
    }
    std::vector<torch::Tensor> weights = {q_proj->weight, k_proj->weight, v_proj->weight};
    std::vector<torch::Tensor> biases = {q_proj->bias, k_proj->bias, v_proj->bias};
    if (whole_kv_) {
      // This rank's key/value heads of the whole k_proj and v_proj, whose gradients are summed
      // over the group (one all-reduce): each rank's query heads give a part.
      const int64_t head_dim = config_.HeadDim();
      std::vector<torch::Tensor> kv = CopyToTensorParallel(
          std::vector<torch::Tensor>{weights[1], weights[2], biases[1], biases[2]}, tp_);
      for (torch::Tensor& t : kv) {
        if (t.defined()) t = t.narrow(0, kv_begin_ * head_dim, (kv_end_ - kv_begin_) * head_dim);
      }
      weights[1] = kv[0];
      weights[2] = kv[1];
      biases[1] = kv[2];
      biases[2] = kv[3];
    }
    if (sequence_split) return LinearsOverGatheredSequence(input, weights, biases, tp_);
    std::vector<torch::Tensor> products;
    for (int i = 0; i < 3; ++i) products.push_back(DeferrableLinear(input, weights[i], biases[i]));
    return products;
  }

  // A product's `count` heads, [b, count, S, head_dim] (Project's per-head views as they are).
  torch::Tensor HeadsOf(const torch::Tensor& product, int64_t batch, int64_t length,
                        int64_t count) const {
    const torch::Tensor split =
        product.dim() == 4 ? product : product.view({batch, length, count, config_.HeadDim()});
    return split.transpose(1, 2);
  }

  // OLMoE's q_norm and k_norm on the query and key products (before the clamp); none
  // elsewhere. Each normalises every head together: under tensor parallelism a rank holds
  // its heads' features, and the sum of squares is summed over the group.
  void NormaliseQueryAndKey(std::vector<torch::Tensor>& products) {
    if (config_.HeadNorms()) {  // each head apart (HeadNorm): [b, S, heads, head_dim]
      products[0] = q_head_norm(products[0]);
      products[1] = k_head_norm(products[1]);
      return;
    }
    if (!config_.QkNorms()) return;
    if (!tp_.enabled()) {
      products[0] = q_norm(products[0]);
      products[1] = k_norm(products[1]);
      return;
    }
    products[0] = q_norm->NormalizeSplit(products[0], config_.heads * config_.HeadDim(), tp_);
    products[1] = k_norm->NormalizeSplit(products[1], config_.kv_heads * config_.HeadDim(), tp_);
  }

  LlamaConfig config_;
  int64_t window_;
  TensorParallel tp_;
  // Under tensor parallelism with key/value heads the degree does not divide: k_proj and v_proj
  // whole on every rank, this rank's query heads reading heads [kv_begin_, kv_end_), query head
  // i the kv_of_head_[i]-th of them (kv_index_ on the products' device).
  bool whole_kv_ = false;
  int64_t kv_begin_ = 0, kv_end_ = 0;
  std::vector<int64_t> kv_of_head_;
  torch::Tensor kv_index_;
};
TORCH_MODULE(LlamaAttention);

// mlp: down_proj(act(gate_proj(x)) * up_proj(x)) with act silu (Llama) or GELU (Gemma), gate
// and up column-parallel, down row-parallel; StarCoder 2's c_proj(act(c_fc(x))), Phi's
// fc2(act(fc1(x))), GPT-NeoX's dense_4h_to_h(act(dense_h_to_4h(x))).
class LlamaMlpImpl : public torch::nn::Cloneable<LlamaMlpImpl> {
 public:
  explicit LlamaMlpImpl(const LlamaConfig& config) : config_(config) { reset(); }

  void reset() override {
    const int64_t hidden = config_.hidden, units = config_.intermediate;
    const bool bias = config_.mlp_bias;
    if (config_.PlainMlp()) {
      // StarCoder 2's c_fc, then c_proj (Phi's fc1, fc2); no gate (gate_proj holds c_fc,
      // up_proj is none).
      const ModuleNames names = ModuleNamesOf(config_);
      gate_proj = register_module(names.mlp_up, ColumnParallelLinear(hidden, units, bias));
      down_proj = register_module(names.mlp_down, RowParallelLinear(units, hidden, bias));
    } else {
      gate_proj = register_module("gate_proj", ColumnParallelLinear(hidden, units, bias));
      up_proj = register_module("up_proj", ColumnParallelLinear(hidden, units, bias));
      down_proj = register_module("down_proj", RowParallelLinear(units, hidden, bias));
    }
    InitNormal(gate_proj->weight, gate_proj->bias, config_.init_std);
    if (!up_proj.is_empty()) InitNormal(up_proj->weight, up_proj->bias, config_.init_std);
    InitNormal(down_proj->weight, down_proj->bias, config_.init_std);
  }

  absl::Status ShardForTensorParallel(const TensorParallel& tp) {
    TANDEM_RETURN_IF_ERROR(gate_proj->ShardForTensorParallel(tp));
    if (!up_proj.is_empty()) TANDEM_RETURN_IF_ERROR(up_proj->ShardForTensorParallel(tp));
    TANDEM_RETURN_IF_ERROR(down_proj->ShardForTensorParallel(tp));
    tp_ = tp;
    return absl::OkStatus();
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return down_proj(Units(CopyToTensorParallel(x, tp_)));  // one all-reduce backward
  }

  // This rank's units act(gate) * up of the whole sequence `input` (copied), or with
  // `sequence_split` of this rank's S/t tokens gathered (as Attend).
  torch::Tensor Units(const torch::Tensor& input, bool sequence_split = false) {
    if (config_.PlainMlp()) {
      const torch::Tensor product =
          sequence_split
              ? LinearsOverGatheredSequence(input, {gate_proj->weight}, {gate_proj->bias}, tp_)[0]
              : DeferrableLinear(input, gate_proj->weight, gate_proj->bias);
      return Activate(product, config_.hidden_act);
    }
    if (sequence_split) {
      const std::vector<torch::Tensor> products = LinearsOverGatheredSequence(
          input, {gate_proj->weight, up_proj->weight}, {gate_proj->bias, up_proj->bias}, tp_);
      return Activate(products[0], config_.hidden_act) * products[1];
    }
    const torch::Tensor gate = DeferrableLinear(input, gate_proj->weight, gate_proj->bias);
    const torch::Tensor up = DeferrableLinear(input, up_proj->weight, up_proj->bias);
    return Activate(gate, config_.hidden_act) * up;
  }

  ColumnParallelLinear gate_proj{nullptr}, up_proj{nullptr};
  RowParallelLinear down_proj{nullptr};

 private:
  LlamaConfig config_;
  TensorParallel tp_;
};
TORCH_MODULE(LlamaMlp);

// An expert (transformers' MixtralBlockSparseTop2MLP, Qwen2MoeMLP): down(act(gate x) * up x) of
// `units` units, no biases; named w1, w3 and w2 (Mixtral) or gate_proj, up_proj and down_proj
// (Qwen2-MoE). gate and up are split by units under tensor parallelism, down by its inputs (its
// partial product is summed over the group by the mixture, once for all experts).
class LlamaExpertImpl : public torch::nn::Cloneable<LlamaExpertImpl> {
 public:
  LlamaExpertImpl(const LlamaConfig& config, int64_t units) : config_(config), units_(units) {
    reset();
  }

  void reset() override {
    const int64_t hidden = config_.hidden;
    const bool mixtral = config_.MixtralExperts();  // Mixtral's names: w1, w2, w3
    // Registered in the order of transformers' state dict.
    gate = register_module(mixtral ? "w1" : "gate_proj",
                           ColumnParallelLinear(hidden, units_, /*bias=*/false));
    if (mixtral) down = register_module("w2", RowParallelLinear(units_, hidden, /*bias=*/false));
    up = register_module(mixtral ? "w3" : "up_proj",
                         ColumnParallelLinear(hidden, units_, /*bias=*/false));
    if (!mixtral) {
      down = register_module("down_proj", RowParallelLinear(units_, hidden, /*bias=*/false));
    }
    for (torch::Tensor* weight : {&gate->weight, &up->weight, &down->weight}) {
      torch::Tensor none;
      InitNormal(*weight, none, config_.init_std);
    }
  }

  absl::Status ShardForTensorParallel(const TensorParallel& tp) {
    TANDEM_RETURN_IF_ERROR(gate->ShardForTensorParallel(tp));
    TANDEM_RETURN_IF_ERROR(up->ShardForTensorParallel(tp));
    return down->ShardForTensorParallel(tp);
  }

  // Keeps units [begin, begin + count) of this rank's (expert parallelism: all of an expert
  // this rank's part of the group holds, split further over that part, or none).
  void KeepUnits(int64_t begin, int64_t count) {
    KeepSlice(gate->weight, 0, begin, count);
    KeepSlice(up->weight, 0, begin, count);
    KeepSlice(down->weight, 1, begin, count);
  }

  // This rank's part of the expert's output for `tokens` [n, hidden] (the whole output without
  // tensor parallelism).
  torch::Tensor Partial(const torch::Tensor& tokens) {
    const torch::Tensor g = DeferrableLinear(tokens, gate->weight, {});
    const torch::Tensor u = DeferrableLinear(tokens, up->weight, {});
    return DeferrableLinear(Activate(g, config_.hidden_act) * u, down->weight, {});
  }

  ColumnParallelLinear gate{nullptr}, up{nullptr};
  RowParallelLinear down{nullptr};

 private:
  LlamaConfig config_;
  int64_t units_;
};
TORCH_MODULE(LlamaExpert);

// A product whose weight every rank holds whole, applied to the whole sequence (its own
// tokens under sequence parallelism, the products then gathered), whose output's gradient the
// rank's expert shards give a part of: summed over the group (by the gather's reduce-scatter,
// else by a copy's all-reduce) before it reaches the weight and the input.
torch::Tensor WholeOverTheGroup(const torch::Tensor& x, const torch::Tensor& weight,
                                const TensorParallel& tp) {
  if (tp.sequence_split()) {
    return GatherFromSequenceParallel(
        DeferrableLinear(x, SharedOverTheSequence({weight}, tp)[0], {}), tp);
  }
  return CopyToTensorParallel(DeferrableLinear(x, weight, {}), tp);
}

// A mixture of experts in place of the MLP (transformers' MixtralSparseMoeBlock and
// Qwen2MoeSparseMoeBlock, see llama.h): gate routes, experts.<e> compute, and Qwen2-MoE's
// shared_expert, scaled by sigmoid(shared_expert_gate x), adds to every token.
class LlamaMoeImpl : public torch::nn::Cloneable<LlamaMoeImpl> {
 public:
  explicit LlamaMoeImpl(const LlamaConfig& config) : config_(config) { reset(); }

  void reset() override {
    // The router: a product without bias, whole on every rank.
    gate = register_module("gate", ColumnParallelLinear(config_.hidden, config_.experts,
                                                        /*bias=*/false));
    torch::Tensor none;
    InitNormal(gate->weight, none, config_.init_std);
    experts = register_module("experts", torch::nn::ModuleList());
    for (int64_t e = 0; e < config_.experts; ++e) {
      experts->push_back(LlamaExpert(config_, config_.ExpertUnits()));
    }
    if (config_.shared_expert_intermediate > 0) {
      shared_expert = register_module("shared_expert",
                                      LlamaExpert(config_, config_.shared_expert_intermediate));
      shared_expert_gate = register_module("shared_expert_gate",
                                           ColumnParallelLinear(config_.hidden, 1, /*bias=*/false));
      InitNormal(shared_expert_gate->weight, none, config_.init_std);
    }
  }

  absl::Status ShardForTensorParallel(const TensorParallel& tp) {
    // Expert parallelism: part p of the group (its t / ep consecutive ranks) holds experts
    // [p, p + 1) x experts / ep, each split over the part's ranks.
    const int64_t ep = std::max(1, tp.expert_parallel), across = tp.size / ep;
    const int64_t held = config_.experts / ep, part = tp.rank / across;
    const int64_t units = config_.ExpertUnits() / across;
    first_of_part_ = part * held;
    end_of_part_ = first_of_part_ + held;
    first_held_ = first_of_part_;
    end_held_ = end_of_part_;
    if (tp.experts_over_replicas()) {
      // Expert parallelism across replicas: replica j holds the j-th run of the part's.
      const int64_t replicas = tp.expert_replicas;
      if (held % replicas != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(held, " experts", ep > 1 ? " per part of the tensor-parallel group" : "",
                         " do not spread evenly over ", replicas, " data-parallel replicas"));
      }
      if (tp.expert_group == nullptr || tp.expert_group->size() != replicas ||
          tp.expert_group->rank() != tp.expert_replica) {
        return absl::InvalidArgumentError(absl::StrCat("experts spread over ", replicas,
                                                       " replicas (this one ", tp.expert_replica,
                                                       ") without a matching communicator"));
      }
      first_held_ = first_of_part_ + tp.expert_replica * (held / replicas);
      end_held_ = first_held_ + held / replicas;
    }
    for (int64_t e = 0; e < config_.experts; ++e) {
      const bool mine = e >= first_held_ && e < end_held_;
      experts[e]->as<LlamaExpertImpl>()->KeepUnits(mine ? (tp.rank % across) * units : 0,
                                                   mine ? units : 0);
    }
    if (!shared_expert.is_empty()) {
      TANDEM_RETURN_IF_ERROR(shared_expert->ShardForTensorParallel(tp));
    }
    tp_ = tp;
    return absl::OkStatus();
  }

  // x [b, S, hidden] (this rank's [b, S/t, hidden] under sequence parallelism) -> the same
  // shape.
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t hidden = config_.hidden, count = config_.experts;
    // The router's scores and the experts' input, the whole sequence on every rank.
    const torch::Tensor scores = WholeOverTheGroup(x, gate->weight, tp_);
    const torch::Tensor input =
        tp_.sequence_split() ? GatherFromSequenceParallel(x, tp_) : CopyToTensorParallel(x, tp_);
    const torch::Tensor tokens = input.reshape({-1, hidden});
    // The best experts_per_token experts of each token, their softmax probabilities (float32),
    // renormalised where the family does so, in the input's type.
    const torch::Tensor probabilities =
        torch::softmax(scores.reshape({-1, count}), /*dim=*/1, torch::kFloat);
    auto [weights, selected] = probabilities.topk(config_.experts_per_token, /*dim=*/-1);
    if (config_.normalize_top_k) weights = weights / weights.sum(-1, /*keepdim=*/true);
    weights = weights.to(tokens.scalar_type());
    torch::Tensor output = torch::zeros({tokens.size(0), hidden}, tokens.options());
    // The (token, choice) pairs sorted by expert (stably: by token within one), and each
    // expert's count, read on the host once for all experts (a host sync per block, not per
    // expert). The experts this rank holds are one run of them (expert parallelism), or all.
    const torch::Tensor flat = selected.reshape({-1});  // pair i: token i / k, choice i % k
    const torch::Tensor order =
        std::get<1>(flat.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
    const torch::Tensor counts = torch::bincount(flat, {}, count).to(torch::kCPU);
    if (tp_.experts_over_replicas()) {
      AddExpertsOverReplicas(tokens, weights, order, counts, output);
    } else {
      AddHeldExperts(tokens, weights, order, counts, output);
    }
    if (!shared_expert.is_empty()) {
      const torch::Tensor scale =
          torch::sigmoid(WholeOverTheGroup(x, shared_expert_gate->weight, tp_).reshape({-1, 1}));
      output = output + scale * shared_expert->Partial(tokens);
    }
    output = output.view(input.sizes());
    output = tp_.sequence_split() ? ReduceScatterToSequenceParallel(output, tp_)
                                  : ReduceFromTensorParallel(output, tp_);
    if (config_.router_aux_loss_coef > 0 && torch::GradMode::is_enabled()) {
      // Every rank of the group computes it from the same scores, whose gradient the group
      // sums: each adds 1 / t of it.
      const torch::Tensor balance = BalancingLoss(probabilities, selected);
      output = AddAuxiliaryLoss(output, balance * (config_.router_aux_loss_coef *
                                                   CurrentAuxiliaryLossScale() / tp_.size));
    }
    return output;
  }

  // Adds the outputs of the experts this rank holds, each weighted, for this rank's tokens
  // `tokens` [n, hidden] to `output`. `order`: the (token, choice) pairs i (token i / k,
  // choice i % k) sorted by expert; `counts` (on the CPU): each expert's pairs.
  void AddHeldExperts(const torch::Tensor& tokens, const torch::Tensor& weights,
                      const torch::Tensor& order, const torch::Tensor& counts,
                      torch::Tensor& output) {
    const int64_t k = config_.experts_per_token;
    const int64_t* routed = counts.data_ptr<int64_t>();
    const int64_t first = first_held_, end = end_held_ < 0 ? config_.experts : end_held_;
    int64_t begin = 0, held = 0;
    for (int64_t e = 0; e < first; ++e) begin += routed[e];
    for (int64_t e = first; e < end; ++e) held += routed[e];
    const torch::Tensor pairs = order.narrow(0, begin, held);
    const torch::Tensor token = pairs.div(k, "floor");
    // Split, not narrowed: a split's backward concatenates the parts' gradients once, where
    // each narrow's would write a zero tensor of the whole size.
    const std::vector<int64_t> sizes(routed + first, routed + end);
    const std::vector<torch::Tensor> routed_tokens =
        tokens.index_select(0, token).split_with_sizes(sizes);
    const std::vector<torch::Tensor> routed_weights =
        weights.reshape({-1}).index_select(0, pairs).unsqueeze(-1).split_with_sizes(sizes);
    const std::vector<torch::Tensor> routed_to = token.split_with_sizes(sizes);
    for (int64_t e = first; e < end; ++e) {
      // With no token routed too: its gradient is then zero, as transformers' is.
      const size_t i = static_cast<size_t>(e - first);
      const torch::Tensor part =
          experts[e]->as<LlamaExpertImpl>()->Partial(routed_tokens[i]) * routed_weights[i];
      output.index_add_(0, routed_to[i], part.to(output.scalar_type()));
    }
  }

  // AddHeldExperts when the experts are spread over replicas: this rank's pairs for the
  // experts of its part of the group go to the replicas holding them (each replica's run of
  // experts is one run of the sorted pairs), every replica's pairs for this rank's experts
  // come here, and the experts' outputs go back the same way, weighted where the tokens are.
  void AddExpertsOverReplicas(const torch::Tensor& tokens, const torch::Tensor& weights,
                              const torch::Tensor& order, const torch::Tensor& counts,
                              torch::Tensor& output) {
    const int64_t k = config_.experts_per_token, count = config_.experts;
    const int replicas = tp_.expert_replicas;
    const int64_t per_replica = (end_of_part_ - first_of_part_) / replicas;
    const int64_t* mine = counts.data_ptr<int64_t>();
    int64_t begin = 0;
    for (int64_t e = 0; e < first_of_part_; ++e) begin += mine[e];
    std::vector<int64_t> send(replicas, 0), receive(replicas, 0);
    for (int j = 0; j < replicas; ++j) {
      for (int64_t e = first_of_part_ + j * per_replica; e < first_of_part_ + (j + 1) * per_replica;
           ++e) {
        send[j] += mine[e];
      }
    }
    // Every replica's counts: what arrives from each, for each expert held here.
    const torch::Tensor all = GatherExpertCounts(counts, tokens.device(), tp_);
    const int64_t* routed = all.data_ptr<int64_t>();  // [replica * count + expert]
    std::vector<int64_t> arrival(replicas, 0);        // where replica s's rows start
    int64_t arrived_rows = 0;
    for (int s = 0; s < replicas; ++s) {
      arrival[s] = arrived_rows;
      for (int64_t e = first_held_; e < end_held_; ++e) receive[s] += routed[s * count + e];
      arrived_rows += receive[s];
    }
    int64_t sent_rows = 0;
    for (int64_t rows : send) sent_rows += rows;
    const torch::Tensor pairs = order.narrow(0, begin, sent_rows);
    const torch::Tensor token = pairs.div(k, "floor");
    const torch::Tensor arrived =
        ExchangeExpertRows(tokens.index_select(0, token), send, receive, tp_);
    // The arrived rows by expert (by replica, then as sent, within one), and back.
    std::vector<int64_t> by_expert, sizes;
    by_expert.reserve(static_cast<size_t>(arrived_rows));
    std::vector<int64_t> at = arrival;
    for (int64_t e = first_held_; e < end_held_; ++e) {
      int64_t size = 0;
      for (int s = 0; s < replicas; ++s) {
        const int64_t rows = routed[s * count + e];
        for (int64_t r = 0; r < rows; ++r) by_expert.push_back(at[s] + r);
        at[s] += rows;
        size += rows;
      }
      sizes.push_back(size);
    }
    std::vector<int64_t> back(by_expert.size());
    for (size_t i = 0; i < by_expert.size(); ++i) {
      back[static_cast<size_t>(by_expert[i])] = static_cast<int64_t>(i);
    }
    const torch::Device device = tokens.device();
    const std::vector<torch::Tensor> grouped =
        arrived.index_select(0, torch::tensor(by_expert, torch::kLong).to(device))
            .split_with_sizes(sizes);
    std::vector<torch::Tensor> results;
    for (int64_t e = first_held_; e < end_held_; ++e) {
      // With no token routed too: its gradient is then zero, as transformers' is.
      results.push_back(experts[e]->as<LlamaExpertImpl>()->Partial(
          grouped[static_cast<size_t>(e - first_held_)]));
    }
    const torch::Tensor computed =
        torch::cat(results).index_select(0, torch::tensor(back, torch::kLong).to(device));
    const torch::Tensor returned = ExchangeExpertRows(computed, receive, send, tp_);
    const torch::Tensor routed_weights = weights.reshape({-1}).index_select(0, pairs).unsqueeze(-1);
    output.index_add_(0, token, (returned * routed_weights).to(output.scalar_type()));
  }

  // transformers' load_balancing_loss_func for this block's router: experts x the sum over
  // experts of the share of choices that went to each (per choice rank, over the tokens) x its
  // mean probability.
  torch::Tensor BalancingLoss(const torch::Tensor& probabilities,
                              const torch::Tensor& selected) const {
    const int64_t count = config_.experts;
    const torch::Tensor shares =
        torch::one_hot(selected, count).to(torch::kFloat).mean(/*dim=*/0);  // [k, experts]
    const torch::Tensor mean_probability = probabilities.mean(/*dim=*/0);   // [experts]
    return (shares * mean_probability.unsqueeze(0)).sum() * static_cast<double>(count);
  }

  ColumnParallelLinear gate{nullptr};
  torch::nn::ModuleList experts{nullptr};
  LlamaExpert shared_expert{nullptr};                // Qwen2-MoE's
  ColumnParallelLinear shared_expert_gate{nullptr};  // Qwen2-MoE's

 private:
  LlamaConfig config_;
  TensorParallel tp_;
  // The experts this rank holds, [first_held_, end_held_) (every one until sharded; -1: the
  // experts' count), and those of its part of the group, [first_of_part_, end_of_part_) (spread
  // over replicas, or the same).
  int64_t first_held_ = 0, end_held_ = -1;
  int64_t first_of_part_ = 0, end_of_part_ = -1;
};
TORCH_MODULE(LlamaMoe);

// Layers 1..L: transformers' LlamaDecoderLayer (GemmaDecoderLayer, Gemma2DecoderLayer).
class LlamaBlockImpl : public torch::nn::Cloneable<LlamaBlockImpl>, public IncrementalLayer {
 public:
  // `block`: the block's index from 0 (which decides its sliding window).
  LlamaBlockImpl(const LlamaConfig& config, int64_t block)
      : config_(config),
        block_(block),
        sparse_(config.SparseBlock(block)),
        inverse_frequencies_(InverseFrequencies(RotaryConfigOfBlock(config, block))),
        long_inverse_frequencies_(config.long_rope ? InverseFrequencies(config, true)
                                                   : torch::Tensor()),
        rotary_scale_(RotaryConfigOfBlock(config, block).RotaryScale()) {
    reset();
  }

  void reset() override {
    // Named as the family's checkpoints name them (GPT-J's ln_1 and attn, GPT-NeoX's attention).
    const ModuleNames names = ModuleNamesOf(config_);
    // OLMo 2's blocks normalise outputs only.
    if (!config_.PostNormsOnly()) {
      input_layernorm = register_module(names.input_norm, MakeNorm(config_));
    }
    self_attn =
        register_module(names.attention, LlamaAttention(config_, config_.WindowOfBlock(block_)));
    // Phi's one norm serves the attention and the MLP.
    if (!config_.SharedNorm()) {
      post_attention_layernorm = register_module(names.post_norm, MakeNorm(config_));
    }
    const SandwichNames sandwich = SandwichNamesOf(config_);
    if (config_.SandwichNorms()) {
      pre_feedforward_layernorm = register_module(sandwich.pre_mlp, MakeNorm(config_));
    }
    if (config_.SandwichNorms() || config_.PostNormsOnly()) {
      post_feedforward_layernorm = register_module(sandwich.post_mlp, MakeNorm(config_));
    }
    if (sparse_) {
      // Mixtral's is block_sparse_moe, Qwen2-MoE's takes the MLP's name.
      moe =
          register_module(config_.MixtralExperts() ? "block_sparse_moe" : "mlp", LlamaMoe(config_));
    } else {
      mlp = register_module("mlp", LlamaMlp(config_));
    }
  }

  absl::Status ShardForTensorParallel(const TensorParallel& tp) {
    TANDEM_RETURN_IF_ERROR(self_attn->ShardForTensorParallel(tp));
    TANDEM_RETURN_IF_ERROR(sparse_ ? moe->ShardForTensorParallel(tp)
                                   : mlp->ShardForTensorParallel(tp));
    tp_ = tp;
    return absl::OkStatus();
  }

  torch::Tensor forward(torch::Tensor x) {
    if (tp_.sequence_split()) {
      if (config_.PostNormsOnly()) return ForwardPostNormsSequenceParallel(x);
      return config_.ParallelBlock() ? ForwardParallelSequenceSplit(x) : ForwardSequenceParallel(x);
    }
    const auto [cos, sin] = Angles(x.size(1), x);
    if (config_.ParallelBlock()) {
      // Phi's and StableLM's: both take the one norm's output; GPT-NeoX's each its own.
      const torch::Tensor normed = input_layernorm(x);
      return ParallelSum(x, self_attn->forward(normed, cos, sin),
                         Feedforward(config_.SharedNorm() ? normed : post_attention_layernorm(x)));
    }
    if (config_.SandwichNorms()) {
      x = x + post_attention_layernorm(self_attn->forward(input_layernorm(x), cos, sin));
      return x + post_feedforward_layernorm(Feedforward(pre_feedforward_layernorm(x)));
    }
    if (config_.PostNormsOnly()) {
      x = x + post_attention_layernorm(self_attn->forward(x, cos, sin));
      return x + post_feedforward_layernorm(Feedforward(x));
    }
    if (!tp_.enabled() && x.is_cuda() && FusedKernelsEnabled() && !config_.Gemma() &&
        !config_.LayerNormWithoutParameters() && !config_.LayerNormWithBias() &&
        config_.residual_multiplier == 1.0) {
      // The norms write the products' type in the pass that reads their input; the
      // attention's residual add is the second norm's first step (fused_layer_norm.h).
      const torch::ScalarType type = AutocastMatmulType(x.device()).value_or(x.scalar_type());
      const torch::Tensor normed = ResidualRmsNorm(x, torch::Tensor(), input_layernorm->weight,
                                                   input_layernorm->eps(), type)
                                       .normed;
      const ResidualNorm second =
          ResidualRmsNorm(x, self_attn->forward(normed, cos, sin),
                          post_attention_layernorm->weight, post_attention_layernorm->eps(), type);
      return second.sum + Feedforward(second.normed);
    }
    x = x + Residual(self_attn->forward(input_layernorm(x), cos, sin));
    return x + Residual(Feedforward(post_attention_layernorm(x)));
  }

  // x: this rank's S/t tokens [b, S/t, hidden]. The norms and residual adds run on them; the
  // split products see the whole sequence (gathered before, reduce-scattered after), and the
  // parameters applied to this rank's tokens only have their gradients summed over the group.
  torch::Tensor ForwardSequenceParallel(torch::Tensor x) {
    const bool sandwich = config_.SandwichNorms();
    // OLMo's norms hold no weights: none to share.
    const bool norm_weights = input_layernorm->has_weight();
    std::vector<torch::Tensor> whole;
    if (norm_weights) {
      whole = {input_layernorm->weight, post_attention_layernorm->weight};
      if (sandwich) {
        whole.push_back(pre_feedforward_layernorm->weight);
        whole.push_back(post_feedforward_layernorm->weight);
      }
    }
    const bool attention_bias = self_attn->o_proj->bias.defined();
    const bool mlp_bias = !sparse_ && mlp->down_proj->bias.defined();
    if (attention_bias) whole.push_back(self_attn->o_proj->bias);
    if (mlp_bias) whole.push_back(mlp->down_proj->bias);
    // StarCoder 2's layer norms have biases (it has no sandwich norms).
    const bool norm_biases = input_layernorm->has_bias();
    const size_t first_norm_bias = whole.size();
    if (norm_biases) {
      whole.push_back(input_layernorm->bias);
      whole.push_back(post_attention_layernorm->bias);
    }
    const std::vector<torch::Tensor> shared =
        whole.empty() ? std::vector<torch::Tensor>{} : SharedOverTheSequence(whole, tp_);
    size_t next_bias = !norm_weights ? 0 : sandwich ? 4 : 2;
    // Norm n's weight as the group shares it (n: 0 input, 1 post-attention, 2 and 3 Gemma 2's
    // feedforward norms); none for OLMo's. Its bias (StarCoder 2's norms 0 and 1).
    const auto norm_weight = [&](size_t n) { return norm_weights ? shared[n] : torch::Tensor(); };
    const auto norm_bias = [&](size_t n) {
      return norm_biases ? shared[first_norm_bias + n] : torch::Tensor();
    };
    const torch::Tensor o_bias = attention_bias ? shared[next_bias++] : torch::Tensor();
    const torch::Tensor down_bias = mlp_bias ? shared[next_bias++] : torch::Tensor();
    const auto with_bias = [](const torch::Tensor& y, const torch::Tensor& bias) {
      return bias.defined() ? y + bias : y;
    };

    // This rank's tokens, normalised: the products gather them.
    const torch::Tensor normed = input_layernorm->Normalize(x, norm_weight(0), norm_bias(0));
    const auto [cos, sin] = Angles(normed.size(1) * tp_.size, x);
    const torch::Tensor attended = self_attn->Attend(normed, cos, sin, /*sequence_split=*/true);
    torch::Tensor attention =
        with_bias(ReduceScatterToSequenceParallel(
                      DeferrableLinear(attended, self_attn->o_proj->weight, {}), tp_),
                  o_bias);
    // Gemma 2 normalises the attention's output (this rank's tokens) before the residual add.
    if (sandwich) attention = post_attention_layernorm->Normalize(attention, norm_weight(1));
    x = x + Residual(attention);
    const torch::Tensor normed_x =
        sandwich ? pre_feedforward_layernorm->Normalize(x, norm_weight(2))
                 : post_attention_layernorm->Normalize(x, norm_weight(1), norm_bias(1));
    // The experts gather this rank's tokens and reduce-scatter their sum themselves.
    torch::Tensor output =
        sparse_ ? moe(normed_x)
                : with_bias(ReduceScatterToSequenceParallel(
                                DeferrableLinear(mlp->Units(normed_x, /*sequence_split=*/true),
                                                 mlp->down_proj->weight, {}),
                                tp_),
                            down_bias);
    if (sandwich) output = post_feedforward_layernorm->Normalize(output, norm_weight(3));
    return x + Residual(output);
  }

  // OLMo 2's block under sequence parallelism: the products gather this rank's tokens of the
  // block's input itself and reduce-scatter their outputs, which the post-norms normalise on
  // this rank's tokens (their weights, and the products' whole biases, shared: their gradients
  // summed over the group).
  torch::Tensor ForwardPostNormsSequenceParallel(torch::Tensor x) {
    std::vector<torch::Tensor> whole = {post_attention_layernorm->weight,
                                        post_feedforward_layernorm->weight};
    const bool attention_bias = self_attn->o_proj->bias.defined();
    const bool mlp_bias = !sparse_ && mlp->down_proj->bias.defined();
    if (attention_bias) whole.push_back(self_attn->o_proj->bias);
    if (mlp_bias) whole.push_back(mlp->down_proj->bias);
    const std::vector<torch::Tensor> shared = SharedOverTheSequence(whole, tp_);
    size_t next_bias = 2;
    const auto [cos, sin] = Angles(x.size(1) * tp_.size, x);
    torch::Tensor attention = ReduceScatterToSequenceParallel(
        DeferrableLinear(self_attn->Attend(x, cos, sin, /*sequence_split=*/true),
                         self_attn->o_proj->weight, {}),
        tp_);
    if (attention_bias) attention = attention + shared[next_bias++];
    x = x + post_attention_layernorm->Normalize(attention, shared[0]);
    // The experts gather this rank's tokens and reduce-scatter their sum themselves.
    torch::Tensor output = sparse_ ? moe(x)
                                   : ReduceScatterToSequenceParallel(
                                         DeferrableLinear(mlp->Units(x, /*sequence_split=*/true),
                                                          mlp->down_proj->weight, {}),
                                         tp_);
    if (mlp_bias) output = output + shared[next_bias++];
    return x + post_feedforward_layernorm->Normalize(output, shared[1]);
  }

  // Phi's and GPT-NeoX's parallel block under sequence parallelism: x + attention(n) + mlp(m)
  // with n the norm of this rank's tokens and m n (Phi's) or the second norm's, which the
  // products gather; their outputs reduce-scattered back to this rank's tokens, the norms'
  // weights and biases and the products' whole biases shared (their gradients summed over the
  // group).
  torch::Tensor ForwardParallelSequenceSplit(const torch::Tensor& x) {
    // The norms' weights and (but Cohere's) biases, then the products' whole biases, in the
    // order `shared` holds them.
    const bool second_norm = !config_.SharedNorm();
    const bool norm_bias = input_layernorm->has_bias();
    std::vector<torch::Tensor> whole;
    for (RmsNorm* norm : {&input_layernorm, &post_attention_layernorm}) {
      if (norm->is_empty()) continue;
      whole.push_back((*norm)->weight);
      if (norm_bias) whole.push_back((*norm)->bias);
    }
    const bool attention_bias = self_attn->o_proj->bias.defined();
    const bool mlp_bias = mlp->down_proj->bias.defined();
    if (attention_bias) whole.push_back(self_attn->o_proj->bias);
    if (mlp_bias) whole.push_back(mlp->down_proj->bias);
    const std::vector<torch::Tensor> shared = SharedOverTheSequence(whole, tp_);
    size_t next = 0;
    const auto next_norm = [&](RmsNorm& norm) {
      const torch::Tensor& weight = shared[next++];
      return norm->Normalize(x, weight, norm_bias ? shared[next++] : torch::Tensor());
    };
    const torch::Tensor normed = next_norm(input_layernorm);
    const torch::Tensor mlp_input = second_norm ? next_norm(post_attention_layernorm) : normed;
    const auto [cos, sin] = Angles(normed.size(1) * tp_.size, x);
    size_t next_bias = next;
    torch::Tensor attention = ReduceScatterToSequenceParallel(
        DeferrableLinear(self_attn->Attend(normed, cos, sin, /*sequence_split=*/true),
                         self_attn->o_proj->weight, {}),
        tp_);
    if (attention_bias) attention = attention + shared[next_bias++];
    torch::Tensor output = ReduceScatterToSequenceParallel(
        DeferrableLinear(mlp->Units(mlp_input, /*sequence_split=*/true), mlp->down_proj->weight,
                         {}),
        tp_);
    if (mlp_bias) output = output + shared[next_bias++];
    return ParallelSum(x, attention, output);
  }

  // forward() for positions [start, start + n): the same angles for those positions.
  torch::Tensor ForwardIncremental(const torch::Tensor& input, int64_t start,
                                   KeyValueCache& cache) override {
    const auto [cos, sin] = Angles(start, start + input.size(1), input);
    if (config_.ParallelBlock()) {
      const torch::Tensor normed = input_layernorm(input);
      return ParallelSum(
          input, self_attn->ForwardIncremental(normed, cos, sin, start, cache),
          Feedforward(config_.SharedNorm() ? normed : post_attention_layernorm(input)));
    }
    if (config_.PostNormsOnly()) {
      const torch::Tensor x = input + post_attention_layernorm(self_attn->ForwardIncremental(
                                          input, cos, sin, start, cache));
      return x + post_feedforward_layernorm(Feedforward(x));
    }
    const torch::Tensor attended =
        self_attn->ForwardIncremental(input_layernorm(input), cos, sin, start, cache);
    if (config_.SandwichNorms()) {
      const torch::Tensor x = input + post_attention_layernorm(attended);
      return x + post_feedforward_layernorm(Feedforward(pre_feedforward_layernorm(x)));
    }
    const torch::Tensor x = input + Residual(attended);
    return x + Residual(Feedforward(post_attention_layernorm(x)));
  }

  // The MLP, or the experts.
  torch::Tensor Feedforward(const torch::Tensor& x) { return sparse_ ? moe(x) : mlp(x); }

  // post_attention_layernorm normalises the MLP's input, except in Gemma 2: there it normalises
  // the attention's output, and pre_feedforward_layernorm the MLP's input (both feedforward
  // norms are Gemma 2's only; OLMo 2 has post_feedforward_layernorm and no input_layernorm).
  // Phi's blocks have none: input_layernorm serves both.
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  RmsNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMlp mlp{nullptr};  // dense blocks
  LlamaMoe moe{nullptr};  // sparse blocks (mixtures of experts)

 private:
  // A parallel block's output, added in transformers' order: StableLM's and Cohere's
  // (x + attention) + mlp, Phi's, GPT-NeoX's and GPT-J's (attention + mlp) + x.
  torch::Tensor ParallelSum(const torch::Tensor& x, const torch::Tensor& attention,
                            const torch::Tensor& mlp) const {
    return config_.StableLm() || config_.Cohere() ? x + attention + mlp : attention + mlp + x;
  }

  // What a residual add adds: the attention's or the MLP's output, times Granite's
  // residual_multiplier.
  torch::Tensor Residual(const torch::Tensor& y) const {
    return config_.residual_multiplier == 1.0 ? y : y * config_.residual_multiplier;
  }

  // transformers' LlamaRotaryEmbedding for positions [0, length): angles position * inverse
  // frequency in float32, the two halves of a head rotated by the same angles; cos and sin
  // [length, head_dim] in `like`'s type, on its device.
  std::pair<torch::Tensor, torch::Tensor> Angles(int64_t length, const torch::Tensor& like) const {
    return Angles(0, length, like);
  }
  // The same for positions [start, end): a forward pass that ends there (Phi-3's LongRoPE
  // takes its long factors past original_max_position_embeddings, as transformers decides by
  // the pass's last position).
  std::pair<torch::Tensor, torch::Tensor> Angles(int64_t start, int64_t end,
                                                 const torch::Tensor& like) const {
    const bool long_context =
        config_.long_rope && end > config_.long_rope->original_max_position_embeddings;
    const torch::Tensor& frequencies =
        long_context ? long_inverse_frequencies_ : inverse_frequencies_;
    const torch::Tensor positions = torch::arange(
        start, end, torch::TensorOptions().dtype(torch::kFloat).device(like.device()));
    const torch::Tensor angles = torch::outer(positions, frequencies.to(like.device()));
    // Each angle for both features it rotates: the halves' (rotate_half), or neighbours'.
    const torch::Tensor both = config_.InterleavedRotary() ? torch::repeat_interleave(angles, 2, -1)
                                                           : torch::cat({angles, angles}, -1);
    if (rotary_scale_ != 1.0) {
      return {(both.cos() * rotary_scale_).to(like.scalar_type()),
              (both.sin() * rotary_scale_).to(like.scalar_type())};
    }
    return {both.cos().to(like.scalar_type()), both.sin().to(like.scalar_type())};
  }

  LlamaConfig config_;
  int64_t block_;
  bool sparse_;                        // experts instead of the MLP
  torch::Tensor inverse_frequencies_;  // [head_dim / 2], float32, on the CPU
  torch::Tensor long_inverse_frequencies_;  // LongRoPE's long factors' (else undefined)
  double rotary_scale_;                     // of cos and sin (LongRoPE's), 1 without
  TensorParallel tp_;
};
TORCH_MODULE(LlamaBlock);

// Layer L + 1: the final RMSNorm and the LM head.
class LlamaHeadImpl : public torch::nn::Cloneable<LlamaHeadImpl>, public IncrementalLayer {
 public:
  explicit LlamaHeadImpl(const LlamaConfig& config) : config_(config) { reset(); }

  void reset() override {
    norm = register_module("norm", MakeNorm(config_));
    lm_head = register_module(
        "lm_head", LmHead(config_.hidden, config_.vocab, config_.init_std, config_.HeadBias()));
  }

  // This rank's vocabulary rows of the LM head (and of its bias).
  void ShardForTensorParallel(const TensorParallel& tp) {
    lm_head->ShardForTensorParallel(tp);
    tp_ = tp;
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // Under sequence parallelism this rank's tokens are normalised (the norm's gradient summed
    // over the group) and the LM head gathers the whole sequence.
    // Gemma 2's soft cap applies to each logit: to this rank's vocabulary rows alike.
    // Granite's logits are divided by logits_scaling, each alike too.
    const double cap = config_.final_logit_softcapping;
    const torch::Tensor logits =
        tp_.sequence_split() ? lm_head(NormalizeSequenceSplit(x)) : lm_head(norm(x));
    // Cohere's are multiplied by logit_scale.
    const torch::Tensor scaled = config_.logit_scale != 1.0 ? logits * config_.logit_scale : logits;
    return SoftCap(config_.logits_scaling == 1.0 ? scaled : scaled / config_.logits_scaling, cap);
  }

  torch::Tensor ForwardIncremental(const torch::Tensor& x, int64_t /*start*/,
                                   KeyValueCache& /*cache*/) override {
    if (tp_.enabled()) throw std::logic_error("llama: incremental decoding of a shard");
    return forward(x);
  }

  RmsNorm norm{nullptr};
  LmHead lm_head{nullptr};

 private:
  // This rank's tokens through the final norm, its weight and bias (none for OLMo's; a bias
  // for StarCoder 2's) as the group shares them.
  torch::Tensor NormalizeSequenceSplit(const torch::Tensor& x) {
    if (!norm->has_weight()) return norm->Normalize(x, torch::Tensor());
    if (!norm->has_bias()) return norm->Normalize(x, SharedOverTheSequence({norm->weight}, tp_)[0]);
    const std::vector<torch::Tensor> shared =
        SharedOverTheSequence({norm->weight, norm->bias}, tp_);
    return norm->Normalize(x, shared[0], shared[1]);
  }

  LlamaConfig config_;
  TensorParallel tp_;
};
TORCH_MODULE(LlamaHead);

// The defaults of a family's config class (transformers 4.46) for the fields tandem reads.
struct FamilyDefaults {
  int64_t vocab, hidden, intermediate, layers, heads;
  int64_t kv_heads;  // 0: as many as heads
  int64_t head_dim;  // 0: hidden / heads
  int64_t max_positions;
  double rms_norm_eps, rope_theta;
  bool tied;
  int64_t window;  // a windowed family's sliding_window when the file has none; 0: none
};

FamilyDefaults DefaultsOf(const std::string& model_type) {
  if (model_type == "mistral") {
    return {32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-6, 10000.0, false, 4096};
  }
  if (model_type == "qwen2") {
    return {151936, 4096, 22016, 32, 32, 32, 0, 32768, 1e-6, 10000.0, false, 4096};
  }
  if (model_type == "mixtral") {
    return {32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-5, 1e6, false, 0};
  }
  if (model_type == "qwen2_moe") {
    return {151936, 2048, 5632, 24, 16, 16, 0, 32768, 1e-6, 10000.0, false, 4096};
  }
  if (model_type == "qwen3") {  // transformers 4.51's Qwen3Config
    return {151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, 10000.0, false, 4096};
  }
  if (model_type == "qwen3_moe") {  // Qwen3MoeConfig: head_dim hidden / heads unless given
    return {151936, 2048, 6144, 24, 32, 4, 0, 32768, 1e-6, 10000.0, false, 4096};
  }
  if (model_type == "gemma3_text") {  // transformers 4.51's Gemma3TextConfig
    return {262208, 2304, 9216, 26, 8, 4, 256, 131072, 1e-6, 1e6, true, 4096};
  }
  if (model_type == "gemma" || model_type == "gemma2") {
    return {256000, 3072, 24576, 28, 16, 16, 256, 8192, 1e-6, 10000.0, true, 4096};
  }
  if (model_type == "phi3") {
    return {32064, 3072, 8192, 32, 32, 0, 0, 4096, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "olmo") {
    return {50304, 4096, 11008, 32, 32, 0, 0, 2048, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "olmoe") {
    return {50304, 2048, 2048, 16, 16, 0, 0, 4096, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "olmo2") {  // transformers 4.51's Olmo2Config
    return {50304, 4096, 11008, 32, 32, 0, 0, 2048, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "starcoder2") {  // tied as PretrainedConfig's default; no window
    return {49152, 3072, 12288, 30, 24, 2, 0, 4096, 1e-5, 10000.0, true, 0};
  }
  if (model_type == "phi") {
    return {51200, 2048, 8192, 24, 32, 0, 0, 2048, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "gpt_neox") {
    return {50432, 6144, 24576, 44, 64, 0, 0, 2048, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "stablelm") {
    return {50304, 2560, 6912, 32, 32, 32, 0, 4096, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "glm4") {  // transformers 4.51's Glm4Config
    return {151552, 4096, 13696, 40, 32, 2, 128, 131072, 1.5625e-7, 10000.0, false, 0};
  }
  if (model_type == "glm") {  // head_dim 128 for the rotation; pad_token_id 151329
    return {151552, 4096, 13696, 40, 32, 2, 0, 131072, 1.5625e-7, 10000.0, false, 0};
  }
  if (model_type == "cohere") {  // pad_token_id 0
    return {256000, 8192, 22528, 40, 64, 0, 0, 8192, 1e-5, 10000.0, true, 0};
  }
  if (model_type == "gptj") {  // n_inner (intermediate) is 4 x n_embd unless given
    return {50400, 4096, 16384, 28, 16, 0, 0, 2048, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "nemotron") {
    return {256000, 6144, 24576, 32, 48, 0, 0, 4096, 1e-5, 10000.0, false, 0};
  }
  if (model_type == "falcon") {  // ffn_hidden_size is 4 x hidden_size unless given
    return {65024, 4544, 18176, 32, 71, 0, 0, 2048, 1e-5, 10000.0, true, 0};
  }
  return {32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, 10000.0, false, 0};  // LlamaConfig's
}

// The weights of block `block`'s MLP a token is multiplied by: the three matrices of the MLP,
// or of each expert it reaches, the router, and the shared expert and its gate.
double FeedforwardWeightsPerToken(const LlamaConfig& config, int64_t block) {
  const double h = static_cast<double>(config.hidden);
  if (!config.SparseBlock(block)) {
    return (config.PlainMlp() ? 2.0 : 3.0) * h * static_cast<double>(config.intermediate);
  }
  const double shared = static_cast<double>(config.shared_expert_intermediate);
  return static_cast<double>(config.experts_per_token) * 3.0 * h *
             static_cast<double>(config.ExpertUnits()) +
         h * static_cast<double>(config.experts) + (shared > 0 ? 3.0 * h * shared + h : 0.0);
}

// Where a parameter of a block stored fused lies: its key (inside the block), its first row
// (of the key's tensor with every dimension but the last flattened into rows) and the key's
// shape. Phi-3's q/k/v_proj are rows of self_attn.qkv_proj, its gate/up_proj of
// mlp.gate_up_proj; GraniteMoE's experts' w1 and w3 (gate and up) are expert e's two halves of
// block_sparse_moe.input_linear [experts, 2 x units, hidden], their w2 expert e of
// block_sparse_moe.output_linear [experts, hidden, units].
struct FusedSlot {
  std::string key;
  int64_t first_row = 0;
  std::vector<int64_t> key_shape;
};
std::optional<FusedSlot> FusedSlotOf(const LlamaConfig& config, const std::string& name) {
  const int64_t h = config.hidden;
  if (config.FusedGateUp()) {
    const int64_t q = config.heads * config.HeadDim(), kv = config.kv_heads * config.HeadDim();
    const int64_t units = config.intermediate;
    const std::vector<int64_t> qkv = {q + 2 * kv, h}, gate_up = {2 * units, h};
    const bool fused_qkv = config.FusedCheckpoint();  // GLM's are apart
    if (name == "self_attn.q_proj.weight" && fused_qkv) {
      return FusedSlot{"self_attn.qkv_proj.weight", 0, qkv};
    }
    if (name == "self_attn.k_proj.weight" && fused_qkv) {
      return FusedSlot{"self_attn.qkv_proj.weight", q, qkv};
    }
    if (name == "self_attn.v_proj.weight" && fused_qkv) {
      return FusedSlot{"self_attn.qkv_proj.weight", q + kv, qkv};
    }
    if (name == "mlp.gate_proj.weight") return FusedSlot{"mlp.gate_up_proj.weight", 0, gate_up};
    if (name == "mlp.up_proj.weight") return FusedSlot{"mlp.gate_up_proj.weight", units, gate_up};
    return std::nullopt;
  }
  if (!config.FusedExperts()) return std::nullopt;
  std::string rest;
  const int e = NumberAfterPrefix(name, "block_sparse_moe.experts.", &rest);
  if (e < 0 || e >= config.experts) return std::nullopt;
  const int64_t units = config.ExpertUnits(), experts = config.experts;
  if (rest == "w1.weight" || rest == "w3.weight") {
    return FusedSlot{"block_sparse_moe.input_linear.weight",
                     e * 2 * units + (rest == "w3.weight" ? units : 0),
                     {experts, 2 * units, h}};
  }
  if (rest == "w2.weight") {
    return FusedSlot{"block_sparse_moe.output_linear.weight", e * h, {experts, h, units}};
  }
  return std::nullopt;
}

// A key of a block (transformers' name inside it) that tandem names otherwise, not fused:
// GraniteMoE's router, Phi's self_attn.dense (tandem's o_proj).
std::string RenamedKey(const LlamaConfig& config, const std::string& name) {
  if (config.FusedExperts() && name == "block_sparse_moe.gate.weight") {
    return "block_sparse_moe.router.layer.weight";
  }
  if (config.Phi() && absl::StartsWith(name, "self_attn.o_proj.")) {
    return absl::StrCat("self_attn.dense.", name.substr(sizeof("self_attn.o_proj.") - 1));
  }
  return name;
}

// The reverse of FusedSlotOf and RenamedKey for a key inside a block: a fused key names its
// first part; nullopt for a key named as its parameter.
std::optional<std::string> TandemNameOfKey(const LlamaConfig& config, const std::string& key) {
  if (config.FusedCheckpoint() && key == "self_attn.qkv_proj.weight") {
    return "self_attn.q_proj.weight";
  }
  if (config.FusedGateUp() && key == "mlp.gate_up_proj.weight") return "mlp.gate_proj.weight";
  if (config.FusedExperts()) {
    if (key == "block_sparse_moe.input_linear.weight") {
      return "block_sparse_moe.experts.0.w1.weight";
    }
    if (key == "block_sparse_moe.output_linear.weight") {
      return "block_sparse_moe.experts.0.w2.weight";
    }
    if (key == "block_sparse_moe.router.layer.weight") return "block_sparse_moe.gate.weight";
  }
  if (config.Phi() && absl::StartsWith(key, "self_attn.dense.")) {
    return absl::StrCat("self_attn.o_proj.", key.substr(sizeof("self_attn.dense.") - 1));
  }
  return std::nullopt;
}

// The checkpoint's names of the embedding, the final norm and the LM head (up to "weight"), and
// the blocks' prefix: Llama's "model.embed_tokens.weight", "model.norm.", "lm_head." and
// "model.layers."; Phi's final norm "model.final_layernorm."; GPT-NeoX's
// "gpt_neox.embed_in.weight", "gpt_neox.final_layer_norm.", "embed_out." and
// "gpt_neox.layers.".
struct CheckpointNames {
  std::string embedding, norm, head, blocks;
};
CheckpointNames CheckpointNamesOf(const LlamaConfig& config) {
  if (config.NeoX()) {
    return {"gpt_neox.embed_in.weight", "gpt_neox.final_layer_norm.", "embed_out.",
            "gpt_neox.layers."};
  }
  if (config.GptJ()) {
    return {"transformer.wte.weight", "transformer.ln_f.", "lm_head.", "transformer.h."};
  }
  if (config.Falcon()) {
    return {"transformer.word_embeddings.weight", "transformer.ln_f.", "lm_head.",
            "transformer.h."};
  }
  if (config.Gemma3Multimodal()) {
    return {"language_model.model.embed_tokens.weight", "language_model.model.norm.",
            "language_model.lm_head.", "language_model.model.layers."};
  }
  return {"model.embed_tokens.weight", config.Phi() ? "model.final_layernorm." : "model.norm.",
          "lm_head.", "model.layers."};
}

bool IsBlockParameter(const LlamaConfig& config, int64_t block, const std::string& name) {
  for (const auto& [known, shape] : LlamaBlockParameters(config, block)) {
    if (known == name) return true;
  }
  return false;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> LlamaBlockParameters(
    const LlamaConfig& config, int64_t block) {
  const int64_t h = config.hidden, q = config.heads * config.HeadDim(),
                kv = config.kv_heads * config.HeadDim();
  std::vector<std::pair<std::string, std::vector<int64_t>>> parameters;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    parameters.emplace_back(std::move(name), std::move(shape));
  };
  if (config.GptJ()) {
    // GPTJBlock's: ln_1, attn, mlp.
    add("ln_1.weight", {h});
    add("ln_1.bias", {h});
    for (const char* projection : {"q_proj", "k_proj", "v_proj"}) {
      add(absl::StrCat("attn.", projection, ".weight"), {q, h});
    }
    add("attn.out_proj.weight", {h, q});
    add("mlp.fc_in.weight", {config.intermediate, h});
    add("mlp.fc_in.bias", {config.intermediate});
    add("mlp.fc_out.weight", {h, config.intermediate});
    add("mlp.fc_out.bias", {h});
    return parameters;
  }
  if (config.FusedQkv()) {
    // GPTNeoXLayer's state-dict order: the norms, the attention, the MLP (FalconDecoderLayer's
    // is the attention, the MLP, the norms).
    const int64_t units = config.intermediate;
    const ModuleNames names = ModuleNamesOf(config);
    for (const char* norm : {names.input_norm, names.post_norm}) {
      if (absl::string_view(norm) == names.post_norm && config.SharedNorm()) continue;
      add(absl::StrCat(norm, ".weight"), {h});
      add(absl::StrCat(norm, ".bias"), {h});
    }
    const std::string attention = absl::StrCat(names.attention, ".");
    add(attention + "query_key_value.weight", {q + 2 * kv, h});
    if (config.QkvBias()) add(attention + "query_key_value.bias", {q + 2 * kv});
    add(attention + "dense.weight", {h, q});
    if (config.attention_bias) add(attention + "dense.bias", {h});
    add("mlp.dense_h_to_4h.weight", {units, h});
    if (config.mlp_bias) add("mlp.dense_h_to_4h.bias", {units});
    add("mlp.dense_4h_to_h.weight", {h, units});
    if (config.mlp_bias) add("mlp.dense_4h_to_h.bias", {h});
    return parameters;
  }
  const bool norms = !config.LayerNormWithoutParameters();  // OLMo's hold none
  const bool norm_biases = config.LayerNormWithBias();      // StarCoder 2's and Phi's have them
  // Phi's one norm comes last in its state dict (PhiDecoderLayer's order).
  const bool norm_first = !config.Phi();
  if (norms && norm_first && !config.PostNormsOnly()) add("input_layernorm.weight", {h});
  if (norm_biases && norm_first) add("input_layernorm.bias", {h});
  const std::pair<const char*, std::pair<int64_t, int64_t>> attention[] = {
      {"q_proj", {q, h}}, {"k_proj", {kv, h}}, {"v_proj", {kv, h}}, {"o_proj", {h, q}}};
  for (const auto& [projection, out_in] : attention) {
    add(absl::StrCat("self_attn.", projection, ".weight"), {out_in.first, out_in.second});
    const bool bias =
        absl::string_view(projection) == "o_proj" ? config.attention_bias : config.QkvBias();
    if (bias) add(absl::StrCat("self_attn.", projection, ".bias"), {out_in.first});
  }
  if (config.head_qk_norms && config.StableLm()) {
    for (const auto& [norm, heads] : {std::pair<const char*, int64_t>{"q", config.heads},
                                      std::pair<const char*, int64_t>{"k", config.kv_heads}}) {
      for (int64_t h = 0; h < heads; ++h) {
        add(absl::StrCat("self_attn.", norm, "_layernorm.norms.", h, ".weight"),
            {config.HeadDim()});
      }
    }
  } else if (config.head_qk_norms) {
    add("self_attn.q_norm.weight", {config.heads, config.HeadDim()});
    add("self_attn.k_norm.weight", {config.kv_heads, config.HeadDim()});
  } else if (config.Qwen3() || config.Gemma3()) {
    add("self_attn.q_norm.weight", {config.HeadDim()});
    add("self_attn.k_norm.weight", {config.HeadDim()});
  }
  if (config.QkNorms()) {
    add("self_attn.q_norm.weight", {q});
    add("self_attn.k_norm.weight", {kv});
  }
  // None where one norm serves both (Phi's, StableLM's side by side).
  const std::string post_norm = absl::StrCat(ModuleNamesOf(config).post_norm, ".");
  if (norms && !config.SharedNorm()) add(post_norm + "weight", {h});
  if (norm_biases && !config.SharedNorm()) add("post_attention_layernorm.bias", {h});
  const SandwichNames sandwich = SandwichNamesOf(config);
  if (config.SandwichNorms()) add(absl::StrCat(sandwich.pre_mlp, ".weight"), {h});
  if (config.SandwichNorms() || config.PostNormsOnly()) {
    add(absl::StrCat(sandwich.post_mlp, ".weight"), {h});
  }
  // An MLP (or expert) of `units` units under `prefix`, its matrices named `names` (gate, up,
  // down).
  auto mlp = [&](const std::string& prefix, int64_t units, const std::vector<const char*>& names,
                 bool bias) {
    for (size_t i = 0; i < names.size(); ++i) {
      const bool down = i == 2;
      add(absl::StrCat(prefix, names[i], ".weight"),
          down ? std::vector<int64_t>{h, units} : std::vector<int64_t>{units, h});
      if (bias) add(absl::StrCat(prefix, names[i], ".bias"), {down ? h : units});
    }
  };
  if (config.PlainMlp()) {
    const ModuleNames names = ModuleNamesOf(config);
    const std::string up = absl::StrCat("mlp.", names.mlp_up, ".");
    const std::string down = absl::StrCat("mlp.", names.mlp_down, ".");
    add(up + "weight", {config.intermediate, h});
    if (config.mlp_bias) add(up + "bias", {config.intermediate});
    add(down + "weight", {h, config.intermediate});
    if (config.mlp_bias) add(down + "bias", {h});
    if (!norm_first) {
      add("input_layernorm.weight", {h});
      add("input_layernorm.bias", {h});
    }
    return parameters;
  }
  if (!config.SparseBlock(block)) {
    mlp("mlp.", config.intermediate, {"gate_proj", "up_proj", "down_proj"}, config.mlp_bias);
    return parameters;
  }
  if (config.MixtralExperts()) {
    add("block_sparse_moe.gate.weight", {config.experts, h});
    for (int64_t e = 0; e < config.experts; ++e) {
      // State-dict order: w1, w2, w3.
      const std::string expert = absl::StrCat("block_sparse_moe.experts.", e, ".");
      add(expert + "w1.weight", {config.ExpertUnits(), h});
      add(expert + "w2.weight", {h, config.ExpertUnits()});
      add(expert + "w3.weight", {config.ExpertUnits(), h});
    }
    return parameters;
  }
  add("mlp.gate.weight", {config.experts, h});
  for (int64_t e = 0; e < config.experts; ++e) {
    mlp(absl::StrCat("mlp.experts.", e, "."), config.ExpertUnits(),
        {"gate_proj", "up_proj", "down_proj"}, /*bias=*/false);
  }
  if (config.shared_expert_intermediate > 0) {
    mlp("mlp.shared_expert.", config.shared_expert_intermediate,
        {"gate_proj", "up_proj", "down_proj"}, /*bias=*/false);
    add("mlp.shared_expert_gate.weight", {1, h});
  }
  return parameters;
}

namespace {

// A list of numbers, `field` of `object`.
absl::StatusOr<std::vector<double>> NumbersOf(const Json& object, absl::string_view field,
                                              absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const Json* list, GetArray(object, field, where));
  std::vector<double> numbers;
  for (const Json& item : *list) {
    if (!item.is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, " must be a list of numbers, got ", list->dump()));
    }
    numbers.push_back(item.get<double>());
  }
  return numbers;
}

// A rope_scaling of type "yarn" as transformers 4.51 reads it (LlamaRopeScaling): factor
// max_position_embeddings / original_max_position_embeddings where the file gives the latter,
// the attention factor resolved.
absl::StatusOr<LlamaRopeScaling> YarnScalingOf(const Json& scaling, const LlamaConfig& config) {
  const std::string where = "config.json: rope_scaling";
  LlamaRopeScaling s;
  s.type = "yarn";
  TANDEM_ASSIGN_OR_RETURN(s.factor, GetNumber(scaling, "factor", where));
  s.original_max_position_embeddings = config.max_position_embeddings;
  if (IsSet(scaling, "original_max_position_embeddings")) {
    TANDEM_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                            GetInt(scaling, "original_max_position_embeddings", where));
    if (s.original_max_position_embeddings <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": original_max_position_embeddings must be positive, got ",
                       s.original_max_position_embeddings));
    }
    s.factor = static_cast<double>(config.max_position_embeddings) /
               static_cast<double>(s.original_max_position_embeddings);
  }
  // transformers takes a beta of 0 (or null) as its default.
  TANDEM_ASSIGN_OR_RETURN(s.beta_fast, GetNumberOr(scaling, "beta_fast", 0.0, where));
  TANDEM_ASSIGN_OR_RETURN(s.beta_slow, GetNumberOr(scaling, "beta_slow", 0.0, where));
  if (s.beta_fast == 0) s.beta_fast = 32;
  if (s.beta_slow == 0) s.beta_slow = 1;
  const auto mscale_of = [&](double m) {
    return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0;
  };
  TANDEM_ASSIGN_OR_RETURN(const double mscale, GetNumberOr(scaling, "mscale", 0.0, where));
  TANDEM_ASSIGN_OR_RETURN(const double mscale_all_dim,
                          GetNumberOr(scaling, "mscale_all_dim", 0.0, where));
  s.attention_factor = mscale != 0 && mscale_all_dim != 0
                           ? mscale_of(mscale) / mscale_of(mscale_all_dim)
                           : mscale_of(1.0);
  if (IsSet(scaling, "attention_factor")) {
    TANDEM_ASSIGN_OR_RETURN(s.attention_factor, GetNumber(scaling, "attention_factor", where));
  }
  return s;
}

// Phi-3's rope_scaling: LongRoPE (transformers reads its older names "su" and "yarn" as it).
absl::StatusOr<LlamaLongRope> LongRopeOf(const Json& json) {
  const std::string where = "config.json: rope_scaling";
  TANDEM_ASSIGN_OR_RETURN(const Json* scaling, GetObject(json, "rope_scaling", "config.json"));
  std::string type;
  if (IsSet(*scaling, "type")) {
    TANDEM_ASSIGN_OR_RETURN(type, GetString(*scaling, "type", where));
  } else if (IsSet(*scaling, "rope_type")) {
    TANDEM_ASSIGN_OR_RETURN(type, GetString(*scaling, "rope_type", where));
  }
  if (type != "longrope" && type != "su" && type != "yarn") {
    return absl::InvalidArgumentError(absl::StrCat("config.json: rope_scaling type \"", type,
                                                   "\" is not supported for phi3 (longrope is)"));
  }
  LlamaLongRope rope;
  TANDEM_ASSIGN_OR_RETURN(rope.short_factor, NumbersOf(*scaling, "short_factor", where));
  TANDEM_ASSIGN_OR_RETURN(rope.long_factor, NumbersOf(*scaling, "long_factor", where));
  TANDEM_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                          GetIntOr(json, "original_max_position_embeddings", 4096, "config.json"));
  return rope;
}

// FalconConfig's sizes and layout into `config`: n_embed for hidden_size in older files,
// ffn_hidden_size (4 x hidden_size when absent), the key/value groups (num_kv_heads with
// new_decoder_architecture, one with multi_query, else one per head) and where the attention
// and the MLP sit. Refused: alibi, and the layouts transformers' FalconDecoderLayer builds
// without the norms its forward pass reads.
absl::Status ReadFalconLayout(const Json& json, LlamaConfig& config) {
  constexpr absl::string_view where = "config.json";
  if (IsSet(json, "n_embed")) {
    TANDEM_ASSIGN_OR_RETURN(config.hidden, GetInt(json, "n_embed", where));
  }
  TANDEM_ASSIGN_OR_RETURN(const bool alibi, GetBoolOrUnset(json, "alibi", false, where));
  if (alibi) {
    return absl::InvalidArgumentError(
        "config.json: alibi true is not supported for falcon (tandem's llama has rotary "
        "positions only)");
  }
  config.intermediate = 4 * config.hidden;
  if (IsSet(json, "ffn_hidden_size")) {
    TANDEM_ASSIGN_OR_RETURN(config.intermediate, GetInt(json, "ffn_hidden_size", where));
  }
  TANDEM_ASSIGN_OR_RETURN(const bool new_architecture,
                          GetBoolOrUnset(json, "new_decoder_architecture", false, where));
  TANDEM_ASSIGN_OR_RETURN(const bool multi_query, GetBoolOrUnset(json, "multi_query", true, where));
  TANDEM_ASSIGN_OR_RETURN(const bool parallel, GetBoolOrUnset(json, "parallel_attn", true, where));
  int64_t norms = new_architecture ? 2 : 1;  // num_ln_in_parallel_attn, as transformers reads it
  const bool norms_given = IsSet(json, "num_ln_in_parallel_attn");
  if (norms_given) {
    TANDEM_ASSIGN_OR_RETURN(norms, GetInt(json, "num_ln_in_parallel_attn", where));
  }
  config.head_dim = 0;  // hidden_size / num_attention_heads
  if (new_architecture) {
    config.kv_heads = config.heads;
    if (IsSet(json, "num_kv_heads")) {
      TANDEM_ASSIGN_OR_RETURN(config.kv_heads, GetInt(json, "num_kv_heads", where));
    }
    if (!parallel || (norms != 1 && norms != 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: falcon's new_decoder_architecture needs parallel_attn true and "
          "num_ln_in_parallel_attn 1 or 2 (transformers builds no other), got parallel_attn ",
          parallel ? "true" : "false", " and num_ln_in_parallel_attn ", norms));
    }
  } else {
    config.kv_heads = multi_query ? 1 : config.heads;
    if (parallel && norms_given && norms != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: num_ln_in_parallel_attn ", norms,
          " is not supported for falcon without new_decoder_architecture (transformers then "
          "builds ln_attn and ln_mlp but reads input_layernorm)"));
    }
  }
  config.parallel_residual = new_architecture || parallel;
  config.branch_norms = new_architecture && norms == 2;
  return absl::OkStatus();
}

}  // namespace

bool IsLlamaModelType(absl::string_view model_type) {
  for (const char* known :
       {"llama",    "mistral",    "qwen2",     "gemma",  "gemma2",      "mixtral",    "qwen2_moe",
        "granite",  "granitemoe", "phi3",      "olmo",   "olmoe",       "starcoder2", "phi",
        "gpt_neox", "stablelm",   "gptj",      "cohere", "glm",         "falcon",     "nemotron",
        "glm4",     "qwen3",      "qwen3_moe", "olmo2",  "gemma3_text", "gemma3"}) {
    if (model_type == known) return true;
  }
  return false;
}

absl::StatusOr<LlamaConfig> LlamaConfigFromJson(const Json& json) {
  constexpr absl::string_view where = "config.json";
  if (!json.is_object()) {
    return absl::InvalidArgumentError("config.json: expected a JSON object");
  }
  LlamaConfig config;
  TANDEM_ASSIGN_OR_RETURN(config.model_type, GetStringOr(json, "model_type", "llama", where));
  if (config.model_type == "gemma3") {
    // Gemma3ForConditionalGeneration: its language model is text_config's (Gemma3TextConfig's
    // defaults for what that leaves out).
    TANDEM_ASSIGN_OR_RETURN(const Json* text, GetObject(json, "text_config", where));
    Json text_config = *text;
    if (text_config.contains("model_type") && text_config["model_type"] != "gemma3_text") {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: text_config of a gemma3 model has model_type ",
                       text_config["model_type"].dump(), ", not \"gemma3_text\""));
    }
    text_config["model_type"] = "gemma3_text";
    auto language = LlamaConfigFromJson(text_config);
    if (!language.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(absl::StrReplaceAll(language.status().message(), {{"config.json: ", ""}}),
                       " (config.json: text_config)"));
    }
    language->model_type = "gemma3";
    return *language;
  }
  const bool mistral = config.model_type == "mistral";
  const bool qwen2_moe = config.model_type == "qwen2_moe";
  const bool qwen2 = config.model_type == "qwen2" || qwen2_moe;  // Qwen2's attention
  // Gemma 2's and Gemma 3's fields (GLM-4-0414 has their norms only).
  const bool gemma = config.Gemma(), gemma2 = config.SandwichNorms() && !config.Glm4();
  const bool mixtral = config.model_type == "mixtral";
  const bool granite = config.Granite(), granitemoe = config.model_type == "granitemoe";
  const bool phi3 = config.model_type == "phi3";
  const bool olmoe = config.model_type == "olmoe";
  const bool olmo = config.model_type == "olmo" || olmoe;  // OLMo's clamp and padding row
  const bool starcoder2 = config.Starcoder2();
  const bool phi = config.Phi();
  const bool neox = config.NeoX();
  const bool stablelm = config.StableLm();
  const bool gptj = config.GptJ();
  const bool cohere = config.Cohere();
  const bool glm = config.Glm();
  const bool glm4 = config.Glm4();
  const bool falcon = config.Falcon();
  const bool nemotron = config.Nemotron();
  const bool qwen3_moe = config.model_type == "qwen3_moe";
  const bool qwen3 = config.Qwen3();  // Qwen3's attention
  const bool olmo2 = config.Olmo2();
  if (!IsLlamaModelType(config.model_type)) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: model_type \"", config.model_type,
                                                   "\" is not supported by tandem's llama (",
                                                   kLlamaModelTypes, " are)"));
  }
  // transformers' defaults for absent fields: those of the family's config class.
  const FamilyDefaults defaults = DefaultsOf(config.model_type);
  TANDEM_ASSIGN_OR_RETURN(config.vocab, GetIntOr(json, "vocab_size", defaults.vocab, where));
  TANDEM_ASSIGN_OR_RETURN(config.hidden, GetIntOr(json, "hidden_size", defaults.hidden, where));
  TANDEM_ASSIGN_OR_RETURN(config.intermediate,
                          GetIntOr(json, "intermediate_size", defaults.intermediate, where));
  TANDEM_ASSIGN_OR_RETURN(config.layers,
                          GetIntOr(json, "num_hidden_layers", defaults.layers, where));
  TANDEM_ASSIGN_OR_RETURN(config.heads,
                          GetIntOr(json, "num_attention_heads", defaults.heads, where));
  config.kv_heads = defaults.kv_heads > 0 ? defaults.kv_heads : config.heads;
  if (IsSet(json, "num_key_value_heads")) {
    TANDEM_ASSIGN_OR_RETURN(config.kv_heads, GetInt(json, "num_key_value_heads", where));
  }
  config.head_dim = defaults.head_dim;
  // Qwen2's, Mixtral's, Granite's, Phi-3's and OLMo's attention take hidden / heads whatever the
  // file says.
  if (IsSet(json, "head_dim") && !qwen2 && !mixtral && !granite && !phi3 && !olmo && !starcoder2 &&
      !phi && !neox && !stablelm && !cohere && !glm && !falcon) {
    TANDEM_ASSIGN_OR_RETURN(config.head_dim, GetInt(json, "head_dim", where));
  }
  if (gptj) {
    // GPTJConfig's names (hidden_size and the others are aliases transformers maps to them).
    const std::pair<const char*, int64_t*> sizes[] = {
        {"n_embd", &config.hidden}, {"n_layer", &config.layers}, {"n_head", &config.heads}};
    for (const auto& [field, size] : sizes) {
      TANDEM_ASSIGN_OR_RETURN(*size, GetIntOr(json, field, *size, where));
    }
    config.intermediate = 4 * config.hidden;
    if (IsSet(json, "n_inner")) {
      TANDEM_ASSIGN_OR_RETURN(config.intermediate, GetInt(json, "n_inner", where));
    }
    if (json.contains("rotary_dim") && !IsSet(json, "rotary_dim")) {
      return absl::InvalidArgumentError(
          "config.json: rotary_dim null is not supported for gptj (transformers then rotates "
          "by positions of the whole hidden size, which it runs with one head only)");
    }
    TANDEM_ASSIGN_OR_RETURN(config.rotary_dims, GetIntOr(json, "rotary_dim", 64, where));
  }
  if (glm) {
    // GLM's attention takes hidden / heads; its head_dim (128 unless given) sizes the
    // rotation: the first head_dim / 2 features of each head.
    TANDEM_ASSIGN_OR_RETURN(const int64_t rotary_head, GetIntOr(json, "head_dim", 128, where));
    config.rotary_dims = rotary_head / 2;
    if (!json.contains("pad_token_id")) config.pad_token_id = 151329;  // GlmConfig's default
  }
  if (neox || gptj) {
    // GPTNeoXConfig and GPTJConfig have no key/value groups and take hidden / heads.
    config.kv_heads = config.heads;
    config.head_dim = 0;
  }
  if (falcon) {
    TANDEM_RETURN_IF_ERROR(ReadFalconLayout(json, config));
  }
  TANDEM_ASSIGN_OR_RETURN(config.max_position_embeddings,
                          GetIntOr(json, gptj ? "n_positions" : "max_position_embeddings",
                                   defaults.max_positions, where));
  TANDEM_ASSIGN_OR_RETURN(config.rms_norm_eps,
                          GetNumberOr(json, "rms_norm_eps", defaults.rms_norm_eps, where));
  if (starcoder2 || nemotron) {  // their layer norms' epsilon
    TANDEM_ASSIGN_OR_RETURN(
        config.rms_norm_eps,
        GetNumberOr(json, starcoder2 ? "norm_epsilon" : "norm_eps", defaults.rms_norm_eps, where));
  }
  if (phi || neox || stablelm || gptj || cohere || falcon) {  // their layer norms' epsilon
    TANDEM_ASSIGN_OR_RETURN(
        config.rms_norm_eps,
        GetNumberOr(json, gptj || falcon ? "layer_norm_epsilon" : "layer_norm_eps",
                    defaults.rms_norm_eps, where));
  }
  if (neox || stablelm) {  // GPTNeoXConfig's default true, StableLmConfig's false
    TANDEM_ASSIGN_OR_RETURN(config.parallel_residual,
                            GetBoolOrUnset(json, "use_parallel_residual", neox, where));
  }
  if (cohere) {
    TANDEM_ASSIGN_OR_RETURN(config.logit_scale, GetNumberOr(json, "logit_scale", 0.0625, where));
    if (!json.contains("pad_token_id")) config.pad_token_id = 0;  // CohereConfig's default
  }
  if (cohere) {
    TANDEM_ASSIGN_OR_RETURN(config.head_qk_norms,
                            GetBoolOrUnset(json, "use_qk_norm", false, where));
  }
  if (stablelm) {
    TANDEM_ASSIGN_OR_RETURN(config.head_qk_norms,
                            GetBoolOrUnset(json, "qk_layernorm", false, where));
  }
  if (phi) {
    const char* field = "qk_layernorm";
    TANDEM_ASSIGN_OR_RETURN(const bool qk_layernorm, GetBoolOrUnset(json, field, false, where));
    if (qk_layernorm) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: ", field, " true is not supported for ", config.model_type,
                       " (tandem normalises neither its queries nor its keys)"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(config.rope_theta,
                          GetNumberOr(json, "rope_theta", defaults.rope_theta, where));
  if (neox) {
    // GPTNeoXConfig reads rotary_emb_base and rotary_pct (over the rope_theta and
    // partial_rotary_factor it writes beside them).
    TANDEM_ASSIGN_OR_RETURN(config.rope_theta,
                            GetNumberOr(json, "rotary_emb_base", defaults.rope_theta, where));
  }
  if (gptj) config.rope_theta = 10000.0;  // GPT-J's sinusoids have no other base
  TANDEM_ASSIGN_OR_RETURN(config.init_std, GetNumberOr(json, "initializer_range", 0.02, where));
  TANDEM_ASSIGN_OR_RETURN(config.tie_word_embeddings,
                          GetBoolOrUnset(json, "tie_word_embeddings", defaults.tied, where));
  if (qwen2_moe || qwen3_moe) {
    // Qwen2MoeConfig's defaults: Qwen1.5-MoE-A2.7B's; Qwen3MoeConfig's: Qwen3-30B-A3B's,
    // without a shared expert (the field is not Qwen3MoeConfig's: ignored, as transformers
    // ignores it).
    TANDEM_ASSIGN_OR_RETURN(config.experts,
                            GetIntOr(json, "num_experts", qwen3_moe ? 128 : 60, where));
    TANDEM_ASSIGN_OR_RETURN(config.experts_per_token,
                            GetIntOr(json, "num_experts_per_tok", qwen3_moe ? 8 : 4, where));
    TANDEM_ASSIGN_OR_RETURN(config.expert_intermediate,
                            GetIntOr(json, "moe_intermediate_size", qwen3_moe ? 768 : 1408, where));
    if (qwen2_moe) {
      TANDEM_ASSIGN_OR_RETURN(config.shared_expert_intermediate,
                              GetIntOr(json, "shared_expert_intermediate_size", 5632, where));
    }
    TANDEM_ASSIGN_OR_RETURN(config.normalize_top_k,
                            GetBoolOrUnset(json, "norm_topk_prob", false, where));
    TANDEM_ASSIGN_OR_RETURN(config.sparse_step, GetIntOr(json, "decoder_sparse_step", 1, where));
    if (IsSet(json, "mlp_only_layers")) {
      const Json& dense = json.at("mlp_only_layers");
      if (!dense.is_array()) {
        return absl::InvalidArgumentError("config.json: mlp_only_layers must be a list of layers");
      }
      for (const Json& layer : dense) {
        if (!layer.is_number_integer()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "config.json: mlp_only_layers must be a list of layers, got ", dense.dump()));
        }
        config.dense_blocks.push_back(layer.get<int64_t>());
      }
      std::sort(config.dense_blocks.begin(), config.dense_blocks.end());
      config.dense_blocks.erase(std::unique(config.dense_blocks.begin(), config.dense_blocks.end()),
                                config.dense_blocks.end());
    }
  }
  if (olmoe) {
    // OlmoeConfig's defaults: OLMoE-1B-7B's; every block sparse, no shared expert.
    TANDEM_ASSIGN_OR_RETURN(config.experts, GetIntOr(json, "num_experts", 64, where));
    TANDEM_ASSIGN_OR_RETURN(config.experts_per_token,
                            GetIntOr(json, "num_experts_per_tok", 8, where));
    TANDEM_ASSIGN_OR_RETURN(config.normalize_top_k,
                            GetBoolOrUnset(json, "norm_topk_prob", false, where));
  }
  if (mixtral || granitemoe) {
    TANDEM_ASSIGN_OR_RETURN(config.experts, GetIntOr(json, "num_local_experts", 8, where));
    TANDEM_ASSIGN_OR_RETURN(config.experts_per_token,
                            GetIntOr(json, "num_experts_per_tok", 2, where));
  }
  if (mixtral || qwen2_moe || granitemoe || olmoe || qwen3_moe) {
    TANDEM_ASSIGN_OR_RETURN(const bool router_logits,
                            GetBoolOrUnset(json, "output_router_logits", false, where));
    if (router_logits) {
      return absl::InvalidArgumentError(
          "config.json: output_router_logits true is not supported: transformers then adds a "
          "load-balancing loss over the router scores of all layers pooled, which tandem does "
          "not compute; set it to false (and give --moe-aux-loss-coef for tandem's, taken "
          "layer by layer)");
    }
    TANDEM_ASSIGN_OR_RETURN(const double jitter,
                            GetNumberOr(json, "router_jitter_noise", 0.0, where));
    if (jitter != 0.0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: router_jitter_noise ", jitter,
          " is not supported (tandem routes without noise, as transformers does in eval mode; "
          "set it to 0)"));
    }
  }
  if (gemma) {
    // Gemma's activation is hidden_activation; transformers ignores hidden_act for it.
    TANDEM_ASSIGN_OR_RETURN(config.hidden_act,
                            GetStringOr(json, "hidden_activation", "gelu_pytorch_tanh", where));
    if (config.hidden_act != "gelu_pytorch_tanh" && config.hidden_act != "gelu") {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: hidden_activation \"", config.hidden_act,
                       "\" is not supported (gemma: gelu_pytorch_tanh and gelu)"));
    }
    if (!json.contains("pad_token_id")) config.pad_token_id = 0;  // GemmaConfig's default
    // Gemma 3's scales its global blocks' frequencies (read below as other families' are).
    if (IsSet(json, "rope_scaling") && !config.Gemma3()) {
      return absl::InvalidArgumentError(
          "config.json: rope_scaling is not supported for gemma (transformers' Gemma has plain "
          "rotary embeddings)");
    }
  }
  if (granite) {
    const std::pair<const char*, double*> multipliers[] = {
        {"embedding_multiplier", &config.embedding_multiplier},
        {"residual_multiplier", &config.residual_multiplier},
        {"attention_multiplier", &config.attention_multiplier},
        {"logits_scaling", &config.logits_scaling}};
    for (const auto& [field, value] : multipliers) {
      TANDEM_ASSIGN_OR_RETURN(*value, GetNumberOr(json, field, 1.0, where));
    }
    if (!(config.attention_multiplier > 0)) {  // 0 would mean none to tandem
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: attention_multiplier must be positive, got ", config.attention_multiplier));
    }
  }
  if (olmo2 && !json.contains("pad_token_id")) config.pad_token_id = 1;  // Olmo2Config's default
  if (glm4 && !json.contains("pad_token_id")) config.pad_token_id = 151329;  // Glm4Config's
  if (olmo) {
    // OlmoLayerNorm's epsilon is fixed (OlmoConfig has no rms_norm_eps); OLMoE's RMSNorms
    // read theirs.
    if (!olmoe) config.rms_norm_eps = 1e-5;
    // OlmoConfig's and OlmoeConfig's default.
    if (!json.contains("pad_token_id")) config.pad_token_id = 1;
    if (IsSet(json, "clip_qkv")) {
      TANDEM_ASSIGN_OR_RETURN(config.clip_qkv, GetNumber(json, "clip_qkv", where));
      if (!(config.clip_qkv > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.json: clip_qkv must be positive or null, got ", config.clip_qkv));
      }
    }
  }
  if (phi3) {
    if (!json.contains("pad_token_id")) config.pad_token_id = 32000;  // Phi3Config's default
    if (IsSet(json, "rope_scaling")) {
      TANDEM_ASSIGN_OR_RETURN(config.long_rope, LongRopeOf(json));
    }
  }
  if (gemma2) {
    const bool gemma3 = config.Gemma3();
    TANDEM_ASSIGN_OR_RETURN(
        config.query_pre_attn_scalar,
        GetNumberOr(json, "query_pre_attn_scalar", gemma3 ? 256.0 : 224.0, where));
    // A cap of null is none; an absent one Gemma2Config's default (Gemma3TextConfig's: none).
    const std::pair<const char*, double*> caps[] = {
        {"attn_logit_softcapping", &config.attn_logit_softcapping},
        {"final_logit_softcapping", &config.final_logit_softcapping}};
    if (gemma3 && IsSet(json, "attn_logit_softcapping")) {
      return absl::InvalidArgumentError(
          "config.json: attn_logit_softcapping is not supported for gemma3_text (transformers' "
          "Gemma 3 attention does not apply it, and Gemma 3's models have none; set it to "
          "null)");
    }
    if (gemma3) {
      TANDEM_ASSIGN_OR_RETURN(config.sliding_window_pattern,
                              GetIntOr(json, "sliding_window_pattern", 6, where));
      TANDEM_ASSIGN_OR_RETURN(config.rope_local_theta,
                              GetNumberOr(json, "rope_local_base_freq", 10000.0, where));
    }
    for (const auto& [field, cap] : caps) {
      *cap = gemma3 ? 0.0 : absl::string_view(field) == "attn_logit_softcapping" ? 50.0 : 30.0;
      if (json.contains(field)) {
        *cap = 0;
        if (IsSet(json, field)) {
          TANDEM_ASSIGN_OR_RETURN(*cap, GetNumber(json, field, where));
        }
      }
    }
  }
  if (qwen2) {
    // Qwen2's q/k/v_proj always have biases, o_proj and the MLP never.
    config.qkv_bias = true;
  } else if (phi) {
    // Phi's products all have biases.
    config.attention_bias = true;
    config.mlp_bias = true;
  } else if (glm || glm4) {
    // GLM's q/k/v_proj have them with attention_bias (its default); o_proj and the MLP never.
    TANDEM_ASSIGN_OR_RETURN(config.qkv_bias, GetBoolOrUnset(json, "attention_bias", true, where));
  } else if (gptj) {
    // GPT-J's MLP has biases, its attention none.
    config.mlp_bias = true;
  } else if (falcon) {
    // One `bias` for every product (FalconConfig's default: none).
    TANDEM_ASSIGN_OR_RETURN(config.attention_bias, GetBoolOrUnset(json, "bias", false, where));
    config.mlp_bias = config.attention_bias;
  } else if (stablelm) {
    // StableLM's q/k/v_proj have them with use_qkv_bias; o_proj and the MLP never.
    TANDEM_ASSIGN_OR_RETURN(config.qkv_bias, GetBoolOrUnset(json, "use_qkv_bias", false, where));
  } else if (neox) {
    // GPT-NeoX's attention has them with attention_bias (its default), its MLP always.
    TANDEM_ASSIGN_OR_RETURN(config.attention_bias,
                            GetBoolOrUnset(json, "attention_bias", true, where));
    config.mlp_bias = true;
  } else if (starcoder2) {
    // One use_bias for every product (Starcoder2Config's default: true).
    TANDEM_ASSIGN_OR_RETURN(config.attention_bias, GetBoolOrUnset(json, "use_bias", true, where));
    config.mlp_bias = config.attention_bias;
  } else if (!mistral && !mixtral && !phi3) {  // MistralConfig, MixtralConfig, Phi3Config
                                               // have no biases
    TANDEM_ASSIGN_OR_RETURN(config.attention_bias,
                            GetBoolOrUnset(json, "attention_bias", false, where));
    if (!gemma && !olmo && !cohere && !qwen3 && !olmo2) {  // their MLPs have no biases
      TANDEM_ASSIGN_OR_RETURN(config.mlp_bias, GetBoolOrUnset(json, "mlp_bias", false, where));
    }
  }
  // The sliding window: Mistral's when set (transformers' default 4096), Qwen2's only with
  // use_sliding_window (its default 4096), Gemma 2's on every other layer (default 4096),
  // Mixtral's and Phi-3's when set (default none).
  bool windowed = mistral || gemma2 || mixtral || phi3 || starcoder2;
  if (qwen2 || qwen3) {
    TANDEM_ASSIGN_OR_RETURN(windowed, GetBoolOrUnset(json, "use_sliding_window", false, where));
  }
  if (windowed) {
    config.sliding_window = defaults.window;
    if (json.contains("sliding_window")) {
      if (json.at("sliding_window").is_null()) {
        config.sliding_window = 0;
      } else {
        TANDEM_ASSIGN_OR_RETURN(config.sliding_window, GetInt(json, "sliding_window", where));
        if (config.sliding_window <= 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "config.json: sliding_window must be positive or null, got ", config.sliding_window));
        }
      }
    }
  }
  if (starcoder2 || stablelm) {
    TANDEM_ASSIGN_OR_RETURN(
        config.hidden_act,
        GetStringOr(json, "hidden_act", starcoder2 ? "gelu_pytorch_tanh" : "silu", where));
    if (config.hidden_act != "gelu_pytorch_tanh" && config.hidden_act != "gelu" &&
        config.hidden_act != "silu") {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: hidden_act \"", config.hidden_act, "\" is not supported (",
                       config.model_type, ": gelu_pytorch_tanh, gelu and silu)"));
    }
  } else if (phi || neox || gptj || falcon) {
    // GPT-J's and Falcon's names for it.
    const char* field = gptj ? "activation_function" : falcon ? "activation" : "hidden_act";
    TANDEM_ASSIGN_OR_RETURN(config.hidden_act,
                            GetStringOr(json, field, neox || falcon ? "gelu" : "gelu_new", where));
    if (config.hidden_act != "gelu_new" && config.hidden_act != "gelu_pytorch_tanh" &&
        config.hidden_act != "gelu") {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: ", field, " \"", config.hidden_act, "\" is not supported (",
                       config.model_type, ": gelu_new, gelu_pytorch_tanh and gelu)"));
    }
  } else if (nemotron) {
    TANDEM_ASSIGN_OR_RETURN(config.hidden_act, GetStringOr(json, "hidden_act", "relu2", where));
    if (config.hidden_act != "relu2" && config.hidden_act != "silu" &&
        config.hidden_act != "gelu" && config.hidden_act != "gelu_new" &&
        config.hidden_act != "gelu_pytorch_tanh") {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: hidden_act \"", config.hidden_act,
                       "\" is not supported (nemotron: relu2, silu, gelu, gelu_new and "
                       "gelu_pytorch_tanh)"));
    }
  } else if (!gemma) {
    TANDEM_ASSIGN_OR_RETURN(config.hidden_act, GetStringOr(json, "hidden_act", "silu", where));
    if (config.hidden_act != "silu") {
      return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_act \"",
                                                     config.hidden_act,
                                                     "\" is not supported (llama: silu only)"));
    }
  }
  if (neox) {
    TANDEM_ASSIGN_OR_RETURN(config.partial_rotary_factor,
                            GetNumberOr(json, "rotary_pct", 0.25, where));
  } else {
    // PhiConfig's, NemotronConfig's, StableLmConfig's.
    const double factor = phi || nemotron || glm4 ? 0.5 : stablelm ? 0.25 : 1.0;
    TANDEM_ASSIGN_OR_RETURN(config.partial_rotary_factor,
                            GetNumberOr(json, "partial_rotary_factor", factor, where));
  }
  if (!config.PartialRotation() && config.partial_rotary_factor != 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: partial_rotary_factor ", config.partial_rotary_factor,
                     " is not supported for ", config.model_type,
                     " (only 1; phi's, phi3's, gpt_neox's, stablelm's and "
                     "nemotron's may be less)"));
  }
  if (IsSet(json, "pad_token_id")) {
    TANDEM_ASSIGN_OR_RETURN(const int64_t pad, GetInt(json, "pad_token_id", where));
    config.pad_token_id = pad;
  }
  if (IsSet(json, "rope_scaling") && (gptj || glm || nemotron)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: rope_scaling is not supported for ", config.model_type,
                     " (transformers' ", config.model_type, " has plain rotary embeddings)"));
  }
  if (IsSet(json, "rope_scaling") && !phi3) {
    TANDEM_ASSIGN_OR_RETURN(const Json* scaling, GetObject(json, "rope_scaling", where));
    const std::string scaling_where = "config.json: rope_scaling";
    // transformers reads "rope_type", and "type" from older files.
    std::string type = "default";
    if (IsSet(*scaling, "rope_type")) {
      TANDEM_ASSIGN_OR_RETURN(type, GetString(*scaling, "rope_type", scaling_where));
    } else if (IsSet(*scaling, "type")) {
      TANDEM_ASSIGN_OR_RETURN(type, GetString(*scaling, "type", scaling_where));
    }
    if (type == "linear") {
      LlamaRopeScaling s;
      s.type = type;
      TANDEM_ASSIGN_OR_RETURN(s.factor, GetNumber(*scaling, "factor", scaling_where));
      config.rope_scaling = s;
    } else if (type == "yarn") {
      TANDEM_ASSIGN_OR_RETURN(config.rope_scaling, YarnScalingOf(*scaling, config));
    } else if (type == "llama3") {
      LlamaRopeScaling s;
      TANDEM_ASSIGN_OR_RETURN(s.factor, GetNumber(*scaling, "factor", scaling_where));
      TANDEM_ASSIGN_OR_RETURN(s.low_freq_factor,
                              GetNumber(*scaling, "low_freq_factor", scaling_where));
      TANDEM_ASSIGN_OR_RETURN(s.high_freq_factor,
                              GetNumber(*scaling, "high_freq_factor", scaling_where));
      TANDEM_ASSIGN_OR_RETURN(
          s.original_max_position_embeddings,
          GetInt(*scaling, "original_max_position_embeddings", scaling_where));
      config.rope_scaling = s;
    } else if (type != "default") {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: rope_scaling type \"", type,
          "\" is not supported (tandem's llama has \"llama3\", \"linear\", \"yarn\" and "
          "\"default\")"));
    }
  }
  config.seq_len = std::min(config.seq_len, config.max_position_embeddings);
  config.seq_len = std::min(config.seq_len, config.MaxPositions());
  if (absl::Status valid = ValidateLlamaConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", valid.message()));
  }
  return config;
}

absl::Status ValidateLlamaConfig(const LlamaConfig& config) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", config.vocab},
      {"num_hidden_layers", config.layers},
      {"hidden_size", config.hidden},
      {"num_attention_heads", config.heads},
      {"num_key_value_heads", config.kv_heads},
      {"intermediate_size", config.intermediate},
      {"seq_len", config.seq_len},
      {"max_position_embeddings", config.max_position_embeddings}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("llama: ", field, " must be positive, got ", value));
    }
  }
  if (config.heads % config.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: num_key_value_heads (", config.kv_heads, ") must divide num_attention_heads (",
        config.heads, ")"));
  }
  if (config.head_dim < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: head_dim must be positive, got ", config.head_dim));
  }
  if (config.head_dim == 0 && config.hidden % config.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: hidden_size (", config.hidden,
                     ") must be divisible by num_attention_heads (", config.heads,
                     ") unless head_dim is given"));
  }
  if (config.HeadDim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: the head dimension (", config.HeadDim(), ") must be even (rotary embeddings)"));
  }
  if (config.seq_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: seq_len ", config.seq_len, " exceeds max_position_embeddings ",
                     config.max_position_embeddings));
  }
  if (config.sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: sliding_window must be positive, got ", config.sliding_window));
  }
  if (config.seq_len > config.MaxPositions()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: seq_len ", config.seq_len, " exceeds the sliding window (", config.sliding_window,
        " tokens) of ", config.model_type,
        ": tandem computes its attention in full, which equals the windowed one only for "
        "sequences within the window"));
  }
  const bool mixtral = config.MixtralExperts(), qwen2_moe = config.model_type == "qwen2_moe";
  const bool olmoe = config.model_type == "olmoe";
  const bool qwen3_moe = config.model_type == "qwen3_moe";
  if (!IsLlamaModelType(config.model_type)) {
    return absl::InvalidArgumentError(absl::StrCat("llama: model_type \"", config.model_type,
                                                   "\" is not one of ", kLlamaModelTypes));
  }
  if (config.experts < 0 || (config.Moe() && !mixtral && !qwen2_moe && !olmoe && !qwen3_moe) ||
      ((mixtral || olmoe) && !config.Moe())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: experts (num_local_experts, num_experts) are Mixtral's, GraniteMoE's, "
        "Qwen2-MoE's, OLMoE's and Qwen3-MoE's: mixtral, granitemoe and olmoe need them, the "
        "other families have none; got ",
        config.experts, " for ", config.model_type));
  }
  if (qwen3_moe && config.Moe() &&
      (config.expert_intermediate <= 0 || config.shared_expert_intermediate != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: Qwen3-MoE's experts have moe_intermediate_size units (positive, got ",
                     config.expert_intermediate, ") and no shared expert"));
  }
  if (olmoe && (config.expert_intermediate != 0 || config.shared_expert_intermediate != 0 ||
                config.sparse_step != 1 || !config.dense_blocks.empty())) {
    return absl::InvalidArgumentError(
        "llama: OLMoE's experts have intermediate_size units, no shared expert and every block "
        "sparse");
  }
  if (mixtral &&
      (config.expert_intermediate != 0 || config.shared_expert_intermediate != 0 ||
       !config.normalize_top_k || config.sparse_step != 1 || !config.dense_blocks.empty())) {
    return absl::InvalidArgumentError(
        "llama: Mixtral's experts have intermediate_size units, no shared expert, renormalised "
        "probabilities and every block sparse");
  }
  if (config.expert_intermediate < 0 || config.shared_expert_intermediate < 0 ||
      (qwen2_moe && config.Moe() &&
       (config.expert_intermediate == 0 || config.shared_expert_intermediate == 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: moe_intermediate_size (", config.expert_intermediate,
                     ") and shared_expert_intermediate_size (", config.shared_expert_intermediate,
                     ") must be positive"));
  }
  if (!(config.router_aux_loss_coef >= 0) || std::isinf(config.router_aux_loss_coef) ||
      (config.router_aux_loss_coef > 0 && !config.Moe())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: the experts' load-balancing loss coefficient must be 0, or positive for a model "
        "with experts; got ",
        config.router_aux_loss_coef, " for ", config.Moe() ? "experts" : "a dense model"));
  }
  if (config.sparse_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: decoder_sparse_step must be positive, got ", config.sparse_step));
  }
  if (config.Moe() && (config.experts_per_token < 1 || config.experts_per_token > config.experts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: num_experts_per_tok (", config.experts_per_token,
                     ") must be between 1 and num_local_experts (", config.experts, ")"));
  }
  if (config.Moe() && config.mlp_bias) {
    return absl::InvalidArgumentError("llama: experts have no biases (mlp_bias)");
  }
  if ((config.hidden_act != "silu" && config.hidden_act != "gelu_pytorch_tanh" &&
       config.hidden_act != "gelu" && config.hidden_act != "gelu_new" &&
       config.hidden_act != "relu2") ||
      (config.hidden_act == "relu2" && !config.Nemotron())) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: hidden_act \"", config.hidden_act,
                     "\" is not silu, gelu_pytorch_tanh, gelu or gelu_new (or Nemotron's relu2)"));
  }
  if (!(config.partial_rotary_factor > 0 && config.partial_rotary_factor <= 1) ||
      (!config.PartialRotation() && config.partial_rotary_factor != 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: partial_rotary_factor must be in (0, 1], and 1 except for phi, phi3, gpt_neox, "
        "stablelm and nemotron; got ",
        config.partial_rotary_factor, " for ", config.model_type));
  }
  if (config.parallel_residual && !config.ParallelResidualFamily()) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: use_parallel_residual is GPT-NeoX's, StableLM's and Falcon's, not ",
                     config.model_type));
  }
  if (config.branch_norms && !(config.Falcon() && config.parallel_residual)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: a norm for each of the attention and the MLP side by side is Falcon's, not ",
        config.model_type, "'s", config.parallel_residual ? "" : " (sequential blocks)"));
  }
  if (config.Falcon() &&
      (config.qkv_bias || config.attention_bias != config.mlp_bias ||
       (!config.parallel_residual && config.kv_heads != 1 && config.kv_heads != config.heads))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: Falcon has one bias setting for every product, and its sequential blocks one "
        "key/value head or one per head; got ",
        config.kv_heads, " key/value heads of ", config.heads));
  }
  if ((config.Gemma3() || config.sliding_window_pattern != 0 || config.rope_local_theta != 0) &&
      !(config.Gemma3() && config.sliding_window_pattern > 0 && config.rope_local_theta > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: sliding_window_pattern and rope_local_base_freq are Gemma 3's (both positive); "
        "got ",
        config.sliding_window_pattern, " and ", config.rope_local_theta, " for ",
        config.model_type));
  }
  if (config.head_qk_norms && !config.Cohere() && !config.StableLm()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: a norm of each query and key head (use_qk_norm, qk_layernorm) is Cohere's and "
        "StableLM's, not ",
        config.model_type, "'s"));
  }
  if (config.NeoX() && config.kv_heads != config.heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: GPT-NeoX's attention has as many key/value heads as heads (",
                     config.heads, "), got ", config.kv_heads));
  }
  if (config.rotary_dims < 0 || (config.rotary_dims > 0 && !config.GptJ() && !config.Glm()) ||
      config.rotary_dims > config.HeadDim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama: GPT-J's rotary_dim (half of GLM's head_dim) must be at most the head dimension (",
        config.HeadDim(), ") and is theirs only; got ", config.rotary_dims, " for ",
        config.model_type));
  }
  if (config.GptJ() && config.kv_heads != config.heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: GPT-J's attention has as many key/value heads as heads (",
                     config.heads, "), got ", config.kv_heads));
  }
  if (config.RotaryDim() < 2 || config.RotaryDim() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: partial_rotary_factor ", config.partial_rotary_factor, " of head_dim ",
                     config.HeadDim(), " rotates ", config.RotaryDim(),
                     " features; rotary embeddings need an even number, at least 2"));
  }
  const std::pair<const char*, double> scalars[] = {
      {"query_pre_attn_scalar", config.query_pre_attn_scalar},
      {"attn_logit_softcapping", config.attn_logit_softcapping},
      {"final_logit_softcapping", config.final_logit_softcapping}};
  for (const auto& [field, value] : scalars) {
    if (!(value >= 0) || std::isinf(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("llama: ", field, " must be positive (or 0 for none), got ", value));
    }
  }
  if (!(config.rope_theta > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: rope_theta must be positive, got ", config.rope_theta));
  }
  if (!(config.rms_norm_eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: rms_norm_eps must be positive, got ", config.rms_norm_eps));
  }
  if (!(config.init_std > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: initializer_range must be positive, got ", config.init_std));
  }
  const std::pair<const char*, double> multipliers[] = {
      {"logit_scale", config.logit_scale},
      {"embedding_multiplier", config.embedding_multiplier},
      {"residual_multiplier", config.residual_multiplier},
      {"logits_scaling", config.logits_scaling}};
  for (const auto& [field, value] : multipliers) {
    if (!(value > 0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("llama: ", field, " must be positive, got ", value));
    }
  }
  if (!(config.clip_qkv >= 0) || !std::isfinite(config.clip_qkv)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: clip_qkv must be positive (or 0: none), got ", config.clip_qkv));
  }
  if (!(config.attention_multiplier >= 0) || !std::isfinite(config.attention_multiplier)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: attention_multiplier must be positive (or 0: none), got ",
                     config.attention_multiplier));
  }
  if (config.long_rope) {
    const LlamaLongRope& rope = *config.long_rope;
    const size_t half = static_cast<size_t>(config.RotaryDim() / 2);
    if (rope.short_factor.size() != half || rope.long_factor.size() != half) {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama: LongRoPE needs a factor for each pair of rotated features (", half,
          ") short and long, got ", rope.short_factor.size(), " and ", rope.long_factor.size()));
    }
    for (const std::vector<double>* factors : {&rope.short_factor, &rope.long_factor}) {
      for (const double f : *factors) {
        if (!(f > 0) || !std::isfinite(f)) {
          return absl::InvalidArgumentError(
              absl::StrCat("llama: LongRoPE's factors must be positive, got ", f));
        }
      }
    }
    if (rope.original_max_position_embeddings <= 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("llama: original_max_position_embeddings must be more than 1, got ",
                       rope.original_max_position_embeddings));
    }
  }
  if (config.pad_token_id && (*config.pad_token_id < 0 || *config.pad_token_id >= config.vocab)) {
    return absl::InvalidArgumentError(absl::StrCat("llama: pad_token_id ", *config.pad_token_id,
                                                   " is not below vocab_size ", config.vocab));
  }
  if (config.rope_scaling && config.rope_scaling->type != "llama3") {
    const LlamaRopeScaling& s = *config.rope_scaling;
    const bool yarn = s.type == "yarn";
    if ((s.type != "linear" && !yarn) || !(s.factor > 0) || std::isinf(s.factor) ||
        (yarn &&
         (!(s.factor >= 1) || s.original_max_position_embeddings <= 0 || !(s.beta_fast > 0) ||
          !(s.beta_slow > 0) || !(s.attention_factor > 0) || std::isinf(s.attention_factor)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama: rope_scaling ", s.type,
          " needs a finite factor > 0 (yarn: at least 1, with positive beta_fast, beta_slow, "
          "attention_factor and original_max_position_embeddings); got factor ",
          s.factor));
    }
  } else if (config.rope_scaling) {
    const LlamaRopeScaling& s = *config.rope_scaling;
    if (!(s.factor > 0) || !(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor) ||
        s.original_max_position_embeddings <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama: rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
          "original_max_position_embeddings > 0; got factor ",
          s.factor, ", low_freq_factor ", s.low_freq_factor, ", high_freq_factor ",
          s.high_freq_factor, ", original_max_position_embeddings ",
          s.original_max_position_embeddings));
    }
  }
  return absl::OkStatus();
}

std::string DescribeLlama(const LlamaConfig& config) {
  std::string text = absl::StrCat("llama L=", config.layers, " H=", config.hidden,
                                  " A=", config.heads, " KV=", config.kv_heads,
                                  " I=", config.intermediate, " S=", config.seq_len,
                                  " V=", config.vocab);
  if (config.head_dim > 0) absl::StrAppend(&text, " hd=", config.head_dim);
  // Six significant digits where they read back as the same number (every description
  // written before), else the shortest text that does: a theta such as StarCoder2-3B's
  // 999999.4420358813 is not rounded.
  std::string theta = absl::StrCat(config.rope_theta);
  double read_back = 0;
  if (!absl::SimpleAtod(theta, &read_back) || read_back != config.rope_theta) {
    char digits[32];
    const std::to_chars_result written =
        std::to_chars(digits, digits + sizeof(digits), config.rope_theta);
    theta.assign(digits, written.ptr);
  }
  absl::StrAppend(&text, " rope=", theta);
  if (config.rope_scaling) {
    const LlamaRopeScaling& s = *config.rope_scaling;
    if (s.type == "linear") {
      absl::StrAppend(&text, " linear-scaling=", s.factor);
    } else if (s.type == "yarn") {
      absl::StrAppend(&text, " yarn-scaling=", s.factor, "/", s.original_max_position_embeddings,
                      "/", s.beta_fast, "/", s.beta_slow, "/", s.attention_factor);
    } else {
      absl::StrAppend(&text, " llama3-scaling=", s.factor, "/", s.low_freq_factor, "/",
                      s.high_freq_factor, "/", s.original_max_position_embeddings);
    }
  }
  if (config.tie_word_embeddings) absl::StrAppend(&text, " tied");
  if (config.attention_bias) absl::StrAppend(&text, " attention-bias");
  if (config.qkv_bias && !config.attention_bias) absl::StrAppend(&text, " qkv-bias");
  if (config.mlp_bias) absl::StrAppend(&text, " mlp-bias");
  if (config.sliding_window > 0) absl::StrAppend(&text, " window=", config.sliding_window);
  if (config.sliding_window_pattern > 0) {
    absl::StrAppend(&text, " window-pattern=", config.sliding_window_pattern);
  }
  if (config.rope_local_theta > 0) absl::StrAppend(&text, " local-rope=", config.rope_local_theta);
  if (config.hidden_act != "silu") absl::StrAppend(&text, " act=", config.hidden_act);
  if (config.query_pre_attn_scalar > 0) {
    absl::StrAppend(&text, " qscale=", config.query_pre_attn_scalar);
  }
  if (config.attn_logit_softcapping > 0) {
    absl::StrAppend(&text, " attn-softcap=", config.attn_logit_softcapping);
  }
  if (config.final_logit_softcapping > 0) {
    absl::StrAppend(&text, " final-softcap=", config.final_logit_softcapping);
  }
  if (config.Moe()) {
    absl::StrAppend(&text, " experts=", config.experts, "/", config.experts_per_token);
    if (config.expert_intermediate > 0) {
      absl::StrAppend(&text, " expert-units=", config.expert_intermediate);
    }
    if (config.shared_expert_intermediate > 0) {
      absl::StrAppend(&text, " shared-units=", config.shared_expert_intermediate);
    }
    if (!config.normalize_top_k) absl::StrAppend(&text, " topk=raw");
    if (config.sparse_step != 1) absl::StrAppend(&text, " sparse-step=", config.sparse_step);
    if (!config.dense_blocks.empty()) {
      absl::StrAppend(&text, " dense=", absl::StrJoin(config.dense_blocks, ","));
    }
    if (config.router_aux_loss_coef > 0) {
      absl::StrAppend(&text, " aux-loss=", config.router_aux_loss_coef);
    }
  }
  if (config.long_rope) {
    // The factors themselves (head_dim of them) would make the description long: a hash of
    // their decimal text tells models apart.
    const LlamaLongRope& rope = *config.long_rope;
    const std::string factors = absl::StrCat(absl::StrJoin(rope.short_factor, ","), "/",
                                             absl::StrJoin(rope.long_factor, ","));
    uint32_t hash = 2166136261u;  // FNV-1a
    for (const unsigned char c : factors) hash = (hash ^ c) * 16777619u;
    absl::StrAppend(&text, " longrope=", rope.original_max_position_embeddings, "/",
                    absl::Hex(hash, absl::kZeroPad8));
  }
  if (config.embedding_multiplier != 1.0) {
    absl::StrAppend(&text, " embedding-mult=", config.embedding_multiplier);
  }
  if (config.residual_multiplier != 1.0) {
    absl::StrAppend(&text, " residual-mult=", config.residual_multiplier);
  }
  if (config.attention_multiplier > 0) {
    absl::StrAppend(&text, " attention-mult=", config.attention_multiplier);
  }
  if (config.logits_scaling != 1.0) {
    absl::StrAppend(&text, " logits-scaling=", config.logits_scaling);
  }
  if (config.clip_qkv > 0) absl::StrAppend(&text, " clip-qkv=", config.clip_qkv);
  if (config.partial_rotary_factor != 1.0) {
    absl::StrAppend(&text, " rotary=", config.partial_rotary_factor);
  }
  if (config.rotary_dims > 0) absl::StrAppend(&text, " rotary-dims=", config.rotary_dims);
  if (config.logit_scale != 1.0) absl::StrAppend(&text, " logit-scale=", config.logit_scale);
  if (config.parallel_residual) absl::StrAppend(&text, " parallel-residual");
  if (config.branch_norms) absl::StrAppend(&text, " branch-norms");
  if (config.head_qk_norms) absl::StrAppend(&text, " qk-norm");
  if (config.model_type != "llama") absl::StrAppend(&text, " family=", config.model_type);
  return text;
}

int64_t LlamaConfig::WindowOfBlock(int64_t block) const {
  if (model_type == "mistral" || model_type == "mixtral" || model_type == "phi3" ||
      model_type == "starcoder2") {
    return sliding_window;
  }
  if (model_type == "gemma2") return block % 2 == 0 ? sliding_window : 0;
  if (Gemma3()) return LocalBlock(block) ? sliding_window : 0;
  return 0;
}

bool LlamaConfig::SparseBlock(int64_t block) const {
  return Moe() && (block + 1) % sparse_step == 0 &&
         std::find(dense_blocks.begin(), dense_blocks.end(), block) == dense_blocks.end();
}

int64_t LlamaConfig::MaxPositions() const {
  if ((model_type == "qwen2" || model_type == "qwen2_moe" || Qwen3()) && sliding_window > 0) {
    return std::min(max_position_embeddings, sliding_window);
  }
  return max_position_embeddings;
}

double LlamaConfig::RotaryScale() const {
  if (rope_scaling && rope_scaling->type == "yarn") return rope_scaling->attention_factor;
  if (!long_rope) return 1.0;
  const double original = static_cast<double>(long_rope->original_max_position_embeddings);
  const double scale = static_cast<double>(max_position_embeddings) / original;
  return scale <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(scale) / std::log(original));
}

double LlamaConfig::ScoreDivisor() const {
  if (attention_multiplier > 0) return 1.0 / attention_multiplier;
  return std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                             : static_cast<double>(HeadDim()));
}

double LlamaTrainingFlopsPerToken(const LlamaConfig& config) {
  const double h = static_cast<double>(config.hidden);
  const double q = static_cast<double>(config.heads * config.HeadDim());
  const double kv = static_cast<double>(config.kv_heads * config.HeadDim());
  const double layers = static_cast<double>(config.layers);
  // Per block: q and o h*q each, k and v h*kv each, the MLP's (or each expert's) three
  // matrices and the router.
  double blocks = 0;
  for (int64_t b = 0; b < config.layers; ++b) {
    blocks += 2.0 * h * q + 2.0 * h * kv + FeedforwardWeightsPerToken(config, b);
  }
  const double matmul_parameters = blocks + h * static_cast<double>(config.vocab);
  return 6.0 * matmul_parameters + 12.0 * layers * q * static_cast<double>(config.seq_len);
}

TiedWeights LlamaTiedWeights(const LlamaConfig& config) {
  if (!config.tie_word_embeddings) return {};
  return TiedEmbeddingAndHead("embed_tokens.weight", static_cast<int>(config.layers) + 1);
}

ModelSpec LlamaModelSpec(const LlamaConfig& config) {
  ModelSpec spec;
  spec.name = DescribeLlama(config);
  spec.build_layer = [config](int layer) {
    if (layer == 0) return torch::nn::AnyModule(LlamaEmbedding(config));
    if (layer == config.layers + 1) return torch::nn::AnyModule(LlamaHead(config));
    return torch::nn::AnyModule(LlamaBlock(config, layer - 1));
  };
  spec.describe = [config]() {
    if (absl::Status ok = ValidateLlamaConfig(config); !ok.ok()) {
      throw std::invalid_argument(std::string(ok.message()));
    }
    LayeredModel model;
    model.name = DescribeLlama(config);
    model.layer_names.push_back("embedding");
    for (int64_t block = 0; block < config.layers; ++block) {
      model.layer_names.push_back(absl::StrCat("block", block));
    }
    model.layer_names.push_back("head");
    // Forward FLOPs per token: the lookup; per block the products (2 per weight) and attention
    // scores and values (4 * S * heads * head_dim); the head's product and its loss's softmax.
    const double h = static_cast<double>(config.hidden);
    const double q = static_cast<double>(config.heads * config.HeadDim());
    const double kv = static_cast<double>(config.kv_heads * config.HeadDim());
    const double s_len = static_cast<double>(config.seq_len);
    const double attention = 4.0 * q * s_len;
    const double head = 2.0 * h * static_cast<double>(config.vocab);
    model.layer_costs.push_back(2.0 * h);
    // Input gradients cost each product's forward and twice attention's; weight gradients one
    // product per weight.
    double products = 0;  // of every block
    for (int64_t block = 0; block < config.layers; ++block) {
      const double block_products =
          2.0 * (2.0 * h * q + 2.0 * h * kv + FeedforwardWeightsPerToken(config, block));
      model.layer_costs.push_back(block_products + attention);
      products += block_products;
    }
    model.layer_costs.push_back(head + 5.0 * static_cast<double>(config.vocab));
    const double blocks = static_cast<double>(config.layers);
    model.split_pass_costs = {products + blocks * attention + head,
                              products + blocks * 2.0 * attention + head, products + head};
    model.loss = TokenCrossEntropy(config.vocab);
    model.loss_takes_compute_type = true;
    const int last = static_cast<int>(config.layers) + 1;
    model.shard_for_tensor_parallel = [config, last](std::vector<torch::nn::AnyModule>& layers,
                                                     int first,
                                                     const TensorParallel& tp) -> absl::Status {
      TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(config.heads, "llama: num_attention_heads"));
      if (absl::Status kv = tp.CheckDivisible(config.kv_heads, "llama: num_key_value_heads");
          !kv.ok() && (config.FusedQkv() || config.QkNorms())) {
        // Elsewhere k_proj and v_proj are then held whole on every rank (LlamaAttention). One
        // fused product is split by key/value groups, and OLMoE's k_norm sums over the
        // group's key features.
        return absl::InvalidArgumentError(absl::StrCat(
            kv.message(), ": ",
            config.FusedQkv() ? "query_key_value is split by key/value groups"
                              : "k_norm normalises the key features split over the group",
            " (choose a tensor-parallel degree that divides ", config.kv_heads, ")"));
      }
      TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(config.intermediate, "llama: intermediate_size"));
      if (config.Moe()) {
        const int ep = tp.expert_parallel;
        if (ep < 1 || tp.size % ep != 0 || config.experts % ep != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "llama: expert parallelism of ", ep, " does not divide the ", config.experts,
              " experts and the tensor-parallel group of ", tp.size, " ranks"));
        }
        if (config.ExpertUnits() % (tp.size / ep) != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "llama: the experts' ", config.ExpertUnits(), " units do not split over ",
              tp.size / ep, " ranks (", tp.size, " ranks, expert parallelism of ", ep, ")"));
        }
        if (config.shared_expert_intermediate > 0) {
          TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(config.shared_expert_intermediate,
                                                   "llama: shared_expert_intermediate_size"));
        }
      }
      TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(config.vocab, "llama: vocab_size"));
      if (tp.sequence_split()) {
        TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(
            config.seq_len, "llama: the sequence length (sequence parallelism)"));
      }
      return ShardDecoderLayers<LlamaEmbedding, LlamaBlock, LlamaHead>(layers, first, last, tp);
    };
    model.tensor_parallel_loss = VocabParallelCrossEntropy;
    model.tied_weights = LlamaTiedWeights(config);
    return model;
  };
  return spec;
}

absl::StatusOr<std::string> LlamaHfName(const LlamaConfig& config, absl::string_view name) {
  std::string rest;
  const int layer = NumberAfterPrefix(name, "layers.", &rest);
  const int last = static_cast<int>(config.layers) + 1;
  const CheckpointNames names = CheckpointNamesOf(config);
  if (layer == 0 && rest == "embed_tokens.weight") return names.embedding;
  if (layer == last && rest == "norm.weight") return names.norm + "weight";
  if (layer == last && rest == "norm.bias" && config.LayerNormWithBias()) {
    return names.norm + "bias";
  }
  if (layer == last && rest == "lm_head.weight") return names.head + "weight";
  if (layer == last && rest == "lm_head.bias" && config.HeadBias()) return names.head + "bias";
  if (layer > 0 && layer < last && IsBlockParameter(config, layer - 1, rest)) {
    const std::optional<FusedSlot> fused = FusedSlotOf(config, rest);
    return absl::StrCat(names.blocks, layer - 1, ".",
                        fused ? fused->key : RenamedKey(config, rest));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("llama: '", name, "' is not a parameter of ", DescribeLlama(config)));
}

absl::StatusOr<std::string> LlamaTandemName(const LlamaConfig& config, absl::string_view key) {
  const int last = static_cast<int>(config.layers) + 1;
  const CheckpointNames names = CheckpointNamesOf(config);
  if (key == names.embedding) return std::string("layers.0.embed_tokens.weight");
  if (key == names.norm + "weight") return absl::StrCat("layers.", last, ".norm.weight");
  if (key == names.norm + "bias" && config.LayerNormWithBias()) {
    return absl::StrCat("layers.", last, ".norm.bias");
  }
  if (key == names.head + "weight") return absl::StrCat("layers.", last, ".lm_head.weight");
  if (key == names.head + "bias" && config.HeadBias()) {
    return absl::StrCat("layers.", last, ".lm_head.bias");
  }
  std::string rest;
  const int block = NumberAfterPrefix(key, names.blocks, &rest);
  if (block >= 0 && block < config.layers) {
    if (const std::optional<std::string> name = TandemNameOfKey(config, rest)) {
      return absl::StrCat("layers.", block + 1, ".", *name);
    }
    // A parameter stored fused or renamed has no key of its own name.
    if (IsBlockParameter(config, block, rest) && !FusedSlotOf(config, rest) &&
        RenamedKey(config, rest) == rest) {
      return absl::StrCat("layers.", block + 1, ".", rest);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("llama: '", key, "' is not a transformers key of ", DescribeLlama(config)));
}

std::optional<LlamaFusedRows> LlamaHfRows(const LlamaConfig& config, absl::string_view name) {
  std::string rest;
  const int layer = NumberAfterPrefix(name, "layers.", &rest);
  if (layer <= 0 || layer > config.layers) return std::nullopt;
  std::optional<FusedSlot> fused = FusedSlotOf(config, rest);
  if (!fused) return std::nullopt;
  return LlamaFusedRows{fused->first_row, std::move(fused->key_shape)};
}

}  // namespace tandem::runtime::libtorch
