#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/buffer.h"
#include "comm/check.h"
#include "comm/internal/work_util.h"
#include "common/logging.h"
#include "common/status.h"

// NCCL features are detected by CMake from the header and library found (a version number
// does not say which calls a build has: NCCL 2.28.3's header lacks ncclCommRevoke).
#ifndef TANDEM_NCCL_HAS_SHRINK
#define TANDEM_NCCL_HAS_SHRINK 0
#endif
#ifndef TANDEM_NCCL_HAS_REVOKE
#define TANDEM_NCCL_HAS_REVOKE 0
#endif

namespace tandem::comm {
namespace {

// Host-side polling of events and communicator state.
constexpr auto kPollPause = std::chrono::microseconds(20);
constexpr int kSignatureFields = 5;  // operation, count, type, reduction, root

absl::StatusOr<ncclDataType_t> ToNcclType(DataType type) {
  switch (type) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
  }
  return absl::InvalidArgumentError("nccl backend: unknown data type");
}

absl::StatusOr<ncclRedOp_t> ToNcclOp(ReduceOp op, DataType type) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAverage:
      if (!internal::IsFloatingPoint(type)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "nccl backend: average needs a floating-point type, got ", DataTypeName(type)));
      }
      return ncclAvg;
  }
  return absl::InvalidArgumentError("nccl backend: unknown reduction");
}

// Polls a non-blocking communicator until its pending call finished (ncclInProgress gone).
absl::Status WaitUntilReady(ncclComm_t comm, absl::Time deadline, const std::string& what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    TANDEM_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return absl::Status(state == ncclRemoteError ? absl::StatusCode::kUnavailable
                                                   : absl::StatusCode::kInternal,
                          absl::StrCat(what, ": NCCL error: ", ncclGetErrorString(state)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": NCCL call still in progress"));
    }
    std::this_thread::sleep_for(kPollPause);
  }
}


// Polls until a non-blocking call on `comm` (a revocation) is no longer in progress, or the
// deadline passes; errors are left to the caller's next call.
void WaitWhileInProgress(ncclComm_t comm, absl::Time deadline) {
  ncclResult_t state = ncclInProgress;
  while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
         absl::Now() < deadline) {
    std::this_thread::sleep_for(kPollPause);
  }
}

// One enqueued operation: done when every event of `done` fires (one per stream it was
// enqueued on: the communicator's, or point-to-point links').
struct WorkState {
  std::string description;
  std::vector<cudaEvent_t> done;
  absl::Time issued;
  std::atomic<bool> finished{false};
  std::mutex mu;
  absl::Status status ABSL_GUARDED_BY(mu);
  bool reported_stuck = false;  // watchdog only

  void Finish(absl::Status result) {
    std::lock_guard<std::mutex> lock(mu);
    if (finished.load()) return;
    status = std::move(result);
    finished.store(true);
  }
  absl::Status Result() {
    std::lock_guard<std::mutex> lock(mu);
    return status;
  }
  ~WorkState() {
    for (cudaEvent_t event : done) cudaEventDestroy(event);
  }
};

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  int device = 0;
  int rank = 0;
  int size = 0;
  std::vector<int> world_ranks;
  std::unique_ptr<Communicator> cpu;  // companion over the same ranks
  CommOptions options;
  cudaStream_t stream = nullptr;
  cudaStream_t caller = nullptr;
  int* scratch = nullptr;  // device int for Barrier
  int64_t collective_sequence = 0;
  int64_t p2p_sequence = 0;
  // Channel cap where ranks share the GPU (NCCL's multi-rank mode); 0: NCCL's default.
  int max_ctas = 0;
  int ranks_per_gpu = 1;  // the most ranks of this communicator on one GPU
  // Point-to-point links (ConnectPeers): a two-rank communicator (the sender is its rank 0)
  // and a stream for each ordered pair (sender, receiver) of this group's ranks that this rank
  // belongs to. Written once by ConnectPeers (under mu), then read by the issuing thread.
  struct Link {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };
  std::map<std::pair<int, int>, Link> links;
  bool peers_connected = false;

  std::mutex mu;
  absl::Status aborted ABSL_GUARDED_BY(mu);
  bool revoked ABSL_GUARDED_BY(mu) = false;
  std::vector<std::weak_ptr<WorkState>> pending ABSL_GUARDED_BY(mu);

  std::mutex watchdog_mu;
  std::condition_variable watchdog_wake;
  bool stop_watchdog ABSL_GUARDED_BY(watchdog_mu) = false;
  std::thread watchdog;

  ~State();
  absl::Status Usable(const std::string& what);
  void AbortLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Watch();
  void StartWatchdog() { watchdog = std::thread([this] { Watch(); }); }
};

namespace {

// Non-blocking communicators, with the channel cap of a shared GPU.
ncclConfig_t Config(const NcclCommunicator::State& state) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  if (state.max_ctas > 0) config.maxCTAs = state.max_ctas;
  return config;
}

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::State> comm, std::shared_ptr<WorkState> state)
      : comm_(std::move(comm)), state_(std::move(state)) {}

  bool Test() override {
    if (state_->finished.load()) return true;
    cudaError_t query = cudaSuccess;
    for (cudaEvent_t event : state_->done) {
      query = cudaEventQuery(event);
      if (query != cudaSuccess) break;
    }
    if (query == cudaSuccess) {
      state_->Finish(absl::OkStatus());
      return true;
    }
    if (query != cudaErrorNotReady) {
      state_->Finish(absl::InternalError(absl::StrCat(state_->description, ": CUDA error: ",
                                                      cudaGetErrorString(query))));
      return true;
    }
    {
      std::lock_guard<std::mutex> lock(comm_->mu);
      if (!comm_->aborted.ok()) {
        state_->Finish(absl::FailedPreconditionError(absl::StrCat(
            state_->description, ": communicator aborted: ", comm_->aborted.message())));
        return true;
      }
    }
    return false;
  }

  absl::Status Wait(absl::Duration timeout) override {
    if (timeout == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          state_->description, ": refusing to wait forever (pass a finite timeout)"));
    }
    const absl::Time deadline = absl::Now() + timeout;
    while (!Test()) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            state_->description, " timed out after ", absl::FormatDuration(timeout)));
      }
      std::this_thread::sleep_for(kPollPause);
    }
    return state_->Result();
  }

  absl::Status Wait() override { return Wait(comm_->options.timeout); }
  absl::Status error() override {
    return state_->finished.load() ? state_->Result() : absl::OkStatus();
  }
  std::string Describe() const override { return state_->description; }
  const std::vector<cudaEvent_t>& done_events() const { return state_->done; }
  int device() const { return comm_->device; }

 private:
  std::shared_ptr<NcclCommunicator::State> comm_;
  std::shared_ptr<WorkState> state_;
};

