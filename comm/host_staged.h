// A communicator for device buffers over a host communicator (MPI), through host staging:
// what NCCL cannot do when several ranks share one GPU ("Duplicate GPU detected").
//
// Every operation on a device buffer copies it into a host staging buffer (pinned memory for
// CUDA, so the copies are direct DMA), runs the inner communicator's operation on the host
// copy and, for what it receives, copies the result back to the device when the operation
// completes (in Work::Wait / a successful Test). Host buffers pass straight through. The
// staging buffers live until the operation completes; Abort, timeouts and errors are the
// inner communicator's.
//
// Ordering: a device-to-host copy is issued after the work already queued on the device (it
// waits for it), so what is sent is what the caller's compute wrote; the copy back to the
// device is complete before Wait returns.
//
// The copies are done by a DeviceCopier: the CUDA one (comm/nccl/, CreateHostStagedCommunicator
// in comm/backend.h), or a test's.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace tandem::comm {

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // Host staging memory of `bytes` bytes (pinned where the device supports it).
  virtual absl::StatusOr<std::shared_ptr<void>> AllocateHost(int64_t bytes) = 0;
  // `bytes` from device memory `device` (of `buffer_device`) to host memory, complete on return.
  virtual absl::Status ToHost(void* host, const void* device, int64_t bytes,
                              const Device& buffer_device) = 0;
  virtual absl::Status ToDevice(void* device, const void* host, int64_t bytes,
                                const Device& buffer_device) = 0;
  // Whether buffers on `device` need staging (the CPU's do not).
  virtual bool Stages(const Device& device) const { return device.kind != DeviceKind::kCpu; }
};

// The CUDA copier (pinned host memory, cudaMemcpy); only in builds with the CUDA toolkit
// (comm/nccl/cuda_host_staging.cc).
std::shared_ptr<DeviceCopier> NewCudaCopier();

// Owns `inner`. InvalidArgument if either is null.
absl::StatusOr<std::unique_ptr<Communicator>> NewHostStagedCommunicator(
    std::unique_ptr<Communicator> inner, std::shared_ptr<DeviceCopier> copier);

}  // namespace tandem::comm
