#include "elastic/agreement.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/keep_alive.h"
#include "common/logging.h"
#include "common/status.h"
#include "runtime/peer_liveness.h"

namespace tandem::elastic {
namespace {

constexpr int kTag = 11;  // every membership message, on the membership's own communicator
constexpr absl::Duration kPoll = absl::Milliseconds(2);

enum Kind : int64_t { kHeartbeat = 0, kProposal = 1, kDecided = 2, kLeave = 3 };

// A message: eight 64-bit words (kind, round, committed iteration, sender pid, sender host,
// the committed step's three sums as doubles) and one byte per rank (proposal: suspected
// ranks; decision: live ranks).
constexpr size_t kHeaderWords = 8;
constexpr size_t kHeaderBytes = kHeaderWords * sizeof(int64_t);

struct Header {
  int64_t kind = kHeartbeat;
  int64_t round = 0;
  CommittedStep committed;
  int64_t pid = 0;
  int64_t host = 0;
};

using Bytes = std::vector<uint8_t>;

Bytes Encode(const Header& h, const std::vector<uint8_t>& flags) {
  Bytes out(kHeaderBytes + flags.size());
  int64_t words[kHeaderWords] = {h.kind, h.round, h.committed.iteration, h.pid, h.host};
  std::memcpy(&words[5], h.committed.sums.data(), 3 * sizeof(double));
  std::memcpy(out.data(), words, kHeaderBytes);
  std::copy(flags.begin(), flags.end(), out.begin() + kHeaderBytes);
  return out;
}

Header DecodeHeader(const Bytes& in) {
  int64_t words[kHeaderWords];
  std::memcpy(words, in.data(), kHeaderBytes);
  Header h;
  h.kind = words[0];
  h.round = words[1];
  h.committed.iteration = words[2];
  h.pid = words[3];
  h.host = words[4];
  std::memcpy(h.committed.sums.data(), &words[5], 3 * sizeof(double));
  return h;
}

std::string RankList(const std::vector<int>& ranks) {
  return ranks.empty() ? "none" : absl::StrJoin(ranks, ", ");
}

CommittedStep Later(const CommittedStep& a, const CommittedStep& b) {
  return b.iteration > a.iteration ? b : a;
}

// What a rank proposes: whom anyone suspects, and the highest committed iteration known.
struct Value {
  std::vector<uint8_t> suspected;
  CommittedStep committed;
  void Merge(const std::vector<uint8_t>& other, const CommittedStep& other_committed) {
    for (size_t i = 0; i < suspected.size(); ++i) suspected[i] |= other[i];
    committed = Later(committed, other_committed);
  }
};

}  // namespace

struct Membership::State {
  std::unique_ptr<comm::Communicator> comm;
  MembershipOptions options;
  std::function<void(const absl::Status&)> on_failure;
  int me = 0;
  int n = 1;
  // Who is silent (heartbeats every quarter of the timeout, last heard per peer, identities;
  // runtime/peer_liveness.h): the monitor thread's.
  std::unique_ptr<runtime::PeerLiveness> liveness;
  std::thread thread;
  std::atomic<bool> stop{false};
  double first_silence_seconds = 0;  // monitor thread only
  mutable std::mutex committed_mu;
  CommittedStep committed_step;  // guarded by committed_mu
  CommittedStep Committed() const {
    std::lock_guard<std::mutex> lock(committed_mu);
    return committed_step;
  }

  // Shared with the training thread.
  mutable std::mutex mu;
  std::condition_variable cv;
  bool requested = false;
  absl::Status request_why;
  bool leave_requested = false;
  bool leave_sent = false;
  bool active = false;
  bool done = false;  // decided, or excluded
  absl::Status outcome;
  MembershipDecision decision;

  // The monitor thread's own.
  struct Peer {
    std::shared_ptr<Bytes> inbox;
    comm::WorkPtr receive;
    bool suspected = false;  // final
    bool left = false;       // ended cleanly
    comm::WorkPtr heartbeat;  // the last one, still in flight or done
  };
  std::vector<Peer> peers;
  std::list<std::pair<comm::WorkPtr, std::shared_ptr<Bytes>>> sends;
  // Agreement.
  int round = 0;
  Value mine;                               // the value sent in `round`
  bool suspected_since_send = false;
  std::map<int, std::set<int>> heard;       // round -> ranks heard in it
  std::map<int, Value> received;            // round -> merged values heard in it
  absl::Time entered;
  std::string reason;

  size_t message_bytes() const { return kHeaderBytes + static_cast<size_t>(n); }