absl::Status CheckDeviceBuffer(const Buffer& buffer, int device, const char* what) {
  TANDEM_RETURN_IF_ERROR(internal::CheckBuffer(buffer, what));
  if (buffer.device.kind != DeviceKind::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl backend: ", what, " is in CPU memory; the NCCL backend takes CUDA buffers only "
        "(use the mpi backend)"));
  }
  if (buffer.device.index != device) {
    return absl::InvalidArgumentError(absl::StrCat("nccl backend: ", what, " is on CUDA device ",
                                                   buffer.device.index,
                                                   ", the communicator on device ", device));
  }
  return absl::OkStatus();
}

}  // namespace

// ---- State ----------------------------------------------------------------------------------

NcclCommunicator::State::~State() {
  {
    std::lock_guard<std::mutex> lock(watchdog_mu);
    stop_watchdog = true;
  }
  watchdog_wake.notify_all();
  if (watchdog.joinable()) watchdog.join();
  cudaSetDevice(device);
  if (comm != nullptr) {
    bool clean = false, was_revoked = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      clean = aborted.ok();
      was_revoked = revoked;
    }
    if (clean && ncclCommFinalize(comm) != ncclSystemError &&
        WaitUntilReady(comm, absl::Now() + options.timeout, "finalize").ok()) {
      ncclCommDestroy(comm);
    } else {
      // A revoked communicator is safe to destroy once its revocation has finished.
      if (was_revoked) WaitWhileInProgress(comm, absl::Now() + options.timeout);
      ncclCommAbort(comm);
    }
  }
  for (auto& [pair, link] : links) {
    if (link.comm != nullptr) ncclCommAbort(link.comm);  // idle by now; abort never waits
    if (link.stream != nullptr) cudaStreamDestroy(link.stream);
  }
  if (scratch != nullptr) cudaFree(scratch);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

absl::Status NcclCommunicator::State::Usable(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu);
  if (!aborted.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": communicator aborted: ", aborted.message()));
  }
  return absl::OkStatus();
}

void NcclCommunicator::State::AbortLocked(const absl::Status& reason) {
  if (!aborted.ok()) return;
  aborted = reason.ok() ? absl::AbortedError("aborted") : reason;
  for (auto& weak : pending) {
    if (auto work = weak.lock()) {
      work->Finish(absl::FailedPreconditionError(
          absl::StrCat(work->description, ": communicator aborted: ", aborted.message())));
    }
  }
  pending.clear();
  cudaSetDevice(device);
  // Links are only ever shrunk with their communicator: abort them.
  for (auto& [pair, link] : links) {
    if (link.comm != nullptr) ncclCommAbort(link.comm);
    link.comm = nullptr;
  }
#if TANDEM_NCCL_HAS_REVOKE
  // Stops in-flight operations but keeps the communicator for Shrink. A non-blocking
  // communicator answers ncclInProgress while the revocation completes (Shrink waits for it).
  const ncclResult_t revoke = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  if (revoke == ncclSuccess || revoke == ncclInProgress) {
    revoked = true;
    return;
  }
#endif
  ncclCommAbort(comm);
  comm = nullptr;
}

void NcclCommunicator::State::Watch() {
  std::unique_lock<std::mutex> wake_lock(watchdog_mu);
  while (!stop_watchdog) {
    watchdog_wake.wait_for(wake_lock, absl::ToChronoMilliseconds(options.watchdog_interval));
    if (stop_watchdog) break;
    std::lock_guard<std::mutex> lock(mu);
    if (!aborted.ok() || comm == nullptr) continue;
    ncclResult_t state = ncclSuccess;
    ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    auto healthy = [&] {
      return query == ncclSuccess && (state == ncclSuccess || state == ncclInProgress);
    };
    for (auto it = links.begin(); it != links.end() && healthy(); ++it) {
      if (it->second.comm != nullptr) query = ncclCommGetAsyncError(it->second.comm, &state);
    }
    if (query != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      const absl::Status error(
          state == ncclRemoteError ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal,
          absl::StrCat("NCCL watchdog (rank ", rank, " of ", size, "): asynchronous error: ",
                       ncclGetErrorString(query != ncclSuccess ? query : state)));
      TANDEM_LOG(ERROR) << error.message();
      AbortLocked(error);
      continue;
    }
    const absl::Time now = absl::Now();
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const std::weak_ptr<WorkState>& w) {
                                   auto work = w.lock();
                                   return !work || work->finished.load();
                                 }),
                  pending.end());
    for (auto& weak : pending) {
      auto work = weak.lock();
      if (work && !work->reported_stuck && now - work->issued > options.timeout) {
        work->reported_stuck = true;
        TANDEM_LOG(WARNING) << "NCCL watchdog (rank " << rank << " of " << size << "): "
                            << work->description << " pending for more than "
                            << absl::FormatDuration(options.timeout);
      }
    }
  }
}

// ---- Construction ------------------------------------------------------------------------------

int CudaDeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (why != nullptr) {
      *why = absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(rc), ": ",
                          cudaGetErrorString(rc));
    }
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "cudaGetDeviceCount returned 0 devices";
  return count;
}

int NcclRuntimeVersion() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 0;
  return version;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                                     const CommOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto nccl, NcclCommunicator::Create(bootstrap, options));
  return std::unique_ptr<Communicator>(std::move(nccl));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<State> state) : state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() = default;

namespace {

// Stream, scratch and watchdog of a communicator whose ncclComm_t is being initialised.
absl::Status InitDeviceResources(NcclCommunicator::State& state) {
  TANDEM_CUDA_CHECK(cudaSetDevice(state.device));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaMalloc(&state.scratch, sizeof(int)));
  return absl::OkStatus();
}

