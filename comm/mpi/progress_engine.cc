#include "comm/mpi/progress_engine.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/check.h"
#include "common/status.h"

namespace tandem::comm::mpi_internal {
namespace {

// How long the engine's thread sleeps between checks while a waiter progresses, and at most
// while idle (a safety net against a missed wake-up).
constexpr auto kWaiterHandoffSleep = std::chrono::milliseconds(1);
constexpr auto kIdleSleep = std::chrono::milliseconds(5);
// After the last pending operation: how long, and how often, the engine keeps MPI progressing.
constexpr auto kLinger = std::chrono::milliseconds(100);
// How long the engine's thread leaves newly issued work to the issuing thread.
constexpr auto kStartDelay = std::chrono::microseconds(200);
constexpr auto kLingerPause = std::chrono::microseconds(50);

// Runs when MPI_Finalize frees MPI_COMM_SELF's attributes, before MPI shuts down.
int StopAtFinalize(MPI_Comm, int, void*, void*) {
  ProgressEngine::Get().OnFinalize();
  return MPI_SUCCESS;
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

std::string MismatchMessage(const Op& op) {
  for (int field = 0; field < kSignatureFields; ++field) {
    const int64_t max_value = op.agreed[field];
    const int64_t min_value = -op.agreed[kSignatureFields + field];
    if (max_value != min_value) {
      return absl::StrCat(op.Describe(), ": ranks disagree on ", SignatureFieldName(field),
                          " (this rank ", op.signature[field], ", min ", min_value, ", max ",
                          max_value, ")");
    }
  }
  return "";
}

// A polite wait's pause. Shorter ones, doubling from 20 us, were measured on 4 ranks of 2
// cores: 2 MiB all-gather 0.85-0.90 -> 1.19-1.35x MPI's bus bandwidth, but 8-byte send/recv
// 8-12 -> 23-74 us (all four ranks then share the cores in slices too thin for a pair to meet;
// with 1 ms pauses one pair runs while the other sleeps), the emulated pipeline unchanged.
constexpr auto kPolitePause = std::chrono::microseconds(1000);

// Whether this process may run on one core only (mpirun --bind-to core): the engine's thread
// then takes its polls from the rank's own threads.
bool BoundToOneCore() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  return sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) == 1;
}

}  // namespace

void Backoff::Pause(bool progressed) {
  if (progressed) idle_polls_ = 0;
  if (idle_polls_ < polls_before_yield_) {
    ++idle_polls_;  // a message a few polls away: yielding would only add a system call
    return;
  }
  if (!ProgressEngine::Get().polite()) {
    ++idle_polls_;
    sched_yield();
    return;
  }
  std::this_thread::sleep_for(kPolitePause);
}

const char* SignatureFieldName(int field) {
  static const char* const kNames[kSignatureFields] = {"operation", "element count",
                                                       "data type", "reduction", "root"};
  return field >= 0 && field < kSignatureFields ? kNames[field] : "?";
}

void Op::Claim() {
  while (!TryClaim()) sched_yield();
}

void Op::Complete(absl::Status result) {
  const bool uncount = counted;
  const bool was_stepped = stepped;
  status = std::move(result);
  phase.store(Phase::kDone, std::memory_order_relaxed);
  done.store(true, std::memory_order_release);
  if (uncount) ProgressEngine::Get().OperationFinished(was_stepped);
}

std::string OpLabel::Detail() const {
  std::string out;
  if (count >= 0) absl::StrAppend(&out, count, " x ", DataTypeName(dtype));
  if (reduction != nullptr) absl::StrAppend(&out, out.empty() ? "" : ", ", reduction);
  if (root >= 0) absl::StrAppend(&out, out.empty() ? "" : ", ", "root ", root);
  if (!extra.empty()) absl::StrAppend(&out, out.empty() ? "" : ", ", extra);
  return out;
}

std::string OpLabel::Describe() const {
  const std::string detail = Detail();
  if (peer >= 0) {
    const bool outgoing = std::string_view(name) == "send";
    return absl::StrCat(name, " #", sequence, outgoing ? " to rank " : " from rank ", peer,
                        " tag ", tag, " (", detail, ")");
  }
  return absl::StrCat(name, " #", sequence, " (group of ", group_size, detail.empty() ? "" : ", ",
                      detail, ")");
}

namespace {

// The result of an operation's checks and `finish`, its errors prefixed with the operation.
absl::Status Finish(const Op& op, const MPI_Status& status) {
  absl::Status result;
  if (op.expected_count >= 0) {
    result = CheckReceivedCount(status, op.expected_count, op.received_type);
  }
  if (result.ok() && op.finish) result = op.finish(status);
  if (result.ok()) return result;
  return absl::Status(result.code(), absl::StrCat(op.Describe(), ": ", result.message()));
}

}  // namespace

