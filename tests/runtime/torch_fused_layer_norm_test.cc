// The residual add and normalisation (fused_layer_norm.h: ResidualLayerNorm, ResidualRmsNorm)
// against float64 compositions written here, values and every gradient (x, delta, weight,
// bias) of a loss that uses the sum and the normed rows with random weights. On the CPU the
// fallback (LibTorch's composition) runs; on a CUDA device the fused kernels
// (kernels/layer_norm.cu): float32 within 1e-5, bf16 deltas and outputs within bf16's rounding,
// hidden sizes that take every kernel shape (wide and single-element loads, one to 32 packs per
// thread), rows 1 to 4,099, 3-D, transposed and misaligned inputs, no delta, no bias, one output
// unused. The CUDA cases skip, saying why, without a device.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "runtime/torch/fused_layer_norm.h"
#include "runtime/torch/fused_ops.h"
#include "runtime/torch/precision.h"

namespace tandem::runtime::libtorch {
namespace {

enum class Kind { kLayerNorm, kRmsNorm };
enum class Use { kBoth, kNormedOnly, kSumOnly };  // which outputs the loss reads

// Each element within relative * |expected| + absolute * max |expected|: float32 rounding
// relative to the tensor's scale (sums over thousands of rows, values near zero).
struct Tolerance {
  double relative;
  double absolute;
};
constexpr Tolerance kFloat32Tolerance{1e-5, 1e-5};
constexpr Tolerance kBFloat16Tolerance{2e-2, 1e-2};

struct Case {
  Kind kind = Kind::kLayerNorm;
  std::vector<int64_t> shape;
  torch::ScalarType x_type = torch::kFloat32;
  torch::ScalarType delta_type = torch::kFloat32;
  torch::ScalarType output_type = torch::kFloat32;
  bool with_delta = true;
  bool with_bias = true;  // LayerNorm only
  double eps = 1e-5;
  double scale = 1.0;  // of x and delta: small values make eps matter
  Use use = Use::kBoth;
  bool transposed = false;  // x passed as a [b, a, H] transpose of a [a, b, H] leaf
  bool misaligned = false;  // x's data one element past an aligned address