// Channels (CTAs) a rank may use where `ranks` share its GPU: NCCL's defaults fit two ranks a
// GPU; beyond that every rank's channels compete for the GPU's SMs and memory, and NCCL hangs
// once they are exhausted (its documentation of NCCL_MULTI_RANK_GPU_ENABLE), so fewer a rank.
// 0: NCCL's default. NCCL_MAX_CTAS in the environment overrides this (NCCL reads it last).
int MaxCtasForSharedGpu(int ranks) {
  if (ranks <= 2) return 0;
  return ranks <= 4 ? 2 : 1;
}

// Which ranks of `cpu` share a CUDA device (host name and PCI bus id), and whether NCCL may take
// them (every rank asks SharedGpuOverNccl of its own NCCL and mode; all must allow it). Every
// rank sees the same gathered records, so every rank decides alike. Returns the largest number
// of ranks on one device (1: none shared); FailedPrecondition naming two ranks on one device
// where a rank cannot put them in NCCL's multi-rank mode.
absl::StatusOr<int> RanksPerSharedDevice(Communicator& cpu, int device, SharedGpuMode mode) {
  constexpr int kHost = 96, kBus = 32, kWhy = 160, kRecord = kHost + kBus + 1 + kWhy;
  std::vector<char> mine(kRecord, 0);
  gethostname(mine.data(), kHost - 1);
  TANDEM_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.data() + kHost, kBus - 1, device));
  std::string why;
  absl::StatusOr<bool> allowed = SharedGpuOverNccl(mode, NcclRuntimeVersion(), &why);
  if (!allowed.ok()) why = std::string(allowed.status().message());
  mine[kHost + kBus] = allowed.ok() && *allowed ? 1 : 0;
  std::copy_n(why.data(), std::min<size_t>(why.size(), kWhy - 1), mine.data() + kHost + kBus + 1);
  std::vector<char> all(static_cast<size_t>(kRecord) * cpu.size(), 0);
  TANDEM_RETURN_IF_ERROR(cpu.AllGather(MakeBuffer(mine.data(), kRecord, DataType::kUInt8),
                                       MakeBuffer(all.data(), kRecord * cpu.size(),
                                                  DataType::kUInt8))
                             ->Wait());
  auto device_of = [&](int r) { return std::string(all.data() + r * kRecord, kHost + kBus); };
  int most = 1;
  for (int a = 0; a < cpu.size(); ++a) {
    int sharing = 1;
    for (int b = 0; b < cpu.size(); ++b) {
      if (b == a || device_of(a) != device_of(b)) continue;
      ++sharing;
      const int refusing = all[a * kRecord + kHost + kBus] == 0 ? a
                           : all[b * kRecord + kHost + kBus] == 0 ? b
                                                                    : -1;
      if (refusing < 0) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "nccl backend: ranks ", std::min(a, b), " and ", std::max(a, b),
          " share one CUDA device (PCI ", all.data() + a * kRecord + kHost, " on ",
          all.data() + a * kRecord, ") and rank ", refusing, " cannot put them in one NCCL "
          "communicator: ", all.data() + refusing * kRecord + kHost + kBus + 1,
          " (the runtime then carries device buffers over MPI through pinned host memory)"));
    }
    most = std::max(most, sharing);
  }
  return most;
}

// Turns NCCL's multi-rank mode on in this process where `ranks` share a GPU. NCCL reads the
// variable once, at the first communicator initialisation of a process that checks it, so it
// is set before this process's first communicator over a shared GPU is initialised.
void EnableMultiRankMode(int ranks, int rank, int max_ctas) {
  setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", /*overwrite=*/1);
  static std::once_flag logged;
  if (rank != 0) return;
  std::call_once(logged, [&] {
    TANDEM_LOG(INFO) << "nccl: " << ranks << " ranks share a GPU: NCCL "
                     << NcclVersionName(NcclRuntimeVersion())
                     << "'s multi-rank mode (NCCL_MULTI_RANK_GPU_ENABLE=1"
                     << (max_ctas > 0 ? absl::StrCat(", at most ", max_ctas, " channels a rank")
                                      : std::string())
                     << ")";
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    Communicator& bootstrap, const CommOptions& options) {
  std::string why;
  const int devices = CudaDeviceCount(&why);
  if (devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat("nccl backend: no CUDA device: ", why));
  }
  auto state = std::make_shared<State>();
  state->options = options;
  if (options.cuda_device >= 0) {
    state->device = options.cuda_device;
  } else {
    const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    state->device = (local_rank != nullptr ? std::atoi(local_rank) : bootstrap.rank()) % devices;
  }
  if (state->device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("nccl backend: CUDA device ", state->device,
                                                   " requested, ", devices, " visible"));
  }
  TANDEM_ASSIGN_OR_RETURN(state->cpu, bootstrap.Split(/*color=*/0, /*key=*/bootstrap.rank()));
  state->rank = state->cpu->rank();
  state->size = state->cpu->size();
  state->world_ranks = state->cpu->world_ranks();
  TANDEM_ASSIGN_OR_RETURN(const int sharing,
                          RanksPerSharedDevice(*state->cpu, state->device, options.shared_gpu));
  state->ranks_per_gpu = sharing;
  if (sharing > 1) {
    state->max_ctas = MaxCtasForSharedGpu(sharing);
    EnableMultiRankMode(sharing, state->rank, state->max_ctas);
  }
  TANDEM_RETURN_IF_ERROR(InitDeviceResources(*state));

  ncclUniqueId id;
  if (state->rank == 0) TANDEM_NCCL_CHECK(ncclGetUniqueId(&id));
  TANDEM_RETURN_IF_ERROR(
      state->cpu->Broadcast(MakeBuffer(&id, sizeof(id), DataType::kUInt8), /*root=*/0)->Wait());
  ncclConfig_t config = Config(*state);
  TANDEM_NCCL_CHECK(ncclCommInitRankConfig(&state->comm, state->size, id, state->rank, &config));
  TANDEM_RETURN_IF_ERROR(WaitUntilReady(state->comm, absl::Now() + options.timeout,
                                        absl::StrCat("ncclCommInitRankConfig (rank ", state->rank,
                                                     " of ", state->size, ")")));
  state->StartWatchdog();
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(state)));
}

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return state_->size; }
const std::vector<int>& NcclCommunicator::world_ranks() const { return state_->world_ranks; }
int NcclCommunicator::device() const { return state_->device; }
void* NcclCommunicator::stream() const { return state_->stream; }
void NcclCommunicator::set_caller_stream(void* cuda_stream) {
  state_->caller = static_cast<cudaStream_t>(cuda_stream);
}
void NcclCommunicator::set_timeout(absl::Duration timeout) { state_->options.timeout = timeout; }
absl::Duration NcclCommunicator::timeout() const { return state_->options.timeout; }

