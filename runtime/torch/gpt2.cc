#include "runtime/torch/gpt2.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <ATen/ATen.h>

#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "runtime/torch/fused_layer_norm.h"
#include "runtime/torch/fused_ops.h"
#include "runtime/torch/kv_cache.h"
#include "runtime/torch/precision.h"
#include "runtime/torch/tensor_parallel.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr double kPi = 3.14159265358979323846;

bool KnownActivation(const std::string& name) {
  for (const char* known :
       {"gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "relu", "silu", "swish"}) {
    if (name == known) return true;
  }
  return false;
}

// transformers' ACT2FN[name], with the same operations.
torch::Tensor Activate(const std::string& name, const torch::Tensor& x) {
  if (name == "gelu_new") {  // NewGELUActivation
    return 0.5 * x *
           (1.0 + torch::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * torch::pow(x, 3.0))));
  }
  if (name == "gelu_fast") {  // FastGELUActivation
    return 0.5 * x * (1.0 + torch::tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)));
  }
  if (name == "gelu_pytorch_tanh") return torch::gelu(x, "tanh");
  if (name == "gelu") return torch::gelu(x);
  if (name == "relu") return torch::relu(x);
  return torch::silu(x);  // silu, swish
}

// transformers' Conv1D: weight [in, out], y = x W + b.
class Conv1DImpl : public torch::nn::Cloneable<Conv1DImpl> {
 public:
  Conv1DImpl(int64_t in, int64_t out, double init_std) : in_(in), out_(out), std_(init_std) {
    reset();
  }
  void reset() override {
    weight = register_parameter("weight", torch::empty({in_, out_}));
    bias = register_parameter("bias", torch::zeros({out_}));
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(weight, /*mean=*/0.0, std_);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out_;
    return torch::addmm(bias, x.reshape({-1, in_}), weight).view(shape);
  }
  // forward() of the whole sequence gathered from this rank's S/t tokens `x`, keeping only
  // these for the backward (LinearOverGatheredSequence; the weight's gradient reaches it
  // through its transpose).
  torch::Tensor OverGatheredSequence(const torch::Tensor& x, const TensorParallel& tp) {
    return LinearOverGatheredSequence(x, weight.t(), bias, tp);
  }
  // x W without the bias (a row-parallel shard's partial product).
  torch::Tensor Product(const torch::Tensor& x) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out_;
    return torch::mm(x.reshape({-1, in_}), weight).view(shape);
  }

  // Column-parallel: of each of `parts` equal parts of the output features (c_attn's query,
  // key and value), keeps [begin, begin + length), with the bias's.
  void KeepColumns(int64_t parts, int64_t begin, int64_t length) {
    torch::NoGradGuard no_grad;
    const int64_t part = out_ / parts;
    weight.set_data(weight.view({in_, parts, part})
                        .narrow(2, begin, length)
                        .reshape({in_, parts * length})
                        .clone(torch::MemoryFormat::Contiguous));
    bias.set_data(bias.view({parts, part})
                      .narrow(1, begin, length)
                      .reshape({parts * length})
                      .clone(torch::MemoryFormat::Contiguous));
    out_ = parts * length;
  }
  // Row-parallel: keeps input features [begin, begin + length); the bias stays whole (added
  // after the partial products are summed).
  void KeepRows(int64_t begin, int64_t length) {
    torch::NoGradGuard no_grad;
    weight.set_data(weight.narrow(0, begin, length).clone());
    in_ = length;
  }

  torch::Tensor weight, bias;

 private:
  int64_t in_, out_;
  double std_;
};
TORCH_MODULE(Conv1D);

torch::nn::LayerNorm MakeLayerNorm(const Gpt2Config& config) {
  return torch::nn::LayerNorm(
      torch::nn::LayerNormOptions({config.hidden}).eps(config.layer_norm_epsilon));
}

double ResidualStd(const Gpt2Config& config) {
  return config.init_std / std::sqrt(2.0 * static_cast<double>(config.layers));
}