  std::string Name() const {
    std::string name = kind == Kind::kLayerNorm ? "layer_norm" : "rms_norm";
    name += " shape [";
    for (size_t i = 0; i < shape.size(); ++i) {
      name += (i > 0 ? ", " : "") + std::to_string(shape[i]);
    }
    name += std::string("] x ") + c10::toString(x_type);
    name += with_delta ? std::string(" delta ") + c10::toString(delta_type) : " no delta";
    name += std::string(" output ") + c10::toString(output_type);
    if (kind == Kind::kLayerNorm && !with_bias) name += " no bias";
    name += " eps " + std::to_string(eps) + " scale " + std::to_string(scale);
    if (use == Use::kNormedOnly) name += " normed only";
    if (use == Use::kSumOnly) name += " sum only";
    if (transposed) name += " transposed";
    if (misaligned) name += " misaligned";
    return name;
  }
};

// The inputs (float64, drawn on the device they run on) and the loss's weights:
// loss = sum(sum * grad_sum) + sum(normed * grad_normed), so the gradients reaching the
// outputs are grad_sum and grad_normed (bf16 values, exact in every type tested).
struct Inputs {
  torch::Tensor x, delta, weight, bias, grad_sum, grad_normed;
};

// The outputs' shape: the leaves' with the first two dimensions swapped where transposed.
std::vector<int64_t> OutputShape(const Case& c) {
  std::vector<int64_t> shape = c.shape;
  if (c.transposed) std::swap(shape[0], shape[1]);
  return shape;
}

Inputs MakeInputs(const Case& c, torch::Device device, int64_t seed) {
  torch::manual_seed(seed);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(device);
  const int64_t hidden = c.shape.back();
  auto bf16_exact = [](const torch::Tensor& t) {
    return t.to(torch::kBFloat16).to(torch::kFloat64);
  };
  Inputs in;
  // A mean away from zero, so that LayerNorm's centring matters.
  in.x = (torch::randn(c.shape, f64) + 0.5) * c.scale;
  in.delta = torch::randn(c.shape, f64) * c.scale;
  in.weight = 1.0 + 0.2 * torch::randn({hidden}, f64);
  in.bias = 0.1 * torch::randn({hidden}, f64);
  in.grad_sum = bf16_exact(torch::randn(OutputShape(c), f64));
  in.grad_normed = bf16_exact(torch::randn(OutputShape(c), f64));
  return in;
}

struct Results {
  torch::Tensor sum, normed, grad_x, grad_delta, grad_weight, grad_bias;
};

// A leaf requiring grad: `values` in `type` on `device`.
torch::Tensor Leaf(const torch::Tensor& values, torch::ScalarType type, torch::Device device) {
  return values.to(device, type).detach().requires_grad_(true);
}

torch::Tensor Loss(const Case& c, const torch::Tensor& sum, const torch::Tensor& normed,
                   const Inputs& in) {
  const torch::Device device = sum.device();
  torch::Tensor loss =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  if (c.use != Use::kNormedOnly) {
    loss = loss + (sum.to(torch::kFloat64) * in.grad_sum.to(device)).sum();
  }
  if (c.use != Use::kSumOnly) {
    loss = loss + (normed.to(torch::kFloat64) * in.grad_normed.to(device)).sum();
  }
  return loss;
}

// What the code under test gives on `device`, the loss's gradients included.
Results RunTandem(const Case& c, const Inputs& in, torch::Device device,
                  std::string* grad_fn_name = nullptr) {
  const torch::Tensor x = Leaf(in.x, c.x_type, device);
  const torch::Tensor delta = c.with_delta ? Leaf(in.delta, c.delta_type, device) : torch::Tensor();
  const torch::Tensor weight = Leaf(in.weight, torch::kFloat32, device);
  const bool with_bias = c.kind == Kind::kLayerNorm && c.with_bias;
  const torch::Tensor bias = with_bias ? Leaf(in.bias, torch::kFloat32, device) : torch::Tensor();
  torch::Tensor x_input = x;
  if (c.transposed) x_input = x.transpose(0, 1);
  if (c.misaligned) {
    // The same values one element into a buffer: contiguous, but not aligned for wide loads.
    const torch::Tensor flat =
        torch::cat({torch::zeros({1}, x.options().requires_grad(false)), x_input.reshape({-1})});
    x_input = flat.narrow(0, 1, x_input.numel()).view(x_input.sizes());
  }
  const torch::Tensor delta_input =
      c.with_delta && c.transposed ? delta.transpose(0, 1) : delta;
  const ResidualNorm out =
      c.kind == Kind::kLayerNorm
          ? ResidualLayerNorm(x_input, delta_input, weight, bias, c.eps, c.output_type)
          : ResidualRmsNorm(x_input, delta_input, weight, c.eps, c.output_type);
  if (grad_fn_name != nullptr) {
    *grad_fn_name = out.normed.grad_fn() ? out.normed.grad_fn()->name() : "";
  }
  EXPECT_EQ(out.sum.scalar_type(), c.x_type);
  EXPECT_EQ(out.normed.scalar_type(), c.output_type);
  Loss(c, out.sum, out.normed, in).backward();
  Results r;
  r.sum = out.sum.detach();
  r.normed = out.normed.detach();
  r.grad_x = x.grad();
  if (c.with_delta) r.grad_delta = delta.grad();
  r.grad_weight = weight.grad();
  if (with_bias) r.grad_bias = bias.grad();
  if (r.grad_x.defined()) {
    EXPECT_EQ(r.grad_x.scalar_type(), c.x_type);
  }
  if (r.grad_delta.defined()) {
    EXPECT_EQ(r.grad_delta.scalar_type(), c.delta_type);
  }
  return r;
}

// The composition in float64 from the same (rounded) inputs, on `device`.
Results RunReference(const Case& c, const Inputs& in, torch::Device device, double eps) {
  auto leaf = [&](const torch::Tensor& values, torch::ScalarType type) {
    // Rounded to the tested type first: the reference sees the values the code under test got.
    return values.to(type).to(device, torch::kFloat64).detach().requires_grad_(true);
  };
  const torch::Tensor x = leaf(in.x, c.x_type);
  const torch::Tensor delta = c.with_delta ? leaf(in.delta, c.delta_type) : torch::Tensor();
  const torch::Tensor weight = leaf(in.weight, torch::kFloat32);
  const bool with_bias = c.kind == Kind::kLayerNorm && c.with_bias;
  const torch::Tensor bias = with_bias ? leaf(in.bias, torch::kFloat32) : torch::Tensor();
  const torch::Tensor x_input = c.transposed ? x.transpose(0, 1) : x;
  torch::Tensor sum = x_input;
  if (c.with_delta) sum = x_input + (c.transposed ? delta.transpose(0, 1) : delta);
  torch::Tensor normed;
  if (c.kind == Kind::kLayerNorm) {
    const torch::Tensor centred = sum - sum.mean(-1, /*keepdim=*/true);
    const torch::Tensor variance = centred.pow(2).mean(-1, /*keepdim=*/true);
    normed = centred / torch::sqrt(variance + eps) * weight;
    if (with_bias) normed = normed + bias;
  } else {
    normed = sum / torch::sqrt(sum.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
  }
  Loss(c, sum, normed, in).backward();
  Results r;
  r.sum = sum.detach();
  r.normed = normed.detach();
  r.grad_x = x.grad();
  if (c.with_delta) r.grad_delta = delta.grad();
  r.grad_weight = weight.grad();
  if (with_bias) r.grad_bias = bias.grad();
  return r;
}

// max over elements of |actual - expected| / allowed (> 1: outside the tolerance; NaN where
// either has one). Computed where `expected` is, in float64.
double WorstRatio(const torch::Tensor& actual, const torch::Tensor& expected,
                  Tolerance tolerance) {
  const torch::Tensor e = expected.detach().to(torch::kFloat64);
  const torch::Tensor a = actual.detach().to(e.device(), torch::kFloat64);
  if (e.numel() == 0) return 0.0;
  const double scale = std::max(e.abs().max().item<double>(), 1e-30);
  const torch::Tensor allowed = e.abs() * tolerance.relative + tolerance.absolute * scale;
  return ((a - e).abs() / allowed).max().item<double>();
}

void ExpectClose(const torch::Tensor& actual, const torch::Tensor& expected, Tolerance tolerance,
                 const char* what) {
  if (!expected.defined()) {
    // No gradient expected: none, or zeros.
    EXPECT_TRUE(!actual.defined() || actual.abs().max().item<double>() == 0.0) << what;
    return;
  }
  ASSERT_TRUE(actual.defined()) << what << " missing";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double ratio = WorstRatio(actual, expected, tolerance);
  EXPECT_LE(ratio, 1.0) << what << ": worst difference " << ratio
                        << " times the tolerance (relative " << tolerance.relative
                        << ", absolute " << tolerance.absolute << " of the largest value)";
}

void ExpectMatches(const Results& actual, const Results& expected, Tolerance values,
                   Tolerance gradients) {
  ExpectClose(actual.sum, expected.sum, values, "sum");
  ExpectClose(actual.normed, expected.normed, values, "normed");
  ExpectClose(actual.grad_x, expected.grad_x, gradients, "x's gradient");
  ExpectClose(actual.grad_delta, expected.grad_delta, gradients, "delta's gradient");
  ExpectClose(actual.grad_weight, expected.grad_weight, gradients, "weight's gradient");
  ExpectClose(actual.grad_bias, expected.grad_bias, gradients, "bias's gradient");
}

// float32 throughout where every type is; bf16's rounding where any is.
Tolerance ToleranceFor(const Case& c) {
  const bool bf16 = c.x_type == torch::kBFloat16 || c.output_type == torch::kBFloat16 ||
                    (c.with_delta && c.delta_type == torch::kBFloat16);
  return bf16 ? kBFloat16Tolerance : kFloat32Tolerance;
}

// The code under test on `device` against the float64 reference, asserting (on CUDA, with the
// kernels on) that the fused function ran.
void ExpectCaseMatches(const Case& c, torch::Device device, int64_t seed) {
  SCOPED_TRACE(c.Name());
  const Inputs in = MakeInputs(c, device, seed);
  std::string grad_fn;
  const Results actual = RunTandem(c, in, device, &grad_fn);
  if (device.is_cuda() && FusedKernelsEnabled()) {
    EXPECT_NE(grad_fn.find("ResidualNormFunction"), std::string::npos)
        << "the composition ran (" << grad_fn << "), not the fused kernels";
  }
  const Results expected = RunReference(c, in, device, c.eps);
  const Tolerance tolerance = ToleranceFor(c);
  ExpectMatches(actual, expected, tolerance, tolerance);
}

// A case of `kind` with its models' usual epsilon (GPT-2's 1e-5, Llama's 1e-6).
Case Norm(Kind kind, std::vector<int64_t> shape) {
  Case c;
  c.kind = kind;
  c.shape = std::move(shape);
  c.eps = kind == Kind::kLayerNorm ? 1e-5 : 1e-6;
  return c;
}

Case LayerNorm(std::vector<int64_t> shape) { return Norm(Kind::kLayerNorm, std::move(shape)); }
Case RmsNorm(std::vector<int64_t> shape) { return Norm(Kind::kRmsNorm, std::move(shape)); }

// The same case with other types.
Case Typed(Case c, torch::ScalarType x, torch::ScalarType delta, torch::ScalarType output) {
  c.x_type = x;
  c.delta_type = delta;
  c.output_type = output;
  return c;
}

// Every variant of one norm on one shape: present and absent delta (and bias), each output
// alone, small values (eps matters).
std::vector<Case> Variants(const Case& base) {
  std::vector<Case> cases = {base};
  Case no_delta = base;
  no_delta.with_delta = false;
  cases.push_back(no_delta);
  if (base.kind == Kind::kLayerNorm) {
    Case no_bias = base;
    no_bias.with_bias = false;
    cases.push_back(no_bias);
    no_delta.with_bias = false;
    cases.push_back(no_delta);
  }
  Case normed_only = base;
  normed_only.use = Use::kNormedOnly;
  cases.push_back(normed_only);
  Case sum_only = base;
  sum_only.use = Use::kSumOnly;
  cases.push_back(sum_only);
  Case small = base;
  small.scale = 1e-2;
  small.eps = 1e-4;
  cases.push_back(small);
  return cases;
}

bool CudaMissing() { return !torch::cuda::is_available(); }

TEST(FusedLayerNormTest, CpuRunsTheCompositionAndMatchesTheReference) {
  int64_t seed = 1;
  for (const Case& base : {LayerNorm({7, 32}), LayerNorm({2, 5, 24}), RmsNorm({7, 32}),
                           RmsNorm({2, 5, 24})}) {
    for (const Case& c : Variants(base)) ExpectCaseMatches(c, torch::kCPU, ++seed);
    for (const Case& c :
         {Typed(base, torch::kFloat32, torch::kBFloat16, torch::kBFloat16),
          Typed(base, torch::kFloat32, torch::kBFloat16, torch::kFloat32)}) {
      ExpectCaseMatches(c, torch::kCPU, ++seed);
    }
  }
}

// The tolerances catch what a kernel could get wrong: the reference with another eps (10% off
// for float32's, twice for bf16's, on values small enough for eps to matter, as the small
// variants of the cases have), or without the sum's own gradient in x's, is outside them.
TEST(FusedLayerNormTest, TolerancesCatchAWrongEpsilonOrAMissingSumGradient) {
  for (Case c : {LayerNorm({16, 64}), RmsNorm({16, 64})}) {
    c.scale = 1e-2;
    c.eps = 1e-4;
    SCOPED_TRACE(c.Name());
    const Inputs in = MakeInputs(c, torch::kCPU, 7);
    const Results right = RunReference(c, in, torch::kCPU, c.eps);
    const Results close_eps = RunReference(c, in, torch::kCPU, c.eps * 1.1);
    EXPECT_GT(WorstRatio(close_eps.normed, right.normed, kFloat32Tolerance), 1.0);
    EXPECT_GT(WorstRatio(close_eps.grad_x, right.grad_x, kFloat32Tolerance), 1.0);
    EXPECT_GT(WorstRatio(close_eps.grad_weight, right.grad_weight, kFloat32Tolerance), 1.0);
    const Results far_eps = RunReference(c, in, torch::kCPU, c.eps * 2);
    EXPECT_GT(WorstRatio(far_eps.normed, right.normed, kBFloat16Tolerance), 1.0);
    EXPECT_GT(WorstRatio(far_eps.grad_x, right.grad_x, kBFloat16Tolerance), 1.0);
    Case normed_only = c;
    normed_only.use = Use::kNormedOnly;
    const Results no_sum_gradient = RunReference(normed_only, in, torch::kCPU, c.eps);
    EXPECT_GT(WorstRatio(no_sum_gradient.grad_x, right.grad_x, kBFloat16Tolerance), 1.0);
    EXPECT_GT(WorstRatio(no_sum_gradient.grad_delta, right.grad_delta, kBFloat16Tolerance), 1.0);
    // And the fallback passes where the wrong ones fail.
    ExpectCaseMatches(c, torch::kCPU, 7);
  }
}

TEST(FusedLayerNormTest, CudaFloat32MatchesTheReference) {
  if (CudaMissing()) GTEST_SKIP() << "no CUDA device";
  int64_t seed = 100;
  for (const int64_t hidden : {768, 1024, 4096, 100}) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{1, hidden}, std::vector<int64_t>{3, hidden},
          std::vector<int64_t>{4099, hidden}, std::vector<int64_t>{2, 5, hidden}}) {
      ExpectCaseMatches(LayerNorm(shape), torch::kCUDA, ++seed);
      ExpectCaseMatches(RmsNorm(shape), torch::kCUDA, ++seed);
    }
    for (const Case& base : {LayerNorm({37, hidden}), RmsNorm({37, hidden})}) {
      for (const Case& c : Variants(base)) ExpectCaseMatches(c, torch::kCUDA, ++seed);
    }
  }
}

