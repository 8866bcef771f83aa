#include "comm/mpi/mpi_communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/check.h"
#include "comm/internal/work_util.h"
#include "comm/keep_alive.h"
#include "comm/mpi/libnbc_tuning.h"
#include "comm/mpi/mpi_types.h"
#include "comm/mpi/progress_engine.h"
#include "comm/mpi/ring.h"
#include "common/status.h"

namespace tandem::comm {
namespace {

using mpi_internal::CommState;
using mpi_internal::Op;
using mpi_internal::ProgressEngine;

// Tags on the control communicator (user tags only ever travel on the data communicator).
constexpr int kSplitDataTag = 101;
constexpr int kSplitControlTag = 102;
constexpr int kShrinkDataTag = 103;
constexpr int kShrinkControlTag = 104;
constexpr int kLivenessTagBase = 1000;  // + 2 * round + phase
// How long liveness probes may take to leave before their sends are abandoned.
constexpr absl::Duration kSendDrainTime = absl::Milliseconds(100);

// How long a waiter sleeps when another thread is progressing (it is woken earlier when that
// thread completes something).
constexpr std::chrono::microseconds kBusyWaitPause(50);
// A wait reads the clock first after kPollsBeforeClock polls (a few microseconds: the deadline
// starts that much late), then every kPollsPerClockRead polls. A clock read costs as much as a
// poll or two, and an 8-byte operation completes within 10-30 polls: read every 8 polls, the
// clock took a tenth of an 8-byte all-gather's time on two ranks.
constexpr int kPollsBeforeClock = 256;
constexpr int kPollsPerClockRead = 32;

// A Work over an Op: waiting drives progress itself. The Op lives in the same allocation
// (Create): one allocation per operation.
class MpiWork : public Work {
 public:
  // The Work, and its Op sharing its ownership (for the progress side's lists).
  static std::pair<std::shared_ptr<MpiWork>, std::shared_ptr<Op>> Create(
      absl::Duration default_timeout) {
    auto work = std::make_shared<MpiWork>(default_timeout);
    std::shared_ptr<Op> op(work, &work->storage_);
    return {std::move(work), std::move(op)};
  }

  // A waiter-driven operation (Op::waiter_driven): never queued, so it keeps its communicator's
  // state to see an abort, and hands a request still pending at its end to the progress side.
  static std::shared_ptr<MpiWork> CreateWaiterDriven(
      absl::Duration default_timeout, std::shared_ptr<mpi_internal::CommState> state) {
    auto work = std::make_shared<MpiWork>(default_timeout);
    work->state_ = std::move(state);
    work->storage_.waiter_driven = true;
    return work;
  }
  Op& op() { return storage_; }

  explicit MpiWork(absl::Duration default_timeout) : default_timeout_(default_timeout) {}

  ~MpiWork() override {
    if (state_ != nullptr && !op_->done.load(std::memory_order_acquire)) HandOver();
  }

  bool Test() override {
    if (mpi_internal::TryCompleteDirectly(*op_)) return true;
    if (op_->waiter_driven) return FailIfAborted();
    if (ProgressEngine::Get().SteppingPending(/*besides=*/op_->stepped ? 1 : 0) ||
        op_->phase.load(std::memory_order_acquire) != Op::Phase::kPosted) {
      ProgressEngine::Get().TryProgress();
    }
    return op_->done.load(std::memory_order_acquire);
  }

  // Tests this operation's request from the waiting thread (no hand-off to the engine's
  // thread); runs the engine's steps too while some operation needs them (a signature check,
  // a queued collective, a ring step of another operation that the peers may be waiting for).
  absl::Status Wait(absl::Duration timeout) override {
    if (timeout == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_->Describe(), ": refusing to wait forever (pass a finite timeout)"));
    }
    // Often done already (an eager send, a message that arrived): no clock, no waiter count.
    if (!mpi_internal::TryCompleteDirectly(*op_)) {
      // The clock is first read after kPollsBeforeClock polls: most waits end before that.
      std::optional<std::chrono::steady_clock::time_point> deadline;
      int next_clock_read = kPollsBeforeClock;
      ProgressEngine::WaiterScope waiter;
      mpi_internal::Backoff backoff;
      int polls = 0;
      while (!mpi_internal::TryCompleteDirectly(*op_)) {
        bool progressed = false;
        bool busy = false;
        if (op_->waiter_driven) {
          if (FailIfAborted()) break;
        } else if (ProgressEngine::Get().SteppingPending(/*besides=*/op_->stepped ? 1 : 0) ||
                   op_->phase.load(std::memory_order_acquire) != Op::Phase::kPosted) {
          progressed = ProgressEngine::Get().TryProgress(&busy);
          if (op_->done.load(std::memory_order_acquire)) break;
        }
        if (++polls >= next_clock_read) {
          next_clock_read = polls + kPollsPerClockRead;
          const auto now = std::chrono::steady_clock::now();
          if (!deadline.has_value()) {
            // Capped: a saturated duration would overflow the time point.
            deadline = now + absl::ToChronoNanoseconds(std::min(timeout, absl::Hours(1e6)));
          } else if (now >= *deadline) {
            return absl::DeadlineExceededError(absl::StrCat(
                op_->Describe(), " timed out after ", absl::FormatDuration(timeout)));
          }
        }
        if (busy) {
          ProgressEngine::Get().SleepWhileBusy(kBusyWaitPause);
        } else {
          backoff.Pause(progressed);
        }
      }
    }
    return op_->status;
  }

  absl::Status Wait() override { return Wait(default_timeout_); }

  absl::Status error() override {
    if (!op_->done.load(std::memory_order_acquire)) return absl::OkStatus();
    return op_->status;
  }

  std::string Describe() const override { return op_->Describe(); }

 private:
  // A waiter-driven operation of an aborted communicator fails here (the progress side never
  // sees it). True once the operation is done.
  bool FailIfAborted() {
    if (!state_->aborting.load(std::memory_order_acquire)) return false;
    op_->Claim();
    if (!op_->done.load(std::memory_order_acquire)) state_->FailWaiterDriven(*op_);
    op_->Release();
    return true;
  }

  // A waiter-driven operation dropped before it completed (a timed-out wait, a receive nobody
  // waits for): its request goes to the progress side, which completes it (or fails it on an
  // abort) as it does any queued operation.
  void HandOver() {
    auto op = std::make_shared<Op>();
    op->label = op_->label;
    op->collective = false;
    op->expected_count = op_->expected_count;
    op->received_type = op_->received_type;
    op->request = op_->request;
    op->phase.store(Op::Phase::kPosted, std::memory_order_relaxed);
    const absl::Status queued = state_->Enqueue(op, mpi_internal::CommState::NothingToPost,
                                                /*test_at_issue=*/false);
    if (!queued.ok()) state_->Abandon(std::move(op));
  }

  Op storage_;
  Op* const op_ = &storage_;
  absl::Duration default_timeout_;
  std::shared_ptr<mpi_internal::CommState> state_;  // waiter-driven operations only
};

