// Parts the Hugging Face decoder models (runtime/torch/llama.h, gpt2.h) share: the tied
// embedding and LM head as the runtime must see them, causal self-attention in either of
// gpt.h's forms, the LM head layer's product and the token cross-entropy.
//
// Tied weights. transformers ties the LM head to the token embedding (one tensor used twice).
// tandem's layers are separate modules that may live on different pipeline stages, so a tied
// model's head holds its own copy of the embedding, as Megatron-LM's last stage does: the copy
// starts equal to the embedding (TorchStage builds it from the embedding's values) and the two
// gradients are summed every step (Engine::SumTiedGradients, over the ranks holding either),
// which keeps them equal. TiedWeights names such pairs. Where one
// process holds both layers (a single stage, the reference trainer), TiedWeights::share makes
// the head use the embedding's parameter itself, so autograd sums the gradients and the
// optimizer steps one tensor, exactly as transformers does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "absl/status/status.h"
#include "runtime/torch/model.h"
#include "runtime/torch/tensor_parallel.h"

namespace tandem::runtime::libtorch {

// Causal self-attention of query, key and value [b, heads, S, head_dim] (as many key/value
// heads as query heads): softmax(q k^T / divisor + causal mask) v, in the fused form
// (scaled_dot_product_attention, see GptAttention in gpt.h) when `fused` and `divisor` is
// sqrt(head_dim) (the only scale LibTorch 1.13's fused form has), else explicitly.
torch::Tensor CausalSelfAttention(const torch::Tensor& query, const torch::Tensor& key,
                                  const torch::Tensor& value, double divisor, bool fused);

// `norm` applied with `weight` and `bias` in place of its own parameters (as
// SharedOverTheSequence returns them under sequence parallelism).
torch::Tensor LayerNormWith(const torch::nn::LayerNorm& norm, const torch::Tensor& x,
                            const torch::Tensor& weight, const torch::Tensor& bias);

// An LM head: logits = x W^T with W [vocab, hidden] (parameter "weight", drawn N(0, init_std)),
// plus a bias [vocab] (parameter "bias", zero) with `bias` (Phi's; a tied weight leaves the bias
// the head's own). Under tensor parallelism it keeps this rank's vocabulary rows and gives this
// rank's logits (for VocabParallelCrossEntropy); under sequence parallelism it takes this rank's
// S/t tokens and gives the logits of the whole sequence (gathered before the product).
class LmHeadImpl : public torch::nn::Cloneable<LmHeadImpl> {
 public:
  LmHeadImpl(int64_t hidden, int64_t vocab, double init_std, bool bias = false);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  // Keeps rows [tp.ShardBegin(vocab), + tp.ShardSize(vocab)); vocab must divide.
  void ShardForTensorParallel(const TensorParallel& tp);
  // Drops this head's own parameter and multiplies by `shared` (the tied embedding's
  // parameter, of the same shape) instead: autograd then sums both uses' gradients into it.
  void UseSharedWeight(const torch::Tensor& shared);
  bool shares_weight() const { return shared_.defined(); }

  torch::Tensor weight;  // its own parameter; undefined once it shares
  torch::Tensor bias;    // undefined without one

 private:
  int64_t hidden_, vocab_;
  double init_std_;
  bool has_bias_;
  torch::Tensor shared_;
  TensorParallel tp_;
};
TORCH_MODULE(LmHead);

// The mean token cross-entropy of logits [..., vocab] against targets [...] (int64).
LossFunction TokenCrossEntropy(int64_t vocab);

// The head layer's LmHead, for TiedWeights::share: `layer` must be a model's head module with
// a child "lm_head" of type LmHead (nullptr otherwise).
LmHeadImpl* FindLmHead(const torch::nn::AnyModule& layer);

// TiedWeights for a model whose layer 0 holds the token embedding parameter `embedding_name`
// (its name inside the layer: "embed_tokens.weight") and whose layer `head_layer` holds an
// LmHead "lm_head": {"layers.0.<embedding_name>", "layers.<head_layer>.lm_head.weight"}.
TiedWeights TiedEmbeddingAndHead(const std::string& embedding_name, int head_layer);

// The tensor-parallel sharding of a decoder model laid out as an Embedding (layer 0), Blocks
// and a Head (layer `head_layer`): ShardForTensorParallel of each of `layers` (layers [first,
// first + layers.size())) as its type, after the model checked that its sizes divide. For
// LayeredModel::shard_for_tensor_parallel; the loss is VocabParallelCrossEntropy.
template <typename Embedding, typename Block, typename Head>
absl::Status ShardDecoderLayers(std::vector<torch::nn::AnyModule>& layers, int first,
                                int head_layer, const TensorParallel& tp) {
  const auto shard = [&tp](auto* layer) -> absl::Status {
    if constexpr (std::is_void_v<decltype(layer->ShardForTensorParallel(tp))>) {
      layer->ShardForTensorParallel(tp);
      return absl::OkStatus();
    } else {
      return layer->ShardForTensorParallel(tp);
    }
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    const int index = first + static_cast<int>(i);
    absl::Status status = index == 0            ? shard(layers[i].get<Embedding>().get())
                          : index == head_layer ? shard(layers[i].get<Head>().get())
                                                : shard(layers[i].get<Block>().get());
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime::libtorch
