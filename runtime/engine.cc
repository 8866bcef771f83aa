#include "runtime/engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <tuple>

#include <unistd.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "comm/backend.h"
#include "runtime/groups.h"
#include "common/status.h"
#include "pipeline/generators.h"
#include "runtime/checkpoint.h"
#include "runtime/device_ops.h"
#include "runtime/transfer.h"

namespace tandem::runtime {
namespace {

// Tags on the engine's private point-to-point communicator.
constexpr int kTransferTag = 1;  // payloads
constexpr int kGatherTag = 2;
constexpr int kHeaderTag = 4;    // transfer headers (first exchange of each kind)
// torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing.
constexpr double kClipEpsilon = 1e-6;

// Timeline lanes (Chrome-trace threads) of a rank.
enum Lane : int { kComputeLane = 0, kSendLane = 1, kReceiveLane = 2, kSyncLane = 3 };

// A tensor set in flight on this rank, named by the stage that produced it.
struct TensorKey {
  int replica;
  int stage;
  int microbatch;
  bool operator<(const TensorKey& o) const {
    return std::tie(replica, stage, microbatch) < std::tie(o.replica, o.stage, o.microbatch);
  }
};

std::string KeyText(const TensorKey& k) {
  return absl::StrCat("stage ", k.stage, " micro-batch ", k.microbatch,
                      k.replica != 0 ? absl::StrCat(" replica ", k.replica) : "");
}

const char* CategoryOf(pipeline::ActionType type) {
  switch (type) {
    case pipeline::ActionType::kForward: return "forward";
    case pipeline::ActionType::kBackward: return "backward";
    case pipeline::ActionType::kBackwardInput: return "backward_input";
    case pipeline::ActionType::kBackwardWeight: return "backward_weight";
    case pipeline::ActionType::kSendActivation:
    case pipeline::ActionType::kSendGradient: return "send";
    case pipeline::ActionType::kRecvActivation:
    case pipeline::ActionType::kRecvGradient: return "receive";
    case pipeline::ActionType::kGradientSync: return "sync";
    case pipeline::ActionType::kOptimizerStep: return "optimizer";
  }
  return "other";
}

Lane LaneOf(pipeline::ActionType type) {
  if (pipeline::IsCompute(type)) return kComputeLane;
  switch (type) {
    case pipeline::ActionType::kSendActivation:
    case pipeline::ActionType::kSendGradient: return kSendLane;
    case pipeline::ActionType::kRecvActivation:
    case pipeline::ActionType::kRecvGradient: return kReceiveLane;
    default: return kSyncLane;
  }
}

comm::Buffer DoubleBuffer(double* data, int64_t count) {
  comm::Buffer b;
  b.data = data;
  b.count = count;
  b.dtype = comm::DataType::kFloat64;
  return b;
}

// Every rank learns whether any rank failed a local step; the failing ranks keep their own
// error, the others get Aborted naming the lowest failing rank. Collective over `world`.
absl::Status AgreeOnSuccess(comm::Communicator* world, const absl::Status& local,
                            absl::string_view what) {
  double failed_rank = local.ok() ? static_cast<double>(INT_MAX) : world->rank();
  absl::Status s = world->AllReduce(DoubleBuffer(&failed_rank, 1), comm::ReduceOp::kMin)->Wait();
  if (!local.ok()) return local;
  if (!s.ok()) return Annotate(s, absl::StrCat("agreeing on ", what));
  if (failed_rank != static_cast<double>(INT_MAX)) {
    return absl::AbortedError(absl::StrCat("rank ", static_cast<int>(failed_rank), " failed ",
                                           what, " (see its error)"));
  }
  return absl::OkStatus();
}

// Sends a string to `peer` / receives one from `peer` (size first, then bytes).
absl::Status SendString(comm::Communicator& comm, int peer, const std::string& text) {
  int64_t size = static_cast<int64_t>(text.size());
  comm::Buffer size_buffer;
  size_buffer.data = &size;
  size_buffer.count = 1;
  size_buffer.dtype = comm::DataType::kInt64;
  TANDEM_RETURN_IF_ERROR(comm.Send(size_buffer, peer, kGatherTag)->Wait());
  comm::Buffer bytes;
  bytes.data = const_cast<char*>(text.data());
  bytes.count = size;
  bytes.dtype = comm::DataType::kUInt8;
  return comm.Send(bytes, peer, kGatherTag)->Wait();
}

absl::StatusOr<std::string> ReceiveString(comm::Communicator& comm, int peer) {
  int64_t size = 0;
  comm::Buffer size_buffer;
  size_buffer.data = &size;
  size_buffer.count = 1;
  size_buffer.dtype = comm::DataType::kInt64;
  TANDEM_RETURN_IF_ERROR(comm.Recv(size_buffer, peer, kGatherTag)->Wait());
  std::string text(static_cast<size_t>(size), '\0');
  comm::Buffer bytes;
  bytes.data = text.data();
  bytes.count = size;
  bytes.dtype = comm::DataType::kUInt8;
  TANDEM_RETURN_IF_ERROR(comm.Recv(bytes, peer, kGatherTag)->Wait());
  return text;
}

// Strings of all ranks on rank 0 (index = rank); empty elsewhere. Collective.
absl::StatusOr<std::vector<std::string>> GatherStrings(comm::Communicator& comm,
                                                       const std::string& mine) {
  std::vector<std::string> all;
  if (comm.rank() != 0) {
    TANDEM_RETURN_IF_ERROR(SendString(comm, 0, mine));
    return all;
  }
  all.resize(comm.size());
  all[0] = mine;
  for (int r = 1; r < comm.size(); ++r) {
    TANDEM_ASSIGN_OR_RETURN(all[r], ReceiveString(comm, r));
  }
  return all;
}

// Whether two ranks of `world` on one host use the same CUDA device (NCCL refuses that).
// Collective: the host names and device indices are gathered on every rank.
absl::StatusOr<bool> AnyDeviceShared(comm::Communicator& world, int device_index) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string mine = absl::StrCat(host, "/", device_index);
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> all, GatherStrings(world, mine));
  // Rank 0 decides and broadcasts.
  double shared = 0;
  if (world.rank() == 0) {
    std::vector<std::string> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    shared = std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ? 1 : 0;
  }
  TANDEM_RETURN_IF_ERROR(world.Broadcast(DoubleBuffer(&shared, 1), /*root=*/0)->Wait());
  return shared != 0;
}

}  // namespace