  void Post(int peer) {
    Peer& p = peers[peer];
    p.inbox = std::make_shared<Bytes>(message_bytes());
    p.receive = comm->Recv({p.inbox->data(), static_cast<int64_t>(p.inbox->size()),
                            comm::DataType::kUInt8, comm::Device::Cpu()},
                           peer, kTag);
  }

  comm::WorkPtr Send(int peer, const Header& h, const std::vector<uint8_t>& flags) {
    auto bytes = std::make_shared<Bytes>(Encode(h, flags));
    comm::WorkPtr work = comm->Send({bytes->data(), static_cast<int64_t>(bytes->size()),
                                     comm::DataType::kUInt8, comm::Device::Cpu()},
                                    peer, kTag);
    sends.emplace_back(work, bytes);
    return work;
  }

  Header MakeHeader(int64_t kind) const {
    Header h;
    h.kind = kind;
    h.round = round;
    h.committed = Committed();
    h.pid = liveness->self().pid;
    h.host = liveness->self().host;
    return h;
  }

  bool Watched(int r) const { return r != me && !peers[r].suspected && !peers[r].left; }

  void SendToWatched(int64_t kind, const std::vector<uint8_t>& flags,
                     const CommittedStep& value_committed) {
    Header h = MakeHeader(kind);
    h.committed = value_committed;
    for (int r = 0; r < n; ++r) {
      if (Watched(r)) Send(r, h, flags);
    }
  }

  void Run();
  void Receive(int from, const Bytes& message);
  void Suspect(int r, const std::string& why);
  void Enter(const std::string& why);
  void Progress();
  void Decide(const std::vector<int>& live, const CommittedStep& committed_step, int rounds);
  void Exclude(const std::string& why);
  void Heartbeats(absl::Time now);
  void SendLeave();
};

void Membership::State::SendLeave() {
  SendToWatched(kLeave, std::vector<uint8_t>(n, 0), Committed());
  for (Peer& p : peers) p.left = true;  // watch no one any more
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (absl::Now() < deadline &&
         std::any_of(sends.begin(), sends.end(), [](const auto& s) { return !s.first->Test(); })) {
    absl::SleepFor(kPoll);
  }
  std::lock_guard<std::mutex> lock(mu);
  leave_sent = true;
  cv.notify_all();
}

void Membership::State::Run() {
  for (int r = 0; r < n; ++r) {
    if (r != me) Post(r);
  }
  while (!stop.load()) {
    const absl::Time now = absl::Now();
    for (int r = 0; r < n; ++r) {
      Peer& p = peers[r];
      if (r == me || !p.receive || !p.receive->Test()) continue;
      const absl::Status status = p.receive->error();
      if (!status.ok()) {
        p.receive.reset();  // the communicator was aborted or the peer is gone
        if (!p.suspected && !p.left) Suspect(r, absl::StrCat("receive failed: ", status.message()));
        continue;
      }
      Bytes message = *p.inbox;
      Post(r);
      Receive(r, message);
    }
    bool leave;
    {
      std::lock_guard<std::mutex> lock(mu);
      leave = leave_requested && !leave_sent;
    }
    if (leave) SendLeave();
    bool finished;
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = done;
    }
    if (!finished) Heartbeats(now);
    for (int r = liveness->FirstSilent(now); r >= 0 && !finished; r = liveness->FirstSilent(now)) {
      if (Watched(r)) {
        Suspect(r, absl::StrCat("no heartbeat for ",
                                absl::FormatDuration(liveness->SilentFor(r, now))));
      }
      liveness->Unwatch(r);  // suspected, or left: its silence says nothing more
    }
    bool enter = false;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (requested && !active && !done) {
        enter = true;
        why = request_why.ToString();
      }
    }
    if (enter) Enter(why);
    Progress();
    sends.remove_if([](const auto& s) { return s.first->Test(); });
    absl::SleepFor(kPoll);
  }
}

void Membership::State::Heartbeats(absl::Time now) {
  if (!liveness->HeartbeatDue(now)) return;
  const Bytes none(n, 0);
  for (int r = 0; r < n; ++r) {
    Peer& p = peers[r];
    if (!Watched(r)) continue;
    if (p.heartbeat && !p.heartbeat->Test()) continue;  // the last one has not gone yet
    p.heartbeat = Send(r, MakeHeader(kHeartbeat), none);
  }
}