// Layer 0: token and position embeddings.
class Gpt2EmbeddingImpl : public torch::nn::Cloneable<Gpt2EmbeddingImpl>,
                          public IncrementalLayer {
 public:
  explicit Gpt2EmbeddingImpl(const Gpt2Config& config) : config_(config) { reset(); }

  void reset() override {
    wte = register_module("wte", torch::nn::Embedding(config_.vocab, config_.hidden));
    wpe = register_module("wpe", torch::nn::Embedding(config_.positions, config_.hidden));
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(wte->weight, 0.0, config_.init_std);
    torch::nn::init::normal_(wpe->weight, 0.0, config_.init_std);
  }

  // Keeps this rank's rows of wte (vocabulary-parallel); wpe stays whole.
  void ShardForTensorParallel(const TensorParallel& tp) {
    const int64_t rows = tp.ShardSize(config_.vocab);
    torch::nn::Embedding shard(rows, config_.hidden);
    {
      torch::NoGradGuard no_grad;
      shard->weight.copy_(wte->weight.narrow(0, tp.ShardBegin(config_.vocab), rows));
    }
    wte = replace_module("wte", shard);
    tp_ = tp;
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    const torch::Tensor positions = torch::arange(
        ids.size(1), torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    if (!tp_.enabled()) return wte(ids) + wpe(positions);
    // Ids outside this rank's rows look up zeros; the sum over the group is the full lookup.
    const int64_t rows = wte->weight.size(0);
    const torch::Tensor local = ids - tp_.ShardBegin(config_.vocab);
    const torch::Tensor mine = local.ge(0).logical_and(local.lt(rows));
    const torch::Tensor found =
        wte(local.clamp(0, rows - 1)) * mine.unsqueeze(-1).to(wte->weight.scalar_type());
    if (tp_.sequence_split()) {
      // Summed and split along the sequence at once; this rank adds its tokens' positions.
      const int64_t length = ids.size(1) / tp_.size;
      const torch::Tensor table = SharedOverTheSequence({wpe->weight}, tp_)[0];
      return ReduceScatterToSequenceParallel(found, tp_) +
             torch::embedding(table, positions.narrow(0, tp_.rank * length, length));
    }
    return ReduceFromTensorParallel(found, tp_) + wpe(positions);
  }

  // ids [b, n] at positions [start, start + n), start + n <= n_positions.
  torch::Tensor ForwardIncremental(const torch::Tensor& ids, int64_t start,
                                   KeyValueCache& /*cache*/) override {
    if (tp_.enabled()) throw std::logic_error("gpt2: incremental decoding of a shard");
    const torch::Tensor positions =
        torch::arange(start, start + ids.size(1),
                      torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    return wte(ids) + wpe(positions);
  }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};

 private:
  Gpt2Config config_;
  TensorParallel tp_;
};
TORCH_MODULE(Gpt2Embedding);

// attn: GPT2Attention (eager form, or the fused one where asked and the scale allows).
class Gpt2AttentionImpl : public torch::nn::Cloneable<Gpt2AttentionImpl> {
 public:
  Gpt2AttentionImpl(const Gpt2Config& config, int64_t block) : config_(config), block_(block) {
    reset();
  }

  void reset() override {
    c_attn = register_module("c_attn", Conv1D(config_.hidden, 3 * config_.hidden,
                                              config_.init_std));
    c_proj = register_module("c_proj",
                             Conv1D(config_.hidden, config_.hidden, ResidualStd(config_)));
  }

  // This rank's heads: the thirds of c_attn (query, key, value) column-parallel, c_proj
  // row-parallel (heads must divide).
  void ShardForTensorParallel(const TensorParallel& tp) {
    c_attn->KeepColumns(3, tp.ShardBegin(config_.hidden), tp.ShardSize(config_.hidden));
    c_proj->KeepRows(tp.ShardBegin(config_.hidden), tp.ShardSize(config_.hidden));
  }

  torch::Tensor forward(const torch::Tensor& x) { return c_proj(Attend(x)); }

  // The heads this module holds attended, [b, S, their width], before c_proj: `x` is the whole
  // normalised sequence (under tensor parallelism as the group's products take it), or with
  // `gather` (sequence parallelism) this rank's S/t tokens of it, which c_attn gathers.
  torch::Tensor Attend(const torch::Tensor& x, const TensorParallel* gather = nullptr) {
    const int64_t batch = x.size(0), length = x.size(1) * (gather != nullptr ? gather->size : 1);
    const int64_t head_dim = config_.hidden / config_.heads;
    const int64_t width = c_attn->weight.size(1) / 3, heads = width / head_dim;
    const torch::Tensor qkv =
        gather != nullptr ? c_attn->OverGatheredSequence(x, *gather) : c_attn(x);
    // [b, S, 3w] -> [3, b, A, S, hd]: query, key and value are the thirds of c_attn's output.
    const std::vector<torch::Tensor> split =
        qkv.view({batch, length, 3, heads, head_dim}).permute({2, 0, 3, 1, 4}).unbind(0);
    const bool fused = config_.attention == GptAttention::kFused ||
                       (config_.attention == GptAttention::kAuto && FusedAttentionByDefault());
    const torch::Tensor attended =
        CausalSelfAttention(split[0], split[1], split[2], Divisor(head_dim), fused);
    return attended.transpose(1, 2).reshape({batch, length, width});
  }

  // forward() for positions [start, start + n), the earlier keys and values in `cache`.
  torch::Tensor ForwardIncremental(const torch::Tensor& x, int64_t start, KeyValueCache& cache) {
    const int64_t batch = x.size(0), length = x.size(1), hidden = config_.hidden;
    const int64_t heads = config_.heads, head_dim = hidden / heads;
    const std::vector<torch::Tensor> split = c_attn(x)
                                                 .view({batch, length, 3, heads, head_dim})
                                                 .permute({2, 0, 3, 1, 4})
                                                 .unbind(0);
    const auto [keys, values] = cache.Append(split[1], split[2]);
    const torch::Tensor attended =
        CachedCausalAttention(split[0], keys, values, start, Divisor(head_dim));
    return c_proj(attended.transpose(1, 2).reshape({batch, length, hidden}));
  }

  Conv1D c_attn{nullptr}, c_proj{nullptr};

 private:
  // What the scores are divided by (forward's rule).
  double Divisor(int64_t head_dim) const {
    double divisor = 1.0;
    if (config_.scale_attn_weights) divisor = std::sqrt(static_cast<double>(head_dim));
    if (config_.scale_attn_by_inverse_layer_idx) divisor *= static_cast<double>(block_ + 1);
    return divisor;
  }

  Gpt2Config config_;
  int64_t block_;
};
TORCH_MODULE(Gpt2Attention);

// mlp: GPT2MLP.
class Gpt2MlpImpl : public torch::nn::Cloneable<Gpt2MlpImpl> {
 public:
  explicit Gpt2MlpImpl(const Gpt2Config& config) : config_(config) { reset(); }

  void reset() override {
    c_fc = register_module("c_fc", Conv1D(config_.hidden, config_.Inner(), config_.init_std));
    c_proj = register_module("c_proj",
                             Conv1D(config_.Inner(), config_.hidden, ResidualStd(config_)));
  }

  // This rank's units: c_fc column-parallel, c_proj row-parallel (n_inner must divide).
  void ShardForTensorParallel(const TensorParallel& tp) {
    c_fc->KeepColumns(1, tp.ShardBegin(config_.Inner()), tp.ShardSize(config_.Inner()));
    c_proj->KeepRows(tp.ShardBegin(config_.Inner()), tp.ShardSize(config_.Inner()));
  }

  torch::Tensor forward(const torch::Tensor& x) { return c_proj(Units(x)); }

  // act(c_fc(x)) of the units this module holds; with `gather`, of the whole sequence gathered
  // from this rank's S/t tokens `x` (as Attend).
  torch::Tensor Units(const torch::Tensor& x, const TensorParallel* gather = nullptr) {
    return Activate(config_.activation,
                    gather != nullptr ? c_fc->OverGatheredSequence(x, *gather) : c_fc(x));
  }

  Conv1D c_fc{nullptr}, c_proj{nullptr};

 private:
  Gpt2Config config_;
};
TORCH_MODULE(Gpt2Mlp);

// Layers 1..L: GPT2Block (block `block`, counted from 0).
class Gpt2BlockImpl : public torch::nn::Cloneable<Gpt2BlockImpl>, public IncrementalLayer {
 public:
  Gpt2BlockImpl(const Gpt2Config& config, int64_t block) : config_(config), block_(block) {
    reset();
  }

  void reset() override {
    ln_1 = register_module("ln_1", MakeLayerNorm(config_));
    attn = register_module("attn", Gpt2Attention(config_, block_));
    ln_2 = register_module("ln_2", MakeLayerNorm(config_));
    mlp = register_module("mlp", Gpt2Mlp(config_));
  }

  void ShardForTensorParallel(const TensorParallel& tp) {
    attn->ShardForTensorParallel(tp);
    mlp->ShardForTensorParallel(tp);
    tp_ = tp;
  }

  torch::Tensor forward(torch::Tensor x) {
    if (tp_.enabled()) return ForwardTensorParallel(x);
    if (x.is_cuda() && FusedKernelsEnabled()) {
      // The layer norms write the products' type in the pass that reads their input; the
      // attention's residual add is ln_2's first step (fused_layer_norm.h).
      const torch::ScalarType type = AutocastMatmulType(x.device()).value_or(x.scalar_type());
      const torch::Tensor normed =
          ResidualLayerNorm(x, torch::Tensor(), ln_1->weight, ln_1->bias,
                            ln_1->options.eps(), type)
              .normed;
      const ResidualNorm second = ResidualLayerNorm(x, attn(normed), ln_2->weight, ln_2->bias,
                                                    ln_2->options.eps(), type);
      return second.sum + mlp(second.normed);
    }
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }

  // Megatron's block: the whole normalised input enters the group's products (copied, or
  // under sequence parallelism gathered from the ranks' S/t tokens), their partial products
  // leave summed (or reduce-scattered back to S/t tokens), then the whole biases. Under
  // sequence parallelism the layer norms and biases apply to this rank's tokens and their
  // gradients are summed over the group (SharedOverTheSequence; without it, the parameters).
  torch::Tensor ForwardTensorParallel(torch::Tensor x) {
    const bool split = tp_.sequence_split();
    // Without sequence parallelism the products take the whole input, copied to the group;
    // with it they gather this rank's tokens themselves (keeping only these for the backward).
    const TensorParallel* gather = split ? &tp_ : nullptr;
    const auto enter = [&](const torch::Tensor& y) {
      return split ? y : CopyToTensorParallel(y, tp_);
    };
    const auto leave = [&](const torch::Tensor& y) {
      return split ? ReduceScatterToSequenceParallel(y, tp_) : ReduceFromTensorParallel(y, tp_);
    };
    const std::vector<torch::Tensor> shared = SharedOverTheSequence(
        {ln_1->weight, ln_1->bias, attn->c_proj->bias, ln_2->weight, ln_2->bias,
         mlp->c_proj->bias},
        tp_);
    x = x + (leave(attn->c_proj->Product(
                 attn->Attend(enter(LayerNormWith(ln_1, x, shared[0], shared[1])), gather))) +
             shared[2]);
    return x + (leave(mlp->c_proj->Product(
                    mlp->Units(enter(LayerNormWith(ln_2, x, shared[3], shared[4])), gather))) +
                shared[5]);
  }

  torch::Tensor ForwardIncremental(const torch::Tensor& input, int64_t start,
                                   KeyValueCache& cache) override {
    if (tp_.enabled()) throw std::logic_error("gpt2: incremental decoding of a shard");
    const torch::Tensor x = input + attn->ForwardIncremental(ln_1(input), start, cache);
    return x + mlp(ln_2(x));
  }

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Gpt2Attention attn{nullptr};
  Gpt2Mlp mlp{nullptr};

 private:
  Gpt2Config config_;
  int64_t block_;
  TensorParallel tp_;
};
TORCH_MODULE(Gpt2Block);

// Layer L + 1: ln_f and the LM head.
class Gpt2HeadImpl : public torch::nn::Cloneable<Gpt2HeadImpl>, public IncrementalLayer {
 public:
  explicit Gpt2HeadImpl(const Gpt2Config& config) : config_(config) { reset(); }

  void reset() override {
    ln_f = register_module("ln_f", MakeLayerNorm(config_));
    lm_head = register_module("lm_head", LmHead(config_.hidden, config_.vocab, config_.init_std));
  }

  // This rank's vocabulary rows of the LM head.
  void ShardForTensorParallel(const TensorParallel& tp) {
    lm_head->ShardForTensorParallel(tp);
    tp_ = tp;
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // Under sequence parallelism this rank's tokens are normalised (ln_f's gradients summed
    // over the group) and the LM head gathers the whole sequence.
    if (tp_.sequence_split()) {
      const std::vector<torch::Tensor> shared =
          SharedOverTheSequence({ln_f->weight, ln_f->bias}, tp_);
      return lm_head(LayerNormWith(ln_f, x, shared[0], shared[1]));
    }
    return lm_head(ln_f(x));
  }

  torch::Tensor ForwardIncremental(const torch::Tensor& x, int64_t /*start*/,
                                   KeyValueCache& /*cache*/) override {
    if (tp_.enabled()) throw std::logic_error("gpt2: incremental decoding of a shard");
    return forward(x);
  }

  torch::nn::LayerNorm ln_f{nullptr};
  LmHead lm_head{nullptr};

 private:
  Gpt2Config config_;
  TensorParallel tp_;
};
TORCH_MODULE(Gpt2Head);

bool IsBlockParameter(absl::string_view name) {
  for (const char* known :
       {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
        "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
    if (name == known) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Gpt2Config> Gpt2ConfigFromJson(const Json& json) {
  constexpr absl::string_view where = "config.json";
  if (!json.is_object()) {
    return absl::InvalidArgumentError("config.json: expected a JSON object");
  }
  Gpt2Config config;
  TANDEM_ASSIGN_OR_RETURN(const std::string model_type,
                          GetStringOr(json, "model_type", "gpt2", where));
  if (model_type != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: model_type \"", model_type, "\" is not supported by tandem's gpt2"));
  }
  TANDEM_ASSIGN_OR_RETURN(config.vocab, GetIntOr(json, "vocab_size", 50257, where));
  TANDEM_ASSIGN_OR_RETURN(config.positions, GetIntOr(json, "n_positions", 1024, where));
  TANDEM_ASSIGN_OR_RETURN(config.hidden, GetIntOr(json, "n_embd", 768, where));
  TANDEM_ASSIGN_OR_RETURN(config.layers, GetIntOr(json, "n_layer", 12, where));
  TANDEM_ASSIGN_OR_RETURN(config.heads, GetIntOr(json, "n_head", 12, where));
  config.inner = 0;
  if (IsSet(json, "n_inner")) {
    TANDEM_ASSIGN_OR_RETURN(config.inner, GetInt(json, "n_inner", where));
  }
  TANDEM_ASSIGN_OR_RETURN(config.layer_norm_epsilon,
                          GetNumberOr(json, "layer_norm_epsilon", 1e-5, where));
  TANDEM_ASSIGN_OR_RETURN(config.init_std, GetNumberOr(json, "initializer_range", 0.02, where));
  TANDEM_ASSIGN_OR_RETURN(config.activation,
                          GetStringOr(json, "activation_function", "gelu_new", where));
  if (!KnownActivation(config.activation)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: activation_function \"", config.activation,
        "\" is not supported (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu, silu, swish)"));
  }
  TANDEM_ASSIGN_OR_RETURN(config.scale_attn_weights,
                          GetBoolOrUnset(json, "scale_attn_weights", true, where));
  TANDEM_ASSIGN_OR_RETURN(config.scale_attn_by_inverse_layer_idx,
                          GetBoolOrUnset(json, "scale_attn_by_inverse_layer_idx", false, where));
  TANDEM_ASSIGN_OR_RETURN(config.tie_word_embeddings,
                          GetBoolOrUnset(json, "tie_word_embeddings", true, where));
  TANDEM_ASSIGN_OR_RETURN(const bool cross_attention,
                          GetBoolOrUnset(json, "add_cross_attention", false, where));
  if (cross_attention) {
    return absl::InvalidArgumentError(
        "config.json: add_cross_attention true is not supported (a decoder-only model)");
  }
  config.seq_len = std::min(config.seq_len, config.positions);
  if (absl::Status valid = ValidateGpt2Config(config); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", valid.message()));
  }
  return config;
}