absl::Status NcclCommunicator::OrderAfter(const WorkPtr& work, void* cuda_stream) {
  auto* nccl_work = dynamic_cast<NcclWork*>(work.get());
  if (nccl_work == nullptr) return work->Wait();  // finished before enqueueing (an error)
  TANDEM_RETURN_IF_ERROR(work->error());            // failed already (an abort)
  // On the communicator's device: the legacy default stream (nullptr) is the current device's.
  int previous = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&previous));
  TANDEM_CUDA_CHECK(cudaSetDevice(nccl_work->device()));
  cudaError_t waited = cudaSuccess;
  for (cudaEvent_t event : nccl_work->done_events()) {
    waited = cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda_stream), event, 0);
    if (waited != cudaSuccess) break;
  }
  TANDEM_CUDA_CHECK(cudaSetDevice(previous));
  TANDEM_CUDA_CHECK(waited);
  return absl::OkStatus();
}

// ---- Issuing ------------------------------------------------------------------------------------

namespace {

// Orders the communication stream after the caller's, runs `enqueue` (NCCL calls on the
// communication stream), records the completion event.
// NCCL calls on one communicator and stream: `enqueue` issues them.
struct EnqueueTarget {
  ncclComm_t comm;
  cudaStream_t stream;
  std::function<absl::Status()> enqueue;
};

// Orders each target's stream after the caller's, runs its `enqueue`, records a completion
// event on its stream; one Work for all of them.
absl::StatusOr<WorkPtr> EnqueueOn(const std::shared_ptr<NcclCommunicator::State>& state,
                                  const std::string& description,
                                  const std::vector<EnqueueTarget>& targets) {
  std::lock_guard<std::mutex> lock(state->mu);
  if (!state->aborted.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(description, ": communicator aborted: ", state->aborted.message()));
  }
  TANDEM_CUDA_CHECK(cudaSetDevice(state->device));
  cudaEvent_t ready = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  auto release_ready = absl::Cleanup([&] { cudaEventDestroy(ready); });  // once it has fired
  TANDEM_CUDA_CHECK(cudaEventRecord(ready, state->caller));
  auto work = std::make_shared<WorkState>();
  work->description = description;
  work->issued = absl::Now();
  for (const EnqueueTarget& target : targets) {
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(target.stream, ready, 0));
    const absl::Status enqueued = target.enqueue();
    if (!enqueued.ok()) return Annotate(enqueued, description);
    TANDEM_RETURN_IF_ERROR(
        WaitUntilReady(target.comm, absl::Now() + state->options.timeout, description));
    cudaEvent_t done = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    work->done.push_back(done);
    TANDEM_CUDA_CHECK(cudaEventRecord(done, target.stream));
  }
  state->pending.push_back(work);
  return WorkPtr(std::make_shared<NcclWork>(state, std::move(work)));
}

// On the communicator's own stream.
absl::StatusOr<WorkPtr> Enqueue(const std::shared_ptr<NcclCommunicator::State>& state,
                                const std::string& description,
                                const std::function<absl::Status()>& enqueue) {
  return EnqueueOn(state, description, {EnqueueTarget{state->comm, state->stream, enqueue}});
}

WorkPtr ToWork(absl::StatusOr<WorkPtr> result, const std::string& description) {
  if (result.ok()) return *std::move(result);
  return internal::MakeCompletedWork(result.status(), description);
}

}  // namespace

// Checks on the CPU companion that every rank enqueues the same collective.
static absl::Status VerifySignature(NcclCommunicator::State& state, const std::string& what,
                                    const int64_t (&fields)[kSignatureFields]) {
  if (!state.options.verify_collectives || state.size == 1) return absl::OkStatus();
  static const char* const kNames[kSignatureFields] = {"operation", "element count",
                                                       "data type", "reduction", "root"};
  int64_t both[2 * kSignatureFields];
  for (int i = 0; i < kSignatureFields; ++i) {
    both[i] = fields[i];
    both[kSignatureFields + i] = -fields[i];
  }
  TANDEM_RETURN_IF_ERROR(
      state.cpu->AllReduce(CpuBuffer(both, 2 * kSignatureFields), ReduceOp::kMax)->Wait());
  for (int i = 0; i < kSignatureFields; ++i) {
    if (both[i] != -both[kSignatureFields + i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ranks disagree on ", kNames[i], " (this rank ", fields[i], ", min ",
          -both[kSignatureFields + i], ", max ", both[i], ")"));
    }
  }
  return absl::OkStatus();
}

WorkPtr NcclCommunicator::Send(const Buffer& buffer, int peer, int tag) {
  return SendRecvBatch({PointToPoint{PointToPoint::Kind::kSend, buffer, peer, tag}});
}

WorkPtr NcclCommunicator::Recv(const Buffer& buffer, int peer, int tag) {
  return SendRecvBatch({PointToPoint{PointToPoint::Kind::kRecv, buffer, peer, tag}});
}

