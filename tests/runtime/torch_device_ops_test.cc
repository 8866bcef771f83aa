// The device layer's optimizers against torch::optim over many steps: the runtime's CPU loops
// and the LibTorch tensor operations (the GPU path, here on the CPU; on a CUDA device too when
// one is present). Also the memory operations and the running squared norm.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "runtime/device_ops.h"
#include "runtime/torch/device_ops.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr int kSteps = 60;

// ||a - b|| / ||b||: the difference relative to the parameters' norm. (Element-wise relative
// differences are dominated by values near zero, where a single float32 rounding, e.g. a fused
// multiply-add in LibTorch's vectorised kernels, is large against the value itself.)
double RelativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  torch::Tensor x = a.detach().to(torch::kCPU, torch::kFloat64);
  torch::Tensor y = b.detach().to(torch::kCPU, torch::kFloat64);
  return ((x - y).norm() / y.norm()).item<double>();
}

struct Case {
  std::string name;
  OptimizerConfig config;
  double grad_scale = 1.0;  // clipping coefficient applied every other step
};

std::vector<Case> Cases() {
  return {
      {"sgd", OptimizerConfig::Sgd(/*momentum=*/0.0), 1.0},
      {"sgd_momentum", OptimizerConfig::Sgd(/*momentum=*/0.9), 1.0},
      {"sgd_momentum_decay_clipped", OptimizerConfig::Sgd(0.9, /*weight_decay=*/0.01), 0.5},
      {"adamw", OptimizerConfig::AdamW(), 1.0},
      {"adamw_decay_clipped", OptimizerConfig::AdamW(/*weight_decay=*/0.1, 0.8, 0.99, 1e-6),
       0.25},
  };
}

// Runs kSteps of `ops`'s optimizer and of torch::optim on the same parameters (two tensors of
// different sizes, one optimizer span each) and gradients; returns the largest relative
// difference of a parameter tensor at the end.
double CompareWithTorchOptim(DeviceOps& ops, torch::Device device, const Case& c) {
  torch::manual_seed(3);
  const std::vector<int64_t> counts = {1031, 77};
  std::vector<torch::Tensor> ours, reference;
  for (int64_t n : counts) {
    torch::Tensor initial = torch::randn({n});
    ours.push_back(initial.clone().to(device));
    reference.push_back(initial.clone().requires_grad_(true));
  }
  std::unique_ptr<torch::optim::Optimizer> optim;
  const double lr = 0.01;
  if (c.config.kind == OptimizerKind::kSgd) {
    optim = std::make_unique<torch::optim::SGD>(
        reference,
        torch::optim::SGDOptions(lr).momentum(c.config.momentum).weight_decay(
            c.config.weight_decay));
  } else {
    optim = std::make_unique<torch::optim::AdamW>(
        reference, torch::optim::AdamWOptions(lr)
                       .betas({c.config.beta1, c.config.beta2})
                       .eps(c.config.eps)
                       .weight_decay(c.config.weight_decay));
  }
  auto optimizer = ops.NewOptimizer(c.config, counts);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  if (!optimizer.ok()) return 1e9;
  for (int step = 0; step < kSteps; ++step) {
    const double scale = step % 2 == 1 ? c.grad_scale : 1.0;
    std::vector<float*> params, grads;
    std::vector<torch::Tensor> grad_tensors;
    for (size_t i = 0; i < counts.size(); ++i) {
      torch::Tensor g = torch::randn({counts[i]});
      // torch::optim sees the scaled gradient, as clip_grad_norm_ leaves it.
      reference[i].mutable_grad() = g * static_cast<float>(scale);
      grad_tensors.push_back(g.to(device).contiguous());
      params.push_back(ours[i].data_ptr<float>());
      grads.push_back(grad_tensors.back().data_ptr<float>());
    }
    optim->step();
    const absl::Status s = (*optimizer)->Step(0, params, grads, lr, scale);
    EXPECT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ((*optimizer)->steps(), kSteps);
  double worst = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    worst = std::max(worst, RelativeDifference(ours[i], reference[i]));
  }
  return worst;
}

TEST(DeviceOptimizerTest, CpuLoopsEqualTorchOptim) {
  for (const Case& c : Cases()) {
    EXPECT_LE(CompareWithTorchOptim(DefaultCpuDeviceOps(), torch::kCPU, c), 1e-6) << c.name;
  }
}

