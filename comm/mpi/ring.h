// Ring reduce-scatter and all-gather over point-to-point messages (internal to the MPI
// backend).
//
// Open MPI 4.1's non-blocking reduce-scatter (libnbc) reduces on a tree and then scatters,
// which moves every byte through one rank: measured here at a third of the ring all-reduce's
// bandwidth, although a reduce-scatter moves half the data. DeAR's gradient path is a
// reduce-scatter, so the backend runs the bandwidth-optimal ring itself: in step k (0 .. n-2)
// rank r sends its partial sum of shard (r-k-1) mod n to rank r+1 and receives shard
// (r-k-2) mod n from rank r-1, which it adds to its own input (MPI_Reduce_local, so every MPI
// reduction, the 16-bit float ones included, works); after n-1 steps it holds the full sum of
// its shard r. Messages travel on the control communicator with a tag per operation, so
// several rings in flight cannot mix.
//
// All-gather: libnbc's MPI_Iallgatherv reaches a quarter to a third of the blocking
// MPI_Allgatherv's bandwidth from 32 KiB (2 ranks, shared memory). The ring moves each shard
// once per hop straight into the output: in step k rank r sends shard (r-k) mod n to rank r+1
// and receives shard (r-k-1) mod n from rank r-1.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace tandem::comm::mpi_internal {

// From this size (and at least one element per rank) reduce-scatters use the ring.
inline constexpr int64_t kRingReduceScatterMinBytes = int64_t{32} << 10;
// Tags [kRingTagBase, kRingTagBase + kRingTagRange) on the control communicator.
inline constexpr int kRingTagBase = 1 << 20;
inline constexpr int kRingTagRange = 1 << 20;

// What the reduce-scatters and all-gathers share: the group, the element type (and the
// reduction, MPI_OP_NULL for gathers) and where each rank's shard of `count` elements lies.
class ShardLayout {
 public:
  ShardLayout(MPI_Comm comm, int rank, int size, int tag, MPI_Datatype type, MPI_Op op,
              size_t element_bytes, const void* input, void* output, int64_t count);
  ShardLayout(MPI_Comm comm, int rank, int size, int tag, MPI_Datatype type,
              size_t element_bytes, const void* input, void* output, int64_t count)
      : ShardLayout(comm, rank, size, tag, type, MPI_OP_NULL, element_bytes, input, output,
                    count) {}

 protected:
  // Computed when asked (a division): no table to allocate per operation.
  ShardRange ShardOf(int rank) const { return Shard(count_, size_, rank); }
  const char* InputShard(int shard) const {
    return input_ + ShardOf(shard).offset * element_bytes_;
  }
  char* OutputShard(int shard) const { return output_ + ShardOf(shard).offset * element_bytes_; }

  MPI_Comm comm_;
  int rank_, size_, tag_;
  MPI_Datatype type_;
  MPI_Op op_;
  size_t element_bytes_;
  const char* input_;
  char* output_;
  int64_t count_;
};

// The direct algorithms below exchange with every other rank of a group of at most this many
// ranks at once; their requests live inline (no allocation per operation).
inline constexpr int kDirectMaxRanks = 8;
using DirectRequests = std::array<MPI_Request, 2 * (kDirectMaxRanks - 1)>;

// Scratch memory for received data: inline up to kInlineBytes (a small operation allocates
// nothing), else on the heap.
class Scratch {
 public:
  static constexpr size_t kInlineBytes = 256;
  explicit Scratch(size_t bytes)
      : heap_(bytes > kInlineBytes ? new char[bytes] : nullptr) {}
  char* get() { return heap_ != nullptr ? heap_.get() : inline_; }

 private:
  std::unique_ptr<char[]> heap_;
  alignas(16) char inline_[kInlineBytes];
};

class RingReduceScatter : private ShardLayout {
 public:
  // Whether it may move while its requests are pending (MpiCommunicator::IssueAlgorithm):
  // MPI writes into the output and the heap scratch only.
  static constexpr bool kMovableOncePosted = true;
  RingReduceScatter(MPI_Comm comm, int rank, int size, int tag, MPI_Datatype type, MPI_Op op,
                    size_t element_bytes, const void* input, void* output, int64_t count);
  // Posts step 0; returns an MPI error code.
  int Start();
  // Tests the current step; when it is done, reduces and posts the next. True when complete.
  absl::StatusOr<bool> Progress();

 private:
  int Post();

  // Received partial sums, alternating; only rings of three or more ranks need them (with two,
  // the one step receives straight into the output). Not zero-filled: always written first.
  std::unique_ptr<char[]> partial_[2];
  int step_ = 0;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// All-gathers over at most kDirectAllGatherMaxRanks ranks use the direct exchange below at
// every size; larger groups use the ring from kRingAllGatherMinBytes (libnbc below).
inline constexpr int64_t kRingAllGatherMinBytes = int64_t{8} << 10;
inline constexpr int kDirectAllGatherMaxRanks = kDirectMaxRanks;

// All-gather in one step: every rank sends its shard to every other rank, straight into their
// outputs. The same bytes as the ring, without its n-1 dependent steps, which on a rank that
// shares its core cost a scheduling delay each. Empty shards (fewer elements than ranks) are
// neither sent nor received; the direct reduce-scatter below skips them the same way.

class DirectAllGather : private ShardLayout {
 public:
  // Whether it may move while its requests are pending (MpiCommunicator::IssueAlgorithm):
  // MPI writes into the output only.
  static constexpr bool kMovableOncePosted = true;
  using ShardLayout::ShardLayout;
  int Start();  // MPI_ERR_COMM beyond kDirectMaxRanks ranks
  absl::StatusOr<bool> Progress();

