// Failure notices: a failing rank tells every other rank at once.
//
// Every rank keeps one receive posted from every other rank on the control communicator; a
// rank whose call fails sends its error to all (Report), and a watchdog thread that sees a
// notice calls `abort` (the engine aborts its communicators), so waits everywhere end at once
// with the failing rank's message instead of each timing out in turn. A rank that dies
// without a word (killed) is noticed by its neighbours' timeouts, whose notices then reach
// everyone: every survivor fails within about one timeout. At a clean shutdown (the
// destructor, when nothing failed) each rank sends a closing notice, which satisfies the
// posted receives, and waits at most 10 s for everyone else's.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "comm/communicator.h"

namespace tandem::runtime {

class FailureNotices {
 public:
  // Posts the receives and starts the watchdog. `control` must outlive this object and carry
  // nothing else on tag 3; `abort` runs on the watchdog thread.
  FailureNotices(comm::Communicator& control, std::function<void(const absl::Status&)> abort);
  ~FailureNotices();
  FailureNotices(const FailureNotices&) = delete;
  FailureNotices& operator=(const FailureNotices&) = delete;

  // Tells every other rank about `status` (the first failure only; OK does nothing) and
  // returns it.
  absl::Status Report(absl::Status status);
  // A failure was reported here or received from a peer.
  bool failed() const;

 private:
  struct State;
  void SendToAll(char kind, const std::string& text);

  comm::Communicator& control_;
  std::unique_ptr<State> state_;
};

}  // namespace tandem::runtime
