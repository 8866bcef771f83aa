#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/backend.h"
#include "common/status.h"
#include "pipeline/generators.h"
#include "pipeline/validator.h"
#include "runtime/checkpoint.h"
#include "runtime/control.h"
#include "runtime/devices.h"
#include "runtime/engine_internal.h"
#include "runtime/failure_notices.h"
#include "runtime/groups.h"
#include "runtime/split_grad_sync.h"
#include "runtime/stage_checkpoint.h"

namespace tandem::runtime {

using engine_internal::kComputeLane;
using engine_internal::kReceiveLane;
using engine_internal::kSendLane;
using engine_internal::kSyncLane;

Engine::~Engine() {
  // Before anything else goes: the closing handshake, and the watchdog thread that may abort
  // the communicators below.
  notices_.reset();
}

absl::Status Engine::Report(absl::Status status) {
  return notices_ != nullptr ? notices_->Report(std::move(status)) : status;
}

void Engine::AbortCommunicators(const absl::Status& reason) {
  if (p2p_ != nullptr) p2p_->Abort(reason);
  if (nccl_pipeline_ != nullptr) nccl_pipeline_->Abort(reason);
  for (auto& l : locals_) {
    if (l->group != nullptr) l->group->Abort(reason);
    if (l->device.device_group != nullptr) l->device.device_group->Abort(reason);
  }
  for (auto& l : locals_) {
    if (l->expert_data_group != nullptr) l->expert_data_group->Abort(reason);
  }
  if (expert_group_ != nullptr) expert_group_->Abort(reason);
  if (expert_block_ != nullptr) expert_block_->Abort(reason);
  if (tensor_group_ != nullptr) tensor_group_->Abort(reason);
  if (nccl_tensor_group_ != nullptr) nccl_tensor_group_->Abort(reason);
  if (lane_ != nullptr) lane_->Abort(reason);
  if (control_ != nullptr) control_->Abort(reason);
}

void Engine::Abort(const absl::Status& reason) {
  if (notices_ != nullptr) notices_->Abandon();
  AbortCommunicators(reason);
}

std::vector<ParameterView> Engine::LocalParameters() const {
  std::vector<ParameterView> out;
  for (const auto& l : locals_) {
    out.insert(out.end(), l->device.parameters.begin(), l->device.parameters.end());
  }
  return out;
}

std::vector<DeviceOps*> Engine::LocalParameterOps() const {
  std::vector<DeviceOps*> out;
  for (const auto& l : locals_) out.insert(out.end(), l->device.parameters.size(), l->device.ops);
  return out;
}

absl::StatusOr<std::vector<ParameterState>> Engine::ExportState() {
  std::vector<ParameterState> out;
  for (auto& l : locals_) {
    TANDEM_RETURN_IF_ERROR(l->sync->Flush());
    TANDEM_ASSIGN_OR_RETURN(std::vector<ParameterOptimizerState> optimizer,
                            l->sync->GatherOptimizerState());
    std::map<std::string, ParameterOptimizerState> by_name;
    for (auto& o : optimizer) by_name[o.name] = std::move(o);
    for (const ParameterView& v : l->device.parameters) {
      ParameterState p;
      p.name = v.name;
      p.shape = v.shape;
      p.value.resize(static_cast<size_t>(v.value.count));
      TANDEM_RETURN_IF_ERROR(l->device.ops->CopyToHost(
          p.value.data(), static_cast<const float*>(v.value.data), v.value.count));
      auto it = by_name.find(v.name);
      if (it != by_name.end()) p.optimizer = std::move(it->second);
      p.optimizer.name = v.name;
      out.push_back(std::move(p));
    }
  }
  return out;
}

absl::Status Engine::ImportState(const std::vector<ParameterState>& state) {
  std::map<std::string, const ParameterState*> by_name;
  for (const ParameterState& p : state) by_name[p.name] = &p;
  for (auto& l : locals_) {
    std::vector<ParameterOptimizerState> optimizer;
    for (const ParameterView& v : l->device.parameters) {
      auto it = by_name.find(v.name);
      if (it == by_name.end()) {
        return absl::NotFoundError(absl::StrCat("rank ", world_rank_, ": no state for parameter '",
                                                v.name, "' of stage ", l->spec.stage));
      }
      const ParameterState* state = it->second;
      // A whole parameter (a checkpoint's, or another layout's) for a tensor-parallel shard:
      // this rank's part of it.
      ParameterState cut;
      if (v.tensor_parallel_index != nullptr && v.whole_count != v.value.count &&
          static_cast<int64_t>(state->value.size()) == v.whole_count) {
        cut = CutShard(*state, *v.tensor_parallel_index);
        state = &cut;
      }
      const ParameterState& p = *state;
      if (static_cast<int64_t>(p.value.size()) != v.value.count) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", world_rank_, ": parameter '", v.name, "' has ", p.value.size(),
            " values in the state moved here, the stage holds ", v.value.count));
      }
      TANDEM_RETURN_IF_ERROR(l->device.ops->CopyFromHost(static_cast<float*>(v.value.data),
                                                         p.value.data(), v.value.count));
      optimizer.push_back(p.optimizer);
    }
    std::reverse(optimizer.begin(), optimizer.end());  // the synchroniser's (backward) order
    TANDEM_RETURN_IF_ERROR(l->sync->LoadOptimizerState(optimizer));
    l->parameters_current = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<IterationResult> Engine::RunIteration() {
  auto result = RunIterationInternal();
  if (!result.ok()) return Report(result.status());
  return result;
}