WorkPtr NcclCommunicator::SendRecvBatch(const std::vector<PointToPoint>& transfers) {
  std::string description = absl::StrCat("send_recv #", state_->p2p_sequence++, " (");
  for (size_t i = 0; i < transfers.size(); ++i) {
    const PointToPoint& t = transfers[i];
    absl::StrAppend(&description, i > 0 ? ", " : "",
                    t.kind == PointToPoint::Kind::kSend ? "send to " : "recv from ", "rank ",
                    t.peer, " ", internal::DescribeBuffer(t.buffer));
  }
  absl::StrAppend(&description, ")");
  for (const PointToPoint& t : transfers) {
    absl::Status status = CheckDeviceBuffer(t.buffer, state_->device, "transfer buffer");
    if (status.ok() && (t.peer < 0 || t.peer >= size())) {
      status = absl::InvalidArgumentError(
          absl::StrCat("invalid peer rank ", t.peer, " (group of ", size(), ")"));
    }
    if (status.ok() && t.tag != 0) {
      status = absl::InvalidArgumentError(
          absl::StrCat("nccl backend: tags are not supported (got tag ", t.tag, "; use 0)"));
    }
    if (!status.ok()) return internal::MakeCompletedWork(Annotate(status, description), description);
  }
  // Each transfer goes on its ordered pair's link where ConnectPeers made one (there this
  // rank is the link's rank 0 when it sends, 1 when it receives), else on the communicator.
  // Every target's transfers form one group.
  struct Routed {
    ncclComm_t comm;
    cudaStream_t stream;
    std::vector<std::pair<const PointToPoint*, int>> transfers;  // with the peer's rank there
  };
  std::vector<Routed> routes;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (const PointToPoint& t : transfers) {
      const bool send = t.kind == PointToPoint::Kind::kSend;
      auto link = state_->links.find(send ? std::make_pair(rank(), t.peer)
                                          : std::make_pair(t.peer, rank()));
      const bool linked = link != state_->links.end() && link->second.comm != nullptr;
      const ncclComm_t comm = linked ? link->second.comm : state_->comm;
      auto route = std::find_if(routes.begin(), routes.end(),
                                [&](const Routed& r) { return r.comm == comm; });
      if (route == routes.end()) {
        routes.push_back({comm, linked ? link->second.stream : state_->stream, {}});
        route = routes.end() - 1;
      }
      route->transfers.push_back({&t, linked ? (send ? 1 : 0) : t.peer});
    }
  }
  std::vector<EnqueueTarget> targets;
  for (const Routed& route : routes) {
    targets.push_back({route.comm, route.stream, [&route]() -> absl::Status {
                         TANDEM_NCCL_CHECK(ncclGroupStart());
                         for (const auto& [t, peer] : route.transfers) {
                           auto type = ToNcclType(t->buffer.dtype);
                           if (!type.ok()) {
                             ncclGroupEnd();
                             return type.status();
                           }
                           const ncclResult_t rc =
                               t->kind == PointToPoint::Kind::kSend
                                   ? ncclSend(t->buffer.data, t->buffer.count, *type, peer,
                                              route.comm, route.stream)
                                   : ncclRecv(t->buffer.data, t->buffer.count, *type, peer,
                                              route.comm, route.stream);
                           if (rc != ncclSuccess && rc != ncclInProgress) {
                             ncclGroupEnd();
                             TANDEM_NCCL_CHECK(rc);
                           }
                         }
                         TANDEM_NCCL_CHECK(ncclGroupEnd());
                         return absl::OkStatus();
                       }});
  }
  return ToWork(EnqueueOn(state_, description, targets), description);
}

