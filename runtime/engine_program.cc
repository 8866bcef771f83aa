// The program interpreter: runs this rank's program of the schedule IR action by action
// (transfers batched per run), then the gradient norm, clipping and the optimizer step.
#include <array>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "runtime/control.h"
#include "runtime/engine.h"
#include "runtime/engine_internal.h"

namespace tandem::runtime {

using engine_internal::TensorKey;

namespace {

// torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing.
constexpr double kClipEpsilon = 1e-6;

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

engine_internal::Lane LaneOf(pipeline::ActionType type) {
  if (pipeline::IsCompute(type)) return engine_internal::kComputeLane;
  switch (type) {
    case pipeline::ActionType::kSendActivation:
    case pipeline::ActionType::kSendGradient: return engine_internal::kSendLane;
    case pipeline::ActionType::kRecvActivation:
    case pipeline::ActionType::kRecvGradient: return engine_internal::kReceiveLane;
    default: return engine_internal::kSyncLane;
  }
}

}  // namespace

absl::Status Engine::SynchronizeDevices() {
  for (auto& l : locals_) {
    if (l->device.ops != nullptr) TANDEM_RETURN_IF_ERROR(l->device.ops->Synchronize());
  }
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
  if (options_.record_timeline) TANDEM_RETURN_IF_ERROR(SynchronizeDevices());
  const double start = Now();
  for (auto& l : locals_) {
    absl::Status s = l->impl->BeginIteration(iteration_);
    if (!s.ok()) {
      return Annotate(s, absl::StrCat("rank ", world_rank_, " iteration ", iteration_,
                                      ": beginning stage ", l->spec.stage));
    }
    l->sync_started = false;
  }
  TANDEM_RETURN_IF_ERROR(RunProgram(schedule_.programs[pipeline_position_], &result));
  result.seconds = Now() - start;
  const double capacity =
      result.seconds * (options_.job.ranks > 0 ? options_.job.ranks : world_->size());
  result.bubble_ratio = capacity > 0 ? 1.0 - result.world_compute_seconds / capacity : 0;
  ++iteration_;
  return result;
}

absl::StatusOr<double> Engine::EvaluateInternal(int64_t batches) {
  using pipeline::ActionType;
  if (batches < 1) return absl::InvalidArgumentError("evaluation needs at least one batch");
  if (evaluation_program_.empty()) {
    // The forwards in the training program's order, with the transfers of their activations:
    // a subset of a deadlock-free order with only the forward dependencies left, so it runs
    // to its end too.
    for (const pipeline::Action& action : schedule_.programs[pipeline_position_]) {
      if (action.type == ActionType::kForward || action.type == ActionType::kSendActivation ||
          action.type == ActionType::kRecvActivation) {
        evaluation_program_.push_back(action);
      }
    }
  }
  const bool recording = options_.record_timeline;
  options_.record_timeline = false;
  double total = 0;
  absl::Status status = [&]() -> absl::Status {
    for (int64_t batch = 0; batch < batches; ++batch) {
      for (auto& l : locals_) {
        absl::Status s = l->impl->BeginEvaluation(batch);
        if (!s.ok()) {
          return Annotate(s, absl::StrCat("rank ", world_rank_, " evaluation batch ", batch,
                                          ": beginning stage ", l->spec.stage));
        }
      }
      IterationResult unused;
      TANDEM_RETURN_IF_ERROR(RunProgram(evaluation_program_, &unused));
      // Every rank of a tensor-parallel group computes the same loss: one counts it.
      double loss = 0;
      for (auto& l : locals_) {
        if (l->spec.is_last() && tensor_parallel_index_ == 0) loss += l->impl->IterationLoss();
      }
      if (options_.job.sum_evaluation) {
        TANDEM_RETURN_IF_ERROR(Annotate(options_.job.sum_evaluation(loss),
                                        "summing the validation loss over the job"));
      } else {
        TANDEM_RETURN_IF_ERROR(Annotate(
            control_->AllReduce(DoubleBuffer(&loss, 1), comm::ReduceOp::kSum)->Wait(),
            "summing the validation loss over the world"));
      }
      total += loss;
    }
    return absl::OkStatus();
  }();
  options_.record_timeline = recording;
  TANDEM_RETURN_IF_ERROR(status);
  return total / static_cast<double>(batches);
}

absl::Status Engine::RunProgram(const std::vector<pipeline::Action>& program,
                                IterationResult* result) {
  result->timings.reserve(result->timings.size() + program.size());
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
        result->timings.push_back({program[k], batch_start, batch_end});
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
    TANDEM_RETURN_IF_ERROR(Fail(Execute(action, result), static_cast<int>(i), action));
    if (options_.record_timeline) {
      TANDEM_RETURN_IF_ERROR(Fail(SynchronizeDevices(), static_cast<int>(i), action));
    }
    const double action_end = Now();
    if (pipeline::IsCompute(action.type)) result->compute_seconds += action_end - action_start;
    result->timings.push_back({action, action_start, action_end});
    Record(action, action_start, action_end);
    TANDEM_RETURN_IF_ERROR(Fail(transfers_->Reap(), static_cast<int>(i), action));
    ++i;
  }
  absl::Status s = transfers_->WaitAll();
  if (!s.ok()) return Annotate(s, absl::StrCat("rank ", world_rank_, " iteration ", iteration_));
  if (!transfers_->activations.empty() || !transfers_->gradients.empty()) {
    return absl::InternalError(absl::StrCat(
        "rank ", world_rank_, " iteration ", iteration_, ": ", transfers_->activations.size(),
        " activations and ", transfers_->gradients.size(),
        " gradients were produced but never used (schedule mismatch)"));
  }
  return absl::OkStatus();
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
      TANDEM_RETURN_IF_ERROR(l->impl->FinishGradients());
      // A stage with tied parameters waits for their sum (SumTiedGradients) at the step.
      if (!l->tied.empty()) return absl::OkStatus();
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
  for (auto& l : locals_) {
    if (!l->sync_started) {
      return absl::InternalError(absl::StrCat("optimizer step before the gradient "
                                              "synchronisation of stage ", l->spec.stage));
    }
  }
  TANDEM_RETURN_IF_ERROR(Annotate(SumTiedGradients(),
                                  absl::StrCat("rank ", world_rank_, " iteration ", iteration_,
                                               ": summing tied gradients")));
  // Every rank of a tensor-parallel group computes the same loss: one counts it.
  auto counts_loss = [this](const Local& l) {
    return l.spec.is_last() && tensor_parallel_index_ == 0;
  };
  double local_loss = 0;
  double squared_norm = 0;
  if (options_.clip_norm <= 0 && !options_.job.sync_gradients && !options_.job.sum_over_job) {
    // A step that needs no norm, in a job that ends at a failure (no commit to agree on):
    // queued right behind the backward, while the loss and the norm travel to the host, so
    // the device does not idle between the two waiting for the host to read them.
    for (auto& l : locals_) {
      TANDEM_RETURN_IF_ERROR(l->sync->FinishBackwardNormLater());
      if (counts_loss(*l)) TANDEM_RETURN_IF_ERROR(l->impl->StartReadingIterationLoss());
    }
    const double lr = LearningRateAt(options_.lr_schedule, iteration_);
    TANDEM_RETURN_IF_ERROR(StepAll(lr, /*clip_coefficient=*/1.0));
    for (auto& l : locals_) {
      TANDEM_RETURN_IF_ERROR(l->sync->CollectGradNorm());
      squared_norm += l->sync->LocalGradNormSquared();
      if (counts_loss(*l)) local_loss += l->impl->IterationLoss();
    }
    std::array<double, 3> sums = {local_loss, squared_norm, result->compute_seconds};
    TANDEM_RETURN_IF_ERROR(
        Annotate(control_->AllReduce(DoubleBuffer(sums.data(), 3), comm::ReduceOp::kSum)->Wait(),
                 "summing loss and gradient norm over the world"));
    FillStepResult(sums, result);
    return absl::OkStatus();
  }
  for (auto& l : locals_) {
    TANDEM_RETURN_IF_ERROR(l->sync->FinishBackward());
    squared_norm += l->sync->LocalGradNormSquared();
    if (counts_loss(*l)) local_loss += l->impl->IterationLoss();
  }
  if (options_.job.sync_gradients) {
    // Copies of these layers in other engines of the job: their sum, and this rank's share
    // of the job's norm.
    absl::StatusOr<double> synced = options_.job.sync_gradients(*this);
    if (!synced.ok()) {
      return Annotate(synced.status(), "synchronising gradients with the job's other pipelines");
    }
    squared_norm = *synced;
  }
  // One all-reduce for the loss, the squared norm and the compute time (bubble estimate).
  // Once it completes anywhere, every rank has synchronised its gradients: the iteration is
  // committed.
  std::array<double, 3> sums = {local_loss, squared_norm, result->compute_seconds};
  step_pending_ = true;
  if (options_.job.sum_over_job) {
    TANDEM_RETURN_IF_ERROR(Annotate(options_.job.sum_over_job(iteration_, sums),
                                    "summing loss and gradient norm over the job"));
  } else {
    TANDEM_RETURN_IF_ERROR(
        Annotate(control_->AllReduce(DoubleBuffer(sums.data(), 3), comm::ReduceOp::kSum)->Wait(),
                 "summing loss and gradient norm over the world"));
  }
  return ApplyStep(sums, result);
}

