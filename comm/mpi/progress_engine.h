// Progress for the MPI backend (internal). Open MPI advances non-blocking operations only
// while some thread is inside MPI, so every posted request is tested by:
//   * the thread that waits on it: Work::Wait tests its own operation's request directly
//     (MPI_Test, or the step function of a multi-step algorithm) with no hand-off to another
//     thread, which gives MPI's own latency; or
//   * the engine's own thread, which polls whenever operations are pending and nobody waits,
//     so that communication overlaps computation for real (and, while a
//     Communicator::KeepProgressing handle lives, drives MPI even with nothing pending).
// A small receive not complete when issued is waiter-driven (Op::waiter_driven): never queued
// nor counted, completed by whoever waits on it or tests it, its message leaving the sender
// without this rank's help (eager). Queued, it kept the engine's thread polling beside a waiter
// that needed no help, and beside the computation for receives posted long ahead.
// An operation is touched by one thread at a time: whoever tests or fails it first claims it
// (Op::TryClaim). Tandem-level steps that are not a single request (signature checks, posting
// collectives queued behind them, ring steps of other operations) run under progress_mu_
// (TryProgress); a waiter calls it only while such steps are pending anywhere.
//
// A rank whose operation completed may still owe its peers protocol messages (e.g. the
// acknowledgement of a rendezvous send), which only leave while it calls into MPI. So after the
// last pending operation the engine's thread keeps driving MPI's progress (MPI_Iprobe on
// MPI_COMM_SELF) for kLinger, every kLingerPause at first and then at doubling intervals, then
// every kIdleSleep while idle; while the rank's own threads keep issuing operations it looks
// (and pokes) only every kWaiterHandoffSleep, and while a thread waits it only looks. It stops
// calling MPI when MPI_Finalize begins (a delete callback on MPI_COMM_SELF). Issuing an
// operation does not wake the engine's thread unless it is in its long idle sleep: a wake-up per
// operation costs a context switch that, on a rank with one core, is paid by the waiter.
//
// Collectives of one communicator are posted in issue order on every rank (MPI requires it).
// Without verification the issuing thread posts them at once (like point-to-point operations).
// With verification on, a collective first runs a small all-reduce of its signature (kind,
// count, type, reduction, root) on a separate control communicator; its data request is
// posted by the progress side only after the signature agreed and after every earlier
// collective was posted.
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace tandem::comm::mpi_internal {

// Issued operations wait in CommState::incoming until the progress side takes them, which a
// waiter that completes its own operations never asks for: past this many, done ones are
// dropped there (a few at a time, so that their memory goes back to the allocator's per-thread
// cache; the next pruning waits until the list has doubled, so pending ones cost no rescans).
inline constexpr size_t kIncomingPruneSize = 8;

// Operations up to this size (Open MPI's shared-memory eager limit) are tested when issued
// (collectives up to kCollectiveTestsAtIssue times, sends once, receives not at all: usually
// posted before their message, they are waiter-driven, see the header comment): most complete
// there (an eager send, a collective whose peers' messages are there) and then cost no queue
// entry. Not larger
// ones: that test drives MPI's progress, which may copy a large message arriving for it before
// this thread posts its next operation (a receive issued before its send then delays the send:
// 1-32 MiB send/recv pairs on two ranks ran at 0.65-1.03x instead of 0.92-1.21x).
inline constexpr int64_t kTestAtIssueMaxBytes = 4096;

// A small collective is tested up to this many times when issued (unless waits are polite):
// one whose peers issued theirs about the same time then completes there, on MPI's own path,
// with nothing allocated or queued; one whose peers are late costs its issuer that many tests
// (a few microseconds at most) before it is queued.
inline constexpr int kCollectiveTestsAtIssue = 32;

// Fields of a collective's signature: every rank must agree on each.
inline constexpr int kSignatureFields = 5;  // kind, count, dtype, reduce op, root
const char* SignatureFieldName(int field);

// What an operation is, for messages. Formatted only when asked: issuing and completing an
// operation never builds a string.
struct OpLabel {
  const char* name = "";  // "send", "recv", "all_reduce", ...
  int64_t sequence = -1;
  int peer = -1;  // point to point: the other rank ("to" for sends, "from" otherwise)
  int tag = 0;
  int group_size = 0;  // collectives
  int64_t count = -1;  // elements of the buffer described; -1: none
  DataType dtype = DataType::kFloat32;
  const char* reduction = nullptr;  // "sum", ...
  int root = -1;                    // broadcast
  std::string extra;                // rare details ("colour 1, key 0")

  // "1024 x float32, sum"
  std::string Detail() const;
  // "send #3 to rank 1 tag 0 (1024 x float32)", "all_reduce #2 (group of 4, 8 x float32, sum)"
  std::string Describe() const;
};

// One asynchronous operation.
struct Op {
  // kQueued: issued, not yet seen by the progress side. Collectives then go through kVerify
  // (signature all-reduce in flight, when enabled) and kReady (waiting for earlier collectives
  // to be posted) to kPosted; point-to-point operations are posted by the issuer.
  enum class Phase { kQueued, kVerify, kReady, kPosted, kDone };

  OpLabel label;
  std::string Describe() const { return label.Describe(); }
  // Written only by the thread holding the claim; read without it to decide whether to try.
  std::atomic<Phase> phase{Phase::kQueued};
  bool collective = true;
  bool verify = false;  // run the signature check before posting
  // Verification: signature, then its negation, all-reduced with MPI_MAX (max and -min).
  // Written only when `verify` is set (left uninitialised otherwise: no cost per operation).
  std::array<int64_t, 2 * kSignatureFields> signature;
  std::array<int64_t, 2 * kSignatureFields> agreed;
  MPI_Request verify_request = MPI_REQUEST_NULL;
  // Posts the data request; returns an MPI error code.
  std::function<int(MPI_Request*)> post;
  // Runs after the data request completed (averaging); an error is prefixed with the
  // operation's description.
  std::function<absl::Status(const MPI_Status&)> finish;
  // A receive: the element count its message must have, in `received_type` (checked when it
  // completes, before `finish`); -1 for other operations.
  int64_t expected_count = -1;
  MPI_Datatype received_type = MPI_DATATYPE_NULL;
  // Completed only by the threads that wait on or test it: never queued for the progress side,
  // not counted in the engine's pending operations (see kTestAtIssueMaxBytes). Its waiter
  // watches for an abort itself.
  bool waiter_driven = false;
  MPI_Request request = MPI_REQUEST_NULL;
  // Multi-step algorithms (e.g. the ring reduce-scatter) progress themselves: when set, it
  // replaces MPI_Test(request) and returns whether the operation is complete.
  std::function<absl::StatusOr<bool>()> progress;

  std::atomic<bool> done{false};
  absl::Status status;  // written once, before done is set (release)
  // Counted in the engine's pending operations (set when queued); `stepped` also in its
  // operations that need TryProgress (verification, or a `progress` function).
  bool counted = false;
  bool stepped = false;

  // Exclusive right to touch the request, phase and algorithm state; never held across a wait.
  bool TryClaim() { return !claimed.exchange(true, std::memory_order_acquire); }
  void Claim();  // spins (yielding) until claimed
  void Release() { claimed.store(false, std::memory_order_release); }

  // Under the claim: records the result, marks it done and uncounts it. Once per operation.
  void Complete(absl::Status result);

 private:
  std::atomic<bool> claimed{false};
};

// A receive that got `status`: an error unless it holds exactly `expected` elements of `type`
// (a shorter message; a longer one fails in MPI).
absl::Status CheckReceivedCount(const MPI_Status& status, int64_t expected, MPI_Datatype type);

// Under the claim of a posted operation: tests its request (or runs its `progress` step) and
// completes it when finished. True if it completed.
bool StepPosted(Op& op);

// From a waiting thread: if `op` is posted and nobody else is testing it, tests it here.
// True once the operation is done.
bool TryCompleteDirectly(Op& op);

// A communicator's MPI handles and queues, shared between the communicator (which issues) and
// the engine (which progresses). Issuers only take `incoming_mu` (briefly), so they never wait
// behind a long MPI call of the progress side; the progress side owns everything under `mu`
// and posts every collective, which keeps their order the issue order on every rank.
struct CommState {
  MPI_Comm comm = MPI_COMM_NULL;     // data traffic
  MPI_Comm control = MPI_COMM_NULL;  // signatures, liveness probes, group creation, rings
  int rank = 0;
  int size = 0;

  std::mutex incoming_mu;
  std::vector<std::shared_ptr<Op>> incoming ABSL_GUARDED_BY(incoming_mu);  // issue order
  // From this size, done operations are dropped from `incoming` (then from twice what stays).
  size_t incoming_prune_at ABSL_GUARDED_BY(incoming_mu) = kIncomingPruneSize;
  absl::Status aborted ABSL_GUARDED_BY(incoming_mu);  // non-OK once aborted
  std::atomic<bool> aborting{false};
  // Operations issued so far (a plain increment: one thread issues at a time). While this
  // moves the rank is busy with MPI: the engine's thread looks (and pokes) only every
  // kWaiterHandoffSleep instead of lingering at short pauses. Shared with the engine, which
  // reads it without taking a reference to this state (see ProgressEngine::Registered).
  const std::shared_ptr<std::atomic<uint64_t>> issued =
      std::make_shared<std::atomic<uint64_t>>(0);
  void NoteIssued() {
    issued->store(issued->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  std::mutex mu;
  std::deque<std::shared_ptr<Op>> collectives ABSL_GUARDED_BY(mu);  // issue order
  std::vector<std::shared_ptr<Op>> point_to_point ABSL_GUARDED_BY(mu);
  bool abandoned_requests ABSL_GUARDED_BY(mu) = false;  // requests left unfinished by Abort
  // Operations whose requests Abort left in flight: their buffers must outlive them.
  std::vector<std::shared_ptr<Op>> abandoned ABSL_GUARDED_BY(mu);

  ~CommState();
  // Queues an issued operation (already posted by `post_now` if given, called under
  // incoming_mu so that Abort cannot slip in between and posts keep the issue order). Returns
  // the abort status if the communicator was aborted (then nothing was queued). A small posted
  // operation is tested once first: one that completes at once is never queued.
  // A small operation the issuer already posted and tested (see kTestAtIssueMaxBytes) comes
  // with `test_at_issue` false and a post_now that only records its request; if the
  // communicator was aborted meanwhile, the issuer hands it to Abandon instead.
  absl::Status Enqueue(std::shared_ptr<Op> op,
                       absl::FunctionRef<absl::Status(Op&)> post_now = NothingToPost,
                       bool test_at_issue = true);
  static absl::Status NothingToPost(Op&) { return absl::OkStatus(); }
  // Keeps an operation whose request was posted but could not be queued (the communicator was
  // aborted meanwhile): MPI may still use its buffers.
  void Abandon(std::shared_ptr<Op> op);
  // Under the claim of a waiter-driven operation not yet done, once the communicator was
  // aborted: fails it like Abort fails queued ones (its request is left to MPI).
  void FailWaiterDriven(Op& op);
  // Tests pending requests and posts ready collectives; true if anything changed.
  bool Advance();
  // Fails every pending operation with `reason`; later operations fail immediately.
  void Abort(const absl::Status& reason);
  absl::Status AbortStatus();
  // Operations issued and not yet done.
  int64_t PendingCount();

 private:
  bool AdvanceCollectives() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool AdvancePointToPoint() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Fail(const std::shared_ptr<Op>& op, const absl::Status& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

// Pauses between polls of a waiting thread. Spinning (sched_yield) gives the lowest latency
// when every thread has a core; with more ranks than cores it starves the rank being waited
// for, so "polite" mode sleeps 1 ms at a time once nothing changed for a while.
// Polls before the first sched_yield, or the first pause of a polite wait.
inline constexpr int kPollsBeforeYield = 2000;

class Backoff {
 public:
  explicit Backoff(int polls_before_yield = kPollsBeforeYield)
      : polls_before_yield_(polls_before_yield) {}
  // Call after each poll; `progressed` restarts the polls before the first pause.
  void Pause(bool progressed);

 private:
  int polls_before_yield_;
  int idle_polls_ = 0;
};

class ProgressEngine {
 public:
  static ProgressEngine& Get();

  // Polite (sleeping) or spinning waits, process-wide.
  void set_polite(bool polite) { polite_.store(polite); }
  bool polite() const { return polite_.load(); }

  void Register(const std::shared_ptr<CommState>& state);
  // While kept (counted: Communicator::KeepProgressing), the engine's thread polls MPI even
  // with nothing pending, as if an operation were.
  void KeepProgressing(bool keep);
  // Counts operations added to / finished in any registered communicator, so the engine's
  // thread sleeps only when nothing is pending (or progress is kept).
  void OperationAdded(bool stepped);
  void OperationFinished(bool stepped);
  // Whether more than `besides` pending operations need TryProgress (see the header comment);
  // a waiter steps its own operation itself and passes 1 if it is one of them.
  bool SteppingPending(int besides = 0) const {
    return stepping_.load(std::memory_order_relaxed) > besides;
  }

  // Advances every registered communicator if no other thread is doing so; returns whether
  // anything changed. `busy` (optional) tells whether another thread was progressing.
  bool TryProgress(bool* busy = nullptr);
  // For a waiter that found another thread progressing: sleeps until that thread changes
  // something or `timeout` passes, instead of spinning beside it (on a rank with one core per
  // process, a spinning waiter would halve the speed of the thread copying the data).
  void SleepWhileBusy(std::chrono::microseconds timeout);
  // Drives MPI's progress without any request of ours (see the header comment).
  void Poke();
  // Called when MPI_Finalize begins: no MPI call from the engine afterwards.
  void OnFinalize();

  // While alive, the engine's thread leaves progress to the waiting thread.
  class WaiterScope {
   public:
    WaiterScope();
    ~WaiterScope();
  };

  ~ProgressEngine();

 private:
  ProgressEngine();
  void Loop();
  // Operations issued on every registered communicator (CommState::issued), summed.
  uint64_t IssuedCount();

  // A registered communicator, and its count of issued operations. The engine's thread reads
  // the count once a millisecond under the engine's locks: a reference to the state taken
  // there could be its last one, and would destroy it (MPI_Comm_free) under those locks.
  struct Registered {
    std::weak_ptr<CommState> state;
    std::shared_ptr<const std::atomic<uint64_t>> issued;
  };
  std::mutex list_mu_;
  std::vector<Registered> states_ ABSL_GUARDED_BY(list_mu_);
  std::mutex progress_mu_;
  std::atomic<int64_t> pending_{0};
  std::atomic<int> kept_{0};  // KeepProgressing handles alive
  std::atomic<int64_t> stepping_{0};
  std::atomic<bool> deep_idle_{false};  // the engine's thread sleeps kIdleSleep: wake it
  std::atomic<int> waiters_{0};
  std::atomic<bool> polite_{false};
  std::atomic<bool> finalizing_{false};
  std::mutex changed_mu_;
  std::condition_variable changed_;
  std::atomic<int> busy_sleepers_{0};
  std::atomic<bool> registered_{false};  // MPI is initialised once a communicator registered
  std::once_flag finalize_hook_;
  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool stop_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::thread thread_;
};

}  // namespace tandem::comm::mpi_internal
