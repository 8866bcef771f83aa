// Membership (elastic/agreement.h) on real processes: ranks are killed with SIGKILL or stopped
// with SIGSTOP under `mpirun --enable-recovery`, and every survivor must reach the same
// decision on who is alive within the heartbeat timeout plus a small margin, then build a
// communicator of the survivors and reduce on it. Run by run_agreement_test.cmake, which
// counts the survivors' success markers (mpirun's own exit status is not the verdict once a
// rank is dead).
//
//   agreement_test --scenario=NAME
//     kill_middle   rank n/2 is killed after start-up
//     kill_rank0    rank 0 is killed
//     kill_during   rank n-1 is killed; rank 0 kills itself as soon as it enters the agreement
//                   (a second death, of rank 0, while the others agree)
//     stop_middle   rank n/2 stops (SIGSTOP): declared dead, killed by a peer on this host
//     no_failure    a false alarm (RequestAgreement) decides everyone alive with the highest
//                   committed iteration; ranks that end early (Leave) are not taken for dead
//
// Own main (not the shared MPI gtest main): that one ends with an all-reduce over
// MPI_COMM_WORLD, which cannot complete once a rank is dead.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/mpi/mpi_communicator.h"
#include "elastic/agreement.h"
#include "gtest/gtest.h"

namespace tandem::elastic {
namespace {

std::string g_scenario = "kill_middle";

constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(2);
// Detection is bounded by the heartbeat timeout; the agreement adds a few round trips. The
// margin absorbs an oversubscribed machine (more ranks than cores).
constexpr double kDecisionBoundSeconds = 2.0 + 1.5;

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct World {
  std::unique_ptr<comm::MpiCommunicator> comm;
  int rank = 0;
  int size = 0;
};

World MakeWorld() {
  comm::CommOptions options;
  options.timeout = absl::Seconds(10);
  auto created = comm::MpiCommunicator::World(options);
  EXPECT_TRUE(created.ok()) << created.status();
  World w;
  w.comm = std::move(created).value();
  w.rank = w.comm->rank();
  w.size = w.comm->size();
  return w;
}

// Checks that every survivor decided the same and that the survivors can work together.
std::unique_ptr<comm::Communicator> ExpectSurvivorsWork(World& world,
                                                        const MembershipDecision& d,
                                                        const std::vector<int>& expected_dead) {
  EXPECT_EQ(d.dead, expected_dead) << "live: " << absl::StrJoin(d.live, ",");
  auto shrunk = world.comm->Shrink(d.dead);
  if (!shrunk.ok()) {
    ADD_FAILURE() << shrunk.status();
    return nullptr;
  }
  world.comm->Abort(absl::AbortedError("ranks died"));
  std::unique_ptr<comm::Communicator> survivors = std::move(shrunk).value();
  EXPECT_EQ(survivors->size(), static_cast<int>(d.live.size()));
  // Identical decisions: every survivor contributes its view; all views must be equal.
  std::vector<int64_t> view(world.size + 1, 0);
  for (int r : d.live) view[r] = 1;
  view[world.size] = d.committed_iteration;
  std::vector<int64_t> all(view.size() * survivors->size());
  const comm::ShardRange mine = comm::Shard(static_cast<int64_t>(all.size()), survivors->size(),
                                            survivors->rank());
  EXPECT_TRUE(survivors
                  ->AllGather({view.data(), mine.count, comm::DataType::kInt64},
                              {all.data(), static_cast<int64_t>(all.size()),
                               comm::DataType::kInt64})
                  ->Wait()
                  .ok());
  for (int s = 0; s < survivors->size(); ++s) {
    EXPECT_TRUE(std::equal(view.begin(), view.end(), all.begin() + s * view.size()))
        << "survivor " << s << " decided differently";
  }
  float value = static_cast<float>(world.rank + 1), expected = 0;
  for (int r : d.live) expected += static_cast<float>(r + 1);
  EXPECT_TRUE(survivors->AllReduce({&value, 1})->Wait().ok());
  EXPECT_EQ(value, expected);
  return survivors;
}

void Marker(const World& world, const MembershipDecision& d, double seconds) {
  if (::testing::Test::HasFailure()) return;
  std::printf("TANDEM_AGREEMENT_SURVIVOR_OK rank %d: live {%s} in %.2f s (%d rounds)\n",
              world.rank, absl::StrJoin(d.live, ",").c_str(), seconds, d.rounds);
  std::fflush(stdout);
}

TEST(MembershipTest, Scenario) {
  World world = MakeWorld();
  ASSERT_GE(world.size, 3) << "run with at least 3 ranks";
  MembershipOptions options;
  options.heartbeat_timeout = kHeartbeatTimeout;
  int victim = -1, second_victim = -1;
  bool stop = false;
  if (g_scenario == "kill_middle") victim = world.size / 2;
  if (g_scenario == "kill_rank0") victim = 0;
  if (g_scenario == "kill_during") victim = world.size - 1, second_victim = 0;
  if (g_scenario == "stop_middle") victim = world.size / 2, stop = true;
  std::atomic<int> failures{0};
  const bool die_on_entering = world.rank == second_victim;
  // The kill scenarios commit nothing: the decision carries the value the membership started
  // with.
  const int64_t start_committed = g_scenario == "no_failure" ? -1 : 7;
  auto membership = Membership::Start(
      *world.comm, options,
      [&](const absl::Status&) {
        ++failures;
        if (die_on_entering) raise(SIGKILL);
      },
      start_committed);
  ASSERT_TRUE(membership.ok()) << membership.status();
  std::unique_ptr<Membership> m = std::move(membership).value();

  // Let heartbeats flow (so that peers know each other's process), then start together.
  absl::SleepFor(absl::Milliseconds(600));
  ASSERT_TRUE(world.comm->Barrier()->Wait().ok());
  const auto start = std::chrono::steady_clock::now();

  if (g_scenario == "no_failure") {
    EXPECT_TRUE(m->SetCommitted(10 * world.rank, {0.5 * world.rank, 1.5, -2.0 * world.rank}))
        << "no agreement yet: the commit counts";
    // A rank carries what it had committed when it joined the agreement: every rank commits
    // before anyone starts one (else a slow rank may join first, and the highest value differ).
    ASSERT_TRUE(world.comm->Barrier()->Wait().ok());
    if (world.rank == 1) m->RequestAgreement(absl::DeadlineExceededError("a false alarm"));
    auto d = m->AwaitDecision(absl::Seconds(20));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->committed_iteration, 10 * (world.size - 1));
    // The sums travel with the highest committed iteration, bit for bit.
    EXPECT_EQ(d->committed_sums[0], 0.5 * (world.size - 1));
    EXPECT_EQ(d->committed_sums[1], 1.5);
    EXPECT_EQ(d->committed_sums[2], -2.0 * (world.size - 1));
    EXPECT_EQ(failures.load(), 1);
    const double seconds = Since(start);
    EXPECT_LT(seconds, 1.0) << "no one died: no one waits for a heartbeat timeout";
    EXPECT_FALSE(m->SetCommitted(10 * world.size))
        << "a commit after this rank joined an agreement must wait for its decision";
    std::unique_ptr<comm::Communicator> survivors = ExpectSurvivorsWork(world, *d, {});
    ASSERT_NE(survivors, nullptr);
    // Ranks ending at different times: the last one must not take the others for dead.
    auto again = Membership::Start(*survivors, options, {});
    ASSERT_TRUE(again.ok()) << again.status();
    if (world.rank == 0) {
      absl::SleepFor(kHeartbeatTimeout * 2);
      EXPECT_FALSE((*again)->in_agreement()) << "ranks that left were taken for dead";
    }
    (*again)->Leave();
    Marker(world, *d, seconds);
    return;
  }

  if (world.rank == victim) raise(stop ? SIGSTOP : SIGKILL);
  auto d = m->AwaitDecision(absl::Seconds(30));
  const double seconds = Since(start);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->committed_iteration, start_committed);
  std::vector<int> dead = {victim};
  if (second_victim >= 0) dead.insert(dead.begin(), second_victim);
  EXPECT_EQ(failures.load(), 1);
  if (second_victim < 0) {
    EXPECT_LT(seconds, kDecisionBoundSeconds) << "decision took too long";
  } else {
    // A second death inside the agreement costs one more heartbeat timeout.
    EXPECT_LT(seconds, kDecisionBoundSeconds + 2.0) << "decision took too long";
  }
  ExpectSurvivorsWork(world, *d, dead);
  Marker(world, *d, seconds);
}

}  // namespace
}  // namespace tandem::elastic

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--scenario=", 11) == 0) tandem::elastic::g_scenario = argv[i] + 11;
  }
  const int failed = RUN_ALL_TESTS();
  std::fflush(stdout);
  std::fflush(stderr);
  // MPI_Finalize synchronises with every process, the dead one included: leave without it.
  _exit(failed);
}