TEST(FusedLayerNormTest, CudaBFloat16MatchesTheReference) {
  if (CudaMissing()) GTEST_SKIP() << "no CUDA device";
  int64_t seed = 200;
  for (const int64_t hidden : {768, 1024, 4096, 100}) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{1, hidden}, std::vector<int64_t>{4099, hidden},
          std::vector<int64_t>{2, 5, hidden}}) {
      for (const Case& base : {LayerNorm(shape), RmsNorm(shape)}) {
        // The residual stream in float32 with a bf16 block output (the models under bf16
        // autocast), a float32 output, and everything in bf16.
        for (const Case& c :
             {Typed(base, torch::kFloat32, torch::kBFloat16, torch::kBFloat16),
              Typed(base, torch::kFloat32, torch::kBFloat16, torch::kFloat32),
              Typed(base, torch::kFloat32, torch::kFloat32, torch::kBFloat16),
              Typed(base, torch::kBFloat16, torch::kBFloat16, torch::kBFloat16)}) {
          ExpectCaseMatches(c, torch::kCUDA, ++seed);
        }
      }
    }
    for (const Case& base :
         {Typed(LayerNorm({37, hidden}), torch::kFloat32, torch::kBFloat16, torch::kBFloat16),
          Typed(RmsNorm({37, hidden}), torch::kFloat32, torch::kBFloat16, torch::kBFloat16)}) {
      for (const Case& c : Variants(base)) ExpectCaseMatches(c, torch::kCUDA, ++seed);
    }
  }
}

