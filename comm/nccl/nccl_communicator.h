// The NCCL backend: a Communicator over NCCL for CUDA buffers, one process per rank.
//
//   * Creation: rank 0's ncclUniqueId is broadcast over a CPU communicator (MPI), then every
//     rank initialises a non-blocking communicator (ncclConfig_t.blocking = 0) and polls it
//     until ready, within the communicator's timeout.
//   * Ranks that share a GPU (same host, same PCI bus id): NCCL >= 2.30 takes them in its
//     multi-rank mode, which Create turns on (NCCL_MULTI_RANK_GPU_ENABLE=1; a channel cap of 2
//     a rank for 3-4 ranks on a GPU, 1 beyond, inherited by splits and shrinks) where every
//     rank's SharedGpuOverNccl allows it (comm/backend.h); otherwise Create fails naming the
//     two ranks and why (older NCCL, or TANDEM_COMM_SHARED_GPU=mpi).
//   * Streams: each communicator owns one communication stream. Before an operation it waits
//     (cudaStreamWaitEvent) for an event recorded on the caller's stream (set_caller_stream;
//     default the legacy default stream), so the operation sees the caller's writes; after it
//     an event is recorded, which Work::Wait polls from the host and OrderAfter makes another
//     stream wait for without blocking the host.
//   * Point to point: SendRecvBatch posts a group (ncclGroupStart/End) so paired sends and
//     receives of a pipeline cannot deadlock. NCCL has no tags: tag must be 0. After
//     ConnectPeers, transfers with the listed peers go on a communicator and stream per
//     ordered pair (a group per pair), so that a send never holds up this rank's receives.
//   * ReduceScatter/AllGather with shards of unequal size (count not divisible by the group
//     size) go through padded staging buffers; divisible counts run directly.
//   * Errors: a watchdog thread polls ncclCommGetAsyncError and aborts the communicator on an
//     error (pending and later operations fail with its message); it also logs operations
//     pending longer than the timeout. Abort revokes the communicator (ncclCommRevoke, NCCL
//     >= 2.28) so that Shrink (ncclCommShrink, NCCL >= 2.27) can still build the survivors'
//     communicator; older NCCL aborts it, and Shrink returns Unimplemented.
//   * Mismatch checks (CommOptions::verify_collectives) run on a CPU companion communicator
//     over the same ranks before each collective is enqueued.
//
// Threading: as comm/communicator.h. Buffers must be on this communicator's device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/backend.h"
#include "comm/communicator.h"
#include "comm/options.h"

namespace tandem::comm {

class NcclCommunicator : public Communicator {
 public:
  // Collective over `bootstrap` (a CPU communicator over the same processes, e.g. MPI's
  // world). The communicator keeps its own companion split from `bootstrap`.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(Communicator& bootstrap,
                                                                  const CommOptions& options);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "nccl"; }
  const std::vector<int>& world_ranks() const override;

  WorkPtr Send(const Buffer& buffer, int peer, int tag = 0) override;
  WorkPtr Recv(const Buffer& buffer, int peer, int tag = 0) override;
  WorkPtr SendRecvBatch(const std::vector<PointToPoint>& transfers) override;
  // A two-rank communicator and stream per ordered pair with each peer (comm/communicator.h);
  // later transfers with those peers go on them. Once per communicator; not inherited by
  // Split or Shrink.
  absl::Status ConnectPeers(const std::vector<int>& peers) override;
  WorkPtr AllReduce(const Buffer& buffer, ReduceOp op = ReduceOp::kSum) override;
  WorkPtr ReduceScatter(const Buffer& input, const Buffer& output,
                        ReduceOp op = ReduceOp::kSum) override;
  WorkPtr AllGather(const Buffer& input, const Buffer& output) override;
  WorkPtr Broadcast(const Buffer& buffer, int root) override;
  WorkPtr Barrier() override;

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(
      const std::vector<int>& dead_ranks) override;
  absl::StatusOr<std::vector<int>> DetectDeadRanks(absl::Duration timeout) override;
  void Abort(const absl::Status& reason) override;

  void set_timeout(absl::Duration timeout) override;
  absl::Duration timeout() const override;

  int device() const;
  // The stream whose work operations are ordered after (a cudaStream_t; nullptr: the legacy
  // default stream).
  void set_caller_stream(void* cuda_stream);
  // The communication stream (a cudaStream_t).
  void* stream() const;
  // Makes `cuda_stream` (nullptr: the legacy default stream of the communicator's device)
  // wait, on the device, not the host, until `work` is done. A `work` that is not NCCL's (one
  // that failed before it was enqueued) is waited for on the host.
  static absl::Status OrderAfter(const WorkPtr& work, void* cuda_stream);

  struct State;  // internal

 private:
  explicit NcclCommunicator(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace tandem::comm
