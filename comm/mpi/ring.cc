#include "comm/mpi/ring.h"

#include <algorithm>
#include <cstring>

#include "comm/check.h"

namespace tandem::comm::mpi_internal {

ShardLayout::ShardLayout(MPI_Comm comm, int rank, int size, int tag, MPI_Datatype type,
                         MPI_Op op, size_t element_bytes, const void* input, void* output,
                         int64_t count)
    : comm_(comm),
      rank_(rank),
      size_(size),
      tag_(tag),
      type_(type),
      op_(op),
      element_bytes_(element_bytes),
      input_(static_cast<const char*>(input)),
      output_(static_cast<char*>(output)),
      count_(count) {}

RingReduceScatter::RingReduceScatter(MPI_Comm comm, int rank, int size, int tag,
                                     MPI_Datatype type, MPI_Op op, size_t element_bytes,
                                     const void* input, void* output, int64_t count)
    : ShardLayout(comm, rank, size, tag, type, op, element_bytes, input, output, count) {
  int64_t largest = 0;
  for (int r = 0; r < size_; ++r) largest = std::max(largest, ShardOf(r).count);
  if (size_ > 2) {
    for (auto& buffer : partial_) buffer.reset(new char[largest * element_bytes_]);
  }
}

int RingReduceScatter::Start() { return Post(); }

int RingReduceScatter::Post() {
  const int next = (rank_ + 1) % size_;
  const int previous = (rank_ + size_ - 1) % size_;
  const int send_shard = ((rank_ - step_ - 1) % size_ + size_) % size_;
  const int receive_shard = ((rank_ - step_ - 2) % size_ + size_) % size_;
  const bool last = step_ == size_ - 2;
  // Step 0 sends the input itself; later steps the partial sum received in the step before.
  const void* send = step_ == 0 ? InputShard(send_shard) : partial_[(step_ - 1) % 2].get();
  void* receive = last ? output_ : partial_[step_ % 2].get();
  int rc = MPI_Irecv(receive, static_cast<int>(ShardOf(receive_shard).count), type_, previous,
                     tag_, comm_, &requests_[0]);
  if (rc != MPI_SUCCESS) return rc;
  return MPI_Isend(send, static_cast<int>(ShardOf(send_shard).count), type_, next, tag_, comm_,
                   &requests_[1]);
}

absl::StatusOr<bool> RingReduceScatter::Progress() {
  int done = 0;
  TANDEM_MPI_CHECK(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE));
  if (!done) return false;
  const int receive_shard = ((rank_ - step_ - 2) % size_ + size_) % size_;
  const bool last = step_ == size_ - 2;
  void* received = last ? output_ : partial_[step_ % 2].get();
  const int count = static_cast<int>(ShardOf(receive_shard).count);
  if (count > 0) {
    TANDEM_MPI_CHECK(MPI_Reduce_local(InputShard(receive_shard), received, count, type_, op_));
  }
  if (last) return true;
  ++step_;
  const int rc = Post();
  if (rc != MPI_SUCCESS) return TANDEM_MPI_STATUS(rc);
  return false;
}

int RingAllGather::Start() {
  // Step 0 sends the input itself; this rank's own copy into the output overlaps with it.
  const int rc = Post();
  const ShardRange mine = ShardOf(rank_);
  if (rc == MPI_SUCCESS && mine.count > 0 && input_ != OutputShard(rank_)) {
    std::memcpy(OutputShard(rank_), input_, mine.count * element_bytes_);
  }
  return rc;
}

