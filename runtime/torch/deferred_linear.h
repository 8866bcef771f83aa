// Linear layers whose weight gradient can wait: zero-bubble pipeline schedules split a stage's
// backward into B (input gradients, on the critical path) and W (weight gradients, run later
// to fill bubbles). Autograd alone can only do W by traversing the graph a second time, which
// recomputes every activation gradient of B. With DeferrableLinear, B keeps for each linear
// layer what its weight gradient needs (its input and its output's gradient) and W is just
// those products: the weight gradient is computed once and only once, and the graph is freed
// after B (Qi et al., "Zero Bubble Pipeline Parallelism", 2023).
//
// Outside a LinearGradScope the layer's backward returns every gradient to autograd, like
// torch::nn::functional::linear (the same formulas, so results agree within float rounding).
// Inside one, it returns no weight or bias gradient: it writes them into .grad itself, or, in
// a B pass, leaves them to W; autograd gives the other parameters' gradients (layer norms,
// embeddings, a weight also used elsewhere) as usual, and those of a layer whose weight or
// bias is not a parameter with a .grad (a tensor computed from parameters).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace tandem::runtime::libtorch {

// Where a stage puts its parameters' gradients: each parameter's .grad, which the first
// gradient of an iteration writes over (the old contents are never read: no zero fill before,
// no addition to zeros) and later ones add to.
class GradientWriter {
 public:
  virtual ~GradientWriter() = default;
  // Whether `parameter`'s next gradient is its first this iteration, which then writes over
  // .grad; from then on it is not. False for a parameter the writer does not know.
  virtual bool TakeFirst(const torch::Tensor& parameter) = 0;
};

// parameter.grad (+)= grad, converted to .grad's type; written over where `writer` says it is
// the first (null: always added). .grad must be defined.
void AccumulateGradient(GradientWriter* writer, const torch::Tensor& parameter,
                        const torch::Tensor& grad);

// y = x W^T + b (bias may be undefined), with a deferrable weight gradient.
torch::Tensor DeferrableLinear(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias);

// How LinearOverWhole makes its input whole and hands back its part of the gradient: plain
// functions of a tensor and `context` (e.g. the address of the layer's TensorParallel, which
// must outlive the backward pass).
using InputMaker = torch::Tensor (*)(const torch::Tensor&, int64_t context);
struct InputMakers {
  InputMaker whole = nullptr;             // this rank's part -> the whole input (all-gather)
  InputMaker part_of_gradient = nullptr;  // the whole input's gradient -> the part's
  int64_t context = 0;
};

// DeferrableLinear(makers.whole(x), weight, bias), keeping only x (this rank's part of the
// input, as computed with under autocast) for the backward, which makes it whole again for
// the weight gradient: sequence parallelism's products then keep S/t tokens of their input
// between forward and backward, not all S (Megatron-LM re-gathers them the same way). x's
// gradient is makers.part_of_gradient of the whole input's. Under autocast the part is
// lowered before it is made whole, so a gather moves the compute type.
torch::Tensor LinearOverWhole(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& bias, const InputMakers& makers);
// The same for several products of the one input (Llama's q, k and v): made whole once in the
// forward and once in the backward, its gradient the sum of the products'. biases[i]
// undefined: product i has none. At most 62 products.
std::vector<torch::Tensor> LinearsOverWhole(const torch::Tensor& x,
                                            const std::vector<torch::Tensor>& weights,
                                            const std::vector<torch::Tensor>& biases,
                                            const InputMakers& makers);

// DeferrableLinear computed over a multiple of kPaddedColumns (fused_ops.h) output features on
// CUDA where the fused kernels are on and the output's width is not such a multiple: the
// weight (and bias) get zero rows appended for the products, and the output is the first
// columns of the wider result (a view whose rows lie the padded width apart). cuBLAS runs a
// product with an odd dimension on a slow kernel: GPT-2's LM head over 50,257 words. The
// backward's products run over the padded width too: a gradient whose rows already lie that
// far apart is taken to be a view of a buffer it owns whole (TokenCrossEntropyLoss writes its
// gradient so) and widened in place, its padding zeroed; any other is copied padded. The
// values are DeferrableLinear's within float rounding. Elsewhere it is DeferrableLinear.
torch::Tensor DeferrableLinearPadded(const torch::Tensor& x, const torch::Tensor& weight,
                                     const torch::Tensor& bias);
// The same on any device, padded to a multiple of `multiple` (what DeferrableLinearPadded runs
// on CUDA; tests run it on the CPU).
torch::Tensor DeferrableLinearPaddedTo(const torch::Tensor& x, const torch::Tensor& weight,
                                       const torch::Tensor& bias, int64_t multiple);

// One micro-batch's deferred weight gradients.
class DeferredWeightGrads {
 public:
  // Adds every kept weight (and bias) gradient to the parameters' .grad (through `writer`
  // where given) and forgets them.
  void Apply(GradientWriter* writer = nullptr);
  bool empty() const { return records_.empty(); }

  struct Record {
    // grad_output: [rows, out], or a padded product's [rows, padded] with zeros beyond the
    // weight's rows (DeferrableLinearPadded).
    torch::Tensor input, grad_output, weight, bias;
  };
  void Add(Record record) { records_.push_back(std::move(record)); }

 private:
  std::vector<Record> records_;
};

// While alive, DeferrableLinear backward passes (on any thread of this process: LibTorch runs
// device backward passes on its own threads) put their weight and bias gradients in the
// parameters' .grad through `writer` (not through autograd's results: a product written
// straight where it belongs), or, with `deferred`, keep what computes them there later. One
// scope at a time per process (a stage's backward).
class LinearGradScope {
 public:
  LinearGradScope(GradientWriter* writer, DeferredWeightGrads* deferred);
  ~LinearGradScope();
  LinearGradScope(const LinearGradScope&) = delete;
  LinearGradScope& operator=(const LinearGradScope&) = delete;
  GradientWriter* writer() const { return writer_; }
  DeferredWeightGrads* deferred() const { return deferred_; }

 private:
  GradientWriter* writer_;
  DeferredWeightGrads* deferred_;
};

}  // namespace tandem::runtime::libtorch
