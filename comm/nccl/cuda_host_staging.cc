// CUDA helpers of the communication layer: the DeviceCopier for host-staged communication
// (comm/host_staged.h: pinned host buffers from cudaMallocHost, copies ordered after the work
// queued on the legacy default stream, which LibTorch's default stream is) and device names.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "comm/host_staged.h"
#include "common/status.h"

namespace tandem::comm {
namespace {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

class CudaCopier final : public DeviceCopier {
 public:
  absl::StatusOr<std::shared_ptr<void>> AllocateHost(int64_t bytes) override {
    void* memory = nullptr;
    TANDEM_RETURN_IF_ERROR(
        CudaStatus(cudaMallocHost(&memory, static_cast<size_t>(bytes)), "cudaMallocHost"));
    return std::shared_ptr<void>(memory, [](void* p) { cudaFreeHost(p); });
  }
  absl::Status ToHost(void* host, const void* device, int64_t bytes,
                      const Device& buffer_device) override {
    TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(buffer_device.index), "cudaSetDevice"));
    // cudaMemcpy on the legacy default stream: after the compute queued there, and complete
    // on return.
    return CudaStatus(cudaMemcpy(host, device, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
                      "cudaMemcpy (device to host staging)");
  }
  absl::Status ToDevice(void* device, const void* host, int64_t bytes,
                        const Device& buffer_device) override {
    TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(buffer_device.index), "cudaSetDevice"));
    return CudaStatus(cudaMemcpy(device, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
                      "cudaMemcpy (host staging to device)");
  }
};

}  // namespace

std::shared_ptr<DeviceCopier> NewCudaCopier() { return std::make_shared<CudaCopier>(); }

std::string CudaDeviceName(int index) {
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) return "";
  return properties.name;
}

}  // namespace tandem::comm
