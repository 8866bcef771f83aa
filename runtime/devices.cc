#include "runtime/devices.h"

#include <algorithm>
#include <string>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "common/logging.h"
#include "common/status.h"
#include "runtime/control.h"

namespace tandem::runtime {

absl::StatusOr<DeviceSharing> SharingOfDevices(comm::Communicator& group, int device_index,
                                               comm::SharedGpuMode mode) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string mine = absl::StrCat(host, "/", device_index);
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> all, GatherStrings(group, mine));
  // Each rank asks its own NCCL (the library loaded may differ between hosts).
  DeviceSharing sharing;
  const absl::StatusOr<bool> local =
      comm::SharedGpuOverNccl(mode, comm::NcclRuntimeVersion(), &sharing.why_not_nccl);
  // Rank 0 decides whether a device is shared; every rank's verdict on NCCL is agreed on.
  double flags[3] = {0, local.ok() && *local ? 0.0 : 1.0, local.ok() ? 0.0 : 1.0};
  if (group.rank() == 0) {
    std::vector<std::string> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    flags[0] = std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ? 1 : 0;
  }
  TANDEM_RETURN_IF_ERROR(group.Broadcast(DoubleBuffer(flags, 1), /*root=*/0)->Wait());
  TANDEM_RETURN_IF_ERROR(
      group.AllReduce(DoubleBuffer(flags + 1, 2), comm::ReduceOp::kMax)->Wait());
  sharing.shared = flags[0] != 0;
  if (!sharing.shared) {
    sharing.why_not_nccl.clear();
    return sharing;
  }
  if (flags[2] != 0) {
    return local.ok() ? absl::FailedPreconditionError(
                            "ranks share a GPU and another rank's NCCL cannot take them "
                            "(TANDEM_COMM_SHARED_GPU=nccl)")
                      : local.status();
  }
  sharing.over_nccl = flags[1] == 0;
  if (sharing.over_nccl) sharing.why_not_nccl.clear();
  return sharing;
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> NcclGroupIfPossible(
    comm::Communicator& group, int device_index, const comm::CommOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(const DeviceSharing sharing,
                          SharingOfDevices(group, device_index, options.shared_gpu));
  if (!sharing.over_nccl) return nullptr;
  comm::CommOptions nccl_options = options;
  nccl_options.cuda_device = device_index;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> nccl,
                          comm::CreateNcclCommunicator(group, nccl_options));
  nccl->set_timeout(options.timeout);
  return nccl;
}