absl::Status CheckReceivedCount(const MPI_Status& status, int64_t expected, MPI_Datatype type) {
  int received = 0;
  MPI_Status copy = status;
  MPI_Get_count(&copy, type, &received);
  if (received == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("sender sent ", received, " elements, expected ",
                                                 expected, " (mismatched sizes or types)"));
}

bool StepPosted(Op& op) {
  if (op.progress) {
    absl::StatusOr<bool> complete = op.progress();
    if (!complete.ok()) {
      op.Complete(absl::Status(complete.status().code(),
                               absl::StrCat(op.Describe(), ": ", complete.status().message())));
      return true;
    }
    if (!*complete) return false;
    op.Complete(Finish(op, MPI_Status{}));
    return true;
  }
  int flag = 0;
  MPI_Status status;
  const int rc = MPI_Test(&op.request, &flag, &status);
  if (rc != MPI_SUCCESS) {
    const absl::Status error = TANDEM_MPI_STATUS(rc);
    op.Complete(absl::Status(error.code(), absl::StrCat(op.Describe(), ": ", error.message())));
    return true;
  }
  if (!flag) return false;
  op.Complete(Finish(op, status));
  return true;
}

bool TryCompleteDirectly(Op& op) {
  if (op.done.load(std::memory_order_acquire)) return true;
  if (op.phase.load(std::memory_order_acquire) != Op::Phase::kPosted || !op.TryClaim()) {
    return false;
  }
  if (op.phase.load(std::memory_order_relaxed) == Op::Phase::kPosted) StepPosted(op);
  op.Release();
  return op.done.load(std::memory_order_acquire);
}

CommState::~CommState() {
  if (MpiFinalized()) return;
  {
    // An aborted communicator stays allocated: peers may still send to it (heartbeats, a
    // transfer whose receive was never posted). Freed, its context id would be reused by the
    // next communicator, and their late messages would land there (Open MPI's ob1 then files
    // them under a peer index that may not exist in the new group).
    std::lock_guard<std::mutex> lock(incoming_mu);
    if (!aborted.ok()) return;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (abandoned_requests) return;  // MPI may still use the communicators: leave them
  if (control != MPI_COMM_NULL) MPI_Comm_free(&control);
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

namespace {

int64_t CountPending(const std::shared_ptr<Op>& op) {
  return op->done.load(std::memory_order_acquire) ? 0 : 1;
}

}  // namespace

int64_t CommState::PendingCount() {
  int64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(incoming_mu);
    for (const auto& op : incoming) count += CountPending(op);
  }
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& op : collectives) count += CountPending(op);
  for (const auto& op : point_to_point) count += CountPending(op);
  return count;
}

absl::Status CommState::AbortStatus() {
  std::lock_guard<std::mutex> lock(incoming_mu);
  return aborted;
}

absl::Status CommState::Enqueue(std::shared_ptr<Op> op,
                                absl::FunctionRef<absl::Status(Op&)> post_now,
                                bool test_at_issue) {
  std::lock_guard<std::mutex> lock(incoming_mu);
  if (!aborted.ok()) return aborted;
  TANDEM_RETURN_IF_ERROR(post_now(*op));
  // One test before anyone else sees it: a small operation that completes at once (an eager
  // send, a message already there, a collective that needed no peer) is done here, without a
  // queue entry, a count or a claim (see kTestAtIssueMaxBytes).
  const int64_t bytes = std::max<int64_t>(op->label.count, 0) * SizeOf(op->label.dtype);
  if (test_at_issue && bytes <= kTestAtIssueMaxBytes &&
      op->phase.load(std::memory_order_relaxed) == Op::Phase::kPosted && StepPosted(*op)) {
    return absl::OkStatus();
  }
  // Counted before anyone else can see (and complete) it.
  op->counted = true;
  ProgressEngine::Get().OperationAdded(op->stepped);
  if (incoming.size() >= incoming_prune_at) {
    incoming.erase(std::remove_if(incoming.begin(), incoming.end(),
                                  [](const std::shared_ptr<Op>& queued) {
                                    return queued->done.load(std::memory_order_acquire);
                                  }),
                   incoming.end());
    incoming_prune_at = std::max(kIncomingPruneSize, 2 * incoming.size());
  }
  incoming.push_back(std::move(op));
  return absl::OkStatus();
}