// The Work of a collective run as a tandem algorithm (comm/mpi/ring.h): the algorithm's state
// lives in the same allocation as the Work and its Op (its requests, scratch memory), so the
// operation costs one allocation, and its step function refers to it by a plain pointer.
template <typename Algorithm>
class AlgorithmWork final : public MpiWork {
 public:
  AlgorithmWork(absl::Duration default_timeout, Algorithm&& algorithm)
      : MpiWork(default_timeout), algorithm_(std::move(algorithm)) {}
  Algorithm* algorithm() { return &algorithm_; }

 private:
  Algorithm algorithm_;
};

// An operation that completed successfully when it was issued. One is shared by every such
// operation of a kind (no allocation on the fastest path), so it names the kind only.
class DoneWork final : public Work {
 public:
  explicit DoneWork(const char* name) : name_(name) {}
  bool Test() override { return true; }
  absl::Status Wait(absl::Duration timeout) override {
    if (timeout == absl::InfiniteDuration()) {  // refused like any other operation's
      return absl::InvalidArgumentError(
          absl::StrCat(Describe(), ": refusing to wait forever (pass a finite timeout)"));
    }
    return absl::OkStatus();
  }
  absl::Status Wait() override { return absl::OkStatus(); }
  absl::Status error() override { return absl::OkStatus(); }
  std::string Describe() const override {
    return absl::StrCat(name_, " (completed when issued)");
  }

 private:
  const char* const name_;
};

// An average is a sum divided afterwards: the division, run when the data request completed
// (nothing for the other reductions).
std::function<absl::Status(const MPI_Status&)> AverageAfterSum(ReduceOp op, const Buffer& result,
                                                               int group_size) {
  if (op != ReduceOp::kAverage) return nullptr;
  return [result, group_size](const MPI_Status&) {
    internal::DivideInPlace(result, group_size);
    return absl::OkStatus();
  };
}

}  // namespace

// A small collective posted and tested (PostAndTest) by the issuing thread before anything is
// allocated (see kTestAtIssueMaxBytes): either finished (`finished` set: `done`, shared by every such
// operation of its kind, or an error naming the operation) or posted and pending (`request`,
// unless a multi-step algorithm holds its own requests).
struct mpi_internal::EarlyPost {
  WorkPtr finished;
  bool posted = false;
  MPI_Request request = MPI_REQUEST_NULL;
};

namespace {

using mpi_internal::EarlyPost;

template <typename Post>
EarlyPost PostAndTest(Post& post, absl::FunctionRef<absl::StatusOr<bool>()>* progress,
                      const std::function<absl::Status(const MPI_Status&)>& finish,
                      const mpi_internal::OpLabel& label, const WorkPtr& done, int tests) {
  EarlyPost early;
  absl::Status result;
  bool complete = false;
  if (const int rc = post(&early.request); rc != MPI_SUCCESS) {
    result = TANDEM_MPI_STATUS(rc);
  } else if (progress != nullptr) {
    for (int test = 0; test < tests && result.ok() && !complete; ++test) {
      absl::StatusOr<bool> stepped = (*progress)();
      result = stepped.status();
      complete = stepped.ok() && *stepped;
    }
    // What StepPosted runs after an algorithm's last step (an average's division).
    if (complete && finish) result = finish(MPI_Status{});
  } else {
    for (int test = 0; test < tests && result.ok() && !complete; ++test) {
      int flag = 0;
      MPI_Status mpi_status;
      if (const int rc = MPI_Test(&early.request, &flag, &mpi_status); rc != MPI_SUCCESS) {
        result = TANDEM_MPI_STATUS(rc);
      } else if (flag) {
        complete = true;
        if (finish) result = finish(mpi_status);
      }
    }
  }
  if (!result.ok()) {
    const std::string description = label.Describe();
    early.finished = internal::MakeCompletedWork(
        absl::Status(result.code(), absl::StrCat(description, ": ", result.message())),
        description);
  } else if (complete) {
    early.finished = done;
  } else {
    early.posted = true;
  }
  return early;
}

// Enqueue's post_now: records the request posted early, or posts it now.
template <typename Post>
absl::Status PostNow(Op& o, Post& post, const EarlyPost& early) {
  if (early.posted) {
    o.request = early.request;
  } else if (const int rc = post(&o.request); rc != MPI_SUCCESS) {
    const absl::Status error = TANDEM_MPI_STATUS(rc);
    return absl::Status(error.code(), absl::StrCat(o.Describe(), ": ", error.message()));
  }
  o.phase.store(Op::Phase::kPosted, std::memory_order_relaxed);  // published by Enqueue
  return absl::OkStatus();
}

// The Work of an operation Enqueue refused (`queued`): the communicator was aborted (one posted
// early is kept among the abandoned requests, whose buffers MPI may still use) or posting failed.
WorkPtr RefusedWork(mpi_internal::CommState& state, const std::shared_ptr<Op>& op,
                    const absl::Status& queued, bool posted_early) {
  if (posted_early) state.Abandon(op);
  const bool aborted =
      posted_early || (op->phase != Op::Phase::kPosted && !state.AbortStatus().ok());
  return internal::MakeCompletedWork(
      aborted ? absl::FailedPreconditionError(
                    absl::StrCat(op->Describe(), ": communicator aborted: ", queued.message()))
              : queued,
      op->Describe());
}

absl::Status CheckCpu(const Buffer& buffer, const char* what) {
  TANDEM_RETURN_IF_ERROR(internal::CheckBuffer(buffer, what));
  if (buffer.device.kind != DeviceKind::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mpi backend: ", what, " is a CUDA buffer (device ", buffer.device.index,
        "); the MPI backend takes CPU memory only (use the nccl backend)"));
  }
  if (buffer.count > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("mpi backend: ", what, " has ",
                                                   buffer.count, " elements, more than MPI's int"));
  }
  return absl::OkStatus();
}

// Whether this node runs more ranks than it has cores (Open MPI tells each rank how many
// ranks share its node), in which case spinning waiters would starve each other.
bool PoliteWaits(WaitMode mode) {
  if (mode != WaitMode::kAuto) return mode == WaitMode::kSleep;
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks_here = local_size != nullptr ? std::atoi(local_size) : 1;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());  // online, not bound
  return ranks_here > std::max(1, cores);
}

bool& InitialisedHere() {
  static bool initialised_here = false;
  return initialised_here;
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Waits for `requests` (tested by this thread), up to `deadline`; returns which completed.
std::vector<bool> WaitRequests(std::vector<MPI_Request>& requests, absl::Time deadline) {
  std::vector<bool> completed(requests.size(), false);
  size_t remaining = requests.size();
  mpi_internal::Backoff backoff;
  while (remaining > 0 && absl::Now() < deadline) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (completed[i]) continue;
      int flag = 0;
      if (MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) {
        completed[i] = true;
        --remaining;
      }
    }
    if (remaining > 0) backoff.Pause(false);
  }
  return completed;
}

