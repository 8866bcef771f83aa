// Linear layers whose weight gradient can wait: zero-bubble pipeline schedules split a stage's
// backward into B (input gradients, on the critical path) and W (weight gradients, run later
// to fill bubbles). Autograd alone can only do W by traversing the graph a second time, which
// recomputes every activation gradient of B. With DeferrableLinear, B keeps for each linear
// layer what its weight gradient needs (its input and its output's gradient) and W is just
// those products: the weight gradient is computed once and only once, and the graph is freed
// after B (Qi et al., "Zero Bubble Pipeline Parallelism", 2023).
//
// Outside a DeferWeightGrads scope the layer's backward computes every gradient at once, like
// torch::nn::functional::linear (the same formulas, so results agree within float rounding).
// Inside one, it returns no weight or bias gradient: a B pass asks autograd for every
// parameter's gradient as usual, gets those of the other parameters (layer norms, embeddings,
// a weight also used elsewhere) at once and the linear layers' ones from W.
#pragma once

#include <vector>

#include <torch/types.h>

namespace tandem::runtime::libtorch {

// y = x W^T + b (bias may be undefined), with a deferrable weight gradient.
torch::Tensor DeferrableLinear(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias);

// One micro-batch's deferred weight gradients.
class DeferredWeightGrads {
 public:
  // Adds every kept weight (and bias) gradient to the parameters' .grad and forgets them.
  void Apply();
  bool empty() const { return records_.empty(); }

  struct Record {
    torch::Tensor input, grad_output, weight, bias;
  };
  void Add(Record record) { records_.push_back(std::move(record)); }

 private:
  std::vector<Record> records_;
};

// While alive, DeferrableLinear backward passes (on any thread of this process: LibTorch runs
// device backward passes on its own threads) keep their weight gradients in `sink` instead of
// computing them. One scope at a time per process (a stage's BackwardInput).
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(DeferredWeightGrads* sink);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;
};}  // namespace tandem::runtime::libtorch