void Membership::State::Receive(int from, const Bytes& message) {
  Peer& p = peers[from];
  if (p.suspected) return;  // a suspicion is final: a late message changes nothing
  const Header h = DecodeHeader(message);
  liveness->Heard(from, absl::Now(), runtime::PeerIdentity{h.pid, h.host});
  const std::vector<uint8_t> flags(message.begin() + kHeaderBytes, message.end());
  switch (h.kind) {
    case kHeartbeat:
      return;
    case kLeave:
      p.left = true;
      return;
    case kProposal: {
      if (flags[me]) {
        Exclude(absl::StrCat("rank ", from, " declared this rank dead"));
        return;
      }
      bool is_done;
      {
        std::lock_guard<std::mutex> lock(mu);
        is_done = done;
      }
      if (is_done) return;
      if (!active) Enter(absl::StrCat("rank ", from, " started an agreement"));
      const int r = static_cast<int>(h.round);
      heard[r].insert(from);
      auto [it, inserted] = received.try_emplace(r);
      if (inserted) it->second.suspected.assign(n, 0);
      it->second.Merge(flags, h.committed);
      // A peer's suspicion is ours too (the detector is perfect by construction).
      for (int q = 0; q < n; ++q) {
        if (flags[q] && q != me && !peers[q].suspected) {
          Suspect(q, absl::StrCat("declared dead by rank ", from));
        }
      }
      return;
    }
    case kDecided: {
      bool is_done;
      {
        std::lock_guard<std::mutex> lock(mu);
        is_done = done;
      }
      if (is_done) return;
      if (!flags[me]) {
        Exclude(absl::StrCat("rank ", from, "'s decision leaves this rank out"));
        return;
      }
      if (!active) Enter(absl::StrCat("rank ", from, " decided"));
      std::vector<int> live;
      for (int q = 0; q < n; ++q) {
        if (flags[q]) live.push_back(q);
      }
      Decide(live, h.committed, /*rounds=*/0);
      return;
    }
    default:
      return;
  }
}

void Membership::State::Suspect(int r, const std::string& why) {
  Peer& p = peers[r];
  if (p.suspected) return;
  p.suspected = true;
  if (first_silence_seconds == 0 && absl::StartsWith(why, "no heartbeat")) {
    first_silence_seconds = absl::ToDoubleSeconds(liveness->SilentFor(r, absl::Now()));
  }
  liveness->Unwatch(r);
  const std::string killed = liveness->KillIfLocal(r);
  const std::string text = absl::StrCat("rank ", r, " is dead: ", why,
                                        killed.empty() ? "" : absl::StrCat(" (", killed, ")"));
  TANDEM_LOG(INFO) << "membership: rank " << me << ": " << text;
  if (!mine.suspected.empty()) {
    mine.suspected[r] = 1;
    suspected_since_send = true;
  }
  if (!active) Enter(text);
}

void Membership::State::Enter(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (active || done) return;
    active = true;
  }
  entered = absl::Now();
  reason = why;
  if (on_failure) on_failure(absl::UnavailableError(absl::StrCat("membership: ", why)));
  round = 1;
  mine.suspected.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    if (r != me && peers[r].suspected) mine.suspected[r] = 1;
  }
  mine.committed = Committed();
  suspected_since_send = false;
  SendToWatched(kProposal, mine.suspected, mine.committed);
}

void Membership::State::Progress() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!active || done) return;
  }
  std::set<int>& now_heard = heard[round];
  for (int r = 0; r < n; ++r) {
    if (Watched(r) && !now_heard.count(r)) return;  // still waiting for r's round
  }
  // Round 0: everyone (the world before the agreement).
  std::set<int> before;
  if (round == 1) {
    for (int r = 0; r < n; ++r) {
      if (r != me) before.insert(r);
    }
  } else {
    before = heard[round - 1];
  }
  auto [it, inserted] = received.try_emplace(round);
  if (inserted) it->second.suspected.assign(n, 0);
  Value merged = mine;
  merged.Merge(it->second.suspected, it->second.committed);
  if (now_heard == before && !suspected_since_send) {
    std::vector<int> live = {me};
    for (int r : now_heard) {
      if (!merged.suspected[r]) live.push_back(r);
    }
    std::sort(live.begin(), live.end());
    Value decided;
    decided.suspected.assign(n, 0);
    for (int r : live) decided.suspected[r] = 1;  // a decision carries the live ranks
    SendToWatched(kDecided, decided.suspected, merged.committed);
    Decide(live, merged.committed, round);
    return;
  }
  ++round;
  mine = merged;
  mine.committed = Later(mine.committed, Committed());
  suspected_since_send = false;
  SendToWatched(kProposal, mine.suspected, mine.committed);
}

