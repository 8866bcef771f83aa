// Peer liveness: which of a communicator's ranks fell silent, for the two watchers of the
// project, the runtime's failure notices (runtime/failure_notices.h) and the elastic layer's
// membership (elastic/agreement.h). One detector, two transports: each watcher carries its own
// heartbeats (failure notices on a communicator of their own, the membership among its
// agreement messages) and tells the detector what arrived.
//
// The watcher's thread sends a heartbeat to every watched peer whenever HeartbeatDue says so
// (every quarter of the timeout) and calls Heard for each message a peer sends. A watched peer
// heard from no longer than the timeout ago is alive; one silent for longer (FirstSilent) was
// killed, is stopped (SIGSTOP), or hangs outside its watcher's thread. A stopped process never
// ends by itself and keeps mpirun waiting for ever, so KillIfLocal SIGKILLs a silent peer that
// runs on this host: every rank's identity (process id and a hash of its host name) is
// exchanged when the watcher starts (ExchangeIdentities), so this holds from the first moment,
// before any heartbeat arrived, and heartbeats repeat it.
//
// Not thread-safe: one thread (the watcher's) uses an instance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/communicator.h"

namespace tandem::runtime {

// Who a rank is, as far as a peer on the same host needs to know to end it.
struct PeerIdentity {
  int64_t pid = -1;   // its process id
  int64_t host = -1;  // a hash of its host name (non-negative)

  static PeerIdentity Self();
  bool known() const { return pid > 0 && host >= 0; }
  bool operator==(const PeerIdentity& other) const {
    return pid == other.pid && host == other.host;
  }
};

class PeerLiveness {
 public:
  // Watches every rank of a communicator of `size` ranks but `self`, each heard at `now`.
  // `kill_silent_local_peers`: whether KillIfLocal may kill.
  PeerLiveness(int size, int self, absl::Duration timeout, bool kill_silent_local_peers,
               absl::Time now);

  // Every rank's identity through `comm` (collective: an all-gather of PeerIdentity::Self,
  // rank order; `comm`'s size and rank must be this detector's).
  absl::Status ExchangeIdentities(comm::Communicator& comm);

  // A message from `peer` arrived at `now` (saying who it is, where it does).
  void Heard(int peer, absl::Time now);
  void Heard(int peer, absl::Time now, const PeerIdentity& identity);
  // Stops watching `peer` (it closed, left, or was declared failed): its silence is expected.
  void Unwatch(int peer);
  bool watched(int peer) const;

  // Whether heartbeats are due at `now`; once it says so, the next are due a quarter of the
  // timeout later.
  bool HeartbeatDue(absl::Time now);
  // The lowest watched peer silent for longer than the timeout at `now`, or -1.
  int FirstSilent(absl::Time now) const;
  absl::Duration SilentFor(int peer, absl::Time now) const;

  // SIGKILLs `peer`'s process where its identity says it runs on this host (and it is not
  // this process) and killing is on. The words for a message ("killed its process 1234 on
  // this host"), or empty when nothing was killed.
  std::string KillIfLocal(int peer) const;

  const PeerIdentity& self() const { return self_identity_; }
  const PeerIdentity& identity(int peer) const { return peers_[peer].identity; }
  absl::Duration timeout() const { return timeout_; }

 private:
  struct Peer {
    absl::Time last_heard;
    PeerIdentity identity;
    bool watched = true;
  };
  int self_;
  absl::Duration timeout_;
  bool kill_;
  PeerIdentity self_identity_;
  absl::Time next_heartbeat_;
  std::vector<Peer> peers_;
};

// For a job that cannot start (a rank silent inside MPI's start-up, before any identity is
// known): SIGKILLs this process's stopped siblings running this program, the processes with
// the same parent (the launcher's daemon on this host starts every rank of the host) and the
// same executable, in the stopped state. Their process ids, ascending; none where /proc cannot
// be read. Only for a process a launcher started (the caller checks): a shell's other stopped
// jobs are its siblings too.
std::vector<int64_t> KillStoppedSiblings();

}  // namespace tandem::runtime
