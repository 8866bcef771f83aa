#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"

namespace tandem::comm {

int CudaDeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (why != nullptr) {
      *why = absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(rc), ": ",
                          cudaGetErrorString(rc));
    }
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "cudaGetDeviceCount returned 0 devices";
  return count;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator&,
                                                                     const CommOptions&) {
  return absl::UnimplementedError("nccl backend: communicator not implemented yet");
}

}  // namespace tandem::comm