// A stage this rank runs, with its gradient group and synchroniser.
struct Engine::Local {
  StageSpec spec;
  std::unique_ptr<Stage> impl;
  std::unique_ptr<comm::Communicator> group;  // every copy of this stage
  std::unique_ptr<runtime::GradientSync> sync;
  bool sync_started = false;
  bool parameters_current = false;  // WaitForParameters done since the last step
  // CUDA stages: the gradient group for device buffers (NCCL, or MPI through pinned host
  // staging where ranks share a GPU); null on the CPU, where `group` carries everything.
  std::unique_ptr<comm::Communicator> device_group;
  // Memory operations and optimizer on the stage's device (the stage's, or the CPU loops).
  DeviceOps* ops = nullptr;
  // The stage's parameters, on its device.
  std::vector<ParameterView> parameters;
};

// Tensors produced on this rank and not yet consumed or sent, and sends in flight.
struct Engine::Transfers {
  // Sends still in flight when the engine is destroyed after an error: their memory may yet be
  // read by the communication library, so it is deliberately leaked.
  ~Transfers() {
    if (!sends.empty()) new std::deque<PendingSend>(std::move(sends));
  }

  // Output of stage `key.stage` / gradient of stage `key.stage`'s input, produced here or
  // (still) arriving from a neighbour.
  std::map<TensorKey, ArrivingTensors> activations;
  std::map<TensorKey, ArrivingTensors> gradients;
  std::deque<PendingSend> sends;
  std::unique_ptr<TransferBatcher> batcher;

  // Removes the tensors of `key` and waits for them if they are still arriving.
  absl::StatusOr<std::vector<Tensor>> Take(std::map<TensorKey, ArrivingTensors>& from,
                                           const TensorKey& key, const char* what) {
    auto it = from.find(key);
    if (it == from.end()) {
      return absl::InternalError(absl::StrCat("no ", what, " of ", KeyText(key),
                                              " on this rank (schedule out of order)"));
    }
    ArrivingTensors tensors = std::move(it->second);
    from.erase(it);
    return tensors.Take();
  }
  absl::Status Put(std::map<TensorKey, ArrivingTensors>& into, const TensorKey& key,
                   ArrivingTensors tensors, const char* what) {
    if (!into.emplace(key, std::move(tensors)).second) {
      return absl::InternalError(absl::StrCat(what, " of ", KeyText(key), " produced twice"));
    }
    return absl::OkStatus();
  }
  absl::Status Put(std::map<TensorKey, ArrivingTensors>& into, const TensorKey& key,
                   std::vector<Tensor> tensors, const char* what) {
    return Put(into, key, ArrivingTensors(std::move(tensors)), what);
  }
  // Drops sends that completed; an error if one failed.
  absl::Status Reap() {
    while (!sends.empty()) {
      TANDEM_ASSIGN_OR_RETURN(bool done, sends.front().Test());
      if (!done) break;
      sends.pop_front();
    }
    return absl::OkStatus();
  }
  absl::Status WaitAll() {
    while (!sends.empty()) {
      TANDEM_RETURN_IF_ERROR(sends.front().Wait());
      sends.pop_front();
    }
    return absl::OkStatus();
  }
};

// Failure notices. Every rank keeps one receive posted from every other rank on the control
// communicator; a rank whose engine fails sends its error to all, and a watchdog thread that
// sees a notice aborts this rank's communicators, so waits everywhere end at once with the
// failing rank's message instead of each timing out in turn. A rank that dies without a word
// (killed) is noticed by its neighbours' timeouts, whose notices then reach everyone: every
// survivor fails within about one timeout. At a clean shutdown each rank sends a closing
// notice, which satisfies the posted receives.
namespace {

constexpr int kNoticeBytes = 256;
using NoticeBuffer = std::array<char, kNoticeBytes>;

}  // namespace

struct Engine::Watchdog {
  struct Notice {
    int peer = 0;
    std::shared_ptr<NoticeBuffer> buffer;
    comm::WorkPtr work;
    bool seen = false;
  };
  std::vector<Notice> notices;
  std::thread thread;
  std::mutex mu;
  std::condition_variable wake;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::atomic<bool> failed{false};  // a failure was sent or received: skip the closing
};

