// The device layer of the engine: which device operations each local stage uses and, for
// stages on CUDA devices, the communicators that carry device buffers.
//
// Every rank must run its stages on one kind of device, the same kind on every rank. CPU
// stages use their own DeviceOps or the CPU loops, and MPI for everything. CUDA stages bring
// their DeviceOps (Stage::device_ops); payloads of transfers and gradient synchronisation go
// over NCCL: with a GPU per rank, or with ranks that share a GPU in NCCL's multi-rank mode
// (NCCL >= 2.30 loaded at run time; comm::SharedGpuOverNccl). Where ranks share a GPU and NCCL
// cannot take them (an older NCCL, or TANDEM_COMM_SHARED_GPU=mpi) they go over MPI through
// pinned host staging (comm/host_staged.h), with one notice line on rank 0 saying why. Shape
// headers and agreements stay on MPI. Where NCCL carries the device buffers the
// tensor-parallel group gets an NCCL communicator too (its collectives then run on NCCL's
// stream, ordered with the compute stream by events).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/options.h"
#include "runtime/device_ops.h"
#include "runtime/groups.h"
#include "runtime/stage.h"

namespace tandem::runtime {

// One local stage as the device layer sees it.
struct StageDevice {
  // In: the stage, its index, and its gradient group on MPI (every copy of the stage).
  Stage* stage = nullptr;
  int index = 0;
  comm::Communicator* group = nullptr;
  // Out: the stage's parameters (on its device), its device operations and, on CUDA, its
  // gradient group for device buffers (null on the CPU, where `group` carries everything).
  std::vector<ParameterView> parameters;
  DeviceOps* ops = nullptr;
  std::unique_ptr<comm::Communicator> device_group;
};

// Communicators for device buffers of a CUDA job (all null on the CPU).
struct DeviceLinks {
  std::unique_ptr<comm::Communicator> world;     // NCCL over the world (a GPU per rank)
  std::unique_ptr<comm::Communicator> pipeline;  // transfer payloads of this pipeline
  // NCCL over this rank's tensor-parallel group (a group given and NCCL carrying device
  // buffers); null otherwise: the stages reduce host copies over the MPI group.
  std::unique_ptr<comm::Communicator> tensor;
  // What carries device buffers: "nccl", "mpi host staging", or "" for CPU stages.
  std::string device_backend;
};

// Whether ranks of a group share CUDA devices, and whether NCCL takes them.
struct DeviceSharing {
  bool shared = false;      // two ranks on one host use the same device index
  bool over_nccl = true;    // device buffers go over NCCL (false: MPI host staging)
  std::string why_not_nccl; // rank 0's reason when !over_nccl
};

// Collective over `group` (host names and device indices are gathered, and every rank's
// comm::SharedGpuOverNccl under `mode` agreed on): every rank gets the same answer. An error
// where `mode` is kNccl and a rank's NCCL cannot share a GPU (on every rank).
absl::StatusOr<DeviceSharing> SharingOfDevices(comm::Communicator& group, int device_index,
                                               comm::SharedGpuMode mode);

// An NCCL communicator over the ranks of `group` (an MPI group) on CUDA device `device_index`,
// or null where they share a GPU and NCCL cannot take them (the caller keeps `group`).
// `options` give the timeout of every wait and the shared-GPU mode. Collective over `group`.
absl::StatusOr<std::unique_ptr<comm::Communicator>> NcclGroupIfPossible(
    comm::Communicator& group, int device_index, const comm::CommOptions& options);

// Collective over `control`. `pipeline` is this rank's pipeline group on MPI and
// `tensor_group` its tensor-parallel group on MPI (null without tensor parallelism; every
// rank passes one or none); every wait of the communicators made gets `timeout`.
absl::StatusOr<DeviceLinks> ConnectDevices(comm::Communicator& control,
                                           comm::Communicator& pipeline,
                                           comm::Communicator* tensor_group,
                                           const MeshLayout& layout, absl::Duration timeout,
                                           const std::vector<StageDevice*>& stages);

}  // namespace tandem::runtime
