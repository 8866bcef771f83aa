// A test double for runtime::DeviceOps: every operation passes to the CPU loops
// (DefaultCpuDeviceOps); tests derive from it to count or delay the operations they watch.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device_ops.h"

namespace tandem::runtime {

class DelegatingDeviceOps : public DeviceOps {
 public:
  comm::Device device() const override { return cpu_.device(); }
  std::string name() const override { return "cpu loops (test double)"; }
  absl::StatusOr<DeviceArray> Zeros(int64_t count) override { return cpu_.Zeros(count); }
  absl::Status Copy(float* dst, const float* src, int64_t count) override {
    return cpu_.Copy(dst, src, count);
  }
  absl::Status CopyFromHost(float* dst, const float* host, int64_t count) override {
    return cpu_.CopyFromHost(dst, host, count);
  }
  absl::Status CopyToHost(float* host, const float* src, int64_t count) override {
    return cpu_.CopyToHost(host, src, count);
  }
  absl::Status AverageAndAddSquaredNorm(float* dst, const float* src, int64_t count,
                                        float divisor, bool divide, bool add_to_norm) override {
    return cpu_.AverageAndAddSquaredNorm(dst, src, count, divisor, divide, add_to_norm);
  }
  absl::StatusOr<double> TakeSquaredNorm() override { return cpu_.TakeSquaredNorm(); }
  absl::StatusOr<bool> StartTakingSquaredNorm() override {
    return cpu_.StartTakingSquaredNorm();
  }
  absl::Status ToBFloat16(uint16_t* dst, const float* src, int64_t count) override {
    return cpu_.ToBFloat16(dst, src, count);
  }
  absl::Status FromBFloat16(float* dst, const uint16_t* src, int64_t count) override {
    return cpu_.FromBFloat16(dst, src, count);
  }
  absl::StatusOr<std::unique_ptr<DeviceOptimizer>> NewOptimizer(
      const OptimizerConfig& config, std::vector<int64_t> counts) override {
    return cpu_.NewOptimizer(config, std::move(counts));
  }
  bool prefers_fused_steps() const override { return cpu_.prefers_fused_steps(); }
  absl::Status Synchronize() override { return cpu_.Synchronize(); }

 private:
  DeviceOps& cpu_ = DefaultCpuDeviceOps();
};

}  // namespace tandem::runtime