 private:
  DirectRequests requests_;
  int num_requests_ = 0;
};

class RingAllGather : private ShardLayout {
 public:
  // Whether it may move while its requests are pending (MpiCommunicator::IssueAlgorithm):
  // MPI writes into the output only.
  static constexpr bool kMovableOncePosted = true;
  // `input` is this rank's shard (copied into `output` first unless it is already there).
  using ShardLayout::ShardLayout;
  int Start();
  absl::StatusOr<bool> Progress();

 private:
  int Post();

  int step_ = 0;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// Smaller messages: libnbc's non-blocking all-reduce and reduce-scatter take 1.5-2 us at 8 bytes
// on two ranks where one exchange of point-to-point messages takes well under 1 us. Below
// these sizes, all-reduce over a power-of-two group uses recursive doubling (log2(n) exchanges;
// every rank combines the same two partial results in each round, so all end bitwise equal)
// and reduce-scatter over a small group sends each shard straight to its owner.
// Below libnbc's ring all-reduce (kRingAllreduceMinBytes in libnbc_tuning.h).
inline constexpr int64_t kSmallAllReduceMaxBytes = int64_t{32} << 10;
inline constexpr int64_t kSmallReduceScatterMaxBytes = kRingReduceScatterMinBytes;
inline constexpr int kSmallReduceScatterMaxRanks = kDirectMaxRanks;

class RecursiveDoublingAllReduce {
 public:
  // Whether it may move while its requests are pending (MpiCommunicator::IssueAlgorithm):
  // MPI receives into received_, which may be inline.
  static constexpr bool kMovableOncePosted = false;
  // In place on `buffer`; `size` must be a power of two.
  RecursiveDoublingAllReduce(MPI_Comm comm, int rank, int size, int tag, MPI_Datatype type,
                             MPI_Op op, size_t element_bytes, void* buffer, int64_t count);
  int Start();
  absl::StatusOr<bool> Progress();

 private:
  int Post();

  MPI_Comm comm_;
  int rank_, size_, tag_;
  MPI_Datatype type_;
  MPI_Op op_;
  void* buffer_;
  int count_;
  Scratch received_;
  int distance_ = 1;  // partner: rank ^ distance
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// Broadcast of a small message over a small group, down a binary tree of the ranks counted from the
// root (virtual rank v = (rank - root) mod size; v's children are 2v+1 and 2v+2): one eager message
// per edge. With three ranks or fewer the root sends to every rank itself; from four, no rank sends
// more than two messages, as in Open MPI's blocking MPI_Bcast for 4-15 ranks below 64 bytes (a
// binary tree; binomial trees or the root alone at some larger sizes). Sending to every rank from
// the root made the root's three sends on four ranks the bottleneck of back-to-back broadcasts:
// 1.09 us against MPI's 0.72 on 16 cores, the ratio of their send counts. libnbc's MPI_Ibcast takes
// 1-1.5 us at 8 bytes on two ranks where the blocking call takes a third of that.
// BinaryTreeBroadcast is the side of the root and of every rank with children; a leaf posts one
// receive from its parent with the same tag, a plain request (MpiCommunicator::Broadcast).
inline constexpr int64_t kSmallBroadcastMaxBytes = int64_t{32} << 10;
inline constexpr int kSmallBroadcastMaxRanks = 8;

// The tree's shape, in ranks of the group.
struct BroadcastTree {
  BroadcastTree(int rank, int size, int root);
  int parent = -1;        // -1 at the root
  int children[2] = {-1, -1};
  int num_children = 0;
};

class BinaryTreeBroadcast {
 public:
  // Whether it may move while its requests are pending (MpiCommunicator::IssueAlgorithm):
  // MPI reads and writes the caller's buffer only.
  static constexpr bool kMovableOncePosted = true;
  BinaryTreeBroadcast(MPI_Comm comm, int rank, int size, int tag, MPI_Datatype type, int root,
                      void* buffer, int64_t count)
      : comm_(comm), tag_(tag), type_(type), tree_(rank, size, root), buffer_(buffer),
        count_(static_cast<int>(count)) {}
  // The root posts its sends; any other rank its receive from its parent.
  int Start();
  // Below the root: once the parent's message is in, forwards it to the children.
  absl::StatusOr<bool> Progress();

 private:
  int PostSends();

  MPI_Comm comm_;
  int tag_;
  MPI_Datatype type_;
  BroadcastTree tree_;
  void* buffer_;
  int count_;
  bool received_ = false;  // the parent's message is in (always, at the root)
  MPI_Request receive_ = MPI_REQUEST_NULL;
  MPI_Request sends_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

class DirectReduceScatter : private ShardLayout {
 public:
  // Whether it may move while its requests are pending (MpiCommunicator::IssueAlgorithm):
  // MPI receives into received_, which may be inline.
  static constexpr bool kMovableOncePosted = false;
  DirectReduceScatter(MPI_Comm comm, int rank, int size, int tag, MPI_Datatype type, MPI_Op op,
                      size_t element_bytes, const void* input, void* output, int64_t count);
  int Start();  // MPI_ERR_COMM beyond kDirectMaxRanks ranks
  absl::StatusOr<bool> Progress();

 private:
  Scratch received_;  // (size - 1) shards of this rank, one per peer
  DirectRequests requests_;
  int num_requests_ = 0;
};

}  // namespace tandem::comm::mpi_internal