namespace {

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

void Engine::StartWatchdog() {
  watchdog_ = std::make_unique<Watchdog>();
  for (int r = 0; r < control_->size(); ++r) {
    if (r == world_rank_) continue;
    Watchdog::Notice n;
    n.peer = r;
    n.buffer = std::make_shared<NoticeBuffer>();
    n.work = control_->Recv(NoticeBufferOf(n.buffer.get()), r, kNoticeTag);
    watchdog_->notices.push_back(std::move(n));
  }
  watchdog_->thread = std::thread([this] {
    Watchdog& w = *watchdog_;
    std::unique_lock<std::mutex> lock(w.mu);
    while (!w.stop) {
      w.wake.wait_for(lock, kWatchdogPoll);
      for (Watchdog::Notice& n : w.notices) {
        if (n.seen || !n.work->Test()) continue;
        n.seen = true;
        if (!n.work->error().ok() || (*n.buffer)[0] != kFailureNotice) continue;
        const std::string text(n.buffer->data() + 1);
        w.failed = true;
        AbortCommunicators(absl::AbortedError(absl::StrCat("rank ", n.peer, " failed: ", text)));
      }
    }
  });
}

void Engine::AbortCommunicators(const absl::Status& reason) {
  if (p2p_ != nullptr) p2p_->Abort(reason);
  if (nccl_pipeline_ != nullptr) nccl_pipeline_->Abort(reason);
  for (auto& l : locals_) {
    if (l->group != nullptr) l->group->Abort(reason);
    if (l->device_group != nullptr) l->device_group->Abort(reason);
  }
  if (control_ != nullptr) control_->Abort(reason);
}

void Engine::SendNotices(char kind, const std::string& text) {
  if (control_ == nullptr) return;
  // Freed only when every send completed: a send to a dead rank may stay pending.
  auto* buffer = new NoticeBuffer();
  buffer->fill('\0');
  (*buffer)[0] = kind;
  std::strncpy(buffer->data() + 1, text.c_str(), buffer->size() - 2);
  std::vector<comm::WorkPtr> works;
  for (int r = 0; r < control_->size(); ++r) {
    if (r != world_rank_) works.push_back(control_->Send(NoticeBufferOf(buffer), r, kNoticeTag));
  }
  bool all_sent = true;
  for (const comm::WorkPtr& w : works) all_sent &= w->Wait(kNoticeSendWait).ok();
  if (all_sent) delete buffer;
}

absl::Status Engine::Report(absl::Status status) {
  if (status.ok() || watchdog_ == nullptr) return status;
  if (!watchdog_->failed.exchange(true)) {
    SendNotices(kFailureNotice, std::string(status.message()));
  }
  return status;
}

Engine::~Engine() {
  if (watchdog_ == nullptr) return;
  if (!watchdog_->failed) {
    SendNotices(kClosingNotice, "shutting down");
    const absl::Time deadline = absl::Now() + kClosingWait;
    for (Watchdog::Notice& n : watchdog_->notices) {
      n.work->Wait(std::max(deadline - absl::Now(), absl::Milliseconds(1))).IgnoreError();
    }
  }
  {
    std::lock_guard<std::mutex> lock(watchdog_->mu);
    watchdog_->stop = true;
  }
  watchdog_->wake.notify_all();
  watchdog_->thread.join();
  // Receives still posted (a peer died or never closed) keep their buffers alive.
  for (Watchdog::Notice& n : watchdog_->notices) {
    if (!n.work->Test()) new std::shared_ptr<NoticeBuffer>(n.buffer);
  }
}

absl::StatusOr<IterationResult> Engine::RunIteration() {
  auto result = RunIterationInternal();
  if (!result.ok()) return Report(result.status());
  return result;
}

absl::Status Engine::Flush() { return Report(FlushInternal()); }

absl::Status Engine::SaveCheckpoint(const std::string& dir, const std::string& model) {
  return Report(SaveCheckpointInternal(dir, model));
}

absl::Status Engine::LoadCheckpoint(const std::string& dir, const std::string& model) {
  return Report(LoadCheckpointInternal(dir, model));
}

absl::StatusOr<ChromeTrace> Engine::GatherTimeline() {
  auto trace = GatherTimelineInternal();
  if (!trace.ok()) return Report(trace.status());
  return trace;
}

absl::StatusOr<WorldTimings> Engine::GatherTimings(const std::vector<ActionTiming>& timings) {
  auto gathered = GatherTimingsInternal(timings);
  if (!gathered.ok()) return Report(gathered.status());
  return gathered;
}

double Engine::Now() const { return clock_->NowSeconds() - epoch_; }

Engine::Local* Engine::Find(int replica, int stage) {
  for (auto& l : locals_) {
    if (l->spec.replica == replica && l->spec.stage == stage) return l.get();
  }
  return nullptr;
}

Stage* Engine::stage(int replica, int stage) {
  Local* l = Find(replica, stage);
  return l != nullptr ? l->impl.get() : nullptr;
}

std::vector<LocalStageId> Engine::local_stages() const {
  std::vector<LocalStageId> out;
  for (const auto& l : locals_) out.push_back({l->spec.replica, l->spec.stage});
  return out;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const pipeline::Plan& plan,
                                                       comm::Communicator* world,
                                                       StageFactory factory,
                                                       EngineOptions options) {
  if (world == nullptr) return absl::InvalidArgumentError("engine: no world communicator");
  if (!factory) return absl::InvalidArgumentError("engine: no stage factory");
  std::unique_ptr<Engine> engine(new Engine);
  engine->plan_ = plan;
  engine->options_ = std::move(options);
  engine->clock_ = engine->options_.clock != nullptr ? engine->options_.clock : RealClock::Get();
  engine->world_ = world;
  engine->world_rank_ = world->rank();
  engine->transfers_ = std::make_unique<Transfers>();
  world->set_timeout(engine->options_.timeout);
  TANDEM_RETURN_IF_ERROR(engine->Build(std::move(factory)));
  return engine;
}

absl::Status Engine::Build(StageFactory factory) {
  // The engine's own duplicate of the world: agreements, the loss all-reduce, gathers and
  // failure notices never mix with the caller's traffic, and it can be aborted.
  TANDEM_ASSIGN_OR_RETURN(control_, world_->Split(/*color=*/0, /*key=*/world_rank_));
  control_->set_timeout(options_.timeout);
  // Local checks and stage construction; then every rank agrees before any other collective.
  absl::Status local = [&]() -> absl::Status {
    TANDEM_RETURN_IF_ERROR(Annotate(pipeline::ValidatePlan(plan_, world_->size()),
                                    "the plan does not fit this run"));
    if (!plan_.IsUniform()) {
      return absl::InvalidArgumentError(
          "the plan replicates stages non-uniformly (no data-parallel x pipeline mesh); the "
          "runtime runs mesh plans only");
    }
    if (plan_.tensor_parallel != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the plan uses tensor parallelism of degree ", plan_.tensor_parallel,
          "; the runtime runs tensor_parallel = 1 only"));
    }
    TANDEM_ASSIGN_OR_RETURN(schedule_, pipeline::GenerateSchedule(plan_.schedule));
    bool found = false;
    for (int d = 0; d < plan_.data_parallel && !found; ++d) {
      for (int q = 0; q < plan_.pipeline_parallel; ++q) {
        if (plan_.mesh[d][q] == world_rank_) {
          data_parallel_index_ = d;
          pipeline_position_ = q;
          found = true;
          break;
        }
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", world_rank_, " is not in the plan's mesh"));
    }
    const int num_stages = schedule_.spec.NumStages();
    for (const auto& [replica, stage] : schedule_.placement.StagesOf(pipeline_position_)) {
      auto l = std::make_unique<Local>();
      StageSpec& spec = l->spec;
      spec.data_parallel_index = data_parallel_index_;
      spec.data_parallel = plan_.data_parallel;
      spec.replica = replica;
      spec.stage = stage;
      spec.num_stages = num_stages;
      spec.first_layer = plan_.stages[stage].first_layer;
      spec.end_layer = plan_.stages[stage].end_layer;
      spec.recompute_layers = plan_.stages[stage].recompute_layers;
      spec.num_microbatches = plan_.schedule.num_microbatches;
      spec.microbatch_size = plan_.microbatch_size;
      auto built = factory(spec);
      if (!built.ok()) {
        return Annotate(built.status(),
                        absl::StrCat("building stage ", stage, " replica ", replica));
      }
      l->impl = std::move(built).value();
      if (l->impl == nullptr) {
        return absl::InternalError(absl::StrCat("the stage factory returned null for stage ",
                                                stage));
      }
      locals_.push_back(std::move(l));
    }
    // Blocking collectives over the gradient groups (creation, flushes, state gathers) run in
    // stage order on every rank: a rank holds each stage at most once, so no two ranks can
    // wait for each other in different groups.
    std::sort(locals_.begin(), locals_.end(), [](const auto& a, const auto& b) {
      return a->spec.stage < b->spec.stage;
    });
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(
      AgreeOnSuccess(control_.get(), Annotate(local, absl::StrCat("rank ", world_rank_)),
                     "building the engine"));

  // Collectives: the pipeline group of this data-parallel replica (its ranks are the pipeline
  // positions, so a transfer's peer needs no mapping), one gradient group per stage, and the
  // synchronisers.
  runtime::MeshLayout layout;
  layout.mesh = plan_.mesh;
  layout.placement = schedule_.placement;
  TANDEM_ASSIGN_OR_RETURN(runtime::ProcessGroups groups,
                          runtime::BuildProcessGroups(*control_, layout));
  p2p_ = std::move(groups.pipeline);
  p2p_->set_timeout(options_.timeout);
  for (auto& l : locals_) {
    auto it = groups.gradient.find(l->spec.stage);
    if (it == groups.gradient.end() || it->second == nullptr) {
      return absl::InternalError(absl::StrCat("rank ", world_rank_,
                                              ": no gradient group for stage ", l->spec.stage));
    }
    l->group = std::move(it->second);
    l->group->set_timeout(options_.timeout);
  }
  TANDEM_RETURN_IF_ERROR(ConnectDevices());
  transfers_->batcher =
      std::make_unique<TransferBatcher>(*p2p_, *payload_p2p(), kHeaderTag, kTransferTag);
  local = [&]() -> absl::Status {
    for (auto& l : locals_) {
      // Registered in backward order (the stage lists its parameters in forward order).
      std::vector<runtime::SyncParameter> params;
      for (const ParameterView& v : l->parameters) {
        params.push_back({v.name, v.value, v.grad});
      }
      std::reverse(params.begin(), params.end());
      runtime::GradSyncOptions sync_options;
      sync_options.strategy = options_.grad_sync;
      sync_options.bucket_bytes = options_.bucket_bytes;
      sync_options.optimizer = options_.optimizer;
      sync_options.reduction = runtime::GradientReduction::kSum;
      sync_options.device_ops = l->ops;
      sync_options.host_group = l->group.get();
      comm::Communicator& group = l->device_group != nullptr ? *l->device_group : *l->group;
      auto sync = runtime::GradientSync::Create(group, std::move(params), sync_options);
      if (!sync.ok()) {
        return Annotate(sync.status(), absl::StrCat("gradient sync of stage ", l->spec.stage));
      }
      l->sync = std::move(sync).value();
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(
      AgreeOnSuccess(control_.get(), local, "creating gradient synchronisation"));

  // The timeline's epoch: right after a barrier, so ranks' clocks line up.
  TANDEM_RETURN_IF_ERROR(control_->Barrier()->Wait());
  epoch_ = clock_->NowSeconds();
  StartWatchdog();
  timeline_.NameProcess(world_rank_, absl::StrCat("rank ", world_rank_, " (dp ",
                                                  data_parallel_index_, ", position ",
                                                  pipeline_position_, ")"));
  timeline_.NameThread(world_rank_, kComputeLane, "compute");
  timeline_.NameThread(world_rank_, kSendLane, "send");
  timeline_.NameThread(world_rank_, kReceiveLane, "receive");
  timeline_.NameThread(world_rank_, kSyncLane, "sync");
  return absl::OkStatus();
}

absl::Status Engine::Fail(const absl::Status& status, int step,
                          const pipeline::Action& action) const {
  if (status.ok()) return status;
  return Annotate(status, absl::StrCat("rank ", world_rank_, " iteration ", iteration_,
                                       " step ", step, " (", pipeline::ToString(action), ")"));
}

void Engine::Record(const pipeline::Action& action, double start, double end) {
  if (!options_.record_timeline) return;
  TraceEvent e;
  e.name = pipeline::ToString(action);
  e.category = CategoryOf(action.type);
  e.pid = world_rank_;
  e.tid = LaneOf(action.type);
  e.start_seconds = start;
  e.duration_seconds = end - start;
  e.args = {{"iteration", iteration_},
            {"stage", action.stage},
            {"microbatch", action.microbatch},
            {"replica", action.replica},
            {"type", std::string(pipeline::ActionTypeName(action.type))}};
  timeline_.Add(std::move(e));
}

absl::StatusOr<IterationResult> Engine::RunIterationInternal() {
  IterationResult result;
  result.iteration = iteration_;
  const double start = Now();
  for (auto& l : locals_) {
    absl::Status s = l->impl->BeginIteration(iteration_);
    if (!s.ok()) {
      return Annotate(s, absl::StrCat("rank ", world_rank_, " iteration ", iteration_,
                                      ": beginning stage ", l->spec.stage));
    }
    l->sync_started = false;
  }
  const std::vector<pipeline::Action>& program = schedule_.programs[pipeline_position_];
  result.timings.reserve(program.size());
  for (size_t i = 0; i < program.size();) {
    const pipeline::Action& action = program[i];
    if (pipeline::IsTransfer(action.type)) {
      // A run of consecutive sends and receives goes out as one batch.
      size_t end = i;
      while (end < program.size() && pipeline::IsTransfer(program[end].type)) ++end;
      const double batch_start = Now();
      TANDEM_RETURN_IF_ERROR(Fail(PostTransfers(program, i, end), static_cast<int>(i), action));
      const double batch_end = Now();
      for (size_t k = i; k < end; ++k) {
        result.timings.push_back({program[k], batch_start, batch_end});
        Record(program[k], batch_start, batch_end);
      }
      TANDEM_RETURN_IF_ERROR(Fail(transfers_->Reap(), static_cast<int>(i), action));
      i = end;
      continue;
    }
    // A computation's received inputs are waited for before its clock starts, so waiting is
    // not counted as compute.
    TANDEM_RETURN_IF_ERROR(Fail(WaitForInputs(action), static_cast<int>(i), action));
    const double action_start = Now();
    TANDEM_RETURN_IF_ERROR(Fail(Execute(action, &result), static_cast<int>(i), action));
    const double action_end = Now();
    if (pipeline::IsCompute(action.type)) result.compute_seconds += action_end - action_start;
    result.timings.push_back({action, action_start, action_end});
    Record(action, action_start, action_end);
    TANDEM_RETURN_IF_ERROR(Fail(transfers_->Reap(), static_cast<int>(i), action));
    ++i;
  }
  absl::Status s = transfers_->WaitAll();
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("rank ", world_rank_, " iteration ", iteration_));
  }
  if (!transfers_->activations.empty() || !transfers_->gradients.empty()) {
    return absl::InternalError(absl::StrCat(
        "rank ", world_rank_, " iteration ", iteration_, ": ", transfers_->activations.size(),
        " activations and ", transfers_->gradients.size(),
        " gradients were produced but never used (schedule mismatch)"));
  }
  result.seconds = Now() - start;
  const double capacity = result.seconds * world_->size();
  result.bubble_ratio = capacity > 0 ? 1.0 - result.world_compute_seconds / capacity : 0;
  ++iteration_;
  return result;
}

absl::Status Engine::Execute(const pipeline::Action& action, IterationResult* result) {
  using pipeline::ActionType;
  const TensorKey key{action.replica, action.stage, action.microbatch};
  const int last_stage = schedule_.spec.NumStages() - 1;
  auto local = [&](int replica, int stage) -> absl::StatusOr<Local*> {
    Local* l = Find(replica, stage);
    if (l == nullptr) {
      return absl::InternalError(absl::StrCat("stage ", stage, " replica ", replica,
                                              " is not on this rank"));
    }
    return l;
  };
  switch (action.type) {
    case ActionType::kForward: {
      TANDEM_ASSIGN_OR_RETURN(Local * l, local(action.replica, action.stage));
      TANDEM_RETURN_IF_ERROR(WaitForParameters(l));
      std::vector<Tensor> inputs;
      if (action.stage > 0) {
        TANDEM_ASSIGN_OR_RETURN(
            inputs, transfers_->Take(transfers_->activations,
                                     {action.replica, action.stage - 1, action.microbatch},
                                     "input activation"));
      }
      TANDEM_ASSIGN_OR_RETURN(std::vector<Tensor> outputs,
                              l->impl->Forward(action.microbatch, std::move(inputs)));
      if (action.stage < last_stage) {
        return transfers_->Put(transfers_->activations, key, std::move(outputs), "activation");
      }
      return absl::OkStatus();
    }
    case ActionType::kBackward:
    case ActionType::kBackwardInput: {
      TANDEM_ASSIGN_OR_RETURN(Local * l, local(action.replica, action.stage));
      std::vector<Tensor> output_grads;
      if (action.stage < last_stage) {
        TANDEM_ASSIGN_OR_RETURN(
            output_grads, transfers_->Take(transfers_->gradients,
                                           {action.replica, action.stage + 1, action.microbatch},
                                           "output gradient"));
      }
      auto input_grads = action.type == ActionType::kBackward
                             ? l->impl->Backward(action.microbatch, std::move(output_grads))
                             : l->impl->BackwardInput(action.microbatch, std::move(output_grads));
      if (!input_grads.ok()) return input_grads.status();
      if (action.stage > 0) {
        return transfers_->Put(transfers_->gradients, key, std::move(input_grads).value(),
                               "input gradient");
      }
      return absl::OkStatus();
    }
    case ActionType::kBackwardWeight: {
      TANDEM_ASSIGN_OR_RETURN(Local * l, local(action.replica, action.stage));
      return l->impl->BackwardWeight(action.microbatch);
    }
    case ActionType::kSendActivation:
    case ActionType::kSendGradient:
    case ActionType::kRecvActivation:
    case ActionType::kRecvGradient:
      return absl::InternalError("transfers run as batches (PostTransfers)");
    case ActionType::kGradientSync: {
      TANDEM_ASSIGN_OR_RETURN(Local * l, local(action.replica, action.stage));
      if (l->sync_started) {
        return absl::InternalError("gradient synchronisation started twice");
      }
      l->sync_started = true;
      for (int b = 0; b < l->sync->num_buckets(); ++b) {
        TANDEM_RETURN_IF_ERROR(l->sync->BucketReady(b));
      }
      return absl::OkStatus();
    }
    case ActionType::kOptimizerStep:
      return OptimizerStep(result);
  }
  return absl::InternalError("unknown action type");
}

absl::Status Engine::WaitForInputs(const pipeline::Action& action) {
  using pipeline::ActionType;
  const int last_stage = schedule_.spec.NumStages() - 1;
  std::map<TensorKey, ArrivingTensors>* from = nullptr;
  TensorKey key{action.replica, 0, action.microbatch};
  if (action.type == ActionType::kForward && action.stage > 0) {
    from = &transfers_->activations;
    key.stage = action.stage - 1;
  } else if ((action.type == ActionType::kBackward ||
              action.type == ActionType::kBackwardInput) &&
             action.stage < last_stage) {
    from = &transfers_->gradients;
    key.stage = action.stage + 1;
  }
  if (from == nullptr) return absl::OkStatus();
  auto it = from->find(key);
  return it == from->end() ? absl::OkStatus() : it->second.Wait();
}

absl::Status Engine::PostTransfers(const std::vector<pipeline::Action>& program, size_t begin,
                                   size_t end) {
  using pipeline::ActionType;
  std::vector<OutgoingTransfer> sends;
  std::vector<IncomingTransfer> receives;
  std::vector<std::pair<bool, TensorKey>> destinations;  // per receive: activation?, key
  for (size_t i = begin; i < end; ++i) {
    const pipeline::Action& action = program[i];
    const TensorKey key{action.replica, action.stage, action.microbatch};
    const bool activation = action.type == ActionType::kSendActivation ||
                            action.type == ActionType::kRecvActivation;
    if (action.type == ActionType::kSendActivation || action.type == ActionType::kSendGradient) {
      OutgoingTransfer send;
      send.peer = action.peer;
      send.header.type = action.type;
      send.header.stage = action.stage;
      send.header.microbatch = action.microbatch;
      send.header.replica = action.replica;
      TANDEM_ASSIGN_OR_RETURN(
          send.tensors,
          transfers_->Take(activation ? transfers_->activations : transfers_->gradients, key,
                           activation ? "activation to send" : "gradient to send"));
      sends.push_back(std::move(send));
      continue;
    }
    // The stage that consumes the tensors allocates them.
    const int consumer = activation ? action.stage + 1 : action.stage - 1;
    Local* l = Find(action.replica, consumer);
    if (l == nullptr) {
      return absl::InternalError(absl::StrCat("stage ", consumer, " replica ", action.replica,
                                              " is not on this rank"));
    }
    IncomingTransfer receive;
    receive.peer = action.peer;
    receive.expected.type = activation ? ActionType::kSendActivation : ActionType::kSendGradient;
    receive.expected.stage = action.stage;
    receive.expected.microbatch = action.microbatch;
    receive.expected.replica = action.replica;
    receive.allocate = [l](const TensorMeta& meta) { return l->impl->NewTensor(meta); };
    receives.push_back(std::move(receive));
    destinations.push_back({activation, key});
  }
  TANDEM_ASSIGN_OR_RETURN(TransferBatcher::Posted posted,
                          transfers_->batcher->Post(std::move(sends), std::move(receives)));
  if (posted.sends != nullptr) transfers_->sends.push_back(std::move(*posted.sends));
  for (size_t r = 0; r < destinations.size(); ++r) {
    const auto& [activation, key] = destinations[r];
    TANDEM_RETURN_IF_ERROR(
        transfers_->Put(activation ? transfers_->activations : transfers_->gradients, key,
                        std::move(posted.received[r]), activation ? "activation" : "gradient"));
  }
  return absl::OkStatus();
}

absl::Status Engine::OptimizerStep(IterationResult* result) {
  double local_loss = 0;
  double squared_norm = 0;
  for (auto& l : locals_) {
    if (!l->sync_started) {
      return absl::InternalError(absl::StrCat("optimizer step before the gradient "
                                              "synchronisation of stage ", l->spec.stage));
    }
    TANDEM_RETURN_IF_ERROR(l->sync->FinishBackward());
    squared_norm += l->sync->LocalGradNormSquared();
    if (l->spec.is_last()) local_loss += l->impl->IterationLoss();
  }
  // One all-reduce for the loss, the squared norm and the compute time (bubble estimate).
  double sums[3] = {local_loss, squared_norm, result->compute_seconds};
  TANDEM_RETURN_IF_ERROR(
      Annotate(control_->AllReduce(DoubleBuffer(sums, 3), comm::ReduceOp::kSum)->Wait(),
               "summing loss and gradient norm over the world"));
  result->loss = sums[0];
  result->grad_norm = std::sqrt(std::max(0.0, sums[1]));
  result->world_compute_seconds = sums[2];
  result->clip_coefficient = 1.0;
  if (options_.clip_norm > 0) {
    result->clip_coefficient =
        std::min(1.0, options_.clip_norm / (result->grad_norm + kClipEpsilon));
  }
  result->learning_rate = LearningRateAt(options_.lr_schedule, iteration_);
  for (auto& l : locals_) {
    TANDEM_RETURN_IF_ERROR(l->sync->Step(result->learning_rate, result->clip_coefficient));
    l->parameters_current = false;
  }
  return absl::OkStatus();
}

absl::Status Engine::FlushInternal() {
  for (auto& l : locals_) {
    TANDEM_RETURN_IF_ERROR(Annotate(l->sync->Flush(), absl::StrCat("rank ", world_rank_,
                                                                    ": flushing stage ",
                                                                    l->spec.stage)));
    l->parameters_current = true;
  }
  return absl::OkStatus();
}

namespace {

constexpr char kParameterPrefix[] = "param:";
constexpr char kOptimizerPrefix[] = "optim:";

ShardTensor FloatTensor(const std::string& name, const float* data, int64_t count) {
  ShardTensor t;
  t.name = name;
  t.dtype = comm::DataType::kFloat32;
  t.count = count;
  t.bytes.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(count) * sizeof(float));
  return t;
}

// A float32 buffer on a stage's device, copied to the host.
absl::StatusOr<ShardTensor> DeviceFloatTensor(DeviceOps& ops, const std::string& name,
                                              const comm::Buffer& buffer) {
  std::vector<float> host(static_cast<size_t>(buffer.count));
  TANDEM_RETURN_IF_ERROR(
      ops.CopyToHost(host.data(), static_cast<const float*>(buffer.data), buffer.count));
  return FloatTensor(name, host.data(), buffer.count);
}

nlohmann::json OptimizerJson(const runtime::OptimizerConfig& c) {
  return {{"kind", runtime::OptimizerName(c.kind)}, {"momentum", c.momentum},
          {"weight_decay", c.weight_decay},      {"beta1", c.beta1},
          {"beta2", c.beta2},                    {"eps", c.eps}};
}

}  // namespace