absl::Status ValidateGpt2Config(const Gpt2Config& config) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab_size", config.vocab},
                                                   {"n_layer", config.layers},
                                                   {"n_embd", config.hidden},
                                                   {"n_head", config.heads},
                                                   {"n_positions", config.positions},
                                                   {"seq_len", config.seq_len}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpt2: ", field, " must be positive, got ", value));
    }
  }
  if (config.inner < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt2: n_inner must be positive, got ", config.inner));
  }
  if (config.hidden % config.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpt2: n_embd (", config.hidden,
                                                   ") must be divisible by n_head (",
                                                   config.heads, ")"));
  }
  if (config.seq_len > config.positions) {
    return absl::InvalidArgumentError(absl::StrCat("gpt2: seq_len ", config.seq_len,
                                                   " exceeds n_positions ", config.positions));
  }
  if (!KnownActivation(config.activation)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt2: unknown activation_function \"", config.activation, "\""));
  }
  if (!(config.layer_norm_epsilon > 0) || !(config.init_std > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpt2: layer_norm_epsilon and initializer_range must be positive, got ",
        config.layer_norm_epsilon, " and ", config.init_std));
  }
  return absl::OkStatus();
}

std::string DescribeGpt2(const Gpt2Config& config) {
  std::string text = absl::StrCat("gpt2 L=", config.layers, " H=", config.hidden,
                                  " A=", config.heads, " S=", config.seq_len,
                                  " V=", config.vocab, " P=", config.positions);
  if (config.inner > 0) absl::StrAppend(&text, " I=", config.inner);
  if (config.activation != "gelu_new") absl::StrAppend(&text, " act=", config.activation);
  if (!config.tie_word_embeddings) absl::StrAppend(&text, " untied");
  if (!config.scale_attn_weights) absl::StrAppend(&text, " no-scale");
  if (config.scale_attn_by_inverse_layer_idx) absl::StrAppend(&text, " scale-by-layer");
  return text;
}

