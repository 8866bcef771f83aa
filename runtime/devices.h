// The device layer of the engine: which device operations each local stage uses and, for
// stages on CUDA devices, the communicators that carry device buffers.
//
// Every rank must run its stages on one kind of device, the same kind on every rank. CPU
// stages use their own DeviceOps or the CPU loops, and MPI for everything. CUDA stages bring
// their DeviceOps (Stage::device_ops); payloads of transfers and gradient synchronisation go
// over NCCL with a GPU per rank, or, where ranks share a GPU (which NCCL refuses), over MPI
// through pinned host staging (comm/host_staged.h), with one notice line on rank 0. Shape
// headers and agreements stay on MPI. With a GPU per rank the tensor-parallel group gets an
// NCCL communicator too (its collectives then run on NCCL's stream, ordered with the compute
// stream by events).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
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
  // NCCL over this rank's tensor-parallel group (a GPU per rank and a group given); null
  // otherwise: ranks that share a GPU keep the MPI group (the stages reduce host copies).
  std::unique_ptr<comm::Communicator> tensor;
};

// Whether two ranks of `group` on one host use the same CUDA device `device_index` (NCCL
// refuses that). Collective over `group` (host names and device indices are gathered).
absl::StatusOr<bool> AnyDeviceShared(comm::Communicator& group, int device_index);

// An NCCL communicator over the ranks of `group` (an MPI group) on CUDA device `device_index`,
// or null where two of them share a GPU (NCCL refuses that; the caller keeps `group`). Every
// wait gets `timeout`. Collective over `group`.
absl::StatusOr<std::unique_ptr<comm::Communicator>> NcclUnlessShared(comm::Communicator& group,
                                                                     int device_index,
                                                                     absl::Duration timeout);

// Collective over `control`. `pipeline` is this rank's pipeline group on MPI and
// `tensor_group` its tensor-parallel group on MPI (null without tensor parallelism; every
// rank passes one or none); every wait of the communicators made gets `timeout`.
absl::StatusOr<DeviceLinks> ConnectDevices(comm::Communicator& control,
                                           comm::Communicator& pipeline,
                                           comm::Communicator* tensor_group,
                                           const MeshLayout& layout, absl::Duration timeout,
                                           const std::vector<StageDevice*>& stages);

}  // namespace tandem::runtime
