#include "runtime/failure_notices.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::runtime {
namespace {

constexpr int kNoticeBytes = 256;
using NoticeBuffer = std::array<char, kNoticeBytes>;
constexpr int kNoticeTag = 3;
constexpr char kFailureNotice = 'F';
constexpr char kClosingNotice = 'C';
constexpr auto kWatchdogPoll = std::chrono::milliseconds(20);
// Bounds on the waits of the failure path and of the closing handshake.
constexpr absl::Duration kNoticeSendWait = absl::Milliseconds(500);
constexpr absl::Duration kClosingWait = absl::Seconds(10);

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
  };
  std::vector<Notice> notices;
  std::function<void(const absl::Status&)> abort;
  std::thread thread;
  std::mutex mu;
  std::condition_variable wake;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::atomic<bool> failed{false};  // a failure was sent or received: skip the closing
};

FailureNotices::FailureNotices(comm::Communicator& control,
                               std::function<void(const absl::Status&)> abort)
    : control_(control), state_(std::make_unique<State>()) {
  state_->abort = std::move(abort);
  for (int r = 0; r < control_.size(); ++r) {
    if (r == control_.rank()) continue;
    State::Notice n;
    n.peer = r;
    n.buffer = std::make_shared<NoticeBuffer>();
    n.work = control_.Recv(NoticeBufferOf(n.buffer.get()), r, kNoticeTag);
    state_->notices.push_back(std::move(n));
  }
  state_->thread = std::thread([s = state_.get()] {
    std::unique_lock<std::mutex> lock(s->mu);
    while (!s->stop) {
      s->wake.wait_for(lock, kWatchdogPoll);
      for (State::Notice& n : s->notices) {
        if (n.seen || !n.work->Test()) continue;
        n.seen = true;
        if (!n.work->error().ok() || (*n.buffer)[0] != kFailureNotice) continue;
        const std::string text(n.buffer->data() + 1);
        s->failed = true;
        s->abort(absl::AbortedError(absl::StrCat("rank ", n.peer, " failed: ", text)));
      }
    }
  });
}

FailureNotices::~FailureNotices() {
  if (!state_->failed) {
    SendToAll(kClosingNotice, "shutting down");
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
  // Receives still posted (a peer died or never closed) keep their buffers alive.
  for (State::Notice& n : state_->notices) {
    if (!n.work->Test()) new std::shared_ptr<NoticeBuffer>(n.buffer);
  }
}

bool FailureNotices::failed() const { return state_->failed; }

absl::Status FailureNotices::Report(absl::Status status) {
  if (status.ok()) return status;
  if (!state_->failed.exchange(true)) {
    SendToAll(kFailureNotice, std::string(status.message()));
  }
  return status;
}

void FailureNotices::SendToAll(char kind, const std::string& text) {
  // Freed only when every send completed: a send to a dead rank may stay pending.
  auto* buffer = new NoticeBuffer();
  buffer->fill('\0');
  (*buffer)[0] = kind;
  std::strncpy(buffer->data() + 1, text.c_str(), buffer->size() - 2);
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