// Leaves requests that did not complete: receives are cancelled, sends detached.
void AbandonRequests(std::vector<MPI_Request>& requests, const std::vector<bool>& completed,
                     bool receives) {
  for (size_t i = 0; i < requests.size(); ++i) {
    if (completed[i] || requests[i] == MPI_REQUEST_NULL) continue;
    if (receives) MPI_Cancel(&requests[i]);
    MPI_Request_free(&requests[i]);
  }
}

}  // namespace

// ---- Construction -----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::World(
    const CommOptions& options) {
  int initialized = 0;
  TANDEM_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    TANDEM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    InitialisedHere() = true;
    std::atexit(FinalizeAtExit);
  }
  int provided = 0;
  TANDEM_MPI_CHECK(MPI_Query_thread(&provided));
  if (provided < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(
        "mpi backend: MPI was initialised without MPI_THREAD_MULTIPLE (call MPI_Init_thread "
        "with MPI_THREAD_MULTIPLE, or let tandem initialise MPI)");
  }
  return FromMpiComm(MPI_COMM_WORLD, options);
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::World() {
  TANDEM_ASSIGN_OR_RETURN(CommOptions options, CommOptions::FromEnvironment());
  return World(options);
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::FromMpiComm(
    MPI_Comm comm, const CommOptions& options) {
  MPI_Comm data = MPI_COMM_NULL;
  MPI_Comm control = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_dup(comm, &data));
  TANDEM_MPI_CHECK(MPI_Comm_dup(comm, &control));
  return Adopt(data, control, options);
}

namespace {

// The merged intra-communicator of a spawn, wrapped as a communicator (the merged MPI
// communicator itself is freed: the wrapper works on duplicates).
// `inter` is freed unless it is the parent communicator (MPI keeps that one).
absl::StatusOr<std::unique_ptr<MpiCommunicator>> WrapMerged(MPI_Comm inter, bool high,
                                                            const CommOptions& options) {
  MPI_Comm merged = MPI_COMM_NULL;
  const int rc = MPI_Intercomm_merge(inter, high ? 1 : 0, &merged);
  if (!high) MPI_Comm_free(&inter);
  if (rc != MPI_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("MPI_Intercomm_merge failed (error ", rc, ")"));
  }
  MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
  auto wrapped = MpiCommunicator::FromMpiComm(merged, options);
  MPI_Comm_free(&merged);
  return wrapped;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::SpawnAndMerge(
    const std::vector<std::string>& argv, int count) {
  TANDEM_RETURN_IF_ERROR(CheckUsable("spawn"));
  if (argv.empty() || count < 1) {
    return absl::InvalidArgumentError("spawn: a program and at least one process are needed");
  }
  std::vector<std::string> args(argv.begin() + 1, argv.end());
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  arg_ptrs.push_back(nullptr);
  std::string program = argv[0];
  MPI_Comm inter = MPI_COMM_NULL;
  std::vector<int> errors(static_cast<size_t>(count), MPI_SUCCESS);
  // They start in this process's working directory (relative paths in argv stay valid).
  MPI_Info info = MPI_INFO_NULL;
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) != nullptr && MPI_Info_create(&info) == MPI_SUCCESS) {
    MPI_Info_set(info, "wdir", cwd);
  }
  // On the control communicator: it carries no user traffic.
  const int rc = MPI_Comm_spawn(program.data(), arg_ptrs.data(), count, info,
                                /*root=*/0, state_->control, &inter, errors.data());
  if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    return absl::UnavailableError(absl::StrCat("MPI_Comm_spawn of ", count, " process(es) of ",
                                               program, " failed: ",
                                               std::string(text, static_cast<size_t>(length))));
  }
  return WrapMerged(inter, /*high=*/false, options_);
}

bool MpiCommunicator::Spawned() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return false;
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  return parent != MPI_COMM_NULL;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::JoinParents(
    const CommOptions& options) {
  if (!Spawned()) {
    return absl::FailedPreconditionError("this process was not started by a running job");
  }
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
  return WrapMerged(parent, /*high=*/true, options);
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Adopt(
    MPI_Comm data, MPI_Comm control, const CommOptions& options) {
  auto state = std::make_shared<CommState>();
  state->comm = data;
  state->control = control;
  TANDEM_MPI_CHECK(MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN));
  TANDEM_MPI_CHECK(MPI_Comm_set_errhandler(control, MPI_ERRORS_RETURN));
  TANDEM_MPI_CHECK(MPI_Comm_rank(data, &state->rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(data, &state->size));
  auto communicator =
      std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(state), options));
  // Ranks in MPI_COMM_WORLD, for messages and for the elastic layer.
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world_group = MPI_GROUP_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_group(data, &group));
  TANDEM_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  const int size = communicator->size();
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  communicator->world_ranks_.assign(size, -1);
  TANDEM_MPI_CHECK(MPI_Group_translate_ranks(group, size, ranks.data(), world_group,
                                             communicator->world_ranks_.data()));
  for (int& r : communicator->world_ranks_) {
    if (r == MPI_UNDEFINED) r = -1;  // started later, or a parent (SpawnAndMerge)
  }
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  ProgressEngine::Get().set_polite(PoliteWaits(options.wait_mode));
  ProgressEngine::Get().Register(communicator->state_);
  return communicator;
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<CommState> state, const CommOptions& options)
    : state_(std::move(state)), options_(options) {}

MpiCommunicator::~MpiCommunicator() {
  // Pending operations cannot outlive the communicator: fail them (their MPI requests are
  // abandoned, and the MPI communicators then stay allocated).
  if (state_->PendingCount() > 0) {
    state_->Abort(absl::CancelledError("communicator destroyed with operations pending"));
  }
}

std::shared_ptr<void> MpiCommunicator::KeepProgressing() {
  ProgressEngine::Get().KeepProgressing(true);
  return std::shared_ptr<void>(new char, [](char* handle) {
    ProgressEngine::Get().KeepProgressing(false);
    delete handle;
  });
}

int MpiCommunicator::rank() const { return state_->rank; }
int MpiCommunicator::size() const { return state_->size; }
MPI_Comm MpiCommunicator::mpi_comm() const { return state_->comm; }

std::string MpiCommunicator::GroupText() const {
  return absl::StrCat("group of ", size());
}

absl::Status MpiCommunicator::CheckUsable(const char* what) {
  if (!state_->aborting.load(std::memory_order_acquire)) return absl::OkStatus();
  const absl::Status aborted = state_->AbortStatus();
  if (!aborted.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": communicator aborted: ", aborted.message()));
  }
  return absl::OkStatus();
}

// ---- Issuing ------------------------------------------------------------------------------------