namespace {

// One byte over every link, in one group, while every rank is inside ConnectPeers. NCCL sets
// up a pair's transport at its first transfer, and on a non-blocking communicator that setup
// needs the peer inside NCCL on the same link. Issuing waits until a call is enqueued, so two
// ranks whose first calls are sends to each other (Chimera's opposite pipelines, or a 1F1B
// stage's first gradient while its neighbour still sends activations) each waited in their
// own send for the other's receive: a deadlock found on an H200, where NCCL 2.30 lets ranks
// share the GPU. Connected here, later transfers never wait for the peer to be enqueued.
absl::Status ConnectLinks(const std::map<std::pair<int, int>, NcclCommunicator::State::Link>& links,
                          int me, absl::Duration timeout) {
  if (links.empty()) return absl::OkStatus();
  void* bytes = nullptr;
  TANDEM_CUDA_CHECK(cudaMalloc(&bytes, links.size()));
  auto release = absl::Cleanup([&] { cudaFree(bytes); });
  TANDEM_NCCL_CHECK(ncclGroupStart());
  size_t index = 0;
  for (const auto& [edge, link] : links) {
    void* byte = static_cast<uint8_t*>(bytes) + index++;
    // The sender is the link's rank 0.
    const ncclResult_t rc = edge.first == me
                                ? ncclSend(byte, 1, ncclUint8, 1, link.comm, link.stream)
                                : ncclRecv(byte, 1, ncclUint8, 0, link.comm, link.stream);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      ncclGroupEnd();
      TANDEM_NCCL_CHECK(rc);
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (ended != ncclSuccess && ended != ncclInProgress) TANDEM_NCCL_CHECK(ended);
  const absl::Time deadline = absl::Now() + timeout;
  for (const auto& [edge, link] : links) {
    const std::string what = absl::StrCat("first transfer over the link from rank ", edge.first,
                                          " to rank ", edge.second);
    TANDEM_RETURN_IF_ERROR(WaitUntilReady(link.comm, deadline, what));
    while (true) {
      const cudaError_t done = cudaStreamQuery(link.stream);
      if (done == cudaSuccess) break;
      if (done != cudaErrorNotReady) TANDEM_CUDA_CHECK(done);
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": not finished"));
      }
      std::this_thread::sleep_for(kPollPause);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NcclCommunicator::ConnectPeers(const std::vector<int>& peers) {
  State& state = *state_;
  TANDEM_RETURN_IF_ERROR(state.Usable("connect peers"));
  if (!state.options.nccl_pair_links) return absl::OkStatus();  // the same on every rank
  const int n = size(), me = rank();
  // Every rank's peers (one row each, and a last byte marking a bad list), gathered, so that
  // every rank derives the same links and a bad list fails on every rank.
  std::vector<uint8_t> mine(n + 1, 0), all(static_cast<size_t>(n + 1) * n, 0);
  int bad_peer = -1;
  for (int q : peers) {
    if (q < 0 || q >= n) {
      bad_peer = q;
      mine[n] = 1;
    } else if (q != me) {
      mine[q] = 1;
    }
  }
  if (state.peers_connected) mine[n] = 2;
  TANDEM_RETURN_IF_ERROR(state.cpu->AllGather(MakeBuffer(mine.data(), n + 1, DataType::kUInt8),
                                              MakeBuffer(all.data(), (n + 1) * n,
                                                         DataType::kUInt8))
                             ->Wait());
  for (int r = 0; r < n; ++r) {
    const uint8_t flag = all[r * (n + 1) + n];
    if (flag == 0) continue;
    if (flag == 2) {
      return absl::FailedPreconditionError("connect peers: this communicator's links exist");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "connect peers: rank ", r, " lists a peer outside the group of ", n,
        r == me ? absl::StrCat(" (", bad_peer, ")") : std::string()));
  }
  // Both directions of every pair that either end lists, in one order on every rank.
  std::vector<std::pair<int, int>> edges;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      if (all[a * (n + 1) + b] == 0 && all[b * (n + 1) + a] == 0) continue;
      edges.push_back({a, b});
      edges.push_back({b, a});
    }
  }
  if (edges.empty()) return absl::OkStatus();
  std::vector<ncclUniqueId> ids(edges.size());
  if (me == 0) {
    for (ncclUniqueId& id : ids) TANDEM_NCCL_CHECK(ncclGetUniqueId(&id));
  }
  TANDEM_RETURN_IF_ERROR(
      state.cpu
          ->Broadcast(MakeBuffer(ids.data(), static_cast<int64_t>(ids.size() * sizeof(ids[0])),
                                 DataType::kUInt8),
                      /*root=*/0)
          ->Wait());
  TANDEM_CUDA_CHECK(cudaSetDevice(state.device));
  std::map<std::pair<int, int>, State::Link> made;
  auto release = absl::Cleanup([&] {
    for (auto& [pair, link] : made) {
      if (link.comm != nullptr) ncclCommAbort(link.comm);
      if (link.stream != nullptr) cudaStreamDestroy(link.stream);
    }
  });
  for (const auto& edge : edges) {
    if (edge.first != me && edge.second != me) continue;
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&made[edge].stream, cudaStreamNonBlocking));
  }
  // All of this rank's links initialised in one group: none waits for a peer's other links.
  TANDEM_NCCL_CHECK(ncclGroupStart());
  for (size_t i = 0; i < edges.size(); ++i) {
    auto link = made.find(edges[i]);
    if (link == made.end()) continue;
    ncclConfig_t config = Config(state);
    // On a shared GPU every link's channels add to the ranks' own: two suffice for one peer.
    if (state.ranks_per_gpu > 1) {
      config.maxCTAs = std::min(state.max_ctas > 0 ? state.max_ctas : 2, 2);
    }
    const ncclResult_t rc = ncclCommInitRankConfig(&link->second.comm, 2, ids[i],
                                                   edges[i].first == me ? 0 : 1, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      ncclGroupEnd();
      TANDEM_NCCL_CHECK(rc);
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (ended != ncclSuccess && ended != ncclInProgress) TANDEM_NCCL_CHECK(ended);
  for (auto& [edge, link] : made) {
    TANDEM_RETURN_IF_ERROR(WaitUntilReady(
        link.comm, absl::Now() + state.options.timeout,
        absl::StrCat("ncclCommInitRankConfig (link from rank ", edge.first, " to rank ",
                     edge.second, " of ", n, ")")));
  }
  TANDEM_RETURN_IF_ERROR(ConnectLinks(made, me, state.options.timeout));
  std::lock_guard<std::mutex> lock(state.mu);
  state.links = std::move(made);
  made.clear();
  state.peers_connected = true;
  return absl::OkStatus();
}

WorkPtr NcclCommunicator::AllReduce(const Buffer& buffer, ReduceOp op) {
  const std::string description =
      absl::StrCat("all_reduce #", state_->collective_sequence++, " (group of ", size(), ", ",
                   internal::DescribeBuffer(buffer), ", ", internal::ReduceOpName(op), ")");
  absl::Status status = CheckDeviceBuffer(buffer, state_->device, "all_reduce buffer");
  auto type = ToNcclType(buffer.dtype);
  auto nccl_op = ToNcclOp(op, buffer.dtype);
  if (status.ok() && !type.ok()) status = type.status();
  if (status.ok() && !nccl_op.ok()) status = nccl_op.status();
  if (status.ok()) status = state_->Usable(description);
  const int64_t signature[kSignatureFields] = {1, buffer.count, static_cast<int64_t>(buffer.dtype),
                                               static_cast<int64_t>(op), 0};
  if (status.ok()) status = VerifySignature(*state_, description, signature);
  if (!status.ok()) return internal::MakeCompletedWork(status, description);
  auto state = state_;
  return ToWork(Enqueue(state_, description,
                        [&]() -> absl::Status {
                          TANDEM_NCCL_CHECK(ncclAllReduce(buffer.data, buffer.data, buffer.count,
                                                          *type, *nccl_op, state->comm,
                                                          state->stream));
                          return absl::OkStatus();
                        }),
                description);
}

WorkPtr NcclCommunicator::ReduceScatter(const Buffer& input, const Buffer& output, ReduceOp op) {
  const std::string description =
      absl::StrCat("reduce_scatter #", state_->collective_sequence++, " (group of ", size(), ", ",
                   internal::DescribeBuffer(input), ", ", internal::ReduceOpName(op), ")");
  absl::Status status = CheckDeviceBuffer(input, state_->device, "reduce_scatter input");
  if (status.ok()) status = CheckDeviceBuffer(output, state_->device, "reduce_scatter output");
  const ShardRange shard = Shard(input.count, size(), rank());
  if (status.ok() && output.count != shard.count) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "reduce_scatter: output has ", output.count, " elements but rank ", rank(),
        "'s shard of ", input.count, " over ", size(), " ranks has ", shard.count));
  }
  if (status.ok() && input.dtype != output.dtype) {
    status = absl::InvalidArgumentError("reduce_scatter: input and output types differ");
  }
  auto type = ToNcclType(input.dtype);
  auto nccl_op = ToNcclOp(op, input.dtype);
  if (status.ok() && !type.ok()) status = type.status();
  if (status.ok() && !nccl_op.ok()) status = nccl_op.status();
  if (status.ok()) status = state_->Usable(description);
  const int64_t signature[kSignatureFields] = {2, input.count, static_cast<int64_t>(input.dtype),
                                               static_cast<int64_t>(op), 0};
  if (status.ok()) status = VerifySignature(*state_, description, signature);
  if (!status.ok()) return internal::MakeCompletedWork(status, description);
  auto state = state_;
  const int n = size();
  const size_t element = SizeOf(input.dtype);
  return ToWork(
      Enqueue(state_, description,
              [&]() -> absl::Status {
                if (input.count % n == 0) {
                  TANDEM_NCCL_CHECK(ncclReduceScatter(input.data, output.data, input.count / n,
                                                      *type, *nccl_op, state->comm,
                                                      state->stream));
                  return absl::OkStatus();
                }
                // Unequal shards: pad every shard to the largest, reduce-scatter, copy back.
                const int64_t chunk = (input.count + n - 1) / n;
                char* staging = nullptr;
                TANDEM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&staging),
                                                  (chunk * n + chunk) * element, state->stream));
                char* padded_out = staging + chunk * n * element;
                TANDEM_CUDA_CHECK(cudaMemsetAsync(staging, 0, chunk * n * element, state->stream));
                for (int r = 0; r < n; ++r) {
                  const ShardRange s = Shard(input.count, n, r);
                  if (s.count == 0) continue;
                  TANDEM_CUDA_CHECK(cudaMemcpyAsync(
                      staging + r * chunk * element,
                      static_cast<const char*>(input.data) + s.offset * element,
                      s.count * element, cudaMemcpyDeviceToDevice, state->stream));
                }
                TANDEM_NCCL_CHECK(ncclReduceScatter(staging, padded_out, chunk, *type, *nccl_op,
                                                    state->comm, state->stream));
                TANDEM_RETURN_IF_ERROR(WaitUntilReady(
                    state->comm, absl::Now() + state->options.timeout, "reduce_scatter"));
                if (shard.count > 0) {
                  TANDEM_CUDA_CHECK(cudaMemcpyAsync(output.data, padded_out,
                                                    shard.count * element,
                                                    cudaMemcpyDeviceToDevice, state->stream));
                }
                TANDEM_CUDA_CHECK(cudaFreeAsync(staging, state->stream));
                return absl::OkStatus();
              }),
      description);
}

