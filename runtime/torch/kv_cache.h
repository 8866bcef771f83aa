// Incremental decoding: a decoder layer that runs on the new positions of a sequence only,
// keeping the keys and values of the earlier ones in a cache (runtime/torch/generate.h drives
// it). The layers of gpt.h, gpt2.h and llama.h implement it beside their training forward,
// which it leaves as it is.
#pragma once

#include <cstdint>
#include <utility>

#include <torch/nn/modules/container/any.h>
#include <torch/types.h>

namespace tandem::runtime::libtorch {

// The keys and values one attention layer has seen, for positions [0, length): one sequence
// batch, preallocated for `capacity` positions on first use.
struct KeyValueCache {
  int64_t capacity = 0;  // positions it may hold: set before the first Append
  int64_t length = 0;    // positions held
  torch::Tensor key, value;  // [batch, kv_heads, capacity, head_dim]; undefined until used

  // Stores key and value [batch, kv_heads, n, head_dim] of positions [length, length + n) and
  // returns the keys and values of positions [0, length + n) (views of the cache). Throws
  // std::out_of_range past `capacity`.
  std::pair<torch::Tensor, torch::Tensor> Append(const torch::Tensor& new_key,
                                                 const torch::Tensor& new_value);
};

// A layer that can run incrementally: the embedding, the blocks and the head of a decoder.
class IncrementalLayer {
 public:
  virtual ~IncrementalLayer() = default;

  // The layer's output for positions [start, start + n) of a sequence whose earlier positions
  // this layer has seen already: `x` is its input for those n positions (token ids [b, n] for
  // an embedding, hidden states [b, n, hidden] otherwise), `cache` what it kept of positions
  // [0, start) (an attention layer appends the new positions' keys and values; the others
  // leave it alone). Equals positions [start, start + n) of forward() over the whole sequence,
  // within float rounding. Not for tensor-parallel shards. Throws like LibTorch.
  virtual torch::Tensor ForwardIncremental(const torch::Tensor& x, int64_t start,
                                           KeyValueCache& cache) = 0;
};

// Causal attention of `query` [b, heads, n, head_dim] at positions [start, start + n) over
// `key` and `value` [b, heads, start + n, head_dim] of positions [0, start + n):
// softmax(q k^T / divisor, with later positions masked) v, explicitly (as transformers' eager
// attention computes it).
torch::Tensor CachedCausalAttention(const torch::Tensor& query, const torch::Tensor& key,
                                    const torch::Tensor& value, int64_t start, double divisor);

// The layer's incremental form, or nullptr where it has none (an empty or foreign module).
IncrementalLayer* AsIncremental(const torch::nn::AnyModule& layer);

}  // namespace tandem::runtime::libtorch