absl::StatusOr<double> Engine::Evaluate(int64_t batches) {
  auto loss = EvaluateInternal(batches);
  if (!loss.ok()) return Report(loss.status());
  return loss;
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

absl::Status CheckLossIsFinite(const IterationResult& result) {
  if (std::isfinite(result.loss)) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(
      "iteration ", result.iteration + 1, ": the loss is ", result.loss,
      " (gradient norm ", result.grad_norm, ", learning rate ", result.learning_rate,
      "); training stopped there, nothing of that iteration was saved"));
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
  // This rank's place in the mesh: mesh[d][q] is the first of t consecutive ranks, the tensor-
  // parallel group of that pipeline position. Found before any check so that every rank takes
  // part in the group splits below (a rank outside the mesh joins none; the checks then fail
  // everywhere).
  const int tensor_parallel = std::max(1, plan_.tensor_parallel);
  bool found = false;
  for (size_t d = 0; d < plan_.mesh.size() && !found; ++d) {
    for (size_t q = 0; q < plan_.mesh[d].size(); ++q) {
      const int first = plan_.mesh[d][q];
      if (first <= world_rank_ && world_rank_ < first + tensor_parallel) {
        data_parallel_index_ = static_cast<int>(d);
        pipeline_position_ = static_cast<int>(q);
        tensor_parallel_index_ = world_rank_ - first;
        found = true;
        break;
      }
    }
  }
  if (tensor_parallel > 1) {
    const int group_colour = found ? plan_.mesh[data_parallel_index_][pipeline_position_] : -1;
    TANDEM_ASSIGN_OR_RETURN(tensor_group_, control_->Split(group_colour, tensor_parallel_index_));
    TANDEM_ASSIGN_OR_RETURN(lane_, control_->Split(found ? tensor_parallel_index_ : -1,
                                                   world_rank_));
    if (tensor_group_ != nullptr) {
      tensor_group_->set_timeout(options_.timeout);
      stage_tensor_group_ = std::make_unique<comm::ForwardingCommunicator>(tensor_group_.get());
    }
    if (lane_ != nullptr) lane_->set_timeout(options_.timeout);
  }
  // Experts over replicas: the replicas d with the same d / E share their experts.
  const int expert_replicas = std::max(1, options_.expert_replicas);
  if (expert_replicas > 1) {
    const int block = data_parallel_index_ / expert_replicas * expert_replicas;
    const bool in_block = found && block < static_cast<int>(plan_.mesh.size());
    const int first = in_block ? plan_.mesh[block][pipeline_position_] : -1;
    TANDEM_ASSIGN_OR_RETURN(
        expert_group_,
        control_->Split(in_block ? first + tensor_parallel_index_ : -1, data_parallel_index_));
    TANDEM_ASSIGN_OR_RETURN(expert_block_, control_->Split(in_block ? first : -1,
                                                           data_parallel_index_ * tensor_parallel +
                                                               tensor_parallel_index_));
    for (comm::Communicator* group : {expert_group_.get(), expert_block_.get()}) {
      if (group != nullptr) group->set_timeout(options_.timeout);
    }
  }
  // Local checks and stage construction; then every rank agrees before any other collective.
  absl::Status local = [&]() -> absl::Status {
    TANDEM_RETURN_IF_ERROR(Annotate(pipeline::ValidatePlan(plan_, world_->size()),
                                    "the plan does not fit this run"));
    if (expert_replicas > 1) {
      if (plan_.data_parallel % expert_replicas != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "experts spread over ", expert_replicas,
            " data-parallel replicas need a data-parallel degree they divide; the plan has ",
            plan_.data_parallel));
      }
      if (options_.job.sync_gradients || options_.job.sum_evaluation) {
        return absl::InvalidArgumentError(
            "experts spread over data-parallel replicas do not run in a job of several "
            "engines (the elastic layer)");
      }
    }
    if (!plan_.IsUniform()) {
      return absl::InvalidArgumentError(
          "the plan replicates stages non-uniformly (no data-parallel x pipeline mesh); the "
          "runtime runs mesh plans only");
    }
    if (options_.schedule != nullptr) {
      // Explicit programs: they must be the plan's schedule and run as the IR promises.
      if (!(options_.schedule->spec == plan_.schedule)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the given schedule (", pipeline::ToJson(options_.schedule->spec).dump(),
            ") is not the plan's (", pipeline::ToJson(plan_.schedule).dump(), ")"));
      }
      if (!(options_.schedule->placement == pipeline::PlacementFor(plan_.schedule))) {
        return absl::InvalidArgumentError(
            "the given schedule places its stages unlike the plan's schedule spec");
      }
      TANDEM_RETURN_IF_ERROR(Annotate(pipeline::ValidateSchedule(*options_.schedule),
                                      "the given schedule is not valid"));
      schedule_ = *options_.schedule;
    } else {
      TANDEM_ASSIGN_OR_RETURN(schedule_, pipeline::GenerateSchedule(plan_.schedule));
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
      spec.tensor_parallel = tensor_parallel;
      spec.tensor_parallel_index = tensor_parallel_index_;
      spec.tensor_group = stage_tensor_group_.get();
      spec.expert_replicas = expert_replicas;
      spec.expert_replica = data_parallel_index_ % expert_replicas;
      spec.expert_group = expert_group_.get();
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
  // With tensor parallelism, the groups are built inside this rank's lane, on the mesh of
  // the lane's ranks (renumbered in world order, as the lane's split ranks them).
  comm::Communicator& groups_world = tensor_parallel > 1 ? *lane_ : *control_;
  if (tensor_parallel > 1) {
    std::vector<int> members;
    for (const auto& row : plan_.mesh) {
      for (int first : row) members.push_back(first + tensor_parallel_index_);
    }
    std::sort(members.begin(), members.end());
    for (auto& row : layout.mesh) {
      for (int& rank : row) {
        rank = static_cast<int>(
            std::lower_bound(members.begin(), members.end(), rank + tensor_parallel_index_) -
            members.begin());
      }
    }
  }
  TANDEM_ASSIGN_OR_RETURN(runtime::ProcessGroups groups,
                          runtime::BuildProcessGroups(groups_world, layout));
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
  std::vector<StageDevice*> devices;
  for (auto& l : locals_) {
    l->device.stage = l->impl.get();
    l->device.index = l->spec.stage;
    l->device.group = l->group.get();
    devices.push_back(&l->device);
  }
  TANDEM_ASSIGN_OR_RETURN(DeviceLinks links,
                          ConnectDevices(groups_world, *p2p_, tensor_group_.get(), layout,
                                         options_.timeout, devices));
  device_backend_ = links.device_backend;
  nccl_world_ = std::move(links.world);
  nccl_pipeline_ = std::move(links.pipeline);
  if (links.tensor != nullptr) {
    nccl_tensor_group_ = std::move(links.tensor);
    TANDEM_RETURN_IF_ERROR(stage_tensor_group_->Retarget(nccl_tensor_group_.get()));
  }
  transfers_->batcher =
      std::make_unique<TransferBatcher>(*p2p_, *payload_p2p(), engine_internal::kHeaderTag,
                                         engine_internal::kTransferTag);
  {
    // The backend's per-pair resources for this rank's transfers (NCCL: a communicator and
    // stream per direction, so that a send never holds up this rank's receives, as MPI's
    // buffered sends do not). Collective over the pipeline group.
    std::set<int> peers;
    for (const pipeline::Action& action : schedule_.programs[pipeline_position_]) {
      if (pipeline::IsTransfer(action.type) && action.peer >= 0) peers.insert(action.peer);
    }
    TANDEM_RETURN_IF_ERROR(
        payload_p2p()->ConnectPeers(std::vector<int>(peers.begin(), peers.end())));
  }
  local = [&]() -> absl::Status {
    TANDEM_RETURN_IF_ERROR(CheckTiedParameters());
    for (auto& l : locals_) {
      // Registered in backward order (the stage lists its parameters in forward order).
      std::vector<runtime::SyncParameter> params;
      std::vector<bool> placed;
      for (const ParameterView& v : l->device.parameters) {
        placed.push_back(v.placed_over_replicas);
        // A whole parameter of a tensor-parallel group has the same summed gradient in every
        // lane: the first lane's groups count it in the norm. A tied copy has its owner's
        // gradient (SumTiedGradients): the owner counts it.
        params.push_back({v.name, v.value, v.grad,
                          !(tensor_parallel_index_ > 0 && v.tensor_parallel_replicated) &&
                              !v.is_tied_copy()});
      }
      std::reverse(params.begin(), params.end());
      std::reverse(placed.begin(), placed.end());
      runtime::GradSyncOptions sync_options;
      sync_options.strategy = options_.grad_sync;
      sync_options.bucket_bytes = options_.bucket_bytes;
      sync_options.communication_type = options_.gradient_communication;
      sync_options.optimizer = options_.optimizer;
      sync_options.reduction = runtime::GradientReduction::kSum;
      sync_options.device_ops = l->device.ops;
      sync_options.host_group = l->group.get();
      comm::Communicator& group = l->device.device_group != nullptr ? *l->device.device_group : *l->group;
      absl::StatusOr<std::unique_ptr<GradientSync>> sync;
      if (expert_replicas > 1) {
        // The placed parameters over the replicas holding the same experts (d % E alike).
        TANDEM_ASSIGN_OR_RETURN(
            l->expert_data_group,
            l->group->Split(data_parallel_index_ % expert_replicas, data_parallel_index_));
        l->expert_data_group->set_timeout(options_.timeout);
        if (l->device.device_group != nullptr) {
          TANDEM_ASSIGN_OR_RETURN(l->expert_data_group, comm::CreateHostStagedCommunicator(
                                                            std::move(l->expert_data_group)));
        }
        sync = runtime::CreateSplitGradientSync(group, *l->expert_data_group, std::move(params),
                                                placed, sync_options);
      } else {
        sync = runtime::GradientSync::Create(group, std::move(params), sync_options);
      }
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
  background_progress_ = control_->KeepProgressing();
  FailureNoticeOptions notice_options;
  notice_options.heartbeat_timeout = options_.heartbeat_timeout;
  TANDEM_ASSIGN_OR_RETURN(
      notices_, FailureNotices::Start(*control_, notice_options, [this](const absl::Status& r) {
        AbortCommunicators(r);
      }));
  timeline_.NameProcess(
      world_rank_,
      absl::StrCat("rank ", world_rank_, " (dp ", data_parallel_index_, ", position ",
                   pipeline_position_,
                   tensor_parallel > 1 ? absl::StrCat(", tp ", tensor_parallel_index_) : "",
                   ")"));
  timeline_.NameThread(world_rank_, kComputeLane, "compute");
  timeline_.NameThread(world_rank_, kSendLane, "send");
  timeline_.NameThread(world_rank_, kReceiveLane, "receive");
  timeline_.NameThread(world_rank_, kSyncLane, "sync");
  return absl::OkStatus();
}

CheckpointScope Engine::checkpoint_scope() const {
  CheckpointScope scope;
  scope.control = control_.get();
  scope.plan = &plan_;
  scope.num_stages = schedule_.spec.NumStages();
  scope.optimizer = options_.optimizer;
  scope.reset_optimizer = options_.reset_optimizer;
  scope.run = options_.checkpoint_run;
  return scope;
}

std::vector<CheckpointedStage> Engine::checkpointed_stages() const {
  std::vector<CheckpointedStage> stages;
  for (const auto& l : locals_) {
    CheckpointedStage c;
    c.stage = l->spec.stage;
    c.first_layer = l->spec.first_layer;
    c.end_layer = l->spec.end_layer;
    c.group = l->group.get();
    c.sync = l->sync.get();
    c.ops = l->device.ops;
    c.parameters = &l->device.parameters;
    stages.push_back(c);
  }
  return stages;
}

absl::Status Engine::CheckTiedParameters() {
  for (auto& l : locals_) {
    l->tied.clear();
    for (size_t i = 0; i < l->device.parameters.size(); ++i) {
      const ParameterView& v = l->device.parameters[i];
      if (v.tied_owner.empty()) continue;
      const std::string where = absl::StrCat(
          "rank ", world_rank_, " stage ", l->spec.stage, ": parameter '", v.name, "' is tied",
          v.is_tied_copy() ? absl::StrCat(" to '", v.tied_owner, "'") : std::string(" to a copy"));
      if (options_.job.sync_gradients) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " on another stage: elastic training does not support stages that split a "
                   "tied embedding and LM head; train without --elastic, keep both ends on one "
                   "stage, or untie them (tie_word_embeddings false)"));
      }
      if (v.tied_layers.size() < 2 ||
          std::count(v.tied_layers.begin(), v.tied_layers.end(), v.tied_layer) != 1 ||
          std::set<int>(v.tied_layers.begin(), v.tied_layers.end()).size() !=
              v.tied_layers.size()) {
        return absl::InternalError(absl::StrCat(
            where, " with fewer than two members, one twice, or not among them"));
      }
      for (int layer : v.tied_layers) {
        const bool placed = std::any_of(
            plan_.stages.begin(), plan_.stages.end(), [layer](const pipeline::PlanStage& s) {
              return s.first_layer <= layer && layer < s.end_layer;
            });
        if (!placed) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ", held by layer ", layer, ", which no stage of the plan holds"));
        }
      }
      l->tied.push_back(static_cast<int>(i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<ParameterState>>> Engine::WholeLocalState() {
  TANDEM_ASSIGN_OR_RETURN(std::vector<ParameterState> flat, ExportState());
  std::vector<std::vector<ParameterState>> out;
  size_t next = 0;
  for (auto& l : locals_) {
    out.emplace_back();
    for (const ParameterView& v : l->device.parameters) {
      ParameterState p = std::move(flat.at(next++));
      // A shard comes from the tensor-parallel group; an expert spread over replicas from
      // every lane of those replicas.
      comm::Communicator* group =
          v.placed_over_replicas ? expert_block_.get() : tensor_group_.get();
      if (v.tensor_parallel_index != nullptr && group != nullptr) {
        const int t = group->size();
        // Shards may differ in size (expert parallelism: an expert whole on some ranks, empty
        // on the others): each is gathered padded to the largest, its index padded with -1.
        int64_t n = v.value.count;
        std::vector<int64_t> counts(static_cast<size_t>(t));
        TANDEM_RETURN_IF_ERROR(
            group
                ->AllGather(
                    comm::Buffer{&n, 1, comm::DataType::kInt64, comm::Device::Cpu()},
                    comm::Buffer{counts.data(), t, comm::DataType::kInt64, comm::Device::Cpu()})
                ->Wait());
        int64_t total = 0, largest = 0;
        for (int64_t c : counts) {
          total += c;
          largest = std::max(largest, c);
        }
        if (total != v.whole_count) {
          return absl::InternalError(absl::StrCat("parameter '", v.name, "': shards of ",
                                                  absl::StrJoin(counts, ", "),
                                                  " elements do not make its ", v.whole_count));
        }
        auto gather = [&](const void* in, void* all, comm::DataType type) {
          return group
              ->AllGather(comm::Buffer{const_cast<void*>(in), largest, type, comm::Device::Cpu()},
                          comm::Buffer{all, largest * t, type, comm::Device::Cpu()})
              ->Wait();
        };
        std::vector<int64_t> mine(v.tensor_parallel_index->begin(), v.tensor_parallel_index->end());
        mine.resize(static_cast<size_t>(largest), -1);
        std::vector<int64_t> index(static_cast<size_t>(largest * t));
        TANDEM_RETURN_IF_ERROR(gather(mine.data(), index.data(), comm::DataType::kInt64));
        auto whole = [&](std::vector<float>& values) -> absl::Status {
          values.resize(static_cast<size_t>(largest), 0.0f);
          std::vector<float> all(static_cast<size_t>(largest * t));
          TANDEM_RETURN_IF_ERROR(gather(values.data(), all.data(), comm::DataType::kFloat32));
          values.assign(static_cast<size_t>(v.whole_count), 0.0f);
          for (size_t i = 0; i < all.size(); ++i) {
            if (index[i] >= 0) values[static_cast<size_t>(index[i])] = all[i];
          }
          return absl::OkStatus();
        };
        TANDEM_RETURN_IF_ERROR(whole(p.value));
        for (auto& [name, buffer] : p.optimizer.buffers) {
          if (static_cast<int64_t>(buffer.size()) == n) TANDEM_RETURN_IF_ERROR(whole(buffer));
        }
      }
      out.back().push_back(std::move(p));
    }
  }
  return out;
}

absl::StatusOr<std::vector<ParameterState>> Engine::ExportWholeState() {
  if (plan_.tensor_parallel <= 1 && expert_block_ == nullptr) return ExportState();
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::vector<ParameterState>> whole, WholeLocalState());
  std::vector<ParameterState> out;
  for (auto& stage : whole) {
    for (ParameterState& p : stage) out.push_back(std::move(p));
  }
  return out;
}

absl::Status Engine::SaveCheckpointInternal(const std::string& dir, const std::string& model) {
  TANDEM_RETURN_IF_ERROR(FlushInternal());
  if (plan_.tensor_parallel > 1 || expert_block_ != nullptr) {
    // Whole parameters, gathered over each tensor-parallel group (and the experts over the
    // replicas sharing them) and written by the first lane of the first replica as without
    // tensor parallelism: the checkpoint loads onto any layout.
    TANDEM_ASSIGN_OR_RETURN(std::vector<std::vector<ParameterState>> whole, WholeLocalState());
    std::vector<CheckpointShard> shards;
    for (size_t i = 0; i < locals_.size(); ++i) {
      const Local& l = *locals_[i];
      if (tensor_parallel_index_ == 0 && l.group->rank() == 0) {
        // A tied copy is saved once, as its owner (runtime/stage.h).
        std::vector<ParameterState> saved;
        for (size_t p = 0; p < whole[i].size(); ++p) {
          if (!l.device.parameters[p].is_tied_copy()) saved.push_back(std::move(whole[i][p]));
        }
        shards.push_back(ShardOf(l.spec.stage, l.spec.first_layer, l.spec.end_layer, saved));
      }
    }
    return SaveShardsStep(dir, model, iteration_, options_.keep_checkpoints, checkpoint_scope(),
                          shards);
  }
  return SaveCheckpointStep(dir, model, iteration_, options_.keep_checkpoints, checkpoint_scope(),
                            checkpointed_stages());
}

absl::Status Engine::LoadCheckpointInternal(const std::string& dir, const std::string& model) {
  TANDEM_ASSIGN_OR_RETURN(const std::string folder, ResolveCheckpoint(dir));
  TANDEM_ASSIGN_OR_RETURN(const int64_t step,
                          LoadStages(folder, model, checkpoint_scope(), checkpointed_stages()));
  for (auto& l : locals_) l->parameters_current = true;
  iteration_ = step;
  return absl::OkStatus();
}

comm::Communicator* Engine::payload_p2p() const {
  return nccl_pipeline_ != nullptr ? nccl_pipeline_.get() : p2p_.get();
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
