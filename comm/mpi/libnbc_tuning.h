// Algorithm choice for Open MPI's non-blocking all-reduce (internal to the MPI backend).
//
// Open MPI 4.1 implements MPI_Iallreduce in its libnbc component, whose automatic choice is
// measured here to reach about half the bandwidth of its ring algorithm from 32 KiB up (2 ranks,
// shared memory). libnbc reads its algorithm variable when an operation is posted, so the
// backend sets it through the MPI tool interface (MPI_T) around each post: ring for large
// messages, libnbc's own choice otherwise. Every rank of a group posts the same count, so
// every rank picks the same algorithm. A user's explicit choice
// (--mca coll_libnbc_iallreduce_algorithm N) is left alone, as is any MPI without the variable.
#pragma once

#include <cstdint>
#include <mutex>

namespace tandem::comm::mpi_internal {

// Messages from this size use the ring algorithm.
inline constexpr int64_t kRingAllreduceMinBytes = int64_t{32} << 10;

class IallreduceAlgorithmScope {
 public:
  // Selects the algorithm for an all-reduce of `bytes` (`count` elements) over `group_size`
  // ranks until the scope ends; posts must happen inside the scope.
  IallreduceAlgorithmScope(int64_t bytes, int64_t count, int group_size);
  ~IallreduceAlgorithmScope();

 private:
  std::unique_lock<std::mutex> lock_;
  bool changed_ = false;
};

}  // namespace tandem::comm::mpi_internal
