#include "runtime/torch/kv_cache.h"

#include <limits>
#include <stdexcept>
#include <string>

#include <torch/nn/modules/container/any.h>

namespace tandem::runtime::libtorch {

std::pair<torch::Tensor, torch::Tensor> KeyValueCache::Append(const torch::Tensor& new_key,
                                                              const torch::Tensor& new_value) {
  const int64_t n = new_key.size(2);
  if (length + n > capacity) {
    throw std::out_of_range("key/value cache: " + std::to_string(length + n) +
                            " positions exceed its capacity of " + std::to_string(capacity));
  }
  if (!key.defined()) {
    key = torch::empty({new_key.size(0), new_key.size(1), capacity, new_key.size(3)},
                       new_key.options());
    value = torch::empty({new_value.size(0), new_value.size(1), capacity, new_value.size(3)},
                         new_value.options());
  }
  key.narrow(2, length, n).copy_(new_key);
  value.narrow(2, length, n).copy_(new_value);
  length += n;
  return {key.narrow(2, 0, length), value.narrow(2, 0, length)};
}

torch::Tensor CachedCausalAttention(const torch::Tensor& query, const torch::Tensor& key,
                                    const torch::Tensor& value, int64_t start, double divisor) {
  const int64_t n = query.size(-2), total = key.size(-2);
  auto scores = torch::matmul(query, key.transpose(-2, -1)) / divisor;
  if (n > 1) {
    // Query i (position start + i) sees keys 0 .. start + i.
    const auto future =
        torch::ones({n, total}, torch::TensorOptions().dtype(torch::kBool).device(query.device()))
            .triu(/*diagonal=*/start + 1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  }
  return torch::matmul(torch::softmax(scores, /*dim=*/-1), value);
}

IncrementalLayer* AsIncremental(const torch::nn::AnyModule& layer) {
  if (layer.is_empty()) return nullptr;
  return dynamic_cast<IncrementalLayer*>(layer.ptr().get());
}

}  // namespace tandem::runtime::libtorch