int RingAllGather::Post() {
  const int next = (rank_ + 1) % size_;
  const int previous = (rank_ + size_ - 1) % size_;
  const int send_shard = ((rank_ - step_) % size_ + size_) % size_;
  const int receive_shard = ((rank_ - step_ - 1) % size_ + size_) % size_;
  int rc = MPI_Irecv(OutputShard(receive_shard), static_cast<int>(ShardOf(receive_shard).count),
                     type_, previous, tag_, comm_, &requests_[0]);
  if (rc != MPI_SUCCESS) return rc;
  const char* send = step_ == 0 ? input_ : OutputShard(send_shard);
  return MPI_Isend(send, static_cast<int>(ShardOf(send_shard).count), type_, next, tag_, comm_,
                   &requests_[1]);
}

absl::StatusOr<bool> RingAllGather::Progress() {
  int done = 0;
  TANDEM_MPI_CHECK(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE));
  if (!done) return false;
  if (step_ == size_ - 2) return true;
  ++step_;
  const int rc = Post();
  if (rc != MPI_SUCCESS) return TANDEM_MPI_STATUS(rc);
  return false;
}

int DirectAllGather::Start() {
  if (size_ > kDirectMaxRanks) return MPI_ERR_COMM;
  num_requests_ = 0;
  const int mine = static_cast<int>(ShardOf(rank_).count);
  // Empty shards travel nowhere (fewer elements than ranks: both sides know which are empty).
  for (int i = 1; i < size_; ++i) {
    const int from = (rank_ + size_ - i) % size_;
    const int to = (rank_ + i) % size_;
    const ShardRange theirs = ShardOf(from);
    if (theirs.count > 0) {
      const int rc = MPI_Irecv(output_ + theirs.offset * element_bytes_,
                               static_cast<int>(theirs.count), type_, from, tag_, comm_,
                               &requests_[num_requests_++]);
      if (rc != MPI_SUCCESS) return rc;
    }
    if (mine > 0) {
      const int rc =
          MPI_Isend(input_, mine, type_, to, tag_, comm_, &requests_[num_requests_++]);
      if (rc != MPI_SUCCESS) return rc;
    }
  }
  char* own = output_ + ShardOf(rank_).offset * element_bytes_;
  if (mine > 0 && input_ != own) std::memcpy(own, input_, mine * element_bytes_);
  return MPI_SUCCESS;
}

absl::StatusOr<bool> DirectAllGather::Progress() {
  int done = 0;
  TANDEM_MPI_CHECK(MPI_Testall(num_requests_, requests_.data(), &done, MPI_STATUSES_IGNORE));
  return done != 0;
}

RecursiveDoublingAllReduce::RecursiveDoublingAllReduce(MPI_Comm comm, int rank, int size,
                                                       int tag, MPI_Datatype type, MPI_Op op,
                                                       size_t element_bytes, void* buffer,
                                                       int64_t count)
    : comm_(comm),
      rank_(rank),
      size_(size),
      tag_(tag),
      type_(type),
      op_(op),
      buffer_(buffer),
      count_(static_cast<int>(count)),
      received_(static_cast<size_t>(std::max<int64_t>(count, 1)) * element_bytes) {}

int RecursiveDoublingAllReduce::Start() { return Post(); }

int RecursiveDoublingAllReduce::Post() {
  const int partner = rank_ ^ distance_;
  int rc = MPI_Irecv(received_.get(), count_, type_, partner, tag_, comm_, &requests_[0]);
  if (rc != MPI_SUCCESS) return rc;
  return MPI_Isend(buffer_, count_, type_, partner, tag_, comm_, &requests_[1]);
}

absl::StatusOr<bool> RecursiveDoublingAllReduce::Progress() {
  int done = 0;
  TANDEM_MPI_CHECK(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE));
  if (!done) return false;
  // buffer = received op buffer: both partners add the same two values (IEEE addition and
  // the other reductions are commutative), so they stay bitwise equal.
  if (count_ > 0) TANDEM_MPI_CHECK(MPI_Reduce_local(received_.get(), buffer_, count_, type_, op_));
  distance_ *= 2;
  if (distance_ >= size_) return true;
  const int rc = Post();
  if (rc != MPI_SUCCESS) return TANDEM_MPI_STATUS(rc);
  return false;
}

