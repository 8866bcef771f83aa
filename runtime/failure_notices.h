// Failure notices: a failing rank tells every other rank at once, and a rank that falls
// silent is noticed within seconds.
//
// Every rank keeps one receive posted from every other rank on the control communicator; a
// rank whose call fails sends its error to all (Report), and a watchdog thread that sees a
// notice calls `abort` (the engine aborts its communicators) with the failing rank's message
// and status code, so waits everywhere end at once instead of each timing out in turn, and
// every rank exits as the failing one does.
//
// Heartbeats (on a duplicate of the control communicator, sent and received by the watchdog
// thread, so a rank busy computing still sends them; runtime/peer_liveness.h keeps the times)
// catch a peer that is killed or stopped within FailureNoticeOptions::heartbeat_timeout (2 s):
// the watchdog aborts with "rank R stopped responding" and, where that peer runs on this host,
// kills it so that mpirun can end the job (the peers' process ids are exchanged at Start, so
// this holds for a peer stopped before its first heartbeat). A peer that hangs while its
// process runs is caught by the waits' timeout.
//
// At a clean shutdown (the destructor, when nothing failed) each rank sends a closing notice,
// which satisfies the posted receives and ends the heartbeat watch of that rank, and waits
// at most 10 s for everyone else's.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"

namespace tandem::runtime {

struct FailureNoticeOptions {
  // A peer silent this long (no heartbeat: killed, or stopped) is declared failed; zero turns
  // heartbeats off. Heartbeats go every quarter of it from the watchdog thread, so a rank
  // busy computing still sends them.
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  // Kill (SIGKILL) a silent peer that runs on this host, so that the job can end: a stopped
  // process would keep mpirun waiting for ever.
  bool kill_silent_local_peers = true;
};

class FailureNotices {
 public:
  // Collective over `control` (it duplicates it for the heartbeats). Posts the receives and
  // starts the watchdog. `control` must outlive this object and carry nothing else on tag 3;
  // `abort` runs on the watchdog thread.
  static absl::StatusOr<std::unique_ptr<FailureNotices>> Start(
      comm::Communicator& control, FailureNoticeOptions options,
      std::function<void(const absl::Status&)> abort);
  ~FailureNotices();
  FailureNotices(const FailureNotices&) = delete;
  FailureNotices& operator=(const FailureNotices&) = delete;

  // Tells every other rank about `status` (the first failure only; OK does nothing) and
  // returns it.
  absl::Status Report(absl::Status status);
  // A failure was reported here or received from a peer, or a peer fell silent.
  bool failed() const;
  // Marks this rank failed without telling anyone (the caller handles the failure, e.g. the
  // elastic layer's agreement): the destructor then waits for no closing notices.
  void Abandon();

 private:
  struct State;
  FailureNotices(comm::Communicator& control, std::unique_ptr<comm::Communicator> heartbeats,
                 FailureNoticeOptions options, std::function<void(const absl::Status&)> abort);
  void SendToAll(char kind, absl::StatusCode code, const std::string& text);

  comm::Communicator& control_;
  std::unique_ptr<State> state_;
};

}  // namespace tandem::runtime