absl::Status Engine::SumTiedGradients() {
  // This rank's members of each group, by pipeline replica and owner.
  struct Member {
    Local* local;
    const ParameterView* view;
  };
  std::map<std::pair<int, std::string>, std::vector<Member>> groups;
  for (auto& l : locals_) {
    for (int i : l->tied) {
      const ParameterView& v = l->device.parameters[i];
      groups[{l->spec.replica, v.tied_owner}].push_back({l.get(), &v});
    }
  }
  auto stage_of_layer = [this](int layer) {
    for (size_t s = 0; s < plan_.stages.size(); ++s) {
      if (plan_.stages[s].first_layer <= layer && layer < plan_.stages[s].end_layer) {
        return static_cast<int>(s);
      }
    }
    return -1;
  };
  for (const auto& [key, here] : groups) {
    const auto& [replica, owner] = key;
    const std::vector<int>& layers = here.front().view->tied_layers;
    const int64_t count = here.front().view->grad.count;
    // Every member's gradient on the host, in layer order: those here copied, the others
    // received from the pipeline positions holding them.
    std::vector<std::vector<float>> grads(layers.size(), std::vector<float>(count));
    std::vector<int> positions(layers.size());
    std::vector<bool> local(layers.size(), false);
    for (size_t m = 0; m < layers.size(); ++m) {
      positions[m] = schedule_.placement.RankOf(replica, stage_of_layer(layers[m]));
    }
    for (const Member& member : here) {
      const auto at = std::find(layers.begin(), layers.end(), member.view->tied_layer);
      if (at == layers.end() || member.view->grad.count != count) {
        return absl::InternalError(absl::StrCat("tied parameter '", member.view->name,
                                                "' does not match its group of '", owner, "'"));
      }
      const size_t m = static_cast<size_t>(at - layers.begin());
      local[m] = true;
      TANDEM_RETURN_IF_ERROR(member.local->device.ops->CopyToHost(
          grads[m].data(), static_cast<const float*>(member.view->grad.data), count));
    }
    std::set<int> peers;
    for (size_t m = 0; m < layers.size(); ++m) {
      if (!local[m]) peers.insert(positions[m]);
    }
    // Sends and receives between two positions pair up in member order (MPI keeps the order
    // of messages of one tag between two ranks).
    std::vector<comm::WorkPtr> works;
    auto buffer = [&](size_t m) {
      return comm::Buffer{grads[m].data(), count, comm::DataType::kFloat32, comm::Device::Cpu()};
    };
    for (size_t m = 0; m < layers.size(); ++m) {
      if (local[m]) {
        for (int peer : peers) works.push_back(p2p_->Send(buffer(m), peer, engine_internal::kTiedTag));
      } else {
        works.push_back(p2p_->Recv(buffer(m), positions[m], engine_internal::kTiedTag));
      }
    }
    for (comm::WorkPtr& work : works) {
      TANDEM_RETURN_IF_ERROR(Annotate(work->Wait(), absl::StrCat("gradient of '", owner,
                                                                 "' (replica ", replica, ")")));
    }
    // The same sum, in the same order, on every rank holding a member.
    std::vector<float>& total = grads.front();
    for (size_t m = 1; m < grads.size(); ++m) {
      for (int64_t i = 0; i < count; ++i) total[i] += grads[m][i];
    }
    for (const Member& member : here) {
      TANDEM_RETURN_IF_ERROR(member.local->device.ops->CopyFromHost(
          static_cast<float*>(member.view->grad.data), total.data(), count));
    }
  }
  for (auto& l : locals_) {
    if (l->tied.empty()) continue;
    for (int b = 0; b < l->sync->num_buckets(); ++b) {
      TANDEM_RETURN_IF_ERROR(l->sync->BucketReady(b));
    }
  }
  return absl::OkStatus();
}

