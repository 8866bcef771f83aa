#include "runtime/failure_notices.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/keep_alive.h"
#include "common/status.h"
#include "runtime/peer_liveness.h"

namespace tandem::runtime {
namespace {

constexpr int kNoticeBytes = 256;
using NoticeBuffer = std::array<char, kNoticeBytes>;
constexpr int kNoticeTag = 3;
constexpr int kHeartbeatTag = 5;
constexpr char kFailureNotice = 'F';
constexpr char kClosingNotice = 'C';
constexpr auto kWatchdogPoll = std::chrono::milliseconds(20);
// Bounds on the waits of the failure path and of the closing handshake.
constexpr absl::Duration kNoticeSendWait = absl::Milliseconds(500);
constexpr absl::Duration kClosingWait = absl::Seconds(10);

// A heartbeat: the sender's identity (process id, host hash; runtime/peer_liveness.h).
using Heartbeat = std::array<int64_t, 2>;

comm::Buffer HeartbeatBufferOf(Heartbeat* beat) {
  comm::Buffer b;
  b.data = beat->data();
  b.count = static_cast<int64_t>(beat->size());
  b.dtype = comm::DataType::kInt64;
  return b;
}

comm::Buffer NoticeBufferOf(NoticeBuffer* buffer) {
  comm::Buffer b;
  b.data = buffer->data();
  b.count = static_cast<int64_t>(buffer->size());
  b.dtype = comm::DataType::kUInt8;
  return b;
}

}  // namespace

struct FailureNotices::State {
  struct Notice {
    int peer = 0;
    std::shared_ptr<NoticeBuffer> buffer;
    comm::WorkPtr work;
    bool seen = false;
    // Heartbeats from this peer: the receive posted; and this rank's heartbeat to it still
    // in flight.
    std::shared_ptr<Heartbeat> incoming;
    comm::WorkPtr heartbeat_in;
    comm::WorkPtr heartbeat_out;
    bool closed = false;  // sent its closing notice: silence is expected
  };
  std::vector<Notice> notices;
  std::unique_ptr<comm::Communicator> heartbeats;  // used by the watchdog thread only
  std::unique_ptr<PeerLiveness> liveness;          // with heartbeats; the watchdog thread's
  FailureNoticeOptions options;
  std::function<void(const absl::Status&)> abort;
  std::shared_ptr<Heartbeat> mine = std::make_shared<Heartbeat>();
  std::thread thread;
  std::mutex mu;
  std::condition_variable wake;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::atomic<bool> failed{false};  // a failure was sent or received: skip the closing