WorkPtr MpiCommunicator::IssuePointToPoint(mpi_internal::OpLabel label, bool send,
                                           const Buffer& buffer, MPI_Datatype type, int peer,
                                           int tag) {
  if (static_cast<int64_t>(buffer.bytes()) <= mpi_internal::kTestAtIssueMaxBytes &&
      !state_->aborting.load(std::memory_order_acquire)) {
    return IssueSmallPointToPoint(send, buffer, type, peer, tag, label.sequence);
  }
  state_->NoteIssued();
  // Large (or refused: the communicator was aborted): posted right away by this thread (pairs
  // match in posting order), then handed over. Not tested here: that test drives MPI's
  // progress, which may copy a large arriving message before this thread posts its next
  // operation (see kTestAtIssueMaxBytes).
  MPI_Comm comm = state_->comm;
  const int count = static_cast<int>(buffer.count);
  auto post = [&](MPI_Request* request) {
    return send ? MPI_Isend(buffer.data, count, type, peer, tag, comm, request)
                : MPI_Irecv(buffer.data, count, type, peer, tag, comm, request);
  };
  auto [work, op] = MpiWork::Create(options_.timeout);
  op->label = std::move(label);
  op->collective = false;
  if (!send) {
    op->expected_count = buffer.count;
    op->received_type = type;
  }
  const EarlyPost not_posted;
  const absl::Status queued = state_->Enqueue(
      op, [&](Op& o) { return PostNow(o, post, not_posted); }, /*test_at_issue=*/false);
  if (!queued.ok()) return RefusedWork(*state_, op, queued, /*posted_early=*/false);
  return work;
}

WorkPtr MpiCommunicator::IssueSmallPointToPoint(bool send, const Buffer& buffer,
                                                MPI_Datatype type, int peer, int tag,
                                                int64_t sequence) {
  state_->NoteIssued();
  // Never destroyed; handed out without an owner (an aliasing pointer with no control block),
  // so that the usual outcome costs no reference count on a line every thread shares.
  static DoneWork* const kDone = new DoneWork("send");
  const int count = static_cast<int>(buffer.count);
  MPI_Request request = MPI_REQUEST_NULL;
  absl::Status error;
  if (const int rc = send ? MPI_Isend(buffer.data, count, type, peer, tag, state_->comm, &request)
                          : MPI_Irecv(buffer.data, count, type, peer, tag, state_->comm, &request);
      rc != MPI_SUCCESS) {
    error = TANDEM_MPI_STATUS(rc);
  } else if (send) {
    // Only a send is tested here. A receive is usually posted before its message arrives (an
    // exchange, a pipeline's receives posted ahead): its test found nothing and cost a pass of
    // MPI's progress (8-byte exchange on two ranks: 0.67 -> 0.71 of MPI's rate without it,
    // medians of twelve alternated runs), and on a rank that shares its core Open MPI also
    // yields the core then (4 ranks on 2 cores: 21-30 us -> 8-12 us). A receive whose message is
    // already there gets its Work, done at its first test.
    int flag = 0;
    MPI_Status mpi_status;
    if (const int rc = MPI_Test(&request, &flag, &mpi_status); rc != MPI_SUCCESS) {
      error = TANDEM_MPI_STATUS(rc);
    } else if (flag) {
      return WorkPtr(WorkPtr(), kDone);
    }
  }
  mpi_internal::OpLabel label =
      PointToPointLabel(send ? "send" : "recv", buffer, peer, tag, sequence);
  if (!error.ok()) {
    const std::string description = label.Describe();
    return internal::MakeCompletedWork(
        absl::Status(error.code(), absl::StrCat(description, ": ", error.message())),
        description);
  }
  if (!send) {
    // A pending small receive is never queued: whoever waits on it or tests it completes it.
    // Its message leaves the sender without this rank's help (eager), so the engine's thread
    // has nothing to do for it; counted as pending, it kept that thread polling beside the
    // waiter (and beside the rank's computation, for receives posted long before their message).
    auto work = MpiWork::CreateWaiterDriven(options_.timeout, state_);
    Op& op = work->op();
    op.label = std::move(label);
    op.collective = false;
    op.expected_count = buffer.count;
    op.received_type = type;
    op.request = request;
    op.phase.store(Op::Phase::kPosted, std::memory_order_release);
    return work;
  }
  // A send that did not leave at once (the peer's queue is full): the progress side helps it.
  auto [work, op] = MpiWork::Create(options_.timeout);
  op->label = std::move(label);
  op->collective = false;
  EarlyPost early;
  early.posted = true;
  early.request = request;
  auto posted = [](MPI_Request*) { return MPI_SUCCESS; };  // PostNow only records `early`
  const absl::Status queued = state_->Enqueue(
      op, [&](Op& o) { return PostNow(o, posted, early); }, /*test_at_issue=*/false);
  if (!queued.ok()) return RefusedWork(*state_, op, queued, /*posted_early=*/true);
  return work;
}

MPI_Datatype MpiCommunicator::SmallPointToPointType(const Buffer& buffer, int peer,
                                                    int tag) const {
  // The 16-bit types (created at first use) take the general path.
  if (buffer.device.kind != DeviceKind::kCpu || buffer.count < 0 ||
      buffer.count > mpi_internal::kTestAtIssueMaxBytes ||  // bytes() cannot overflow below
      static_cast<int64_t>(buffer.bytes()) > mpi_internal::kTestAtIssueMaxBytes ||
      (buffer.data == nullptr && buffer.count > 0) || peer < 0 || peer >= state_->size ||
      tag < 0 || state_->aborting.load(std::memory_order_acquire)) {
    return MPI_DATATYPE_NULL;
  }
  return mpi_internal::BuiltinMpiType(buffer.dtype);
}

int MpiCommunicator::TestsAtIssueCount() {
  return ProgressEngine::Get().polite() ? 1 : mpi_internal::kCollectiveTestsAtIssue;
}

bool MpiCommunicator::BeginCollective(mpi_internal::OpLabel& label) {
  state_->NoteIssued();
  label.sequence = collective_sequence_++;
  label.group_size = size();
  return options_.verify_collectives && size() > 1;
}

bool MpiCommunicator::TestsAtIssue(const mpi_internal::OpLabel& label, bool verify) const {
  return !verify &&
         std::max<int64_t>(label.count, 0) * SizeOf(label.dtype) <=
             mpi_internal::kTestAtIssueMaxBytes &&
         !state_->aborting.load(std::memory_order_acquire);
}

const WorkPtr& MpiCommunicator::DoneAtIssue(Kind kind) {
  // Never destroyed, and handed out without an owner (aliasing pointers with no control block,
  // as for point-to-point operations): copying one costs no reference count.
  static const auto* const kDone = new std::array<WorkPtr, 7>{
      nullptr,
      WorkPtr(WorkPtr(), new DoneWork("all_reduce")),
      WorkPtr(WorkPtr(), new DoneWork("reduce_scatter")),
      WorkPtr(WorkPtr(), new DoneWork("all_gather")),
      WorkPtr(WorkPtr(), new DoneWork("broadcast")),
      WorkPtr(WorkPtr(), new DoneWork("barrier")),
      WorkPtr(WorkPtr(), new DoneWork("split"))};
  return (*kDone)[static_cast<size_t>(kind)];
}

