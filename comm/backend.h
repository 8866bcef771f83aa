// Choosing a backend: one table (backend.cc) maps each BackendKind to its factory, so the core
// never #ifdefs on MPI or NCCL. A backend missing from this build fails with Unimplemented
// naming it ("nccl backend: not compiled into this build (no CUDA toolkit found)").
//
//   TANDEM_ASSIGN_OR_RETURN(auto world, comm::CreateWorldCommunicator(comm::BackendKind::kMpi));
//
// The NCCL world is bootstrapped over MPI (rank 0's unique id is broadcast), so both backends
// need the job to run under mpirun.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"
#include "comm/options.h"

namespace tandem::comm {

enum class BackendKind : uint8_t { kMpi, kNccl };

// "mpi", "nccl".
const char* BackendName(BackendKind kind);
// Inverse of BackendName; InvalidArgument lists the known names.
absl::StatusOr<BackendKind> ParseBackendKind(absl::string_view name);
// Whether this build contains the backend (NCCL also needs a GPU at run time).
bool BackendCompiled(BackendKind kind);

// A communicator over every process of the job. `options` default to the environment
// (CommOptions::FromEnvironment). Collective over all processes.
absl::StatusOr<std::unique_ptr<Communicator>> CreateWorldCommunicator(
    BackendKind kind, const CommOptions& options);
absl::StatusOr<std::unique_ptr<Communicator>> CreateWorldCommunicator(BackendKind kind);

// NCCL communicator over the same processes as `bootstrap` (a CPU communicator, e.g. MPI),
// with the unique id broadcast over it. One process per GPU, or several sharing one in NCCL's
// multi-rank mode (SharedGpuOverNccl under options.shared_gpu). Collective over `bootstrap`.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                                     const CommOptions& options);

// NCCL's multi-rank mode: from release 2.30 (experimental there) NCCL takes several ranks (one
// per process) on one GPU in a communicator; older releases refuse them. The NCCL communicator
// turns the mode on (NCCL_MULTI_RANK_GPU_ENABLE=1, fewer channels a rank where more than two
// share a GPU) when its ranks share a GPU and SharedGpuOverNccl allows it.
inline constexpr int kNcclMultiRankGpuVersion = 23000;  // NCCL_VERSION(2, 30, 0)

// The NCCL loaded at run time (ncclGetVersion: 23007 for 2.30.7; not the header's, since the
// library found first may be another); 0 in a build without NCCL.
int NcclRuntimeVersion();
// "2.30.7" for 23007; "none" for 0.
std::string NcclVersionName(int version);

// Whether ranks that share a GPU should exchange device buffers over NCCL (its multi-rank
// mode) rather than MPI host staging, under `mode` with NCCL `nccl_version` loaded (0: none).
// False with the reason in `why` where host staging it is; FailedPrecondition naming the
// version when `mode` is kNccl and that NCCL cannot.
absl::StatusOr<bool> SharedGpuOverNccl(SharedGpuMode mode, int nccl_version, std::string* why);

// Whether an NCCL communicator over the processes of `group` (a CPU communicator) can be made
// here: a CUDA device, and a GPU per rank or ranks sharing GPUs in NCCL's multi-rank mode
// (SharedGpuOverNccl under `mode`; GPUs counted on this host against the group's size).
// Collective over `group`: every rank gets the same answer, the reason in `why` when false.
bool NcclCanRun(Communicator& group, SharedGpuMode mode, std::string* why);

// A communicator for CUDA buffers over `inner` (a CPU communicator, e.g. MPI) through pinned
// host staging (comm/host_staged.h): for ranks that share a GPU where NCCL cannot take them
// (NCCL older than 2.30, or TANDEM_COMM_SHARED_GPU=mpi).
// Unimplemented in a build without CUDA.
absl::StatusOr<std::unique_ptr<Communicator>> CreateHostStagedCommunicator(
    std::unique_ptr<Communicator> inner);

// Makes the work queued later on `cuda_stream` (a cudaStream_t; nullptr: the legacy default
// stream) wait for `work`: on the device, without blocking the host, where the work is
// NCCL's; every other backend's work is waited for on the host (Work::Wait). An error NCCL
// reports later aborts its communicator, which fails its next operations.
absl::Status WaitOnStream(const WorkPtr& work, void* cuda_stream);

// Number of visible CUDA devices; 0 with the reason in `why` when there is none (or no CUDA
// in this build).
int CudaDeviceCount(std::string* why = nullptr);
// The name of CUDA device `index` ("NVIDIA H100 80GB HBM3"); empty without CUDA.
std::string CudaDeviceName(int index);

}  // namespace tandem::comm