void Engine::FillStepResult(const std::array<double, 3>& sums, IterationResult* result) const {
  result->loss = sums[0];
  result->grad_norm = std::sqrt(std::max(0.0, sums[1]));
  result->world_compute_seconds = sums[2];
  result->clip_coefficient = 1.0;
  if (options_.clip_norm > 0) {
    result->clip_coefficient =
        std::min(1.0, options_.clip_norm / (result->grad_norm + kClipEpsilon));
  }
  result->learning_rate = LearningRateAt(options_.lr_schedule, iteration_);
}

absl::Status Engine::StepAll(double lr, double clip_coefficient) {
  for (auto& l : locals_) {
    TANDEM_RETURN_IF_ERROR(l->sync->Step(lr, clip_coefficient));
    l->parameters_current = false;
  }
  return absl::OkStatus();
}

absl::Status Engine::ApplyStep(const std::array<double, 3>& sums, IterationResult* result) {
  FillStepResult(sums, result);
  step_pending_ = false;
  return StepAll(result->learning_rate, result->clip_coefficient);
}

absl::StatusOr<IterationResult> Engine::ApplyCommittedStep(const std::array<double, 3>& sums) {
  if (!step_pending_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", world_rank_, ": no step of iteration ", iteration_,
        " waits to be applied (its gradient synchronisation did not finish here)"));
  }
  IterationResult result;
  result.iteration = iteration_;
  TANDEM_RETURN_IF_ERROR(ApplyStep(sums, &result));
  ++iteration_;
  return result;
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

absl::Status Engine::WaitForParameters(Local* l) {
  if (l->parameters_current) return absl::OkStatus();
  for (int p = l->sync->num_parameters() - 1; p >= 0; --p) {  // forward order
    TANDEM_RETURN_IF_ERROR(l->sync->WaitForParameters(p));
  }
  l->parameters_current = true;
  return absl::OkStatus();
}

}  // namespace tandem::runtime
