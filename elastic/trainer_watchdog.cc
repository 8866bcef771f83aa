// The elastic trainer's watchdog: a rank that MPI holds in a call nothing can interrupt ends
// with an error naming the cause (elastic/internal/trainer_state.h).
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "elastic/internal/trainer_state.h"

namespace tandem::elastic::internal {

void EndStuckRank(const std::string& line,
                  const std::function<void(const std::string&)>& before_exit) {
  TANDEM_LOG(ERROR) << line;
  if (before_exit) before_exit(line);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

StuckWatchdog::StuckWatchdog() : thread_([this] { Loop(); }) {}

StuckWatchdog::~StuckWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void StuckWatchdog::Arm(absl::Duration timeout, std::string line) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  deadline_ = deadline;
  line_ = std::move(line);
  cv_.SignalAll();
}

void StuckWatchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  deadline_ = absl::InfiniteFuture();
}

void StuckWatchdog::set_before_exit(std::function<void(const std::string&)> before_exit) {
  absl::MutexLock lock(&mu_);
  before_exit_ = std::move(before_exit);
}

void StuckWatchdog::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (deadline_ == absl::InfiniteFuture()) {
      cv_.Wait(&mu_);
      continue;
    }
    if (absl::Now() >= deadline_) EndStuckRank(line_, before_exit_);
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
  }
}

}  // namespace tandem::elastic::internal