TEST(DeviceOptimizerTest, LibTorchOperationsEqualTorchOptimOnCpu) {
  for (bool fused : {false, true}) {
    TorchDeviceOps ops(torch::kCPU, fused);
    for (const Case& c : Cases()) {
      EXPECT_LE(CompareWithTorchOptim(ops, torch::kCPU, c), 1e-6)
          << c.name << (fused ? " (fused where available)" : "");
    }
  }
}

TEST(DeviceOptimizerTest, LibTorchOperationsEqualTorchOptimOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (bool fused : {false, true}) {
    TorchDeviceOps ops(torch::Device(torch::kCUDA, 0), fused);
    for (const Case& c : Cases()) {
      // GPU kernels round differently (fused multiply-add, other reduction orders).
      EXPECT_LE(CompareWithTorchOptim(ops, torch::Device(torch::kCUDA, 0), c), 1e-5)
          << c.name << (fused ? " (fused)" : "");
    }
  }
}

// As a stage steps them: spans packed one after another in one arena (odd sizes, so most
// spans start unaligned), a zero gradient on one span (the attention key bias), stepped
// together in one call.
TEST(DeviceOptimizerTest, ArenaSpansEqualTorchOptim) {
  const std::vector<int64_t> counts = {48, 16, 16, 1, 4099, 33, 7, 256};
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  for (bool fused : {false, true}) {
    torch::manual_seed(9);
    TorchDeviceOps ops(torch::kCPU, fused);
    torch::Tensor arena = torch::randn({total});
    torch::Tensor grad_arena = torch::zeros({total});
    std::vector<torch::Tensor> reference;
    std::vector<float*> params, grads;
    int64_t offset = 0;
    for (int64_t n : counts) {
      reference.push_back(arena.narrow(0, offset, n).clone().requires_grad_(true));
      params.push_back(arena.data_ptr<float>() + offset);
      grads.push_back(grad_arena.data_ptr<float>() + offset);
      offset += n;
    }
    torch::optim::AdamW optim(reference, torch::optim::AdamWOptions(1.5e-3).weight_decay(0.01));
    auto optimizer = ops.NewOptimizer(OptimizerConfig::AdamW(0.01), counts);
    ASSERT_TRUE(optimizer.ok());
    for (int step = 0; step < 20; ++step) {
      grad_arena.normal_();
      grad_arena.narrow(0, 0, counts[0]).zero_();
      offset = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        reference[i].mutable_grad() = grad_arena.narrow(0, offset, counts[i]).clone();
        offset += counts[i];
      }
      optim.step();
      ASSERT_TRUE((*optimizer)->Step(0, params, grads, 1.5e-3, 1.0).ok());
    }
    offset = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      EXPECT_LE(RelativeDifference(arena.narrow(0, offset, counts[i]), reference[i]), 1e-6)
          << "span " << i << (fused ? " (fused)" : "");
      offset += counts[i];
    }
  }
}

// The optimizer keeps its views of the buffers from step to step; buffers that move (a stage
// rebuilt after a failure, a checkpoint loaded into new memory) are stepped where they are
// now, and the old ones are left alone.
TEST(DeviceOptimizerTest, BuffersThatMoveBetweenStepsAreSteppedWhereTheyAreNow) {
  const std::vector<int64_t> counts = {5, 3};
  for (bool fused : {false, true}) {
    TorchDeviceOps ops(torch::kCPU, fused);
    auto optimizer = ops.NewOptimizer(OptimizerConfig::Sgd(/*momentum=*/0.0), counts);
    ASSERT_TRUE(optimizer.ok());
    torch::Tensor first = torch::ones({8});
    torch::Tensor second = torch::ones({8});
    torch::Tensor grads = torch::full({8}, 2.0f);
    const auto spans = [&](torch::Tensor& t) {
      return std::vector<float*>{t.data_ptr<float>(), t.data_ptr<float>() + counts[0]};
    };
    std::vector<float*> g = spans(grads);
    ASSERT_TRUE((*optimizer)->Step(0, spans(first), g, 0.25, 1.0).ok());
    EXPECT_TRUE(first.equal(torch::full({8}, 0.5f))) << first;
    ASSERT_TRUE((*optimizer)->Step(0, spans(second), g, 0.25, 1.0).ok());
    EXPECT_TRUE(second.equal(torch::full({8}, 0.5f))) << second;
    EXPECT_TRUE(first.equal(torch::full({8}, 0.5f))) << first;  // not stepped again
    torch::Tensor other_grads = torch::full({8}, 4.0f);
    ASSERT_TRUE((*optimizer)->Step(0, spans(second), spans(other_grads), 0.25, 1.0).ok());
    EXPECT_TRUE(second.equal(torch::full({8}, -0.5f))) << second;
  }
}