// Single-element loads where hidden % 4 == 0 but x is misaligned (so with several packs per
// thread), transposed inputs, and hidden sizes up to the kernels' largest.
TEST(FusedLayerNormTest, CudaOtherLayoutsAndSizes) {
  if (CudaMissing()) GTEST_SKIP() << "no CUDA device";
  int64_t seed = 300;
  std::vector<Case> cases;
  for (const int64_t hidden : {768, 4096, 8192, 5001, 16384, 16383, 1, 3}) {
    cases.push_back(LayerNorm({33, hidden}));
    cases.push_back(RmsNorm({33, hidden}));
  }
  for (const int64_t hidden : {768, 4096, 8192}) {
    for (Case c : {LayerNorm({9, hidden}), RmsNorm({9, hidden}),
                   Typed(LayerNorm({9, hidden}), torch::kBFloat16, torch::kBFloat16,
                         torch::kBFloat16)}) {
      c.misaligned = true;
      cases.push_back(c);
    }
  }
  for (Case c : {LayerNorm({5, 2, 1024}), RmsNorm({5, 2, 1024}), LayerNorm({5, 2, 100})}) {
    c.transposed = true;
    cases.push_back(c);
  }
  for (const Case& c : cases) ExpectCaseMatches(c, torch::kCUDA, ++seed);
}

