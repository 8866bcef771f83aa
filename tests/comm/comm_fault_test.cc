// Fault test: one rank is killed (SIGKILL) in the middle of training-like traffic; the
// survivors must see an error within a bounded time, agree on who died, shrink to a working
// communicator and keep reducing on it. Run under `mpirun --enable-recovery` by
// run_fault_test.cmake, which counts the survivors' success markers (the killed rank makes
// mpirun's own exit status non-zero, so that status is not the verdict).
//
// Its main is tests/support/fault_gtest_main.cc (no reduction over the world, no
// MPI_Finalize: a rank is dead).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/mpi/mpi_communicator.h"
#include "gtest/gtest.h"

namespace tandem::comm {
namespace {

// How long a survivor waits on an operation with the dead rank before declaring it failed,
// and the bound on the whole detection (wait + liveness agreement).
constexpr absl::Duration kOperationTimeout = absl::Seconds(2);
constexpr absl::Duration kDetectionTimeout = absl::Seconds(3);
constexpr double kDetectionBoundSeconds = 15.0;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(MpiFaultTest, SurvivorsDetectKilledRankAndContinueOnShrunkCommunicator) {
  CommOptions options;
  options.timeout = kOperationTimeout;
  auto created = MpiCommunicator::World(options);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<MpiCommunicator> world = std::move(created).value();
  ASSERT_GE(world->size(), 3) << "run with at least 3 ranks";
  const int victim = world->size() / 2;  // a middle rank: survivors are renumbered

  // Healthy traffic first.
  std::vector<float> gradient(1 << 16, 1.0f);
  Buffer buffer{gradient.data(), static_cast<int64_t>(gradient.size())};
  ASSERT_TRUE(world->AllReduce(buffer)->Wait().ok());
  ASSERT_EQ(gradient[0], static_cast<float>(world->size()));
  ASSERT_TRUE(world->Barrier()->Wait().ok());

  if (world->rank() == victim) {
    raise(SIGKILL);  // dies without a word
  }

  // The survivors' next all-reduce cannot complete.
  std::fill(gradient.begin(), gradient.end(), 1.0f);
  const auto start = std::chrono::steady_clock::now();
  const absl::Status failed = world->AllReduce(buffer)->Wait();
  EXPECT_FALSE(failed.ok());
  EXPECT_TRUE(failed.code() == absl::StatusCode::kDeadlineExceeded ||
              failed.code() == absl::StatusCode::kUnavailable ||
              failed.code() == absl::StatusCode::kInternal)
      << failed;
  EXPECT_NE(failed.message().find("all_reduce"), std::string::npos) << failed;

  auto dead = world->DetectDeadRanks(kDetectionTimeout);
  ASSERT_TRUE(dead.ok()) << dead.status();
  EXPECT_EQ(*dead, std::vector<int>{victim});
  const double detection_seconds = SecondsSince(start);
  EXPECT_LT(detection_seconds, kDetectionBoundSeconds);

  auto shrunk = world->Shrink(*dead);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  world->Abort(absl::AbortedError(absl::StrCat("rank ", victim, " died")));
  std::unique_ptr<Communicator> survivors = std::move(shrunk).value();
  ASSERT_EQ(survivors->size(), world->size() - 1);
  EXPECT_EQ(survivors->world_ranks()[survivors->rank()], world->rank());

  // Training goes on: an all-reduce, a reduce-scatter and a broadcast on the survivors.
  std::fill(gradient.begin(), gradient.end(), static_cast<float>(world->rank() + 1));
  ASSERT_TRUE(survivors->AllReduce(buffer)->Wait().ok());
  float expected = 0;
  for (int r = 0; r < world->size(); ++r) {
    if (r != victim) expected += r + 1;
  }
  EXPECT_EQ(gradient[0], expected);
  EXPECT_EQ(gradient.back(), expected);
  const ShardRange shard = Shard(buffer.count, survivors->size(), survivors->rank());
  std::vector<float> mine(shard.count);
  ASSERT_TRUE(survivors->ReduceScatter(buffer, Buffer{mine.data(), shard.count})->Wait().ok());
  EXPECT_EQ(mine[0], expected * survivors->size());
  ASSERT_TRUE(survivors->Barrier()->Wait().ok());
  // The old communicator refuses work instead of hanging.
  EXPECT_EQ(world->Barrier()->Wait().code(), absl::StatusCode::kFailedPrecondition);

  if (!::testing::Test::HasFailure()) {
    std::printf("TANDEM_FAULT_SURVIVOR_OK rank %d detected rank %d dead in %.2f s\n",
                world->rank(), victim, detection_seconds);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace tandem::comm