WorkPtr NcclCommunicator::AllGather(const Buffer& input, const Buffer& output) {
  const std::string description =
      absl::StrCat("all_gather #", state_->collective_sequence++, " (group of ", size(), ", ",
                   internal::DescribeBuffer(output), ")");
  absl::Status status = CheckDeviceBuffer(input, state_->device, "all_gather input");
  if (status.ok()) status = CheckDeviceBuffer(output, state_->device, "all_gather output");
  const ShardRange shard = Shard(output.count, size(), rank());
  if (status.ok() && input.count != shard.count) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "all_gather: input has ", input.count, " elements but rank ", rank(), "'s shard of ",
        output.count, " over ", size(), " ranks has ", shard.count));
  }
  if (status.ok() && input.dtype != output.dtype) {
    status = absl::InvalidArgumentError("all_gather: input and output types differ");
  }
  auto type = ToNcclType(output.dtype);
  if (status.ok() && !type.ok()) status = type.status();
  if (status.ok()) status = state_->Usable(description);
  const int64_t signature[kSignatureFields] = {3, output.count,
                                               static_cast<int64_t>(output.dtype), 0, 0};
  if (status.ok()) status = VerifySignature(*state_, description, signature);
  if (!status.ok()) return internal::MakeCompletedWork(status, description);
  auto state = state_;
  const int n = size();
  const size_t element = SizeOf(output.dtype);
  return ToWork(
      Enqueue(state_, description,
              [&]() -> absl::Status {
                if (output.count % n == 0) {
                  // NCCL handles input == output + rank * chunk (in place) itself.
                  TANDEM_NCCL_CHECK(ncclAllGather(input.data, output.data, output.count / n,
                                                  *type, state->comm, state->stream));
                  return absl::OkStatus();
                }
                const int64_t chunk = (output.count + n - 1) / n;
                char* staging = nullptr;
                TANDEM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&staging),
                                                  (chunk * n + chunk) * element, state->stream));
                char* padded_in = staging + chunk * n * element;
                if (shard.count > 0) {
                  TANDEM_CUDA_CHECK(cudaMemcpyAsync(padded_in, input.data, shard.count * element,
                                                    cudaMemcpyDeviceToDevice, state->stream));
                }
                TANDEM_NCCL_CHECK(ncclAllGather(padded_in, staging, chunk, *type, state->comm,
                                                state->stream));
                TANDEM_RETURN_IF_ERROR(WaitUntilReady(
                    state->comm, absl::Now() + state->options.timeout, "all_gather"));
                for (int r = 0; r < n; ++r) {
                  const ShardRange s = Shard(output.count, n, r);
                  if (s.count == 0) continue;
                  TANDEM_CUDA_CHECK(cudaMemcpyAsync(
                      static_cast<char*>(output.data) + s.offset * element,
                      staging + r * chunk * element, s.count * element,
                      cudaMemcpyDeviceToDevice, state->stream));
                }
                TANDEM_CUDA_CHECK(cudaFreeAsync(staging, state->stream));
                return absl::OkStatus();
              }),
      description);
}

WorkPtr NcclCommunicator::Broadcast(const Buffer& buffer, int root) {
  const std::string description =
      absl::StrCat("broadcast #", state_->collective_sequence++, " (group of ", size(), ", ",
                   internal::DescribeBuffer(buffer), ", root ", root, ")");
  absl::Status status = CheckDeviceBuffer(buffer, state_->device, "broadcast buffer");
  if (status.ok() && (root < 0 || root >= size())) {
    status = absl::InvalidArgumentError(
        absl::StrCat("broadcast: invalid root rank ", root, " (group of ", size(), ")"));
  }
  auto type = ToNcclType(buffer.dtype);
  if (status.ok() && !type.ok()) status = type.status();
  if (status.ok()) status = state_->Usable(description);
  const int64_t signature[kSignatureFields] = {4, buffer.count, static_cast<int64_t>(buffer.dtype),
                                               0, root};
  if (status.ok()) status = VerifySignature(*state_, description, signature);
  if (!status.ok()) return internal::MakeCompletedWork(status, description);
  auto state = state_;
  return ToWork(Enqueue(state_, description,
                        [&]() -> absl::Status {
                          TANDEM_NCCL_CHECK(ncclBroadcast(buffer.data, buffer.data, buffer.count,
                                                          *type, root, state->comm,
                                                          state->stream));
                          return absl::OkStatus();
                        }),
                description);
}