absl::StatusOr<DeviceLinks> ConnectDevices(comm::Communicator& control,
                                           comm::Communicator& pipeline,
                                           comm::Communicator* tensor_group,
                                           const MeshLayout& layout, absl::Duration timeout,
                                           const std::vector<StageDevice*>& stages) {
  const int world_rank = control.rank();
  // Whether this rank's stages live on a CUDA device; every rank must agree.
  int cuda_stages = 0;
  for (StageDevice* l : stages) {
    if (l->stage->device().kind == comm::DeviceKind::kCuda) ++cuda_stages;
  }
  double flags[2] = {cuda_stages > 0 ? 1.0 : 0.0, cuda_stages > 0 ? 0.0 : 1.0};
  TANDEM_RETURN_IF_ERROR(
      control.AllReduce(DoubleBuffer(flags, 2), comm::ReduceOp::kMax)->Wait());
  const bool any_cuda = flags[0] > 0;
  const bool any_cpu = flags[1] > 0;
  absl::Status local = absl::OkStatus();
  if (cuda_stages > 0 && cuda_stages != static_cast<int>(stages.size())) {
    local = absl::InvalidArgumentError(absl::StrCat(
        "rank ", world_rank, " holds stages on both the CPU and a CUDA device"));
  } else if (any_cuda && any_cpu) {
    local = absl::InvalidArgumentError(
        "some ranks run their stages on CUDA devices and others on the CPU; the runtime needs "
        "one kind of device for the whole job");
  }
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(&control, local, "checking stage devices"));
  local = [&]() -> absl::Status {
    for (StageDevice* l : stages) {
      l->parameters = l->stage->Parameters();
      l->ops = l->stage->device_ops();
      if (l->ops == nullptr) {
        if (l->stage->device().kind != comm::DeviceKind::kCpu) {
          return absl::InvalidArgumentError(absl::StrCat(
              "stage ", l->index, " is on a CUDA device but brings no device operations "
              "(Stage::device_ops)"));
        }
        l->ops = &DefaultCpuDeviceOps();
      }
      if (l->ops->device() != l->stage->device()) {
        return absl::InvalidArgumentError(absl::StrCat("stage ", l->index,
                                                       ": its device operations (", l->ops->name(),
                                                       ") are for another device"));
      }
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(
      &control, Annotate(local, absl::StrCat("rank ", world_rank)), "preparing devices"));
  DeviceLinks links;
  if (!any_cuda) return links;

  // CUDA stages: payloads and gradient synchronisation on device buffers, headers and
  // agreements on MPI. NCCL carries the device buffers, with a GPU per rank or with ranks that
  // share one in its multi-rank mode; where it cannot, MPI through pinned host staging.
  const int device_index = stages.empty() ? -1 : stages[0]->stage->device().index;
  absl::StatusOr<comm::CommOptions> environment = comm::CommOptions::FromEnvironment();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(&control, environment.status(), "reading TANDEM_COMM_*"));
  comm::CommOptions comm_options = *environment;
  comm_options.timeout = timeout;
  comm_options.cuda_device = device_index;
  TANDEM_ASSIGN_OR_RETURN(const DeviceSharing sharing,
                          SharingOfDevices(control, device_index, comm_options.shared_gpu));
  links.device_backend = sharing.over_nccl ? "nccl" : "mpi host staging";
  if (sharing.over_nccl) {
    TANDEM_ASSIGN_OR_RETURN(links.world, comm::CreateNcclCommunicator(control, comm_options));
    TANDEM_ASSIGN_OR_RETURN(ProcessGroups groups,
                            BuildProcessGroups(*links.world, layout));
    links.pipeline = std::move(groups.pipeline);
    for (StageDevice* l : stages) l->device_group = std::move(groups.gradient[l->index]);
  } else {
    if (world_rank == 0) {
      TANDEM_LOG(INFO) << "ranks share a GPU and NCCL cannot take them ("
                       << sharing.why_not_nccl << "): pipeline transfers and gradient "
                          "synchronisation go over MPI through pinned host staging";
    }
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> p2p_copy,
                            pipeline.Split(/*color=*/0, /*key=*/pipeline.rank()));
    TANDEM_ASSIGN_OR_RETURN(links.pipeline,
                            comm::CreateHostStagedCommunicator(std::move(p2p_copy)));
    for (StageDevice* l : stages) {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> group_copy,
                              l->group->Split(/*color=*/0, /*key=*/l->group->rank()));
      TANDEM_ASSIGN_OR_RETURN(l->device_group,
                              comm::CreateHostStagedCommunicator(std::move(group_copy)));
    }
  }
  if (tensor_group != nullptr && tensor_group->size() > 1) {
    // Collective over each tensor-parallel group (every rank is in one): NCCL where it carries
    // the device buffers; otherwise the stages keep the MPI group.
    if (sharing.over_nccl) {
      TANDEM_ASSIGN_OR_RETURN(links.tensor,
                              NcclGroupIfPossible(*tensor_group, device_index, comm_options));
    }
    if (links.tensor == nullptr && world_rank == 0 && tensor_group->rank() == 0) {
      TANDEM_LOG(INFO) << "tensor-parallel ranks share a GPU and NCCL cannot take them: their "
                          "collectives reduce host copies over MPI";
    }
  }
  links.pipeline->set_timeout(timeout);
  for (StageDevice* l : stages) l->device_group->set_timeout(timeout);
  return links;
}

}  // namespace tandem::runtime