void Membership::State::Decide(const std::vector<int>& live, const CommittedStep& committed_step,
                               int rounds) {
  const int64_t committed_iteration = committed_step.iteration;
  if (rounds == 0) {
    // Adopted: pass it on, so that ranks waiting for this one's next round learn it too.
    std::vector<uint8_t> flags(n, 0);
    for (int r : live) flags[r] = 1;
    SendToWatched(kDecided, flags, committed_step);
  }
  MembershipDecision d;
  d.live = live;
  for (int r = 0; r < n; ++r) {
    if (!std::binary_search(live.begin(), live.end(), r)) d.dead.push_back(r);
  }
  d.committed_iteration = committed_iteration;
  d.committed_sums = committed_step.sums;
  d.detection_seconds = first_silence_seconds;
  d.rounds = rounds;
  d.seconds = absl::ToDoubleSeconds(absl::Now() - entered);
  d.reason = reason;
  TANDEM_LOG(INFO) << "membership: rank " << me << " decided live {" << RankList(d.live)
                   << "}, dead {" << RankList(d.dead) << "}, committed iteration "
                   << committed_iteration << " after " << rounds << " round(s)";
  std::lock_guard<std::mutex> lock(mu);
  decision = std::move(d);
  done = true;
  cv.notify_all();
}

void Membership::State::Exclude(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    done = true;
    outcome = absl::FailedPreconditionError(
        absl::StrCat("membership: this rank (", me, ") was declared dead by the others (", why,
                     "); it must leave the job"));
    cv.notify_all();
  }
  if (on_failure) on_failure(outcome);
  for (Peer& p : peers) p.left = true;  // stop taking part
}

// ---- Public -----------------------------------------------------------------------------

Membership::Membership(std::unique_ptr<State> state) : state_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Start(
    comm::Communicator& base, MembershipOptions options,
    std::function<void(const absl::Status&)> on_failure, int64_t committed) {
  if (options.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("membership: the heartbeat timeout must be positive");
  }
  auto state = std::make_unique<State>();
  TANDEM_ASSIGN_OR_RETURN(state->comm, base.Split(0, base.rank()));
  state->options = options;
  state->on_failure = std::move(on_failure);
  state->me = state->comm->rank();
  state->n = state->comm->size();
  state->peers.resize(state->n);
  state->liveness = std::make_unique<runtime::PeerLiveness>(
      state->n, state->me, options.heartbeat_timeout, options.kill_silent_local_peers,
      absl::Now());
  // Every rank's process id from the start: one stopped before its first heartbeat is still
  // killed.
  TANDEM_RETURN_IF_ERROR(state->liveness->ExchangeIdentities(*state->comm));
  state->committed_step.iteration = committed;
  State* raw = state.get();
  state->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<Membership>(new Membership(std::move(state)));
}

Membership::~Membership() {
  state_->stop.store(true);
  if (state_->thread.joinable()) state_->thread.join();
  // Receives from the dead never complete: abort, and keep the buffers of what may still be in
  // flight alive for MPI (a few bytes per peer).
  state_->comm->Abort(absl::CancelledError("membership ended"));
  // An aborted operation reads as done, but MPI may still deliver into its buffer: every
  // inbox stays, and every send not known to have completed.
  for (State::Peer& p : state_->peers) comm::KeepAliveAfterAbort(p.inbox);
  for (auto& s : state_->sends) {
    if (!s.first->Test() || !s.first->error().ok()) comm::KeepAliveAfterAbort(s.second);
  }
}

int Membership::rank() const { return state_->me; }
int Membership::size() const { return state_->n; }

bool Membership::SetCommitted(int64_t iteration, const std::array<double, 3>& sums) {
  {
    std::lock_guard<std::mutex> lock(state_->committed_mu);
    if (iteration > state_->committed_step.iteration) state_->committed_step = {iteration, sums};
  }
  // Recorded first, then checked: an agreement that begins after this check reads the value.
  // (A later round may still carry it; the decision says whether it counted.)
  std::lock_guard<std::mutex> lock(state_->mu);
  return !state_->active && !state_->done;
}

void Membership::RequestAgreement(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->requested) return;
  state_->requested = true;
  state_->request_why = why;
}

bool Membership::in_agreement() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->active || state_->done;
}

absl::StatusOr<MembershipDecision> Membership::AwaitDecision(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  const bool finished = state_->cv.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                            [this] { return state_->done; });
  if (!finished) {
    return absl::DeadlineExceededError(absl::StrCat(
        "membership: no agreement on the survivors within ", absl::FormatDuration(timeout)));
  }
  if (!state_->outcome.ok()) return state_->outcome;
  return state_->decision;
}

void Membership::Leave() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->leave_requested = true;
  state_->cv.wait_for(lock, std::chrono::seconds(3), [this] { return state_->leave_sent; });
}

}  // namespace tandem::elastic