absl::Status Engine::SaveCheckpointInternal(const std::string& dir, const std::string& model) {
  // The folder exists and holds no manifest before any shard is written.
  absl::Status local = absl::OkStatus();
  if (world_rank_ == 0) {
    local = EnsureDirectory(dir);
    if (local.ok()) local = RemoveManifest(dir);
  }
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(control_.get(), local, "preparing the checkpoint folder"));
  TANDEM_RETURN_IF_ERROR(FlushInternal());

  // Every member of a gradient group gathers the stage's optimizer state (collective for
  // DeAR, whose state is sharded); the group's first rank writes the shard.
  nlohmann::json records = nlohmann::json::array();
  local = [&]() -> absl::Status {
    for (auto& l : locals_) {
      TANDEM_ASSIGN_OR_RETURN(std::vector<runtime::ParameterOptimizerState> state,
                              l->sync->GatherOptimizerState());
      if (l->group->rank() != 0) continue;
      CheckpointShard shard;
      shard.stage = l->spec.stage;
      nlohmann::json steps = nlohmann::json::object();
      for (const ParameterView& v : l->parameters) {
        if (v.value.dtype != comm::DataType::kFloat32) {
          return absl::UnimplementedError(absl::StrCat("checkpoint of parameter '", v.name,
                                                       "': only float32 parameters"));
        }
        TANDEM_ASSIGN_OR_RETURN(
            ShardTensor tensor,
            DeviceFloatTensor(*l->ops, absl::StrCat(kParameterPrefix, v.name), v.value));
        shard.tensors.push_back(std::move(tensor));
      }
      for (const runtime::ParameterOptimizerState& p : state) {
        steps[p.name] = p.steps;
        for (const auto& [buffer, values] : p.buffers) {
          shard.tensors.push_back(
              FloatTensor(absl::StrCat(kOptimizerPrefix, p.name, ":", buffer), values.data(),
                          static_cast<int64_t>(values.size())));
        }
      }
      shard.metadata = {{"optimizer_steps", steps}, {"layers", {l->spec.first_layer,
                                                                l->spec.end_layer}}};
      TANDEM_ASSIGN_OR_RETURN(ShardRecord record, WriteShard(dir, shard));
      records.push_back({{"stage", record.stage}, {"part", record.part},
                         {"num_parts", record.num_parts}, {"file", record.file},
                         {"bytes", record.bytes}, {"checksum", record.checksum}});
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(
      control_.get(),
      Annotate(local, absl::StrCat("rank ", world_rank_, ": writing checkpoint shards")),
      "writing checkpoint shards"));

  // Rank 0 writes the manifest last, with every shard's checksum.
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> all, GatherStrings(*control_, records.dump()));
  local = absl::OkStatus();
  if (world_rank_ == 0) {
    CheckpointManifest manifest;
    manifest.model = model;
    manifest.plan = pipeline::ToJson(plan_);
    manifest.step = iteration_;
    manifest.data_position = {{"next_iteration", iteration_}};
    manifest.optimizer = OptimizerJson(options_.optimizer);
    local = [&]() -> absl::Status {
      for (const std::string& text : all) {
        nlohmann::json rank_records = nlohmann::json::parse(text, nullptr, false);
        nlohmann::json wrapper = {{"format_version", kCheckpointFormatVersion}, {"model", model},
                                  {"step", 0}, {"plan", nlohmann::json::object()},
                                  {"shards", rank_records}};
        TANDEM_ASSIGN_OR_RETURN(CheckpointManifest part,
                                ManifestFromJson(wrapper, "gathered shard records"));
        for (ShardRecord& r : part.shards) manifest.shards.push_back(std::move(r));
      }
      std::sort(manifest.shards.begin(), manifest.shards.end(),
                [](const ShardRecord& a, const ShardRecord& b) { return a.stage < b.stage; });
      if (static_cast<int>(manifest.shards.size()) != schedule_.spec.NumStages()) {
        return absl::InternalError(absl::StrCat("checkpoint has ", manifest.shards.size(),
                                                " shards for ", schedule_.spec.NumStages(),
                                                " stages"));
      }
      return WriteManifest(dir, manifest);
    }();
  }
  return AgreeOnSuccess(control_.get(), local, "writing the checkpoint manifest");
}

