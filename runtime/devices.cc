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

absl::StatusOr<bool> AnyDeviceShared(comm::Communicator& world, int device_index) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string mine = absl::StrCat(host, "/", device_index);
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> all, GatherStrings(world, mine));
  // Rank 0 decides and broadcasts.
  double shared = 0;
  if (world.rank() == 0) {
    std::vector<std::string> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    shared = std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ? 1 : 0;
  }
  TANDEM_RETURN_IF_ERROR(world.Broadcast(DoubleBuffer(&shared, 1), /*root=*/0)->Wait());
  return shared != 0;
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> NcclUnlessShared(comm::Communicator& group,
                                                                     int device_index,
                                                                     absl::Duration timeout) {
  TANDEM_ASSIGN_OR_RETURN(const bool shared, AnyDeviceShared(group, device_index));
  if (shared) return nullptr;
  comm::CommOptions options;
  options.timeout = timeout;
  options.cuda_device = device_index;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> nccl,
                          comm::CreateNcclCommunicator(group, options));
  nccl->set_timeout(timeout);
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
  // agreements on MPI. With a GPU per rank NCCL carries the device buffers; NCCL refuses ranks
  // that share a GPU, so then MPI carries them through pinned host staging.
  const int device_index = stages.empty() ? -1 : stages[0]->stage->device().index;
  TANDEM_ASSIGN_OR_RETURN(const bool shared, AnyDeviceShared(control, device_index));
  comm::CommOptions comm_options;
  comm_options.timeout = timeout;
  comm_options.cuda_device = device_index;
  if (!shared) {
    TANDEM_ASSIGN_OR_RETURN(links.world, comm::CreateNcclCommunicator(control, comm_options));
    TANDEM_ASSIGN_OR_RETURN(ProcessGroups groups,
                            BuildProcessGroups(*links.world, layout));
    links.pipeline = std::move(groups.pipeline);
    for (StageDevice* l : stages) l->device_group = std::move(groups.gradient[l->index]);
  } else {
    if (world_rank == 0) {
      TANDEM_LOG(INFO) << "ranks share a GPU (NCCL refuses that): pipeline transfers and "
                          "gradient synchronisation go over MPI through pinned host staging";
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
    // Collective over each tensor-parallel group (every rank is in one): NCCL where its ranks
    // have a GPU each; where they share one, the stages keep the MPI group.
    TANDEM_ASSIGN_OR_RETURN(links.tensor, NcclUnlessShared(*tensor_group, device_index, timeout));
    if (links.tensor == nullptr && world_rank == 0 && tensor_group->rank() == 0) {
      TANDEM_LOG(INFO) << "tensor-parallel ranks share a GPU (NCCL refuses that): their "
                          "collectives reduce host copies over MPI";
    }
  }
  links.pipeline->set_timeout(timeout);
  for (StageDevice* l : stages) l->device_group->set_timeout(timeout);
  return links;
}

}  // namespace tandem::runtime
