// Membership: failure detection and agreement on the survivors, for the elastic layer.
//
// Every rank runs a monitor thread over its own duplicate of the job's communicator. The
// thread sends a heartbeat to every peer each heartbeat_timeout / 4 and declares a peer dead
// (suspects it) when nothing arrived from it for heartbeat_timeout: killed (SIGKILL) or
// stopped (SIGSTOP); the runtime's detector (runtime/peer_liveness.h) keeps the times and the
// peers' identities, exchanged at Start. A stopped peer on this host is killed (SIGKILL), even
// one stopped before its first heartbeat, and a rank that learns
// that the others declared it dead stops taking part, so that a suspicion is final: the
// detector behaves as a perfect one. Because the thread runs beside training, a rank busy in a
// long forward still answers, and every survivor notices a death within heartbeat_timeout
// plus one poll, wherever the victim was (compute, a transfer, gradient synchronisation, the
// optimizer, a checkpoint write).
//
// Agreement is flooding consensus with early stopping (Cachin, Guerraoui and Rodrigues,
// "Introduction to Reliable and Secure Distributed Programming", algorithm "Flooding
// Consensus"): in round r every rank sends its value to every rank it has not suspected and
// waits until it heard round r from each of them (or suspected it). A rank that heard from the
// same set in rounds r - 1 and r, and suspected no one since it sent round r, decides and
// sends its decision to all; a rank that receives a decision adopts and forwards it. No rank
// plays a special part, so a further death during the agreement, rank 0 included, only adds
// rounds. The value is (the ranks suspected by anyone, the highest committed iteration anyone
// knew), merged by union and maximum; the decision is the ranks heard in the deciding round
// less the suspected ones, and that iteration. Without failures in the agreement it takes two
// rounds after a death (one when no one died: RequestAgreement on a false alarm).
//
// A rank enters an agreement when it suspects a peer, when a peer's proposal arrives, or when
// the training thread calls RequestAgreement (an operation failed); on entering, `on_failure`
// runs once (on the monitor thread), e.g. to abort the engine's communicators so that the
// training thread's waits end at once. The training thread then calls AwaitDecision.
//
// Limits: heartbeats go to every peer (n^2 small messages per interval); one agreement per
// Membership (after a decision the caller shrinks the communicator and starts a new one).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"

namespace tandem::elastic {

struct MembershipOptions {
  // A peer silent this long is dead. Heartbeats go every quarter of it.
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  // Kill (SIGKILL) a silent peer running on this host: a stopped process must not come back.
  bool kill_silent_local_peers = true;
};

// An iteration known committed on every rank, with the three sums its commit all-reduce
// produced (e.g. loss, squared gradient norm, compute time), so that a rank that missed the
// result can still apply the step exactly as the others did.
struct CommittedStep {
  int64_t iteration = -1;
  std::array<double, 3> sums{};
};

struct MembershipDecision {
  std::vector<int> live;  // ranks of the membership's communicator, ascending
  std::vector<int> dead;  // the others, ascending
  // The highest iteration that some rank (live or dead) knew committed (SetCommitted); -1
  // when none.
  int64_t committed_iteration = -1;
  std::array<double, 3> committed_sums{};  // the sums that iteration's commit produced
  int rounds = 0;            // agreement rounds this rank ran (0: it adopted a decision)
  // How long the first peer this rank found dead had been silent then (about the heartbeat
  // timeout); 0 when this rank learned of the deaths from others.
  double detection_seconds = 0;
  double seconds = 0;        // from entering the agreement to the decision, on this rank
  std::string reason;        // what made this rank enter the agreement
};

class Membership {
 public:
  // Collective over `base` (it is split once for the membership's own messages; `base` is
  // not used afterwards). `on_failure` may be empty.
  // `committed`: the iteration already committed everywhere when it starts (SetCommitted's,
  // set before any agreement can begin).
  static absl::StatusOr<std::unique_ptr<Membership>> Start(
      comm::Communicator& base, MembershipOptions options,
      std::function<void(const absl::Status&)> on_failure, int64_t committed = -1);
  // Stops the monitor thread without waiting for anyone. Call Leave first at a clean end so
  // that peers still working do not take this rank's silence for a death.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  int rank() const;
  int size() const;

  // The highest iteration this rank knows committed on every rank (e.g. after a small
  // all-reduce that follows gradient synchronisation). Carried in this rank's proposals.
  // False once this rank takes part in an agreement: its proposal may have gone out without
  // it, so the decision may name an earlier iteration, and the step must wait for the decision
  // rather than be applied now.
  [[nodiscard]] bool SetCommitted(int64_t iteration, const std::array<double, 3>& sums = {});
  // Enters an agreement although no peer is known dead (an operation failed, `why`).
  void RequestAgreement(const absl::Status& why);
  // An agreement started here or reached this rank.
  bool in_agreement() const;
  // Blocks until the agreement this rank is in has decided. DeadlineExceeded after `timeout`;
  // FailedPrecondition when the others declared this rank dead (it must exit).
  absl::StatusOr<MembershipDecision> AwaitDecision(absl::Duration timeout);
  // Tells the peers that this rank ends cleanly: they stop watching it.
  void Leave();

 private:
  struct State;
  explicit Membership(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tandem::elastic