WorkPtr NcclCommunicator::Barrier() {
  const std::string description = absl::StrCat("barrier #", state_->collective_sequence++,
                                               " (group of ", size(), ")");
  absl::Status status = state_->Usable(description);
  const int64_t signature[kSignatureFields] = {5, 0, 0, 0, 0};
  if (status.ok()) status = VerifySignature(*state_, description, signature);
  if (!status.ok()) return internal::MakeCompletedWork(status, description);
  auto state = state_;
  return ToWork(Enqueue(state_, description,
                        [&]() -> absl::Status {
                          TANDEM_NCCL_CHECK(ncclAllReduce(state->scratch, state->scratch, 1,
                                                          ncclInt32, ncclSum, state->comm,
                                                          state->stream));
                          return absl::OkStatus();
                        }),
                description);
}

// ---- Groups ------------------------------------------------------------------------------------

namespace {

absl::StatusOr<std::shared_ptr<NcclCommunicator::State>> ChildState(
    const NcclCommunicator::State& parent, std::unique_ptr<Communicator> cpu) {
  auto child = std::make_shared<NcclCommunicator::State>();
  child->options = parent.options;
  child->device = parent.device;
  child->caller = parent.caller;
  child->max_ctas = parent.max_ctas;
  child->ranks_per_gpu = parent.ranks_per_gpu;
  child->cpu = std::move(cpu);
  child->rank = child->cpu->rank();
  child->size = child->cpu->size();
  child->world_ranks = child->cpu->world_ranks();
  TANDEM_RETURN_IF_ERROR(InitDeviceResources(*child));
  return child;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Split(int color, int key) {
  TANDEM_RETURN_IF_ERROR(state_->Usable("split"));
  TANDEM_ASSIGN_OR_RETURN(auto cpu, state_->cpu->Split(color, key));
  TANDEM_CUDA_CHECK(cudaSetDevice(state_->device));
  ncclConfig_t config = Config(*state_);
  // NCCL writes the new communicator into `*slot` when its background job ends (as for a
  // shrink, below): the slot stays on the heap if this returns before that.
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  TANDEM_NCCL_CHECK(ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                  slot.get(), &config));
  if (absl::Status ready = WaitUntilReady(state_->comm, absl::Now() + state_->options.timeout,
                                          "ncclCommSplit");
      !ready.ok()) {
    slot.release();  // the job may still write into it
    return ready;
  }
  if (color < 0) return std::unique_ptr<Communicator>();
  const ncclComm_t new_comm = *slot;
  if (new_comm == nullptr) return absl::InternalError("ncclCommSplit gave no communicator");
  TANDEM_RETURN_IF_ERROR(WaitUntilReady(new_comm, absl::Now() + state_->options.timeout,
                                        "ncclCommSplit (new communicator)"));
  TANDEM_ASSIGN_OR_RETURN(auto child, ChildState(*state_, std::move(cpu)));
  child->comm = new_comm;
  child->StartWatchdog();
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(child)));
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Shrink(
    const std::vector<int>& dead_ranks) {
#if TANDEM_NCCL_HAS_SHRINK
  for (int r : dead_ranks) {
    if (r < 0 || r >= size() || r == rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink: invalid dead rank ", r, " (group of ", size(), ", this rank ",
                       rank(), ")"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(auto cpu, state_->cpu->Shrink(dead_ranks));
  bool revoked = false;
  ncclComm_t parent = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    revoked = state_->revoked || !state_->aborted.ok();
    parent = state_->comm;
  }
  if (parent == nullptr) {
    return absl::FailedPreconditionError(
        "shrink: the NCCL communicator was destroyed by an abort (no ncclCommRevoke)");
  }
  TANDEM_CUDA_CHECK(cudaSetDevice(state_->device));
  // A revocation may still be completing (ncclCommRevoke answers ncclInProgress on a
  // non-blocking communicator): the communicator is safe to shrink once it is done.
  if (revoked) WaitWhileInProgress(parent, absl::Now() + state_->options.timeout);
  std::vector<int> exclude = dead_ranks;
  ncclConfig_t config = Config(*state_);
  // On a non-blocking communicator NCCL answers at once and writes the new communicator into
  // `*slot` when its background job finishes (null until then), which the parent's state says:
  // wait for the parent first (as for a split), then for the child. The slot is on the heap
  // and left there if the job outlives the deadline, so a late write lands nowhere harmful.
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  TANDEM_NCCL_CHECK(ncclCommShrink(parent, exclude.data(), static_cast<int>(exclude.size()),
                                   slot.get(), &config,
                                   revoked ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT));
  const absl::Time deadline = absl::Now() + state_->options.timeout;
  // A revoked parent reports its revocation, not success: wait only while it is in progress.
  WaitWhileInProgress(parent, deadline);
  ncclResult_t parent_state = ncclInProgress;
  ncclCommGetAsyncError(parent, &parent_state);
  if (parent_state == ncclInProgress) {
    slot.release();  // the job may still write into it
    return absl::DeadlineExceededError("ncclCommShrink: still in progress");
  }
  const ncclComm_t new_comm = *slot;
  if (new_comm == nullptr) {
    return absl::InternalError(absl::StrCat(
        "ncclCommShrink gave no communicator (the parent's state: ",
        ncclGetErrorString(parent_state), ")"));
  }
  TANDEM_RETURN_IF_ERROR(WaitUntilReady(new_comm, deadline, "ncclCommShrink"));
  TANDEM_ASSIGN_OR_RETURN(auto child, ChildState(*state_, std::move(cpu)));
  child->comm = new_comm;
  child->StartWatchdog();
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(child)));
#else
  return absl::UnimplementedError(absl::StrCat(
      "nccl backend: Shrink needs NCCL >= 2.27 (ncclCommShrink); this build has ", NCCL_MAJOR,
      ".", NCCL_MINOR));
#endif
}

absl::StatusOr<std::vector<int>> NcclCommunicator::DetectDeadRanks(absl::Duration timeout) {
  // The CPU companion has the same ranks; its probes do not depend on the GPU.
  return state_->cpu->DetectDeadRanks(timeout);
}

void NcclCommunicator::Abort(const absl::Status& reason) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->AbortLocked(reason);
}

}  // namespace tandem::comm
