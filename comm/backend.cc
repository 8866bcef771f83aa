#include "comm/backend.h"

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/status.h"
#include "comm/buffer.h"
#include "comm/host_staged.h"

#if TANDEM_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#endif
#if TANDEM_HAVE_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

namespace tandem::comm {
namespace {

using WorldFactory =
    absl::StatusOr<std::unique_ptr<Communicator>> (*)(const CommOptions& options);

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiWorld(const CommOptions& options) {
#if TANDEM_HAVE_MPI
  TANDEM_ASSIGN_OR_RETURN(auto world, MpiCommunicator::World(options));
  return std::unique_ptr<Communicator>(std::move(world));
#else
  return absl::UnimplementedError("mpi backend: not compiled into this build (no MPI found)");
#endif
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclWorld(const CommOptions& options) {
#if TANDEM_HAVE_NCCL && TANDEM_HAVE_MPI
  TANDEM_ASSIGN_OR_RETURN(auto bootstrap, MpiCommunicator::World(options));
  return CreateNcclCommunicator(*bootstrap, options);
#else
  return absl::UnimplementedError(
      "nccl backend: not compiled into this build (needs the CUDA toolkit with NCCL, and MPI "
      "to bootstrap it)");
#endif
}

struct BackendEntry {
  BackendKind kind;
  const char* name;
  bool compiled;
  WorldFactory create_world;
};

constexpr BackendEntry kBackends[] = {
    {BackendKind::kMpi, "mpi", TANDEM_HAVE_MPI != 0, &CreateMpiWorld},
    {BackendKind::kNccl, "nccl", TANDEM_HAVE_NCCL != 0 && TANDEM_HAVE_MPI != 0, &CreateNcclWorld},
};

const BackendEntry& Entry(BackendKind kind) {
  for (const BackendEntry& entry : kBackends) {
    if (entry.kind == kind) return entry;
  }
  return kBackends[0];
}

}  // namespace

const char* BackendName(BackendKind kind) { return Entry(kind).name; }

absl::StatusOr<BackendKind> ParseBackendKind(absl::string_view name) {
  std::string known;
  for (const BackendEntry& entry : kBackends) {
    if (name == entry.name) return entry.kind;
    absl::StrAppend(&known, known.empty() ? "" : ", ", entry.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown communication backend '", name, "' (known: ", known, ")"));
}

bool BackendCompiled(BackendKind kind) { return Entry(kind).compiled; }

std::string NcclVersionName(int version) {
  if (version <= 0) return "none";
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z before 2.9, X*10000 + Y*100 + Z since.
  if (version < 20900) {
    return absl::StrCat(version / 1000, ".", version % 1000 / 100, ".", version % 100);
  }
  return absl::StrCat(version / 10000, ".", version % 10000 / 100, ".", version % 100);
}

absl::StatusOr<bool> SharedGpuOverNccl(SharedGpuMode mode, int nccl_version, std::string* why) {
  std::string reason;
  if (mode == SharedGpuMode::kMpi) {
    reason = "TANDEM_COMM_SHARED_GPU=mpi";
  } else if (nccl_version <= 0) {
    reason = "no NCCL in this build";
  } else if (nccl_version < kNcclMultiRankGpuVersion) {
    reason = absl::StrCat("NCCL ", NcclVersionName(nccl_version),
                          " is loaded; its multi-rank mode needs NCCL >= 2.30");
  } else {
    return true;
  }
  if (mode == SharedGpuMode::kNccl) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TANDEM_COMM_SHARED_GPU=nccl, but ", reason,
        " (put a newer libnccl.so.2 first, e.g. LD_LIBRARY_PATH or LD_PRELOAD, or unset the "
        "variable for MPI host staging)"));
  }
  if (why != nullptr) *why = reason;
  return false;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateWorldCommunicator(
    BackendKind kind, const CommOptions& options) {
  return Entry(kind).create_world(options);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateWorldCommunicator(BackendKind kind) {
  TANDEM_ASSIGN_OR_RETURN(CommOptions options, CommOptions::FromEnvironment());
  return CreateWorldCommunicator(kind, options);
}

#if !TANDEM_HAVE_NCCL
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator&,
                                                                     const CommOptions&) {
  return absl::UnimplementedError(
      "nccl backend: not compiled into this build (no CUDA toolkit with NCCL found)");
}

int NcclRuntimeVersion() { return 0; }

int CudaDeviceCount(std::string* why) {
  if (why != nullptr) *why = "this build has no CUDA support";
  return 0;
}

std::string CudaDeviceName(int) { return ""; }
#endif

absl::Status WaitOnStream(const WorkPtr& work, void* cuda_stream) {
#if TANDEM_HAVE_NCCL
  return NcclCommunicator::OrderAfter(work, cuda_stream);
#else
  (void)cuda_stream;
  return work->Wait();
#endif
}

bool NcclCanRun(Communicator& group, SharedGpuMode mode, std::string* why) {
  std::string reason;
  const int devices = CudaDeviceCount(&reason);
  std::string why_not_shared;
  const absl::StatusOr<bool> sharing =
      SharedGpuOverNccl(mode, NcclRuntimeVersion(), &why_not_shared);
  if (!sharing.ok()) why_not_shared = std::string(sharing.status().message());
  const bool can_share = sharing.value_or(false);
  int64_t usable = devices > 0 && (devices >= group.size() || can_share) ? 1 : 0;
  if (devices > 0 && usable == 0) {
    reason = absl::StrCat(group.size(), " ranks, ", devices,
                          " GPU(s): ranks share a GPU and NCCL cannot take them: ",
                          why_not_shared);
  } else if (devices == 0) {
    reason = absl::StrCat("no CUDA device: ", reason);
  }
  const absl::Status agreed =
      group.AllReduce(MakeBuffer(&usable, 1, DataType::kInt64), ReduceOp::kMin)->Wait();
  if (!agreed.ok()) reason = absl::StrCat("agreeing on NCCL: ", agreed.message());
  if (agreed.ok() && usable != 0) return true;
  if (why != nullptr) *why = reason.empty() ? "another rank cannot run NCCL" : reason;
  return false;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateHostStagedCommunicator(
    std::unique_ptr<Communicator> inner) {
#if TANDEM_HAVE_NCCL
  return NewHostStagedCommunicator(std::move(inner), NewCudaCopier());
#else
  return absl::UnimplementedError(
      "host-staged CUDA communication: not compiled into this build (no CUDA toolkit found)");
#endif
}

}  // namespace tandem::comm