bool CommState::Advance() {
  std::vector<std::shared_ptr<Op>> arrived;
  {
    std::lock_guard<std::mutex> lock(incoming_mu);
    arrived.swap(incoming);
  }
  std::lock_guard<std::mutex> lock(mu);
  for (auto& op : arrived) {
    if (op->done.load(std::memory_order_acquire)) continue;  // completed by its waiter
    if (op->collective) {
      collectives.push_back(std::move(op));
    } else {
      point_to_point.push_back(std::move(op));
    }
  }
  if (collectives.empty() && point_to_point.empty()) return !arrived.empty();
  if (aborting.load()) {
    // Abort ran between the swap and here: fail what arrived like the rest.
    const absl::Status reason = AbortStatus();
    for (auto& op : collectives) Fail(op, reason);
    for (auto& op : point_to_point) Fail(op, reason);
    collectives.clear();
    point_to_point.clear();
    return true;
  }
  const bool collectives_changed = AdvanceCollectives();
  const bool p2p_changed = AdvancePointToPoint();
  return collectives_changed || p2p_changed || !arrived.empty();
}

bool CommState::AdvanceCollectives() {
  bool changed = false;
  bool earlier_unposted = false;
  for (auto& op : collectives) {
    if (op->done.load(std::memory_order_acquire)) continue;
    // Waiters claim posted operations only, so one that is claimed elsewhere is posted.
    if (!op->TryClaim()) continue;
    if (op->phase == Op::Phase::kQueued) {
      // Signature checks are posted here, in issue order, like the collectives themselves.
      if (op->verify) {
        const int rc = MPI_Iallreduce(op->signature.data(), op->agreed.data(),
                                      static_cast<int>(op->signature.size()), MPI_INT64_T,
                                      MPI_MAX, control, &op->verify_request);
        if (rc != MPI_SUCCESS) {
          op->Complete(TANDEM_MPI_STATUS(rc));
        } else {
          op->phase = Op::Phase::kVerify;
        }
      } else {
        op->phase = Op::Phase::kReady;
      }
      changed = true;
    }
    if (op->phase == Op::Phase::kVerify) {
      int flag = 0;
      const int rc = MPI_Test(&op->verify_request, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        op->Complete(TANDEM_MPI_STATUS(rc));
      } else if (flag) {
        const std::string mismatch = MismatchMessage(*op);
        if (mismatch.empty()) {
          op->phase = Op::Phase::kReady;
        } else {
          // Every rank sees the same max/min, so every rank fails this operation and none
          // posts it: the group stays consistent.
          op->Complete(absl::InvalidArgumentError(mismatch));
        }
        changed = true;
      }
    }
    if (op->phase == Op::Phase::kReady && !earlier_unposted) {
      const int rc = op->post(&op->request);
      if (rc != MPI_SUCCESS) {
        op->Complete(TANDEM_MPI_STATUS(rc));
      } else {
        op->phase = Op::Phase::kPosted;
      }
      changed = true;
    }
    if (op->phase == Op::Phase::kPosted) changed = StepPosted(*op) || changed;
    const Op::Phase phase = op->phase;
    if (phase == Op::Phase::kQueued || phase == Op::Phase::kVerify ||
        phase == Op::Phase::kReady) {
      earlier_unposted = true;
    }
    op->Release();
  }
  // Finished operations behind an unfinished one stay queued until it is done, which keeps
  // "earlier collectives were posted" simple; they are already complete for their waiters.
  while (!collectives.empty() && collectives.front()->done.load(std::memory_order_acquire)) {
    collectives.pop_front();
  }
  return changed;
}

bool CommState::AdvancePointToPoint() {
  bool changed = false;
  bool any_done = false;
  for (auto& op : point_to_point) {
    if (!op->done.load(std::memory_order_acquire) && op->TryClaim()) {
      if (op->phase == Op::Phase::kPosted) changed = StepPosted(*op) || changed;
      op->Release();
    }
    any_done = any_done || op->done.load(std::memory_order_acquire);
  }
  if (any_done) {
    point_to_point.erase(std::remove_if(point_to_point.begin(), point_to_point.end(),
                                        [](const std::shared_ptr<Op>& op) {
                                          return op->done.load(std::memory_order_acquire);
                                        }),
                         point_to_point.end());
  }
  return changed;
}

void CommState::Abandon(std::shared_ptr<Op> op) {
  std::lock_guard<std::mutex> lock(mu);
  abandoned_requests = true;
  abandoned.push_back(std::move(op));
}

void CommState::FailWaiterDriven(Op& op) {
  const absl::Status reason = AbortStatus();
  {
    std::lock_guard<std::mutex> lock(mu);
    abandoned_requests = true;  // its request stays posted: keep the MPI communicators
  }
  op.Complete(absl::FailedPreconditionError(
      absl::StrCat(op.Describe(), ": communicator aborted: ", reason.message())));
}

