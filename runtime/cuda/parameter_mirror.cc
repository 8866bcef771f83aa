// ParameterMirror over the CUDA runtime: pinned host buffers (cudaHostAlloc) and synchronous
// copies on the legacy default stream, which orders them after the stage's queued work.
#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/check.h"
#include "common/status.h"
#include "runtime/parameter_mirror.h"

namespace tandem::runtime {
namespace {

class CudaParameterMirror : public ParameterMirror {
 public:
  explicit CudaParameterMirror(std::vector<ParameterView> device) : device_(std::move(device)) {}
  ~CudaParameterMirror() override {
    for (ParameterView& h : host_) {
      if (h.value.data != nullptr) cudaFreeHost(h.value.data);
      if (h.grad.data != nullptr) cudaFreeHost(h.grad.data);
    }
  }

  absl::Status Allocate() {
    for (const ParameterView& d : device_) {
      if (d.value.dtype != comm::DataType::kFloat32 || d.grad.count != d.value.count ||
          d.value.device.kind != comm::DeviceKind::kCuda) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter '", d.name, "': a device mirror needs float32 CUDA value and gradient "
            "buffers of one size"));
      }
      ParameterView h;
      h.name = d.name;
      h.value = d.value;
      h.grad = d.grad;
      h.value.device = comm::Device::Cpu();
      h.grad.device = comm::Device::Cpu();
      h.value.data = nullptr;
      h.grad.data = nullptr;
      host_.push_back(h);
      ParameterView& slot = host_.back();
      TANDEM_CUDA_CHECK(cudaSetDevice(d.value.device.index));
      TANDEM_CUDA_CHECK(cudaHostAlloc(&slot.value.data, d.value.bytes(), cudaHostAllocDefault));
      TANDEM_CUDA_CHECK(cudaHostAlloc(&slot.grad.data, d.grad.bytes(), cudaHostAllocDefault));
      TANDEM_CUDA_CHECK(
          cudaMemcpy(slot.value.data, d.value.data, d.value.bytes(), cudaMemcpyDeviceToHost));
    }
    return absl::OkStatus();
  }

  const std::vector<ParameterView>& host() const override { return host_; }

  absl::Status GradientsToHost() override {
    for (size_t i = 0; i < device_.size(); ++i) {
      TANDEM_CUDA_CHECK(cudaMemcpy(host_[i].grad.data, device_[i].grad.data,
                                   device_[i].grad.bytes(), cudaMemcpyDeviceToHost));
    }
    return absl::OkStatus();
  }

  absl::Status ValuesToDevice() override {
    for (size_t i = 0; i < device_.size(); ++i) {
      TANDEM_CUDA_CHECK(cudaMemcpy(device_[i].value.data, host_[i].value.data,
                                   device_[i].value.bytes(), cudaMemcpyHostToDevice));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<ParameterView> device_;
  std::vector<ParameterView> host_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterMirror>> ParameterMirror::Create(
    std::vector<ParameterView> device_parameters) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError("parameter mirror: no CUDA device is available");
  }
  auto mirror = std::make_unique<CudaParameterMirror>(std::move(device_parameters));
  TANDEM_RETURN_IF_ERROR(mirror->Allocate());
  return std::unique_ptr<ParameterMirror>(std::move(mirror));
}

}  // namespace tandem::runtime
