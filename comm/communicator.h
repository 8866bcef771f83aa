// Communicator and Work: every byte between ranks goes through this interface.
// Backends: MPI for CPU buffers (comm/mpi/), NCCL for CUDA buffers (comm/nccl/), chosen by
// CreateCommunicator (comm/backend.h).
//
// Call-order contract
//   * Collectives (AllReduce, ReduceScatter, AllGather, Broadcast, Barrier, Split, Shrink)
//     must be called in the same order on every rank of the group, with matching counts and
//     types. Where a backend can detect a mismatch it returns InvalidArgument.
//   * Point-to-point messages between a pair of ranks are matched in the order they were
//     posted (FIFO per direction and tag); NCCL has no tags, so tag must be 0 there.
//   * Buffers must stay valid and untouched until the returned Work completes.
//   * Operations may be issued from one thread at a time per communicator; Work handles may be
//     waited on from any thread.
//
// Errors: a Work that times out returns DeadlineExceeded naming the operation, the peer(s) and
// its sequence number ("all_reduce #12 (group of 4) timed out after 30s"). When a peer dies,
// operations fail (Unavailable or Aborted) within the communicator's timeout; after Abort()
// every call returns FailedPrecondition ("communicator aborted: ...") instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::comm {

enum class DataType : uint8_t {
  kFloat32, kFloat64, kBFloat16, kFloat16, kInt8, kUInt8, kInt32, kInt64,
};
size_t SizeOf(DataType type);
const char* DataTypeName(DataType type);