absl::Status Engine::LoadCheckpointInternal(const std::string& dir, const std::string& model) {
  int64_t step = 0;
  std::vector<std::vector<runtime::ParameterOptimizerState>> states(locals_.size());
  absl::Status local = [&]() -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadManifest(dir));
    if (manifest.model != model) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": the checkpoint is of model '",
                                                     manifest.model, "', this run trains '",
                                                     model, "'"));
    }
    auto saved_plan = pipeline::PlanFromJson(manifest.plan, absl::StrCat(dir, ": plan"));
    if (!saved_plan.ok()) return saved_plan.status();
    if (saved_plan->stages.size() != plan_.stages.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": the checkpoint has ", saved_plan->stages.size(), " stages, this plan ",
          plan_.stages.size()));
    }
    for (size_t s = 0; s < plan_.stages.size(); ++s) {
      const auto& a = saved_plan->stages[s];
      const auto& b = plan_.stages[s];
      if (a.first_layer != b.first_layer || a.end_layer != b.end_layer) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, ": stage ", s, " holds layers [", a.first_layer, ", ", a.end_layer,
            ") in the checkpoint but [", b.first_layer, ", ", b.end_layer, ") in this plan"));
      }
    }
    const std::string saved_optimizer = manifest.optimizer.value("kind", "");
    if (saved_optimizer != runtime::OptimizerName(options_.optimizer.kind)) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": the checkpoint's optimizer is '", saved_optimizer, "', this run uses '",
          runtime::OptimizerName(options_.optimizer.kind), "'"));
    }
    step = manifest.step;
    for (size_t i = 0; i < locals_.size(); ++i) {
      Local& l = *locals_[i];
      const ShardRecord* record = manifest.FindShard(l.spec.stage, 0);
      if (record == nullptr) {
        return absl::NotFoundError(absl::StrCat(dir, ": the manifest lists no shard of stage ",
                                                l.spec.stage));
      }
      TANDEM_ASSIGN_OR_RETURN(CheckpointShard shard, ReadShard(dir, *record));
      const std::string where = absl::StrCat(dir, "/", record->file);
      for (const ParameterView& v : l.parameters) {
        const ShardTensor* t = shard.Find(absl::StrCat(kParameterPrefix, v.name));
        if (t == nullptr || t->count != v.value.count ||
            t->dtype != comm::DataType::kFloat32) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": parameter '", v.name, "' is missing or has another size (",
              t == nullptr ? 0 : t->count, " vs ", v.value.count, ")"));
        }
        std::vector<float> host(static_cast<size_t>(t->count));
        std::memcpy(host.data(), t->bytes.data(), t->bytes.size());
        TANDEM_RETURN_IF_ERROR(
            l.ops->CopyFromHost(static_cast<float*>(v.value.data), host.data(), t->count));
      }
      const nlohmann::json steps = shard.metadata.value("optimizer_steps",
                                                        nlohmann::json::object());
      std::vector<runtime::ParameterOptimizerState>& state = states[i];
      const std::vector<ParameterView>& params = l.parameters;
      for (auto it = params.rbegin(); it != params.rend(); ++it) {  // registration order
        runtime::ParameterOptimizerState p;
        p.name = it->name;
        p.steps = steps.value(it->name, int64_t{0});
        const std::string prefix = absl::StrCat(kOptimizerPrefix, it->name, ":");
        for (const ShardTensor& t : shard.tensors) {
          if (t.name.rfind(prefix, 0) != 0) continue;
          std::vector<float> values(static_cast<size_t>(t.count));
          std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
          p.buffers.emplace_back(t.name.substr(prefix.size()), std::move(values));
        }
        state.push_back(std::move(p));
      }
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(
      control_.get(), Annotate(local, absl::StrCat("rank ", world_rank_, ": loading checkpoint")),
      "loading the checkpoint"));
  local = [&]() -> absl::Status {
    for (size_t i = 0; i < locals_.size(); ++i) {
      TANDEM_RETURN_IF_ERROR(locals_[i]->sync->LoadOptimizerState(states[i]));
      locals_[i]->parameters_current = true;
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(control_.get(), local, "loading optimizer state"));
  iteration_ = step;
  return absl::OkStatus();
}

