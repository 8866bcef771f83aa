// The runtime's device layer: what gradient synchronisation and the optimizer need to do with
// memory on a stage's device. Training state (parameters, gradients, optimizer state) stays on
// that device; the host sees it only through CopyToHost / CopyFromHost, for checkpoints and
// state transfer.
//
// Implementations:
//   * CpuDeviceOps (DefaultCpuDeviceOps()): float32 loops with PyTorch's exact update order
//     (runtime/optimizer.h), vectorised; used for CPU stages unless the stage brings its own.
//   * the LibTorch adapter's TorchDeviceOps (runtime/torch/device_ops.h): LibTorch tensor
//     operations on any device (CUDA, or the CPU in tests), a fused multi-tensor AdamW where
//     LibTorch has one. A stage on a CUDA device supplies it through Stage::device_ops().
//
// Ordering: every operation is issued in order on the device's current work queue (LibTorch's
// current CUDA stream); a function that returns a host value (a norm) waits for what it needs
// and nothing more. Communication on device buffers is ordered against this queue by the
// communicator (comm/communicator.h).
//
// Threading: one thread (the engine's) uses a DeviceOps and its optimizers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "comm/buffer.h"
#include "runtime/optimizer.h"

namespace tandem::runtime {

// A float32 array on a device; `holder` owns the memory.
struct DeviceArray {
  float* data = nullptr;
  int64_t count = 0;
  std::shared_ptr<void> holder;
};

// Optimizer state for a fixed list of float32 spans on one device (the parameters of a stage,
// or DeAR's shards of its buckets). Each span counts its own steps; they are stepped together
// (one call over all spans, where a fused multi-tensor kernel pays off) or a run at a time.
class DeviceOptimizer {
 public:
  virtual ~DeviceOptimizer() = default;

  // One update of spans [first_span, first_span + params.size()): params[i] (counts()[first_span
  // + i] elements) from grads[i], with learning rate `lr`; gradients are multiplied by
  // `grad_scale` first (clipping). The gradients may be scaled in place (the step consumes
  // them).
  virtual absl::Status Step(int first_span, absl::Span<float* const> params,
                            absl::Span<float* const> grads, double lr, double grad_scale) = 0;

  virtual const std::vector<int64_t>& counts() const = 0;
  // Steps taken by span 0 (all spans when they are stepped together); set_steps sets all.
  virtual int64_t steps() const = 0;
  virtual void set_steps(int64_t steps) = 0;

  // State buffers by name: SGD "momentum_buffer" (created by the first step when momentum is
  // used), AdamW "exp_avg", "exp_avg_sq". StateBuffer returns span i's buffer on the device,
  // or null when it does not exist yet; with `create` it makes a zeroed one first.
  virtual std::vector<std::string> BufferNames() const = 0;
  virtual absl::StatusOr<float*> StateBuffer(int span, absl::string_view name, bool create) = 0;
  // Drops span i's buffer `name` (SGD before its first step); AdamW buffers are zeroed instead.
  virtual absl::Status ResetStateBuffer(int span, absl::string_view name) = 0;

 protected:
  // The argument check every Step shares: a run of spans within counts(), one gradient per
  // parameter, finite lr and scale.
  absl::Status CheckStep(int first_span, size_t params, size_t grads, double lr,
                         double grad_scale) const;
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  virtual comm::Device device() const = 0;
  // What it is, for messages: "cpu loops", "libtorch on cuda:0".
  virtual std::string name() const = 0;

  // `count` zeros.
  virtual absl::StatusOr<DeviceArray> Zeros(int64_t count) = 0;
  // Device to device, host to device, device to host (`host` is ordinary host memory; the
  // copy to the host has finished when it returns).
  virtual absl::Status Copy(float* dst, const float* src, int64_t count) = 0;
  virtual absl::Status CopyFromHost(float* dst, const float* host, int64_t count) = 0;
  virtual absl::Status CopyToHost(float* host, const float* src, int64_t count) = 0;

  // dst[i] = src[i] / divisor (or src[i] without `divide`); dst may equal src. With
  // `add_to_norm` the sum of dst[i]^2 (in double; LibTorch on a GPU sums one call's squares
  // in float32, as clip_grad_norm_ does) is added to a running squared norm, which
  // TakeSquaredNorm returns and resets: one wait per iteration for the clipping norm, however
  // many buffers contribute. The running norm belongs to the calling thread.
  virtual absl::Status AverageAndAddSquaredNorm(float* dst, const float* src, int64_t count,
                                                float divisor, bool divide, bool add_to_norm) = 0;
  virtual absl::StatusOr<double> TakeSquaredNorm() = 0;
  // Starts moving the running norm to the host without waiting: the TakeSquaredNorm that
  // follows waits for that copy alone, not for work issued in between (an optimizer step).
  // Add no more to the norm before that take. False: not done here (the CPU loops, whose
  // running norm every stage of the thread shares); take the norm now instead.
  virtual absl::StatusOr<bool> StartTakingSquaredNorm() { return false; }

  // float32 -> bfloat16 (round to nearest even, NaN kept a NaN) and back, for gradients
  // communicated in bfloat16; `dst` and `src` on this device, 2 bytes per bfloat16.
  virtual absl::Status ToBFloat16(uint16_t* dst, const float* src, int64_t count) = 0;
  virtual absl::Status FromBFloat16(float* dst, const uint16_t* src, int64_t count) = 0;

  // An optimizer for spans of `counts` elements on this device. `config` must be valid.
  virtual absl::StatusOr<std::unique_ptr<DeviceOptimizer>> NewOptimizer(
      const OptimizerConfig& config, std::vector<int64_t> counts) = 0;

  // Whether one optimizer call over many spans is cheaper than a call per span (a fused
  // kernel); the CPU loops prefer a call per bucket, which lets communication start earlier.
  virtual bool prefers_fused_steps() const = 0;

  // Waits for the work issued so far (end of training, before timing a step); not used on the
  // hot path.
  virtual absl::Status Synchronize() = 0;
};

// The process-wide CPU implementation (stateless; safe to share).
DeviceOps& DefaultCpuDeviceOps();

}  // namespace tandem::runtime