enum class DeviceKind : uint8_t { kCpu, kCuda };
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  // CUDA device index
  static Device Cpu() { return {}; }
  static Device Cuda(int index) { return {DeviceKind::kCuda, index}; }
  bool operator==(const Device& o) const {
    return kind == o.kind && (kind == DeviceKind::kCpu || index == o.index);
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Memory described without LibTorch.
struct Buffer {
  void* data = nullptr;
  int64_t count = 0;  // elements
  DataType dtype = DataType::kFloat32;
  Device device;
  size_t bytes() const { return static_cast<size_t>(count) * SizeOf(dtype); }
};

enum class ReduceOp : uint8_t { kSum, kAverage, kMax, kMin };

// Balanced shard of `count` elements over `size` ranks: the first count % size ranks get one
// more element. Used by ReduceScatter/AllGather and DeAR.
struct ShardRange {
  int64_t offset = 0;
  int64_t count = 0;
};
ShardRange Shard(int64_t count, int size, int rank);

// Handle of an asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // True once the operation finished, successfully or not. Never blocks.
  virtual bool Test() = 0;
  // Waits up to `timeout` (absl::InfiniteDuration() is refused for safety: callers pass the
  // communicator's default via Wait()). Returns the operation's status, or DeadlineExceeded.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Waits with the communicator's default timeout.
  virtual absl::Status Wait() = 0;
  // The error if the operation failed; OK while pending or after success.
  virtual absl::Status error() = 0;
  // "send #3 to rank 2 (1024 x float32)".
  virtual std::string Describe() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// One transfer of a batch (Communicator::SendRecvBatch).
struct PointToPoint {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind = Kind::kSend;
  Buffer buffer;
  int peer = 0;
  int tag = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl"
  // Ranks of this group in the world communicator it was split from.
  virtual const std::vector<int>& world_ranks() const = 0;

  virtual WorkPtr Send(const Buffer& buffer, int peer, int tag = 0) = 0;
  virtual WorkPtr Recv(const Buffer& buffer, int peer, int tag = 0) = 0;
  // In place.
  virtual WorkPtr AllReduce(const Buffer& buffer, ReduceOp op = ReduceOp::kSum) = 0;
  // `input` holds the full vector (count N) on every rank; `output` receives this rank's
  // reduced shard, Shard(N, size(), rank()) (its count must equal that shard's).
  virtual WorkPtr ReduceScatter(const Buffer& input, const Buffer& output,
                                ReduceOp op = ReduceOp::kSum) = 0;
  // `input` is this rank's shard, Shard(N, size(), rank()); `output` (count N) receives all.
  virtual WorkPtr AllGather(const Buffer& input, const Buffer& output) = 0;
  virtual WorkPtr Broadcast(const Buffer& buffer, int root) = 0;
  virtual WorkPtr Barrier() = 0;
  // Posts several sends and receives together, with one Work for all of them. NCCL groups
  // them (ncclGroupStart/End) so that paired sends and receives of a pipeline cannot
  // deadlock; the default posts each one (MPI's non-blocking transfers cannot deadlock).
  virtual WorkPtr SendRecvBatch(const std::vector<PointToPoint>& transfers);
  // Declares the ranks this rank exchanges point-to-point transfers with, before the first of
  // them. Collective over this communicator: every rank lists its own peers (a pair listed by
  // either side counts). NCCL gives each ordered pair (this rank to a peer, a peer to this
  // rank) a communicator and stream of its own, so that a send waits only for its own receive,
  // as MPI's buffered sends do: an NCCL group holds its stream until every call in it
  // completes, so on one communicator two ranks that each send to the other before receiving
  // deadlock (Chimera's two pipelines in opposite directions do). The default does nothing.
  virtual absl::Status ConnectPeers(const std::vector<int>& peers) { return absl::OkStatus(); }

  // Ranks with the same colour form a group, ordered by key (then by rank). colour < 0:
  // returns nullptr for this rank (not a member). Collective over this communicator.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;
  // A new communicator of the surviving ranks (all but `dead_ranks`, given as ranks of this
  // communicator), built without the participation of the dead. Called by every survivor.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Shrink(
      const std::vector<int>& dead_ranks) = 0;
  // Growing a running job: starts `count` processes running `argv` (argv[0] the program) and
  // returns a communicator of this one's ranks (same order) followed by theirs, once they
  // joined. Collective over this communicator. Backends that cannot start processes return
  // Unimplemented naming the backend (the MPI backend can: MPI_Comm_spawn).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> SpawnAndMerge(
      const std::vector<std::string>& argv, int count) {
    (void)argv;
    (void)count;
    return absl::UnimplementedError("starting processes is not supported by the " + backend() +
                                    " backend");
  }
  // Fails all pending and future operations with FailedPrecondition naming `reason`. An
  // aborted communicator keeps its transport resources until the process ends (peers may
  // still send to it): abort one that peers may still use before dropping it.
  virtual void Abort(const absl::Status& reason) = 0;
  // After a failure: the ranks of this communicator that did not answer a liveness probe
  // within `timeout`, agreed among the survivors (every survivor calls it; the result is the
  // union of what each survivor saw). Pass it to Shrink. Backends without failure detection
  // return Unimplemented naming the backend.
  virtual absl::StatusOr<std::vector<int>> DetectDeadRanks(absl::Duration timeout) {
    return absl::UnimplementedError("DetectDeadRanks is not supported by the " + backend() +
                                    " backend");
  }

  // Default timeout of Work::Wait().
  virtual void set_timeout(absl::Duration timeout) = 0;
  virtual absl::Duration timeout() const = 0;

  // While the returned handle lives, the backend keeps its transport progressing in the
  // background even when no operation of this rank is pending (MPI: the progress engine's
  // thread polls MPI, so that protocol steps of transfers in flight between this rank and its
  // peers go on while this rank computes). For jobs that overlap communication with
  // computation, such as the pipeline runtime; it costs a few percent of a core. Without one,
  // the MPI engine's thread idles whenever nothing is pending and leaves a waiting thread the
  // core to itself. Default: nothing to keep (nullptr).
  virtual std::shared_ptr<void> KeepProgressing() { return nullptr; }
};

}  // namespace tandem::comm