template <typename Post>
WorkPtr MpiCommunicator::IssueCollective(Kind kind, mpi_internal::OpLabel label,
                                         int64_t count, DataType dtype, ReduceOp reduce, int root,
                                         Post post,
                                         std::function<absl::Status(const MPI_Status&)> finish,
                                         bool eager_receive) {
  const bool verify = BeginCollective(label);
  const bool test_at_issue = TestsAtIssue(label, verify);
  // Without a signature check this thread posts it now: operations are issued from one thread
  // at a time, so posting order is issue order on every rank. A small one is also tested
  // before anything is allocated (see IssuePointToPoint).
  EarlyPost early;
  if (test_at_issue) {
    early = PostAndTest(post, nullptr, finish, label, DoneAtIssue(kind), TestsAtIssueCount());
    if (early.finished != nullptr) return early.finished;
    if (eager_receive) {
      // Posted, so in issue order already: like a small point-to-point receive, completed by
      // whoever waits on it or tests it, never queued (see IssueSmallPointToPoint).
      auto work = MpiWork::CreateWaiterDriven(options_.timeout, state_);
      Op& op = work->op();
      op.label = std::move(label);
      op.finish = std::move(finish);
      op.request = early.request;
      op.phase.store(Op::Phase::kPosted, std::memory_order_release);
      return work;
    }
  }
  auto [work, op] = MpiWork::Create(options_.timeout);
  return Queue(kind, std::move(label), count, dtype, reduce, root, post, std::move(finish),
               verify, early, std::move(work), std::move(op));
}

template <typename Algorithm>
WorkPtr MpiCommunicator::IssueAlgorithm(Kind kind, mpi_internal::OpLabel label, int64_t count,
                                        DataType dtype, ReduceOp reduce, int root,
                                        std::function<absl::Status(const MPI_Status&)> finish,
                                        Algorithm algorithm) {
  const bool verify = BeginCollective(label);
  const bool test_at_issue = TestsAtIssue(label, verify);
  // An algorithm whose state MPI does not write into (no scratch memory of its own) is posted
  // and tested where it stands, and moved into a Work only if it is still pending: one that
  // completes at once allocates nothing. The others start in their Work.
  std::shared_ptr<AlgorithmWork<Algorithm>> work;
  Algorithm* running = &algorithm;
  if (!Algorithm::kMovableOncePosted || !test_at_issue) {
    work = std::make_shared<AlgorithmWork<Algorithm>>(options_.timeout, std::move(algorithm));
    running = work->algorithm();
  }
  EarlyPost early;
  if (test_at_issue) {
    auto start = [running](MPI_Request*) { return running->Start(); };
    auto step = [running]() { return running->Progress(); };
    absl::FunctionRef<absl::StatusOr<bool>()> progress(step);
    early = PostAndTest(start, &progress, finish, label, DoneAtIssue(kind),
                        TestsAtIssueCount());
    if (early.finished != nullptr) return early.finished;
  }
  if (work == nullptr) {
    work = std::make_shared<AlgorithmWork<Algorithm>>(options_.timeout, std::move(*running));
    running = work->algorithm();
  }
  std::shared_ptr<Op> op(work, &work->op());
  // Plain pointers into the Work: std::function keeps them without allocating.
  op->progress = [running]() { return running->Progress(); };
  auto start = [running](MPI_Request*) { return running->Start(); };
  return Queue(kind, std::move(label), count, dtype, reduce, root, start, std::move(finish),
               verify, early, std::move(work), std::move(op));
}

template <typename Post>
WorkPtr MpiCommunicator::Queue(Kind kind, mpi_internal::OpLabel label, int64_t count,
                               DataType dtype, ReduceOp reduce, int root, Post& post,
                               std::function<absl::Status(const MPI_Status&)> finish,
                               bool verify, const EarlyPost& early, WorkPtr work,
                               std::shared_ptr<mpi_internal::Op> op) {
  op->label = std::move(label);
  op->finish = std::move(finish);
  op->verify = verify;
  if (op->verify) {
    const int64_t fields[mpi_internal::kSignatureFields] = {
        static_cast<int64_t>(kind), count, static_cast<int64_t>(dtype),
        static_cast<int64_t>(reduce), root};
    for (int i = 0; i < mpi_internal::kSignatureFields; ++i) {
      op->signature[i] = fields[i];
      op->signature[mpi_internal::kSignatureFields + i] = -fields[i];
    }
  }
  op->stepped = op->verify || op->progress != nullptr;
  absl::Status queued;
  if (op->verify) {
    // The progress side posts it once the check passed and every earlier collective was posted.
    op->post = std::move(post);
    queued = state_->Enqueue(op);
  } else {
    queued = state_->Enqueue(
        op, [&](Op& o) { return PostNow(o, post, early); }, /*test_at_issue=*/!early.posted);
  }
  if (!queued.ok()) return RefusedWork(*state_, op, queued, early.posted);
  return work;
}

int MpiCommunicator::NextAlgorithmTag() const {
  return mpi_internal::kRingTagBase +
         static_cast<int>(collective_sequence_ % mpi_internal::kRingTagRange);
}

// ---- Point to point -------------------------------------------------------------------------------

absl::StatusOr<MPI_Datatype> MpiCommunicator::CheckPointToPoint(const Buffer& buffer, int peer,
                                                                int tag, const char* what) const {
  TANDEM_RETURN_IF_ERROR(CheckCpu(buffer, what));
  if (peer < 0 || peer >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid peer rank ", peer, " (", GroupText(), ")"));
  }
  if (tag < 0) return absl::InvalidArgumentError("negative tag");
  return mpi_internal::ToMpiType(buffer.dtype);
}

WorkPtr MpiCommunicator::Send(const Buffer& buffer, int peer, int tag) {
  if (MPI_Datatype type = SmallPointToPointType(buffer, peer, tag); type != MPI_DATATYPE_NULL) {
    return IssueSmallPointToPoint(/*send=*/true, buffer, type, peer, tag, p2p_sequence_++);
  }
  mpi_internal::OpLabel label = PointToPointLabel("send", buffer, peer, tag, p2p_sequence_++);
  auto type = CheckPointToPoint(buffer, peer, tag, "send buffer");
  if (!type.ok()) {
    const std::string description = label.Describe();
    return internal::MakeCompletedWork(Annotate(type.status(), description), description);
  }
  return IssuePointToPoint(std::move(label), /*send=*/true, buffer, *type, peer, tag);
}

WorkPtr MpiCommunicator::Recv(const Buffer& buffer, int peer, int tag) {
  if (MPI_Datatype type = SmallPointToPointType(buffer, peer, tag); type != MPI_DATATYPE_NULL) {
    return IssueSmallPointToPoint(/*send=*/false, buffer, type, peer, tag, p2p_sequence_++);
  }
  mpi_internal::OpLabel label = PointToPointLabel("recv", buffer, peer, tag, p2p_sequence_++);
  auto type = CheckPointToPoint(buffer, peer, tag, "receive buffer");
  if (!type.ok()) {
    const std::string description = label.Describe();
    return internal::MakeCompletedWork(Annotate(type.status(), description), description);
  }
  return IssuePointToPoint(std::move(label), /*send=*/false, buffer, *type, peer, tag);
}

