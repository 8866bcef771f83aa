// main() for GoogleTest binaries run under mpirun: initialises MPI with MPI_THREAD_MULTIPLE,
// silences GoogleTest's output on ranks other than 0 (their failures are still printed to
// stderr), and reduces the result across ranks so one failing rank fails the whole test.
#include <mpi.h>

#include <cstdio>
#include <iostream>

#include "common/logging.h"
#include "gtest/gtest.h"

namespace {

// Prints failures of non-zero ranks with their rank, so they are not lost.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "MPI does not provide MPI_THREAD_MULTIPLE\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  tandem::SetLogRank(rank);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = local_failed;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !local_failed) {
    std::fprintf(stderr, "a test failed on another rank (see [rank N] lines above)\n");
  }
  MPI_Finalize();
  return any_failed;
}