absl::Status Engine::ConnectDevices() {
  // Whether this rank's stages live on a CUDA device; every rank must agree.
  int cuda_stages = 0;
  for (auto& l : locals_) {
    if (l->impl->device().kind == comm::DeviceKind::kCuda) ++cuda_stages;
  }
  double flags[2] = {cuda_stages > 0 ? 1.0 : 0.0, cuda_stages > 0 ? 0.0 : 1.0};
  TANDEM_RETURN_IF_ERROR(
      control_->AllReduce(DoubleBuffer(flags, 2), comm::ReduceOp::kMax)->Wait());
  const bool any_cuda = flags[0] > 0;
  const bool any_cpu = flags[1] > 0;
  absl::Status local = absl::OkStatus();
  if (cuda_stages > 0 && cuda_stages != static_cast<int>(locals_.size())) {
    local = absl::InvalidArgumentError(absl::StrCat(
        "rank ", world_rank_, " holds stages on both the CPU and a CUDA device"));
  } else if (any_cuda && any_cpu) {
    local = absl::InvalidArgumentError(
        "some ranks run their stages on CUDA devices and others on the CPU; the runtime needs "
        "one kind of device for the whole job");
  }
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(control_.get(), local, "checking stage devices"));
  local = [&]() -> absl::Status {
    for (auto& l : locals_) {
      l->parameters = l->impl->Parameters();
      l->ops = l->impl->device_ops();
      if (l->ops == nullptr) {
        if (l->impl->device().kind != comm::DeviceKind::kCpu) {
          return absl::InvalidArgumentError(absl::StrCat(
              "stage ", l->spec.stage, " is on a CUDA device but brings no device operations "
              "(Stage::device_ops)"));
        }
        l->ops = &DefaultCpuDeviceOps();
      }
      if (l->ops->device() != l->impl->device()) {
        return absl::InvalidArgumentError(absl::StrCat("stage ", l->spec.stage,
                                                       ": its device operations (", l->ops->name(),
                                                       ") are for another device"));
      }
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(
      control_.get(), Annotate(local, absl::StrCat("rank ", world_rank_)), "preparing devices"));
  if (!any_cuda) return absl::OkStatus();

  // CUDA stages: payloads and gradient synchronisation on device buffers, headers and
  // agreements on MPI. With a GPU per rank NCCL carries the device buffers; NCCL refuses ranks
  // that share a GPU, so then MPI carries them through pinned host staging.
  const int device_index = locals_.empty() ? -1 : locals_[0]->impl->device().index;
  TANDEM_ASSIGN_OR_RETURN(const bool shared, AnyDeviceShared(*control_, device_index));
  comm::CommOptions comm_options;
  comm_options.timeout = options_.timeout;
  runtime::MeshLayout layout;
  layout.mesh = plan_.mesh;
  layout.placement = schedule_.placement;
  if (!shared) {
    TANDEM_ASSIGN_OR_RETURN(nccl_world_, comm::CreateNcclCommunicator(*control_, comm_options));
    TANDEM_ASSIGN_OR_RETURN(runtime::ProcessGroups groups,
                            runtime::BuildProcessGroups(*nccl_world_, layout));
    nccl_pipeline_ = std::move(groups.pipeline);
    for (auto& l : locals_) l->device_group = std::move(groups.gradient[l->spec.stage]);
  } else {
    if (world_rank_ == 0) {
      TANDEM_LOG(INFO) << "ranks share a GPU (NCCL refuses that): pipeline transfers and "
                          "gradient synchronisation go over MPI through pinned host staging";
    }
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> p2p_copy,
                            p2p_->Split(/*color=*/0, /*key=*/p2p_->rank()));
    TANDEM_ASSIGN_OR_RETURN(nccl_pipeline_,
                            comm::CreateHostStagedCommunicator(std::move(p2p_copy)));
    for (auto& l : locals_) {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> group_copy,
                              l->group->Split(/*color=*/0, /*key=*/l->group->rank()));
      TANDEM_ASSIGN_OR_RETURN(l->device_group,
                              comm::CreateHostStagedCommunicator(std::move(group_copy)));
    }
  }
  nccl_pipeline_->set_timeout(options_.timeout);
  for (auto& l : locals_) l->device_group->set_timeout(options_.timeout);
  return absl::OkStatus();
}