TEST(DeviceOpsTest, CopiesAverageAndNormMatchTheCpuLoops) {
  TorchDeviceOps ops(torch::kCPU);
  DeviceOps& cpu = DefaultCpuDeviceOps();
  torch::manual_seed(5);
  torch::Tensor a = torch::randn({4099});
  std::vector<float> host(a.data_ptr<float>(), a.data_ptr<float>() + a.numel());
  auto device = ops.Zeros(a.numel());
  ASSERT_TRUE(device.ok());
  ASSERT_TRUE(ops.CopyFromHost(device->data, host.data(), a.numel()).ok());
  auto copy = ops.Zeros(a.numel());
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE(ops.Copy(copy->data, device->data, a.numel()).ok());
  // Average into a second buffer; the running norm adds only what is asked.
  auto averaged = ops.Zeros(a.numel());
  ASSERT_TRUE(averaged.ok());
  ASSERT_TRUE(
      ops.AverageAndAddSquaredNorm(averaged->data, copy->data, a.numel(), 3.0f, true, true).ok());
  ASSERT_TRUE(ops.AverageAndAddSquaredNorm(copy->data, copy->data, a.numel(), 1.0f, false, false)
                  .ok());
  auto norm = ops.TakeSquaredNorm();
  ASSERT_TRUE(norm.ok());
  std::vector<float> expected(host.size());
  ASSERT_TRUE(
      cpu.AverageAndAddSquaredNorm(expected.data(), host.data(), a.numel(), 3.0f, true, true)
          .ok());
  auto expected_norm = cpu.TakeSquaredNorm();
  ASSERT_TRUE(expected_norm.ok());
  EXPECT_NEAR(*norm, *expected_norm, 1e-12 * *expected_norm);
  std::vector<float> back(host.size());
  ASSERT_TRUE(ops.CopyToHost(back.data(), averaged->data, a.numel()).ok());
  EXPECT_EQ(back, expected);  // the same float division
  auto zero = ops.TakeSquaredNorm();  // reset by the previous take
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, 0.0);
}

TEST(DeviceOptimizerTest, StateBuffersAreCreatedResetAndCounted) {
  TorchDeviceOps ops(torch::kCPU, /*fused_adamw=*/false);
  auto sgd = ops.NewOptimizer(OptimizerConfig::Sgd(0.9), {5});
  ASSERT_TRUE(sgd.ok());
  auto missing = (*sgd)->StateBuffer(0, "momentum_buffer", /*create=*/false);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(*missing, nullptr);  // before the first step
  auto created = (*sgd)->StateBuffer(0, "momentum_buffer", /*create=*/true);
  ASSERT_TRUE(created.ok());
  ASSERT_NE(*created, nullptr);
  EXPECT_EQ((*created)[4], 0.0f);
  EXPECT_EQ((*sgd)->StateBuffer(0, "exp_avg", true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*sgd)->StateBuffer(1, "momentum_buffer", true).status().code(),
            absl::StatusCode::kInvalidArgument);
  float p[5] = {1, 2, 3, 4, 5};
  float g[5] = {1, 1, 1, 1, 1};
  float* pp = p;
  float* gp = g;
  EXPECT_EQ((*sgd)->Step(0, {&pp, 1}, {&gp, 1}, std::nan(""), 1.0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*sgd)->Step(1, {&pp, 1}, {&gp, 1}, 0.1, 1.0).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*sgd)->ResetStateBuffer(0, "momentum_buffer").ok());
  auto reset = (*sgd)->StateBuffer(0, "momentum_buffer", false);
  ASSERT_TRUE(reset.ok());
  EXPECT_EQ(*reset, nullptr);
  (*sgd)->set_steps(7);
  EXPECT_EQ((*sgd)->steps(), 7);
  EXPECT_FALSE(ops.NewOptimizer(OptimizerConfig::Sgd(1.5), {5}).ok());  // momentum >= 1
}

}  // namespace
}  // namespace tandem::runtime::libtorch
