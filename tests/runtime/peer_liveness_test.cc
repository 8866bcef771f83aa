// The peer-liveness detector (runtime/peer_liveness.h): silence by the clock, and real
// SIGKILLs of stopped processes (children of this test, forked and stopped with SIGSTOP).
#include "runtime/peer_liveness.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(2);

TEST(PeerLivenessTest, APeerIsSilentOnlyAfterTheTimeoutAndOnlyWhileWatched) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  PeerLiveness liveness(/*size=*/3, /*self=*/1, kTimeout, /*kill_silent_local_peers=*/false,
                        start);
  EXPECT_FALSE(liveness.watched(1));  // itself
  EXPECT_EQ(liveness.FirstSilent(start + kTimeout), -1);
  liveness.Heard(0, start + absl::Seconds(1));
  EXPECT_EQ(liveness.FirstSilent(start + kTimeout + absl::Milliseconds(1)), 2);
  EXPECT_EQ(liveness.SilentFor(2, start + absl::Seconds(3)), absl::Seconds(3));
  liveness.Unwatch(2);
  EXPECT_EQ(liveness.FirstSilent(start + absl::Seconds(3) + absl::Milliseconds(1)), 0);
  liveness.Heard(0, start + absl::Seconds(3));
  EXPECT_EQ(liveness.FirstSilent(start + absl::Seconds(4)), -1);
  // Heartbeats every quarter of the timeout.
  EXPECT_TRUE(liveness.HeartbeatDue(start));
  EXPECT_FALSE(liveness.HeartbeatDue(start + absl::Milliseconds(499)));
  EXPECT_TRUE(liveness.HeartbeatDue(start + absl::Milliseconds(500)));
}

// A child that stops itself at once: alive, silent, never ending by itself.
pid_t StoppedChild() {
  const pid_t child = ::fork();
  if (child == 0) {
    ::raise(SIGSTOP);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, WUNTRACED);  // until it is stopped
  EXPECT_TRUE(WIFSTOPPED(status));
  return child;
}

// Reaps `child`; whether SIGKILL ended it.
bool KilledBySigkill(pid_t child) {
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

void EndChild(pid_t child) {
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST(PeerLivenessTest, AStoppedPeerOnThisHostIsKilledFromItsIdentity) {
  const pid_t child = StoppedChild();
  PeerLiveness liveness(2, 0, kTimeout, /*kill_silent_local_peers=*/true, absl::Now());
  // Not yet known: nothing to kill.
  EXPECT_EQ(liveness.KillIfLocal(1), "");
  liveness.Heard(1, absl::Now(), PeerIdentity{child, liveness.self().host});
  const std::string killed = liveness.KillIfLocal(1);
  EXPECT_EQ(killed, "killed its process " + std::to_string(child) + " on this host");
  EXPECT_TRUE(KilledBySigkill(child));
}

TEST(PeerLivenessTest, NothingIsKilledOnAnotherHostForItselfOrWhenKillingIsOff) {
  const pid_t child = StoppedChild();
  PeerLiveness elsewhere(2, 0, kTimeout, true, absl::Now());
  elsewhere.Heard(1, absl::Now(), PeerIdentity{child, elsewhere.self().host ^ 1});
  EXPECT_EQ(elsewhere.KillIfLocal(1), "");
  PeerLiveness off(2, 0, kTimeout, /*kill_silent_local_peers=*/false, absl::Now());
  off.Heard(1, absl::Now(), PeerIdentity{child, off.self().host});
  EXPECT_EQ(off.KillIfLocal(1), "");
  PeerLiveness itself(2, 0, kTimeout, true, absl::Now());
  itself.Heard(1, absl::Now(), itself.self());
  EXPECT_EQ(itself.KillIfLocal(1), "");
  // Still there (stopped): only SIGKILL from here ends it.
  EXPECT_EQ(::kill(child, 0), 0);
  EndChild(child);
}

// A rank stopped inside MPI's start-up: its sibling (same parent, same program) ends it, and
// leaves a running sibling alone.
TEST(PeerLivenessTest, StoppedSiblingsOfTheSameProgramAreKilled) {
  const pid_t stopped = StoppedChild();
  const pid_t running = ::fork();
  if (running == 0) {
    ::pause();
    ::_exit(0);
  }
  const pid_t rank = ::fork();
  if (rank == 0) {
    const std::vector<int64_t> killed = KillStoppedSiblings();
    ::_exit(killed.size() == 1 && killed[0] == stopped ? 0 : 1);
  }
  int status = 0;
  ::waitpid(rank, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(KilledBySigkill(stopped));
  EXPECT_EQ(::kill(running, 0), 0);  // not stopped: alive
  EndChild(running);
}

}  // namespace
}  // namespace tandem::runtime