double Gpt2TrainingFlopsPerToken(const Gpt2Config& config) {
  const double h = static_cast<double>(config.hidden);
  const double layers = static_cast<double>(config.layers);
  const double block = 4.0 * h * h + 2.0 * h * static_cast<double>(config.Inner());
  const double matmul_parameters = layers * block + h * static_cast<double>(config.vocab);
  return 6.0 * matmul_parameters + 12.0 * layers * h * static_cast<double>(config.seq_len);
}

TiedWeights Gpt2TiedWeights(const Gpt2Config& config) {
  if (!config.tie_word_embeddings) return {};
  return TiedEmbeddingAndHead("wte.weight", static_cast<int>(config.layers) + 1);
}

ModelSpec Gpt2ModelSpec(const Gpt2Config& config) {
  ModelSpec spec;
  spec.name = DescribeGpt2(config);
  spec.build_layer = [config](int layer) {
    if (layer == 0) return torch::nn::AnyModule(Gpt2Embedding(config));
    if (layer == config.layers + 1) return torch::nn::AnyModule(Gpt2Head(config));
    return torch::nn::AnyModule(Gpt2Block(config, layer - 1));
  };
  spec.describe = [config]() {
    if (absl::Status ok = ValidateGpt2Config(config); !ok.ok()) {
      throw std::invalid_argument(std::string(ok.message()));
    }
    LayeredModel model;
    model.name = DescribeGpt2(config);
    model.layer_names.push_back("embedding");
    for (int64_t block = 0; block < config.layers; ++block) {
      model.layer_names.push_back(absl::StrCat("block", block));
    }
    model.layer_names.push_back("head");
    // Forward FLOPs per token, as GptModelSpec counts them.
    const double h = static_cast<double>(config.hidden);
    const double products = 2.0 * (4.0 * h * h + 2.0 * h * static_cast<double>(config.Inner()));
    const double attention = 4.0 * h * static_cast<double>(config.seq_len);
    const double head = 2.0 * h * static_cast<double>(config.vocab);
    model.layer_costs.push_back(2.0 * h);
    model.layer_costs.insert(model.layer_costs.end(), config.layers, products + attention);
    model.layer_costs.push_back(head + 5.0 * static_cast<double>(config.vocab));
    const double blocks = static_cast<double>(config.layers);
    model.split_pass_costs = {blocks * (products + attention) + head,
                              blocks * (products + 2.0 * attention) + head,
                              blocks * products + head};
    model.loss = TokenCrossEntropy(config.vocab);
    model.loss_takes_compute_type = true;
    model.tied_weights = Gpt2TiedWeights(config);
    const int last = static_cast<int>(config.layers) + 1;
    model.shard_for_tensor_parallel = [config, last](std::vector<torch::nn::AnyModule>& layers,
                                                     int first,
                                                     const TensorParallel& tp) -> absl::Status {
      TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(config.heads, "gpt2: n_head"));
      TANDEM_RETURN_IF_ERROR(tp.CheckDivisible(config.Inner(), "gpt2: n_inner (the MLP's units)"));
      if (absl::Status vocab = tp.CheckDivisible(config.vocab, "gpt2: vocab_size"); !vocab.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            vocab.message(), ": tensor parallelism splits the vocabulary (GPT-2's 50257 rows "
            "do not split; a model trained from scratch can take --vocab 50304)"));
      }
      if (tp.sequence_split()) {
        TANDEM_RETURN_IF_ERROR(
            tp.CheckDivisible(config.seq_len, "gpt2: the sequence length (sequence parallelism)"));
      }
      return ShardDecoderLayers<Gpt2Embedding, Gpt2Block, Gpt2Head>(layers, first, last, tp);
    };
    model.tensor_parallel_loss = VocabParallelCrossEntropy;
    return model;
  };
  return spec;
}

