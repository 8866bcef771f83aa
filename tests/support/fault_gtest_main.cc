// main() for GoogleTest binaries in which a rank is killed (run under `mpirun --enable-recovery`
// by a script that counts the survivors' markers): initialises MPI with MPI_THREAD_MULTIPLE,
// runs the tests and leaves without MPI_Finalize, which would wait for the dead rank. Unlike
// mpi_gtest_main.cc it reduces nothing across ranks (a reduction over the world cannot finish
// once a rank is dead): each survivor's result is its own.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(failed);
}