BroadcastTree::BroadcastTree(int rank, int size, int root) {
  const int v = (rank - root + size) % size;
  if (v > 0) parent = ((v - 1) / 2 + root) % size;
  for (int child = 2 * v + 1; child <= 2 * v + 2 && child < size; ++child) {
    children[num_children++] = (child + root) % size;
  }
}

int BinaryTreeBroadcast::Start() {
  if (tree_.parent < 0) {
    received_ = true;
    return PostSends();
  }
  return MPI_Irecv(buffer_, count_, type_, tree_.parent, tag_, comm_, &receive_);
}

int BinaryTreeBroadcast::PostSends() {
  for (int i = 0; i < tree_.num_children; ++i) {
    const int rc = MPI_Isend(buffer_, count_, type_, tree_.children[i], tag_, comm_, &sends_[i]);
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

absl::StatusOr<bool> BinaryTreeBroadcast::Progress() {
  if (!received_) {
    int done = 0;
    TANDEM_MPI_CHECK(MPI_Test(&receive_, &done, MPI_STATUS_IGNORE));
    if (!done) return false;
    received_ = true;
    if (const int rc = PostSends(); rc != MPI_SUCCESS) return TANDEM_MPI_STATUS(rc);
  }
  int done = 0;
  TANDEM_MPI_CHECK(MPI_Testall(tree_.num_children, sends_, &done, MPI_STATUSES_IGNORE));
  return done != 0;
}

DirectReduceScatter::DirectReduceScatter(MPI_Comm comm, int rank, int size, int tag,
                                         MPI_Datatype type, MPI_Op op, size_t element_bytes,
                                         const void* input, void* output, int64_t count)
    : ShardLayout(comm, rank, size, tag, type, op, element_bytes, input, output, count),
      received_(static_cast<size_t>(std::max<int64_t>(Shard(count, size, rank).count, 1) *
                                    (size - 1)) *
                element_bytes) {}

int DirectReduceScatter::Start() {
  if (size_ > kDirectMaxRanks) return MPI_ERR_COMM;
  const int mine = static_cast<int>(ShardOf(rank_).count);
  num_requests_ = 0;
  // Empty shards travel nowhere (fewer elements than ranks: both sides know which are empty).
  for (int i = 1; i < size_; ++i) {
    const int from = (rank_ + size_ - i) % size_;
    const int to = (rank_ + i) % size_;
    if (mine > 0) {
      const int rc = MPI_Irecv(received_.get() + (i - 1) * mine * element_bytes_, mine, type_,
                               from, tag_, comm_, &requests_[num_requests_++]);
      if (rc != MPI_SUCCESS) return rc;
    }
    const ShardRange theirs = ShardOf(to);
    if (theirs.count > 0) {
      const int rc = MPI_Isend(input_ + theirs.offset * element_bytes_,
                               static_cast<int>(theirs.count), type_, to, tag_, comm_,
                               &requests_[num_requests_++]);
      if (rc != MPI_SUCCESS) return rc;
    }
  }
  if (mine > 0) {
    std::memcpy(output_, input_ + ShardOf(rank_).offset * element_bytes_, mine * element_bytes_);
  }
  return MPI_SUCCESS;
}

absl::StatusOr<bool> DirectReduceScatter::Progress() {
  int done = 0;
  TANDEM_MPI_CHECK(MPI_Testall(num_requests_, requests_.data(), &done, MPI_STATUSES_IGNORE));
  if (!done) return false;
  const int mine = static_cast<int>(ShardOf(rank_).count);
  if (mine == 0) return true;
  for (int i = 1; i < size_; ++i) {
    TANDEM_MPI_CHECK(MPI_Reduce_local(received_.get() + (i - 1) * mine * element_bytes_, output_,
                                      mine, type_, op_));
  }
  return true;
}

}  // namespace tandem::comm::mpi_internal
