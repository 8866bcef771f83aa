// Faults end a training run cleanly: a rank killed mid-training, or a rank whose stage fails,
// makes every other rank print an error and exit non-zero within a bound — no hang. Starts
// `mpirun` itself with the helper program fault_worker (its path is the first argument).
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "gtest/gtest.h"
#include "tests/support/command.h"

namespace {

std::string g_worker;  // path of fault_worker

struct Outcome {
  int exit_status = 0;  // mpirun's (always 0 under --enable-recovery: Open MPI's choice)
  std::string output;
  double seconds = 0;
  // Exit status of world rank r's process, -1 if it printed none (killed with the job).
  int RankStatus(int r) const {
    const std::string prefix = absl::StrCat("[exit ", r, "] ");
    const size_t at = output.find(prefix);
    if (at == std::string::npos) return -1;
    return std::atoi(output.c_str() + at + prefix.size());
  }
};

// Each process runs through a shell that prints its exit status, since mpirun under
// --enable-recovery does not pass it on.
Outcome RunMpi(int ranks, const std::string& mpirun_flags, const std::string& worker_flags) {
  const std::string command = absl::StrCat(
      TANDEM_MPIEXEC, " --allow-run-as-root --oversubscribe --bind-to none ", mpirun_flags,
      " -np ", ranks, " sh -c '", g_worker, " ", worker_flags,
      "; echo \"[exit $OMPI_COMM_WORLD_RANK] $?\"' 2>&1");
  Outcome outcome;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot start: " << command;
    return outcome;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) outcome.output.append(buffer, n);
  const int status = pclose(pipe);
  outcome.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  outcome.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

constexpr int kRanks = 4;

TEST(FaultTest, HealthyRunFinishes) {
  Outcome o = RunMpi(kRanks, "", "--iterations=3");
  EXPECT_EQ(o.exit_status, 0) << o.output;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(o.RankStatus(r), 0) << o.output;
    EXPECT_NE(o.output.find(absl::StrCat("[rank ", r, "] done")), std::string::npos) << o.output;
  }
}

// Every survivor's one error line names the silent rank; its exit status is 1.
void ExpectSurvivorsReportSilence(const Outcome& o, int silent) {
  for (int r = 0; r < kRanks; ++r) {
    if (r == silent) continue;
    EXPECT_EQ(o.RankStatus(r), 1) << "rank " << r << ":\n" << o.output;
    const std::string prefix = absl::StrCat("[rank ", r, "] error: ");
    const size_t at = o.output.find(prefix);
    ASSERT_NE(at, std::string::npos) << "rank " << r << " printed no error:\n" << o.output;
    const std::string line = o.output.substr(at, o.output.find('\n', at) - at);
    // Its own heartbeat watch, or a peer's notice of it.
    const bool silence = line.find(absl::StrCat("rank ", silent, " stopped responding")) !=
                         std::string::npos;
    const bool notified = line.find("failed:") != std::string::npos;
    EXPECT_TRUE(silence || notified) << line;
  }
  EXPECT_EQ(o.output.find(absl::StrCat("[rank ", silent, "] done")), std::string::npos);
}

// A long engine timeout: the heartbeats (2 s), not the waits, must notice the dead rank.
constexpr double kLongTimeoutSeconds = 120;
// Heartbeat timeout, then mpirun's start-up and teardown.
constexpr double kSilenceBoundSeconds = 2 + 13;

TEST(FaultTest, KilledRankMakesEverySurvivorFailWithinSeconds) {
  Outcome o = RunMpi(kRanks, "--enable-recovery",
                     absl::StrCat("--iterations=1000 --kill_rank=2 --at_iteration=3 --timeout_s=",
                                  kLongTimeoutSeconds));
  EXPECT_LT(o.seconds, kSilenceBoundSeconds) << o.output;
  EXPECT_EQ(o.RankStatus(2), 128 + 9) << o.output;  // SIGKILL
  ExpectSurvivorsReportSilence(o, 2);
}

// A stopped rank is alive but silent: the survivors notice it within seconds and kill it (it
// runs on their host), so that mpirun returns instead of waiting for it for ever.
TEST(FaultTest, StoppedRankIsKilledAndTheJobEnds) {
  Outcome o = RunMpi(kRanks, "--enable-recovery",
                     absl::StrCat("--iterations=1000 --stop_rank=1 --at_iteration=3 --timeout_s=",
                                  kLongTimeoutSeconds));
  EXPECT_LT(o.seconds, kSilenceBoundSeconds) << o.output;
  EXPECT_EQ(o.RankStatus(1), 128 + 9) << o.output;  // killed while stopped
  ExpectSurvivorsReportSilence(o, 1);
  EXPECT_NE(o.output.find("killed its process"), std::string::npos) << o.output;
}

TEST(FaultTest, FailingStageIsReportedOnEveryRankAtOnce) {
  // A long timeout: the other ranks must learn of the failure from its notice, not by timing
  // out.
  constexpr double kTimeoutSeconds = 60;
  constexpr double kBoundSeconds = 20;
  Outcome o = RunMpi(kRanks, "--enable-recovery",
                     absl::StrCat("--iterations=1000 --fail_rank=1 --at_iteration=2 --timeout_s=",
                                  kTimeoutSeconds));
  EXPECT_LT(o.seconds, kBoundSeconds) << o.output;
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(o.RankStatus(r), 1) << o.output;
  EXPECT_NE(o.output.find("[rank 1] error: DATA_LOSS"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("injected stage failure"), std::string::npos) << o.output;
  for (int r : {0, 2, 3}) {
    const std::string prefix = absl::StrCat("[rank ", r, "] error: ");
    const size_t at = o.output.find(prefix);
    ASSERT_NE(at, std::string::npos) << "rank " << r << " printed no error:\n" << o.output;
    const std::string line = o.output.substr(at, o.output.find('\n', at) - at);
    EXPECT_NE(line.find("rank 1 failed"), std::string::npos) << line;
  }
}

TEST(FaultTest, PlainMpirunEndsTheJobWhenARankDies) {
  // Without --enable-recovery Open MPI terminates every rank as soon as one dies.
  constexpr double kBoundSeconds = 20;
  Outcome o = RunMpi(kRanks, "", "--iterations=1000 --kill_rank=3 --at_iteration=2");
  EXPECT_NE(o.exit_status, 0) << o.output;
  EXPECT_LT(o.seconds, kBoundSeconds) << o.output;
  EXPECT_EQ(o.output.find("] done"), std::string::npos) << o.output;
}

TEST(FaultTest, PlainMpirunExitsNonZeroWhenAStageFails) {
  constexpr double kBoundSeconds = 20;
  Outcome o = RunMpi(kRanks, "", "--iterations=1000 --fail_rank=2 --at_iteration=2");
  EXPECT_NE(o.exit_status, 0) << o.output;
  EXPECT_LT(o.seconds, kBoundSeconds) << o.output;
  EXPECT_NE(o.output.find("[rank 2] error: DATA_LOSS"), std::string::npos) << o.output;
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::testing::RunTestsWithProgramPath(argc, argv, "PATH_TO_FAULT_WORKER", &g_worker);
}