// Under bf16 autocast the function computes in the types it is given (the same bits), and its
// weight gradient is the same bits on every run (no atomics).
TEST(FusedLayerNormTest, CudaAutocastChangesNothingAndGradientsAreDeterministic) {
  if (CudaMissing()) GTEST_SKIP() << "no CUDA device";
  for (const Case& c :
       {Typed(LayerNorm({4099, 768}), torch::kFloat32, torch::kBFloat16, torch::kBFloat16),
        Typed(RmsNorm({4099, 4096}), torch::kFloat32, torch::kBFloat16, torch::kBFloat16)}) {
    SCOPED_TRACE(c.Name());
    const Inputs in = MakeInputs(c, torch::kCUDA, 400);
    const Results plain = RunTandem(c, in, torch::kCUDA);
    Results autocast;
    {
      AutocastGuard guard(torch::kCUDA, Precision::kBFloat16);
      autocast = RunTandem(c, in, torch::kCUDA);
    }
    const Results again = RunTandem(c, in, torch::kCUDA);
    EXPECT_TRUE(torch::equal(plain.normed, autocast.normed));
    EXPECT_TRUE(torch::equal(plain.grad_x, autocast.grad_x));
    EXPECT_TRUE(torch::equal(plain.grad_weight, again.grad_weight));
    if (c.kind == Kind::kLayerNorm) {
      EXPECT_TRUE(torch::equal(plain.grad_bias, again.grad_bias));
    }
    EXPECT_TRUE(torch::equal(plain.grad_delta, again.grad_delta));
  }
}

// Switched off, the same calls run LibTorch's composition on the device, which agrees.
TEST(FusedLayerNormTest, CudaSwitchedOffRunsTheComposition) {
  if (CudaMissing()) GTEST_SKIP() << "no CUDA device";
  const bool was_enabled = FusedKernelsEnabled();
  for (const Case& c : {LayerNorm({64, 1024}), RmsNorm({64, 1024})}) {
    SCOPED_TRACE(c.Name());
    const Inputs in = MakeInputs(c, torch::kCUDA, 500);
    SetFusedKernelsEnabled(false);
    std::string grad_fn;
    const Results composed = RunTandem(c, in, torch::kCUDA, &grad_fn);
    SetFusedKernelsEnabled(was_enabled);
    EXPECT_EQ(grad_fn.find("ResidualNormFunction"), std::string::npos) << grad_fn;
    ExpectMatches(composed, RunReference(c, in, torch::kCUDA, c.eps), kFloat32Tolerance,
                  kFloat32Tolerance);
    ExpectMatches(RunTandem(c, in, torch::kCUDA), composed, kFloat32Tolerance, kFloat32Tolerance);
  }
}

}  // namespace
}  // namespace tandem::runtime::libtorch