void CommState::Fail(const std::shared_ptr<Op>& op, const absl::Status& reason) {
  op->Claim();  // a waiter holds it at most for one MPI_Test
  if (!op->done.load(std::memory_order_acquire)) {
    const Op::Phase phase = op->phase;
    if (phase == Op::Phase::kPosted || phase == Op::Phase::kVerify) {
      // MPI may still use its buffers: they must outlive the request.
      abandoned_requests = true;
      abandoned.push_back(op);
    }
    op->Complete(absl::FailedPreconditionError(
        absl::StrCat(op->Describe(), ": communicator aborted: ", reason.message())));
  }
  op->Release();
}

void CommState::Abort(const absl::Status& reason) {
  std::vector<std::shared_ptr<Op>> queued;
  {
    std::lock_guard<std::mutex> lock(incoming_mu);
    if (aborted.ok()) aborted = reason.ok() ? absl::AbortedError("aborted") : reason;
    aborting.store(true);
    queued.swap(incoming);
  }
  const absl::Status why = AbortStatus();
  std::lock_guard<std::mutex> lock(mu);
  for (auto& op : queued) Fail(op, why);
  for (auto& op : collectives) Fail(op, why);
  for (auto& op : point_to_point) Fail(op, why);
  collectives.clear();
  point_to_point.clear();
}

// ---- ProgressEngine -------------------------------------------------------------------------

ProgressEngine& ProgressEngine::Get() {
  static ProgressEngine* engine = new ProgressEngine;  // never destroyed: see ~ProgressEngine
  return *engine;
}

ProgressEngine::ProgressEngine() : thread_([this] { Loop(); }) {}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ProgressEngine::Register(const std::shared_ptr<CommState>& state) {
  std::call_once(finalize_hook_, [] {
    int key = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &StopAtFinalize, &key, nullptr) ==
        MPI_SUCCESS) {
      MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
    }
  });
  registered_.store(true);
  std::lock_guard<std::mutex> lock(list_mu_);
  states_.erase(std::remove_if(states_.begin(), states_.end(),
                               [](const Registered& r) { return r.state.expired(); }),
                states_.end());
  states_.push_back({state, state->issued});
}

void ProgressEngine::OperationAdded(bool stepped) {
  if (stepped) stepping_.fetch_add(1);
  // Only a long sleep is cut short: otherwise the engine's thread looks on its own within
  // kStartDelay, or within kWaiterHandoffSleep while this rank's threads wait or keep issuing
  // (a thread that issues work and then computes without waiting should hold
  // Communicator::KeepProgressing, as the runtime does).
  if (pending_.fetch_add(1) == 0 && deep_idle_.load()) {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_.notify_one();
  }
}

void ProgressEngine::KeepProgressing(bool keep) {
  if (!keep) {
    kept_.fetch_sub(1);
    return;
  }
  if (kept_.fetch_add(1) == 0 && deep_idle_.load()) {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_.notify_one();
  }
}

void ProgressEngine::OperationFinished(bool stepped) {
  if (stepped) stepping_.fetch_sub(1);
  pending_.fetch_sub(1);
}

void ProgressEngine::OnFinalize() {
  finalizing_.store(true);
  std::lock_guard<std::mutex> wait_for_progress(progress_mu_);  // the engine is out of MPI
}

void ProgressEngine::Poke() {
  std::unique_lock<std::mutex> progress_lock(progress_mu_, std::try_to_lock);
  if (!progress_lock.owns_lock() || finalizing_.load() || !registered_.load()) return;
  constexpr int kNeverSentTag = 0;  // nothing is ever sent on MPI_COMM_SELF
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, kNeverSentTag, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
}

void ProgressEngine::SleepWhileBusy(std::chrono::microseconds timeout) {
  busy_sleepers_.fetch_add(1);
  {
    std::unique_lock<std::mutex> lock(changed_mu_);
    changed_.wait_for(lock, timeout);
  }
  busy_sleepers_.fetch_sub(1);
}

bool ProgressEngine::TryProgress(bool* busy) {
  std::unique_lock<std::mutex> progress_lock(progress_mu_, std::try_to_lock);
  if (busy != nullptr) *busy = !progress_lock.owns_lock();
  if (!progress_lock.owns_lock() || finalizing_.load()) return false;
  std::vector<std::shared_ptr<CommState>> states;
  {
    std::lock_guard<std::mutex> lock(list_mu_);
    states.reserve(states_.size());
    for (const Registered& registered : states_) {
      if (auto state = registered.state.lock()) states.push_back(std::move(state));
    }
  }
  bool changed = false;
  for (const auto& state : states) changed = state->Advance() || changed;
  if (changed && busy_sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(changed_mu_);
    changed_.notify_all();
  }
  return changed;
}