comm::Communicator* Engine::payload_p2p() const {
  return nccl_pipeline_ != nullptr ? nccl_pipeline_.get() : p2p_.get();
}

absl::Status Engine::WaitForParameters(Local* l) {
  if (l->parameters_current) return absl::OkStatus();
  for (int p = l->sync->num_parameters() - 1; p >= 0; --p) {  // forward order
    TANDEM_RETURN_IF_ERROR(l->sync->WaitForParameters(p));
  }
  l->parameters_current = true;
  return absl::OkStatus();
}

absl::StatusOr<WorldTimings> Engine::GatherTimingsInternal(
    const std::vector<ActionTiming>& timings) {
  // Seven doubles per action: type, stage, micro-batch, replica, peer, start, end.
  constexpr size_t kFields = 7;
  std::vector<double> mine;
  mine.reserve(timings.size() * kFields);
  for (const ActionTiming& t : timings) {
    mine.insert(mine.end(), {static_cast<double>(t.action.type), double(t.action.stage),
                             double(t.action.microbatch), double(t.action.replica),
                             double(t.action.peer), t.start_seconds, t.end_seconds});
  }
  const std::string bytes(reinterpret_cast<const char*>(mine.data()),
                          mine.size() * sizeof(double));
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> all, GatherStrings(*control_, bytes));
  WorldTimings world(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() % (kFields * sizeof(double)) != 0) {
      return absl::DataLossError(absl::StrCat("timings of rank ", r, " are truncated"));
    }
    std::vector<double> values(all[r].size() / sizeof(double));
    std::memcpy(values.data(), all[r].data(), all[r].size());
    for (size_t i = 0; i + kFields <= values.size(); i += kFields) {
      ActionTiming t;
      t.action.type = static_cast<pipeline::ActionType>(static_cast<int>(values[i]));
      t.action.stage = static_cast<int>(values[i + 1]);
      t.action.microbatch = static_cast<int>(values[i + 2]);
      t.action.replica = static_cast<int>(values[i + 3]);
      t.action.peer = static_cast<int>(values[i + 4]);
      t.start_seconds = values[i + 5];
      t.end_seconds = values[i + 6];
      world[r].push_back(t);
    }
  }
  return world;
}

absl::StatusOr<ChromeTrace> Engine::GatherTimelineInternal() {
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> all,
                          GatherStrings(*control_, timeline_.ToJson().dump()));
  ChromeTrace merged;
  for (size_t r = 0; r < all.size(); ++r) {
    auto j = nlohmann::json::parse(all[r], nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::DataLossError(absl::StrCat("timeline of rank ", r, " is not JSON"));
    }
    TANDEM_ASSIGN_OR_RETURN(ChromeTrace trace, ChromeTrace::FromJson(j));
    merged.Merge(trace);
  }
  return merged;
}

}  // namespace tandem::runtime
