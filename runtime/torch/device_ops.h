// TorchDeviceOps: the runtime's device layer (runtime/device_ops.h) as LibTorch tensor
// operations on one device, so parameters, gradients and optimizer state stay where the stage
// computes (a CUDA device; the CPU too, which is how CI tests this path).
//
// Optimizer: AdamW as one fused multi-tensor kernel (at::_fused_adamw_) where LibTorch has it
// (2.x) and `fused` is set; otherwise, and for SGD with momentum, the tensor operations of
// torch::optim in its order, so results equal torch::optim's (bit for bit on the CPU with
// LibTorch 1.13; within float32 rounding for the fused kernel). Gradient scaling (clipping)
// multiplies the gradients in place first. Work is issued on LibTorch's current stream; only
// TakeSquaredNorm and CopyToHost wait (for their own results).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Event.h>
#include <torch/types.h>

#include "runtime/device_ops.h"

namespace tandem::runtime::libtorch {

// Whether this LibTorch has a fused multi-tensor AdamW kernel (at::_fused_adamw_).
bool HasFusedAdamW();

// Peak memory of this process on `device`: the CUDA caching allocator's peak allocated bytes
// on a GPU (0 where this LibTorch has no CUDA), the peak resident set size on the CPU.
double PeakMemoryBytes(torch::Device device);
// Memory of `device`: the GPU's total memory, or the host's physical memory on the CPU (0
// where unknown).
double DeviceMemoryBytes(torch::Device device);

// LibTorch's profiler (Kineto) around a stretch of training: the operators LibTorch runs and,
// with `cuda`, the device's kernels and copies, written by StopTorchTrace as a Chrome trace
// (chrome://tracing, Perfetto). One trace at a time per process; Unimplemented before LibTorch 2.
bool HasTorchTrace();
absl::Status StartTorchTrace(bool cuda);
absl::Status StopTorchTrace(const std::string& path);

// A tensor over memory known to lie on `options.device()` (no copy; `deleter` runs when the
// last tensor over it goes). torch::from_blob asks the CUDA driver where each pointer lives
// (cudaPointerGetAttributes, about a microsecond a call, hundreds of calls an optimizer step);
// a device with an index is taken as given.
torch::Tensor TensorOver(void* data, at::IntArrayRef shape, const torch::TensorOptions& options,
                         std::function<void(void*)> deleter = nullptr);

// A scalar on its way from a device to the host. Start queues its copy into pinned memory
// behind the work issued so far on the device's current stream and returns at once; Take
// waits for that copy alone, not for work issued after Start, and returns the value (on the
// CPU Start keeps a copy).
class HostScalar {
 public:
  void Start(const torch::Tensor& value);
  bool started() const { return host_.defined(); }
  double Take();  // after Start; not started any more after it

 private:
  torch::Tensor host_;
  std::optional<c10::Event> ready_;
};

class TorchDeviceOps final : public DeviceOps {
 public:
  // `fused_adamw`: use at::_fused_adamw_ where available (ignored elsewhere).
  explicit TorchDeviceOps(torch::Device device, bool fused_adamw = true);

  comm::Device device() const override;
  std::string name() const override;
  absl::StatusOr<DeviceArray> Zeros(int64_t count) override;
  absl::Status Copy(float* dst, const float* src, int64_t count) override;
  absl::Status CopyFromHost(float* dst, const float* host, int64_t count) override;
  absl::Status CopyToHost(float* host, const float* src, int64_t count) override;
  absl::Status AverageAndAddSquaredNorm(float* dst, const float* src, int64_t count,
                                        float divisor, bool divide, bool add_to_norm) override;
  absl::StatusOr<double> TakeSquaredNorm() override;
  absl::StatusOr<bool> StartTakingSquaredNorm() override;
  absl::Status ToBFloat16(uint16_t* dst, const float* src, int64_t count) override;
  absl::Status FromBFloat16(float* dst, const uint16_t* src, int64_t count) override;
  absl::StatusOr<std::unique_ptr<DeviceOptimizer>> NewOptimizer(
      const OptimizerConfig& config, std::vector<int64_t> counts) override;
  bool prefers_fused_steps() const override { return true; }
  absl::Status Synchronize() override;

  // A float32 tensor viewing `count` elements at `data` on this device (no copy).
  torch::Tensor View(const float* data, int64_t count) const;

 private:
  torch::Device device_;
  bool fused_adamw_;
  torch::Tensor norm_;  // float64 sum of squares on the device (undefined when zero)
  HostScalar norm_on_its_way_;  // norm_ after StartTakingSquaredNorm
};

}  // namespace tandem::runtime::libtorch