absl::StatusOr<std::string> Gpt2HfName(const Gpt2Config& config, absl::string_view name) {
  std::string rest;
  const int layer = NumberAfterPrefix(name, "layers.", &rest);
  const int last = static_cast<int>(config.layers) + 1;
  if (layer == 0 && (rest == "wte.weight" || rest == "wpe.weight")) {
    return absl::StrCat("transformer.", rest);
  }
  if (layer == last && (rest == "ln_f.weight" || rest == "ln_f.bias")) {
    return absl::StrCat("transformer.", rest);
  }
  if (layer == last && rest == "lm_head.weight") return std::string("lm_head.weight");
  if (layer > 0 && layer < last && IsBlockParameter(rest)) {
    return absl::StrCat("transformer.h.", layer - 1, ".", rest);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gpt2: '", name, "' is not a parameter of ", DescribeGpt2(config)));
}

absl::StatusOr<std::string> Gpt2TandemName(const Gpt2Config& config, absl::string_view key) {
  const int last = static_cast<int>(config.layers) + 1;
  if (key == "lm_head.weight") return absl::StrCat("layers.", last, ".lm_head.weight");
  absl::string_view inner = key;
  absl::ConsumePrefix(&inner, "transformer.");
  if (inner == "wte.weight" || inner == "wpe.weight") return absl::StrCat("layers.0.", inner);
  if (inner == "ln_f.weight" || inner == "ln_f.bias") {
    return absl::StrCat("layers.", last, ".", inner);
  }
  std::string rest;
  const int block = NumberAfterPrefix(inner, "h.", &rest);
  if (block >= 0 && block < config.layers && IsBlockParameter(rest)) {
    return absl::StrCat("layers.", block + 1, ".", rest);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gpt2: '", key, "' is not a transformers parameter of ", DescribeGpt2(config)));
}

}  // namespace tandem::runtime::libtorch