mpi_internal::OpLabel MpiCommunicator::PointToPointLabel(const char* name, const Buffer& buffer,
                                                         int peer, int tag, int64_t sequence) {
  mpi_internal::OpLabel label;
  label.name = name;
  label.sequence = sequence;
  label.peer = peer;
  label.tag = tag;
  label.count = buffer.count;
  label.dtype = buffer.dtype;
  return label;
}

mpi_internal::OpLabel MpiCommunicator::CollectiveLabel(const char* name, const Buffer* buffer,
                                                       const char* reduction, int root) const {
  mpi_internal::OpLabel label;
  label.name = name;
  label.group_size = size();
  if (buffer != nullptr) {
    label.count = buffer->count;
    label.dtype = buffer->dtype;
  }
  label.reduction = reduction;
  label.root = root;
  return label;
}

// ---- Collectives ------------------------------------------------------------------------------------

absl::StatusOr<MpiCommunicator::MpiReduction> MpiCommunicator::CheckReduction(
    DataType dtype, ReduceOp op, const char* name) {
  if (op == ReduceOp::kAverage && !internal::IsFloatingPoint(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": average needs a floating-point type, got ", DataTypeName(dtype)));
  }
  TANDEM_RETURN_IF_ERROR(CheckUsable(name));
  TANDEM_ASSIGN_OR_RETURN(MPI_Datatype type, mpi_internal::ToMpiType(dtype));
  TANDEM_ASSIGN_OR_RETURN(MPI_Op mpi_op, mpi_internal::ToMpiOp(op, dtype));
  return MpiReduction{type, mpi_op};
}

WorkPtr MpiCommunicator::AllReduce(const Buffer& buffer, ReduceOp op) {
  mpi_internal::OpLabel label =
      CollectiveLabel("all_reduce", &buffer, internal::ReduceOpName(op), /*root=*/-1);
  absl::Status status = CheckCpu(buffer, "all_reduce buffer");
  absl::StatusOr<MpiReduction> reduction = CheckReduction(buffer.dtype, op, "all_reduce");
  if (status.ok() && !reduction.ok()) status = reduction.status();
  if (!status.ok()) return internal::MakeCompletedWork(status, "all_reduce (" + label.Detail() + ")");
  MPI_Comm comm = state_->comm;
  const MPI_Datatype mpi_type = reduction->type;
  const MPI_Op mpi_reduction = reduction->op;
  const int group_size = size();
  std::function<absl::Status(const MPI_Status&)> finish = AverageAfterSum(op, buffer, group_size);
  const bool power_of_two = group_size > 1 && (group_size & (group_size - 1)) == 0;
  if (power_of_two && buffer.count > 0 &&
      static_cast<int64_t>(buffer.bytes()) < mpi_internal::kSmallAllReduceMaxBytes) {
    return IssueAlgorithm(
        Kind::kAllReduce, std::move(label), buffer.count, buffer.dtype, op, /*root=*/0,
        std::move(finish),
        mpi_internal::RecursiveDoublingAllReduce(state_->control, rank(), group_size,
                                                 NextAlgorithmTag(), mpi_type, mpi_reduction,
                                                 SizeOf(buffer.dtype), buffer.data,
                                                 buffer.count));
  }
  return IssueCollective(
      Kind::kAllReduce, std::move(label), buffer.count, buffer.dtype, op, /*root=*/0,
      [=](MPI_Request* request) {
        mpi_internal::IallreduceAlgorithmScope algorithm(buffer.bytes(), buffer.count, group_size);
        return MPI_Iallreduce(MPI_IN_PLACE, buffer.data, static_cast<int>(buffer.count),
                              mpi_type, mpi_reduction, comm, request);
      },
      std::move(finish));
}

WorkPtr MpiCommunicator::ReduceScatter(const Buffer& input, const Buffer& output, ReduceOp op) {
  mpi_internal::OpLabel label =
      CollectiveLabel("reduce_scatter", &input, internal::ReduceOpName(op), /*root=*/-1);
  absl::Status status = CheckCpu(input, "reduce_scatter input");
  if (status.ok()) status = CheckCpu(output, "reduce_scatter output");
  const ShardRange shard = Shard(input.count, size(), rank());
  if (status.ok() && output.count != shard.count) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "reduce_scatter: output has ", output.count, " elements but rank ", rank(),
        "'s shard of ", input.count, " over ", size(), " ranks has ", shard.count));
  }
  if (status.ok() && input.dtype != output.dtype) {
    status = absl::InvalidArgumentError(absl::StrCat("reduce_scatter: input is ",
                                                     DataTypeName(input.dtype), ", output ",
                                                     DataTypeName(output.dtype)));
  }
  if (status.ok() && internal::Overlaps(input, output)) {
    status = absl::InvalidArgumentError("reduce_scatter: input and output overlap");
  }
  absl::StatusOr<MpiReduction> reduction = CheckReduction(input.dtype, op, "reduce_scatter");
  if (status.ok() && !reduction.ok()) status = reduction.status();
  if (!status.ok()) return internal::MakeCompletedWork(status, "reduce_scatter (" + label.Detail() + ")");
  MPI_Comm comm = state_->comm;
  const MPI_Datatype mpi_type = reduction->type;
  const MPI_Op mpi_reduction = reduction->op;
  const int group_size = size();
  std::function<absl::Status(const MPI_Status&)> finish = AverageAfterSum(op, output, group_size);
  // Open MPI dereferences the buffers even for zero elements on some paths: give it a valid
  // address.
  static char empty_buffer[16];
  void* send = input.count > 0 ? input.data : empty_buffer;
  void* recv = output.count > 0 ? output.data : empty_buffer + 8;
  const bool ring = group_size > 1 && input.count >= group_size &&
                    static_cast<int64_t>(input.bytes()) >= mpi_internal::kRingReduceScatterMinBytes;
  if (!ring && group_size > 1 && group_size <= mpi_internal::kSmallReduceScatterMaxRanks &&
      input.count > 0) {
    return IssueAlgorithm(
        Kind::kReduceScatter, std::move(label), input.count, input.dtype, op, /*root=*/0,
        std::move(finish),
        mpi_internal::DirectReduceScatter(state_->control, rank(), group_size,
                                          NextAlgorithmTag(), mpi_type, mpi_reduction,
                                          SizeOf(input.dtype), input.data, output.data,
                                          input.count));
  }
  if (!ring) {
    auto counts = std::make_shared<std::vector<int>>(size());
    for (int r = 0; r < size(); ++r) {
      (*counts)[r] = static_cast<int>(Shard(input.count, size(), r).count);
    }
    return IssueCollective(
        Kind::kReduceScatter, std::move(label), input.count, input.dtype, op,
        /*root=*/0,
        [=](MPI_Request* request) {
          return MPI_Ireduce_scatter(send, recv, counts->data(), mpi_type, mpi_reduction, comm,
                                     request);
        },
        std::move(finish));
  }
  return IssueAlgorithm(
      Kind::kReduceScatter, std::move(label), input.count, input.dtype, op, /*root=*/0,
      std::move(finish),
      mpi_internal::RingReduceScatter(state_->control, rank(), group_size, NextAlgorithmTag(),
                                      mpi_type, mpi_reduction, SizeOf(input.dtype), input.data,
                                      output.data, input.count));
}