  void Watch();
  void Beat(absl::Time now);
};

absl::StatusOr<std::unique_ptr<FailureNotices>> FailureNotices::Start(
    comm::Communicator& control, FailureNoticeOptions options,
    std::function<void(const absl::Status&)> abort) {
  std::unique_ptr<comm::Communicator> heartbeats;
  std::unique_ptr<PeerLiveness> liveness;
  if (options.heartbeat_timeout > absl::ZeroDuration()) {
    TANDEM_ASSIGN_OR_RETURN(heartbeats, control.Split(/*color=*/0, /*key=*/control.rank()));
    // Every peer's process id from the start: one stopped before its first heartbeat is
    // still killed.
    liveness = std::make_unique<PeerLiveness>(control.size(), control.rank(),
                                              options.heartbeat_timeout,
                                              options.kill_silent_local_peers, absl::Now());
    TANDEM_RETURN_IF_ERROR(liveness->ExchangeIdentities(*heartbeats));
    heartbeats->set_timeout(options.heartbeat_timeout);
  }
  std::unique_ptr<FailureNotices> notices(
      new FailureNotices(control, std::move(heartbeats), options, std::move(abort)));
  notices->state_->liveness = std::move(liveness);
  notices->state_->thread = std::thread([s = notices->state_.get()] { s->Watch(); });
  return notices;
}

FailureNotices::FailureNotices(comm::Communicator& control,
                               std::unique_ptr<comm::Communicator> heartbeats,
                               FailureNoticeOptions options,
                               std::function<void(const absl::Status&)> abort)
    : control_(control), state_(std::make_unique<State>()) {
  state_->abort = std::move(abort);
  state_->options = options;
  state_->heartbeats = std::move(heartbeats);
  const PeerIdentity me = PeerIdentity::Self();
  *state_->mine = {me.pid, me.host};
  for (int r = 0; r < control_.size(); ++r) {
    if (r == control_.rank()) continue;
    State::Notice n;
    n.peer = r;
    n.buffer = std::make_shared<NoticeBuffer>();
    n.work = control_.Recv(NoticeBufferOf(n.buffer.get()), r, kNoticeTag);
    state_->notices.push_back(std::move(n));
  }
}

void FailureNotices::State::Beat(absl::Time now) {
  for (Notice& n : notices) {
    if (n.closed) continue;
    if (n.heartbeat_in == nullptr) {
      n.incoming = std::make_shared<Heartbeat>();
      n.heartbeat_in = heartbeats->Recv(HeartbeatBufferOf(n.incoming.get()), n.peer,
                                        kHeartbeatTag);
    }
    while (n.heartbeat_in->Test()) {
      if (!n.heartbeat_in->error().ok()) break;
      liveness->Heard(n.peer, now, PeerIdentity{(*n.incoming)[0], (*n.incoming)[1]});
      n.heartbeat_in = heartbeats->Recv(HeartbeatBufferOf(n.incoming.get()), n.peer,
                                        kHeartbeatTag);
    }
    if (n.heartbeat_out == nullptr || n.heartbeat_out->Test()) {
      n.heartbeat_out = heartbeats->Send(HeartbeatBufferOf(mine.get()), n.peer, kHeartbeatTag);
    }
  }
}

void FailureNotices::State::Watch() {
  const bool beating = heartbeats != nullptr;
  std::unique_lock<std::mutex> lock(mu);
  while (!stop) {
    wake.wait_for(lock, kWatchdogPoll);
    for (Notice& n : notices) {
      if (n.seen || !n.work->Test()) continue;
      n.seen = true;
      if (liveness != nullptr) liveness->Unwatch(n.peer);  // its notice came: silence is due
      if (!n.work->error().ok()) continue;
      if ((*n.buffer)[0] == kClosingNotice) {
        n.closed = true;
        continue;
      }
      if ((*n.buffer)[0] != kFailureNotice) continue;
      // Byte 1: the failing rank's status code (bad input stays bad input on every rank).
      const int code = static_cast<unsigned char>((*n.buffer)[1]);
      const std::string text(n.buffer->data() + 2);
      failed = true;
      abort(absl::Status(code > 0 && code < 32 ? static_cast<absl::StatusCode>(code)
                                               : absl::StatusCode::kAborted,
                         absl::StrCat("rank ", n.peer, " failed: ", text)));
    }
    if (!beating || failed) continue;
    const absl::Time now = absl::Now();
    if (liveness->HeartbeatDue(now)) Beat(now);
    const int silent = liveness->FirstSilent(now);
    if (silent < 0) continue;
    const std::string killed = liveness->KillIfLocal(silent);
    failed = true;
    abort(absl::UnavailableError(absl::StrCat(
        "rank ", silent, " stopped responding: no heartbeat for ",
        absl::FormatDuration(liveness->SilentFor(silent, now)), " (killed or stopped)",
        killed.empty() ? "" : absl::StrCat("; ", killed, " so that the job can end"))));
  }
}

FailureNotices::~FailureNotices() {
  if (!state_->failed) {
    SendToAll(kClosingNotice, absl::StatusCode::kOk, "shutting down");
    const absl::Time deadline = absl::Now() + kClosingWait;
    for (State::Notice& n : state_->notices) {
      n.work->Wait(std::max(deadline - absl::Now(), absl::Milliseconds(1))).IgnoreError();
    }
  }
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->wake.notify_all();
  state_->thread.join();
  // Peers still beat until their own watch ends: the heartbeats' communicator is aborted, so
  // that it is never freed under their messages.
  if (state_->heartbeats != nullptr) {
    state_->heartbeats->Abort(absl::CancelledError("failure watch ended"));
  }
  // Receives still posted (a peer died or never closed) keep their buffers alive; so do the
  // heartbeats' (their communicator, destroyed with the state, abandons them to MPI).
  for (State::Notice& n : state_->notices) {
    // An aborted receive reads as done, but MPI may still deliver into its buffer.
    if (!n.work->Test() || !n.work->error().ok()) comm::KeepAliveAfterAbort(n.buffer);
    if (n.heartbeat_in != nullptr &&
        (!n.heartbeat_in->Test() || !n.heartbeat_in->error().ok())) {
      comm::KeepAliveAfterAbort(n.incoming);
    }
    if (n.heartbeat_out != nullptr && !n.heartbeat_out->Test()) {
      comm::KeepAliveAfterAbort(state_->mine);
    }
  }
}

bool FailureNotices::failed() const { return state_->failed; }

void FailureNotices::Abandon() { state_->failed = true; }

absl::Status FailureNotices::Report(absl::Status status) {
  if (status.ok()) return status;
  if (!state_->failed.exchange(true)) {
    SendToAll(kFailureNotice, status.code(), std::string(status.message()));
  }
  return status;
}

void FailureNotices::SendToAll(char kind, absl::StatusCode code, const std::string& text) {
  // Freed only when every send completed: a send to a dead rank may stay pending.
  auto* buffer = new NoticeBuffer();
  buffer->fill('\0');
  (*buffer)[0] = kind;
  (*buffer)[1] = static_cast<char>(static_cast<int>(code) & 31);
  std::strncpy(buffer->data() + 2, text.c_str(), buffer->size() - 3);
  std::vector<comm::WorkPtr> works;
  for (int r = 0; r < control_.size(); ++r) {
    if (r != control_.rank()) {
      works.push_back(control_.Send(NoticeBufferOf(buffer), r, kNoticeTag));
    }
  }
  bool all_sent = true;
  for (const comm::WorkPtr& w : works) all_sent &= w->Wait(kNoticeSendWait).ok();
  if (all_sent) delete buffer;
}

}  // namespace tandem::runtime
