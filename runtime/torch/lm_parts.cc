#include "runtime/torch/lm_parts.h"

#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/version.h>
#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "runtime/torch/deferred_linear.h"
#include "runtime/torch/fused_ops.h"

namespace tandem::runtime::libtorch {

torch::Tensor CausalSelfAttention(const torch::Tensor& query, const torch::Tensor& key,
                                  const torch::Tensor& value, double divisor, bool fused) {
  if (fused && divisor == std::sqrt(static_cast<double>(query.size(-1)))) {
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
  auto scores = torch::matmul(query, key.transpose(-2, -1)) / divisor;
  const auto future =
      torch::ones({length, length},
                  torch::TensorOptions().dtype(torch::kBool).device(query.device()))
          .triu(/*diagonal=*/1);
  // -inf where transformers adds the type's lowest value: both give exactly zero weight.
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, /*dim=*/-1), value);
}

torch::Tensor LayerNormWith(const torch::nn::LayerNorm& norm, const torch::Tensor& x,
                            const torch::Tensor& weight, const torch::Tensor& bias) {
  return torch::layer_norm(x, norm->options.normalized_shape(), weight, bias,
                           norm->options.eps());
}

LmHeadImpl::LmHeadImpl(int64_t hidden, int64_t vocab, double init_std, bool bias)
    : hidden_(hidden), vocab_(vocab), init_std_(init_std), has_bias_(bias) {
  reset();
}

void LmHeadImpl::reset() {
  weight = register_parameter("weight", torch::empty({vocab_, hidden_}));
  if (has_bias_) bias = register_parameter("bias", torch::zeros({vocab_}));
  shared_ = torch::Tensor();
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(weight, /*mean=*/0.0, init_std_);
}

torch::Tensor LmHeadImpl::forward(const torch::Tensor& x) {
  // Under sequence parallelism `x` is this rank's tokens: the product takes them all, and
  // (its own weight) keeps only these for the backward.
  if (tp_.sequence_split() && !shared_.defined()) {
    return LinearOverGatheredSequence(x, weight, bias, tp_);
  }
  const torch::Tensor input = tp_.sequence_split() ? GatherFromSequenceParallel(x, tp_)
                              : tp_.enabled()      ? CopyToTensorParallel(x, tp_)
                                                   : x;
  // A shared weight's gradient is left to autograd, which adds it to the embedding's.
  if (shared_.defined()) return torch::linear(input, shared_, bias);
  return DeferrableLinearPadded(input, weight, bias);
}

void LmHeadImpl::ShardForTensorParallel(const TensorParallel& tp) {
  if (!shared_.defined()) {
    torch::NoGradGuard no_grad;
    weight.set_data(weight.narrow(0, tp.ShardBegin(vocab_), tp.ShardSize(vocab_)).clone());
  }
  if (bias.defined()) {
    torch::NoGradGuard no_grad;
    bias.set_data(bias.narrow(0, tp.ShardBegin(vocab_), tp.ShardSize(vocab_)).clone());
  }
  tp_ = tp;
}

void LmHeadImpl::UseSharedWeight(const torch::Tensor& shared) {
  if (weight.defined()) {
    parameters_.erase("weight");
    weight = torch::Tensor();
  }
  shared_ = shared;
}

LossFunction TokenCrossEntropy(int64_t /*vocab*/) { return TokenCrossEntropyLoss; }

LmHeadImpl* FindLmHead(const torch::nn::AnyModule& layer) {
  if (layer.is_empty()) return nullptr;
  for (const auto& child : layer.ptr()->named_children()) {
    if (child.key() != "lm_head") continue;
    return dynamic_cast<LmHeadImpl*>(child.value().get());
  }
  return nullptr;
}

TiedWeights TiedEmbeddingAndHead(const std::string& embedding_name, int head_layer) {
  TiedWeights tied;
  tied.parameters.push_back({absl::StrCat("layers.0.", embedding_name),
                             absl::StrCat("layers.", head_layer, ".lm_head.weight")});
  tied.share = [embedding_name, head_layer](std::vector<torch::nn::AnyModule>& layers,
                                            int first) -> absl::Status {
    const int end = first + static_cast<int>(layers.size());
    if (first != 0 || head_layer >= end) return absl::OkStatus();  // not both here
    if (layers.front().is_empty()) {
      return absl::FailedPreconditionError("tied weights: the embedding layer is not built");
    }
    const auto parameters = layers.front().ptr()->named_parameters(/*recurse=*/true);
    const torch::Tensor* embedding = parameters.find(embedding_name);
    if (embedding == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tied weights: layer 0 has no parameter ", embedding_name, " (already shared?)"));
    }
    LmHeadImpl* head = FindLmHead(layers[head_layer - first]);
    if (head == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("tied weights: layer ", head_layer, " has no LM head (lm_head)"));
    }
    if (head->shares_weight()) return absl::OkStatus();
    if (head->weight.sizes() != embedding->sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tied weights: the LM head's weight [", head->weight.size(0), ", ",
          head->weight.size(1), "] is not the shape of the embedding's [", embedding->size(0),
          ", ", embedding->size(1), "]"));
    }
    head->UseSharedWeight(*embedding);
    return absl::OkStatus();
  };
  return tied;
}

}  // namespace tandem::runtime::libtorch