WorkPtr MpiCommunicator::AllGather(const Buffer& input, const Buffer& output) {
  mpi_internal::OpLabel label = CollectiveLabel("all_gather", &output, nullptr, /*root=*/-1);
  absl::Status status = CheckCpu(input, "all_gather input");
  if (status.ok()) status = CheckCpu(output, "all_gather output");
  const ShardRange shard = Shard(output.count, size(), rank());
  if (status.ok() && input.count != shard.count) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "all_gather: input has ", input.count, " elements but rank ", rank(), "'s shard of ",
        output.count, " over ", size(), " ranks has ", shard.count));
  }
  if (status.ok() && input.dtype != output.dtype) {
    status = absl::InvalidArgumentError(absl::StrCat("all_gather: input is ",
                                                     DataTypeName(input.dtype), ", output ",
                                                     DataTypeName(output.dtype)));
  }
  const size_t element = SizeOf(output.dtype);
  const bool in_place = shard.count > 0 &&
                        input.data == static_cast<char*>(output.data) + shard.offset * element;
  if (status.ok() && !in_place && internal::Overlaps(input, output)) {
    status = absl::InvalidArgumentError(
        "all_gather: input overlaps output other than at this rank's shard");
  }
  if (status.ok()) status = CheckUsable("all_gather");
  auto type = mpi_internal::ToMpiType(output.dtype);
  if (status.ok() && !type.ok()) status = type.status();
  if (!status.ok()) return internal::MakeCompletedWork(status, "all_gather (" + label.Detail() + ")");
  MPI_Comm comm = state_->comm;
  const MPI_Datatype mpi_type = *type;
  static char empty_buffer[16];
  void* send = in_place ? MPI_IN_PLACE : (input.count > 0 ? input.data : empty_buffer);
  void* recv = output.count > 0 ? output.data : empty_buffer + 8;
  const int send_count = static_cast<int>(input.count);
  const bool ring = size() > 1 && output.count > 0 &&
                    (size() <= mpi_internal::kDirectAllGatherMaxRanks || static_cast<int64_t>(output.bytes()) >=
                                        mpi_internal::kRingAllGatherMinBytes);
  if (!ring) {
    auto counts = std::make_shared<std::vector<int>>(size());
    auto displacements = std::make_shared<std::vector<int>>(size());
    for (int r = 0; r < size(); ++r) {
      const ShardRange range = Shard(output.count, size(), r);
      (*counts)[r] = static_cast<int>(range.count);
      (*displacements)[r] = static_cast<int>(range.offset);
    }
    return IssueCollective(
        Kind::kAllGather, std::move(label), output.count, output.dtype, ReduceOp::kSum,
        /*root=*/0,
        [=](MPI_Request* request) {
          return MPI_Iallgatherv(send, send_count, mpi_type, recv, counts->data(),
                                 displacements->data(), mpi_type, comm, request);
        },
        nullptr);
  }
  if (size() <= mpi_internal::kDirectAllGatherMaxRanks) {
    return IssueAlgorithm(
        Kind::kAllGather, std::move(label), output.count, output.dtype, ReduceOp::kSum,
        /*root=*/0, nullptr,
        mpi_internal::DirectAllGather(state_->control, rank(), size(), NextAlgorithmTag(),
                                      mpi_type, element, input.data, output.data,
                                      output.count));
  }
  return IssueAlgorithm(
      Kind::kAllGather, std::move(label), output.count, output.dtype, ReduceOp::kSum,
      /*root=*/0, nullptr,
      mpi_internal::RingAllGather(state_->control, rank(), size(), NextAlgorithmTag(), mpi_type,
                                  element, input.data, output.data, output.count));
}

WorkPtr MpiCommunicator::Broadcast(const Buffer& buffer, int root) {
  mpi_internal::OpLabel label = CollectiveLabel("broadcast", &buffer, nullptr, root);
  absl::Status status = CheckCpu(buffer, "broadcast buffer");
  if (status.ok() && (root < 0 || root >= size())) {
    status = absl::InvalidArgumentError(
        absl::StrCat("broadcast: invalid root rank ", root, " (", GroupText(), ")"));
  }
  if (status.ok()) status = CheckUsable("broadcast");
  auto type = mpi_internal::ToMpiType(buffer.dtype);
  if (status.ok() && !type.ok()) status = type.status();
  if (!status.ok()) return internal::MakeCompletedWork(status, "broadcast (" + label.Detail() + ")");
  MPI_Comm comm = state_->comm;
  const MPI_Datatype mpi_type = *type;
  if (size() > 1 && size() <= mpi_internal::kSmallBroadcastMaxRanks && buffer.count > 0 &&
      static_cast<int64_t>(buffer.bytes()) < mpi_internal::kSmallBroadcastMaxBytes) {
    const mpi_internal::BroadcastTree tree(rank(), size(), root);
    if (tree.parent >= 0 && tree.num_children == 0) {
      // A leaf of the tree broadcast: one receive from its parent (what the parent's
      // BinaryTreeBroadcast sends), as a plain request: no algorithm object, tested straight by
      // MPI_Test.
      MPI_Comm control = state_->control;
      const int tag = NextAlgorithmTag();
      void* data = buffer.data;
      const int count = static_cast<int>(buffer.count);
      const int parent = tree.parent;
      return IssueCollective(
          Kind::kBroadcast, std::move(label), buffer.count, buffer.dtype, ReduceOp::kSum, root,
          [=](MPI_Request* request) {
            return MPI_Irecv(data, count, mpi_type, parent, tag, control, request);
          },
          nullptr, /*eager_receive=*/true);
    }
    return IssueAlgorithm(
        Kind::kBroadcast, std::move(label), buffer.count, buffer.dtype, ReduceOp::kSum, root,
        nullptr,
        mpi_internal::BinaryTreeBroadcast(state_->control, rank(), size(), NextAlgorithmTag(),
                                          mpi_type, root, buffer.data, buffer.count));
  }
  return IssueCollective(
      Kind::kBroadcast, std::move(label), buffer.count, buffer.dtype, ReduceOp::kSum, root,
      [=](MPI_Request* request) {
        return MPI_Ibcast(buffer.data, static_cast<int>(buffer.count), mpi_type, root, comm,
                          request);
      },
      nullptr);
}

WorkPtr MpiCommunicator::Barrier() {
  absl::Status status = CheckUsable("barrier");
  if (!status.ok()) return internal::MakeCompletedWork(status, "barrier");
  MPI_Comm comm = state_->comm;
  return IssueCollective(
      Kind::kBarrier, CollectiveLabel("barrier", nullptr, nullptr, /*root=*/-1), 0, DataType::kUInt8, ReduceOp::kSum, 0,
      [=](MPI_Request* request) { return MPI_Ibarrier(comm, request); }, nullptr);
}