ProgressEngine::WaiterScope::WaiterScope() { Get().waiters_.fetch_add(1); }
ProgressEngine::WaiterScope::~WaiterScope() { Get().waiters_.fetch_sub(1); }

uint64_t ProgressEngine::IssuedCount() {
  uint64_t issued = 0;
  std::lock_guard<std::mutex> lock(list_mu_);
  for (const Registered& registered : states_) {
    issued += registered.issued->load(std::memory_order_relaxed);
  }
  return issued;
}

void ProgressEngine::Loop() {
  std::unique_lock<std::mutex> lock(wake_mu_);
  // On a core of its own the engine's thread spins between polls like a waiter; on the core of
  // the rank's threads it yields after every poll, which hands the core back whenever they can
  // run (spinning, it kept them off the core: on two ranks bound to a core each, 1-16 MiB
  // all-gather and send/recv ran at 0.87-0.95x MPI's bus bandwidth, 0.96-1.01x with the yield;
  // medians of three alternated runs).
  Backoff backoff(BoundToOneCore() ? 0 : kPollsBeforeYield);
  auto last_active = std::chrono::steady_clock::now() - kLinger;
  bool idle = true;  // no pending operation at the last look
  uint64_t issued_seen = 0;
  std::chrono::microseconds linger_pause = kLingerPause;  // doubles while nothing happens
  while (!stop_) {
    if (pending_.load() <= 0 && kept_.load() <= 0) {
      idle = true;
      // Operations issued since the last look (each calls into MPI): the lingering starts again.
      const uint64_t issued = IssuedCount();
      const bool issuing = issued != issued_seen;
      issued_seen = issued;
      if (issuing) last_active = std::chrono::steady_clock::now();
      const bool lingering = std::chrono::steady_clock::now() - last_active < kLinger;
      if (lingering) {
        // A waiting or issuing thread is inside MPI already: no need to look often (8-byte
        // all-gathers on two ranks woke this thread 4,000 times a second, on the core both of
        // the rank's threads share).
        const bool waiting = waiters_.load() > 0;
        if (waiting || issuing) {
          // An issuing thread may call only MPI_Isend/MPI_Irecv, which need not progress MPI:
          // one poke a look keeps what the rank owes its peers moving meanwhile.
          if (!waiting) {
            lock.unlock();
            Poke();
            lock.lock();
          }
          linger_pause = kLingerPause;
          wake_.wait_for(lock, kWaiterHandoffSleep);
          continue;
        }
        // Nobody calls into MPI: poke, first every kLingerPause, then less and less often (what
        // a rank may owe its peers is owed right after its last operation); past kStartDelay
        // the sleep is cut short by new work, like the idle one.
        lock.unlock();
        Poke();
        lock.lock();
        const bool long_pause = linger_pause > kStartDelay;
        if (long_pause) deep_idle_.store(true);
        if (pending_.load() <= 0 && kept_.load() <= 0 && !stop_) {
          wake_.wait_for(lock, linger_pause);
        }
        if (long_pause) deep_idle_.store(false);
        linger_pause = std::min<std::chrono::microseconds>(2 * linger_pause, kIdleSleep);
        continue;
      }
      lock.unlock();
      Poke();
      lock.lock();
      deep_idle_.store(true);
      if (pending_.load() <= 0 && kept_.load() <= 0 && !stop_) wake_.wait_for(lock, kIdleSleep);
      deep_idle_.store(false);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    linger_pause = kLingerPause;
    if (idle) {
      // Work arrived while idle: give the issuing thread a moment to wait on it (and progress
      // it itself) before competing with it for the core.
      idle = false;
      last_active = now;
      wake_.wait_for(lock, kStartDelay);
      continue;
    }
    last_active = now;
    if (waiters_.load() > 0) {
      wake_.wait_for(lock, kWaiterHandoffSleep);
      continue;
    }
    lock.unlock();
    // Progress kept: MPI is driven on every round, whether or not a request of ours is there
    // to test (with only the operations' own tests, the emulated pipeline on 4 ranks ran
    // 1.037-1.051x its simulation instead of 1.024-1.028x).
    if (kept_.load() > 0) Poke();
    backoff.Pause(TryProgress());
    lock.lock();
  }
}

}  // namespace tandem::comm::mpi_internal