// ---- Groups ------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::Split(int color, int key) {
  TANDEM_RETURN_IF_ERROR(CheckUsable("split"));
  // Everyone's (colour, key), gathered with a timeout instead of MPI_Comm_split's unbounded
  // wait, as an ordinary collective (so issue order is kept); the members of each colour then
  // create their communicator among themselves.
  auto mine = std::make_shared<std::vector<int>>(std::vector<int>{color, key});
  auto everyone = std::make_shared<std::vector<int>>(2 * size());
  MPI_Comm comm = state_->comm;
  mpi_internal::OpLabel label = CollectiveLabel("split", nullptr, nullptr, /*root=*/-1);
  label.extra = absl::StrCat("colour ", color, ", key ", key);
  WorkPtr gather = IssueCollective(
      Kind::kSplit, std::move(label), 2 * size(), DataType::kInt32, ReduceOp::kSum, 0,
      [mine, everyone, comm](MPI_Request* request) {
        return MPI_Iallgather(mine->data(), 2, MPI_INT, everyone->data(), 2, MPI_INT, comm,
                              request);
      },
      nullptr);
  const std::vector<int>& all = *everyone;
  TANDEM_RETURN_IF_ERROR(gather->Wait(options_.timeout));
  if (color < 0) return std::unique_ptr<Communicator>();
  std::vector<std::pair<int, int>> members;  // (key, rank)
  for (int r = 0; r < size(); ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& member : members) ranks.push_back(member.second);
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group sub_group = MPI_GROUP_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_group(state_->control, &group));
  TANDEM_MPI_CHECK(MPI_Group_incl(group, static_cast<int>(ranks.size()), ranks.data(), &sub_group));
  MPI_Comm data = MPI_COMM_NULL;
  MPI_Comm control = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_create_group(state_->control, sub_group, kSplitDataTag, &data));
  TANDEM_MPI_CHECK(MPI_Comm_create_group(state_->control, sub_group, kSplitControlTag, &control));
  MPI_Group_free(&sub_group);
  MPI_Group_free(&group);
  TANDEM_ASSIGN_OR_RETURN(auto child, Adopt(data, control, options_));
  return std::unique_ptr<Communicator>(std::move(child));
}

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::Shrink(
    const std::vector<int>& dead_ranks) {
  std::vector<bool> dead(size(), false);
  for (int r : dead_ranks) {
    if (r < 0 || r >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink: invalid dead rank ", r, " (", GroupText(), ")"));
    }
    dead[r] = true;
  }
  if (dead[rank()]) {
    return absl::InvalidArgumentError(
        absl::StrCat("shrink: this rank (", rank(), ") is listed as dead"));
  }
  std::vector<int> survivors;
  for (int r = 0; r < size(); ++r) {
    if (!dead[r]) survivors.push_back(r);
  }
  // Built on the control communicator, which carries no user traffic.
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group survivor_group = MPI_GROUP_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_group(state_->control, &group));
  TANDEM_MPI_CHECK(MPI_Group_incl(group, static_cast<int>(survivors.size()), survivors.data(),
                                  &survivor_group));
  MPI_Comm data = MPI_COMM_NULL;
  MPI_Comm control = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_create_group(state_->control, survivor_group, kShrinkDataTag, &data));
  TANDEM_MPI_CHECK(
      MPI_Comm_create_group(state_->control, survivor_group, kShrinkControlTag, &control));
  MPI_Group_free(&survivor_group);
  MPI_Group_free(&group);
  TANDEM_ASSIGN_OR_RETURN(auto child, Adopt(data, control, options_));
  return std::unique_ptr<Communicator>(std::move(child));
}

absl::StatusOr<std::vector<int>> MpiCommunicator::DetectDeadRanks(absl::Duration timeout) {
  const int n = size();
  const int me = rank();
  const int round = static_cast<int>(liveness_round_++);
  const int probe_tag = kLivenessTagBase + 2 * round;
  const int agree_tag = probe_tag + 1;
  MPI_Comm control = state_->control;
  // Message buffers outlive this call if a request to a dead rank has to be abandoned.
  struct Buffers {
    int my_rank = 0;
    std::vector<int> probes;
    std::vector<uint8_t> my_view;
    std::vector<std::vector<uint8_t>> views;
  };
  auto buffers = std::make_shared<Buffers>();
  buffers->my_rank = me;
  buffers->probes.assign(n, -1);
  bool abandoned = false;
  auto finish_phase = [&](std::vector<MPI_Request>& receives, std::vector<MPI_Request>& sends,
                          absl::Time deadline) {
    std::vector<bool> received = WaitRequests(receives, deadline);
    std::vector<bool> sent = WaitRequests(sends, absl::Now() + kSendDrainTime);
    for (bool done : received) abandoned = abandoned || !done;
    for (bool done : sent) abandoned = abandoned || !done;
    AbandonRequests(receives, received, /*receives=*/true);
    AbandonRequests(sends, sent, /*receives=*/false);
    return received;
  };

  // Phase 1: everyone probes everyone; a rank that does not answer within `timeout` is dead.
  std::vector<MPI_Request> receives, sends;
  std::vector<int> peers;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    peers.push_back(r);
    receives.emplace_back();
    TANDEM_MPI_CHECK(MPI_Irecv(&buffers->probes[r], 1, MPI_INT, r, probe_tag, control,
                               &receives.back()));
    sends.emplace_back();
    TANDEM_MPI_CHECK(
        MPI_Isend(&buffers->my_rank, 1, MPI_INT, r, probe_tag, control, &sends.back()));
  }
  std::vector<bool> answered = finish_phase(receives, sends, absl::Now() + timeout);
  std::vector<uint8_t> dead(n, 0);
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!answered[i]) dead[peers[i]] = 1;
  }

  // Phase 2: the presumed-alive exchange what they saw and take the union, so that every
  // survivor returns the same list when failures are clean (a dead rank stays silent).
  buffers->my_view = dead;
  receives.clear();
  sends.clear();
  peers.clear();
  for (int r = 0; r < n; ++r) {
    if (r != me && !dead[r]) peers.push_back(r);
  }
  buffers->views.assign(peers.size(), std::vector<uint8_t>(n, 0));
  for (size_t i = 0; i < peers.size(); ++i) {
    receives.emplace_back();
    TANDEM_MPI_CHECK(MPI_Irecv(buffers->views[i].data(), n, MPI_UINT8_T, peers[i], agree_tag,
                               control, &receives.back()));
    sends.emplace_back();
    TANDEM_MPI_CHECK(MPI_Isend(buffers->my_view.data(), n, MPI_UINT8_T, peers[i], agree_tag,
                               control, &sends.back()));
  }
  answered = finish_phase(receives, sends, absl::Now() + timeout);
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!answered[i]) {
      dead[peers[i]] = 1;  // died between the phases
      continue;
    }
    for (int r = 0; r < n; ++r) dead[r] |= buffers->views[i][r];
  }
  if (abandoned) KeepAliveAfterAbort(buffers);

  std::vector<int> result;
  for (int r = 0; r < n; ++r) {
    if (dead[r]) result.push_back(r);
  }
  return result;
}

void MpiCommunicator::Abort(const absl::Status& reason) { state_->Abort(reason); }

}  // namespace tandem::comm
