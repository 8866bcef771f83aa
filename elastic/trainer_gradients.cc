// The elastic trainer's job hooks (runtime::JobHooks): after each engine's backward the
// gradients of every layer are summed over all ranks holding it, and the loss and norm over the
// job, whose all-reduce is the commit point (elastic/trainer.h).
#include <array>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/buffer.h"
#include "comm/keep_alive.h"
#include "common/logging.h"
#include "common/status.h"
#include "elastic/internal/trainer_state.h"
#include "runtime/control.h"

namespace tandem::elastic {

using internal::Ranks;

absl::StatusOr<double> ElasticTrainer::State::SyncGradients(runtime::Engine& e) {
  if (kill.Hits(me, e.iteration(), "sync")) internal::KillSelf(me, e.iteration(), "sync");
  std::vector<runtime::ParameterView> params = e.LocalParameters();
  // Gradients cross pipelines through host memory: on a device, copied there and back.
  const std::vector<runtime::DeviceOps*> ops = e.LocalParameterOps();
  std::vector<int> layer_of(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(layer_of[i], LayerOfParameter(params[i].name));
  }
  double norm = 0;
  for (const HeldSegment& seg : held_segments()) {
    std::vector<size_t> members;
    int64_t count = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (layer_of[i] >= seg.segment.layers.first_layer &&
          layer_of[i] < seg.segment.layers.end_layer) {
        members.push_back(i);
        count += params[i].grad.count;
      }
    }
    // On the heap: after an abort the library may still write into it (then it is kept alive).
    auto buffer = std::make_shared<std::vector<float>>(static_cast<size_t>(count));
    std::vector<float>& flat = *buffer;
    int64_t at = 0;
    for (size_t i : members) {
      TANDEM_RETURN_IF_ERROR(ops[i]->CopyToHost(
          flat.data() + at, static_cast<const float*>(params[i].grad.data), params[i].grad.count));
      at += params[i].grad.count;
    }
    if (seg.comm != nullptr && seg.comm->size() > 1 && count > 0) {
      const absl::Status reduced =
          seg.comm->AllReduce(comm::CpuBuffer(flat.data(), count), comm::ReduceOp::kSum)
              ->Wait();
      if (!reduced.ok()) {
        comm::KeepAliveAfterAbort(buffer);
        return Annotate(reduced, absl::StrCat("summing the gradients of layers [",
                                              seg.segment.layers.first_layer, ", ",
                                              seg.segment.layers.end_layer, ") over ranks ",
                                              Ranks(seg.segment.ranks)));
      }
      at = 0;
      for (size_t i : members) {
        TANDEM_RETURN_IF_ERROR(ops[i]->CopyFromHost(static_cast<float*>(params[i].grad.data),
                                                    flat.data() + at, params[i].grad.count));
        at += params[i].grad.count;
      }
    }
    // Each segment's norm counted once: by its lowest group, each shard by its own rank and a
    // parameter every rank of the group holds whole by the first.
    if (seg.segment.ranks.front() == group()) {
      at = 0;
      for (size_t i : members) {
        if (lane() == 0 || !params[i].tensor_parallel_replicated) {
          for (int64_t k = 0; k < params[i].grad.count; ++k) {
            const double g = flat[static_cast<size_t>(at + k)];
            norm += g * g;
          }
        }
        at += params[i].grad.count;
      }
    }
  }
  return norm;
}

absl::Status ElasticTrainer::State::SumOverJob(int64_t iteration, std::array<double, 3>& sums) {
  // The three sums, and the number of ranks asked to stop: every rank learns a stop request at
  // the same commit.
  const bool stop = options.stop_requested != nullptr && options.stop_requested->load();
  const bool grow = options.grow_requested != nullptr && options.grow_requested->load() > 0;
  auto buffer = std::make_shared<std::array<double, 5>>(std::array<double, 5>{
      sums[0], sums[1], sums[2], stop ? 1.0 : 0.0, grow ? 1.0 : 0.0});
  comm::Communicator* const training = configured().training;
  const absl::Status reduced =
      training->AllReduce(runtime::DoubleBuffer(buffer->data(), 5), comm::ReduceOp::kSum)->Wait();
  if (!reduced.ok()) {
    comm::KeepAliveAfterAbort(buffer);
    return reduced;
  }
  sums = {(*buffer)[0], (*buffer)[1], (*buffer)[2]};
  if ((*buffer)[3] > 0 && stop_end < 0) stop_end = iteration + 1;
  if ((*buffer)[4] > 0 && grow_at < 0) {
    grow_at = iteration + 1;
    grow_nodes = 1;
  }
  if (!late_commit_injected && kill.Hits(me, iteration, "late-commit")) {
    late_commit_injected = true;
    // Fault injection, not a death: this rank records its commit only once the survivors have
    // decided (or after 30 s), as a rank descheduled at this point could.
    (void)membership->AwaitDecision(absl::Seconds(30));
    TANDEM_LOG(WARNING) << "fault injection: rank " << me << " records the commit of iteration "
                        << iteration << " after the agreement";
  }
  const bool counted = membership->SetCommitted(iteration, sums);
  if (kill.Hits(me, iteration, "commit")) internal::KillSelf(me, iteration, "commit");
  if (!counted) {
    // An agreement began before this rank committed: the survivors' decision says whether
    // this step counts (then the recovery applies it) or is redone.
    return absl::AbortedError(absl::StrCat("rank ", me, ": an agreement began before iteration ",
                                           iteration, " committed here"));
  }
  return absl::OkStatus();
}

absl::Status ElasticTrainer::State::SumEvaluation(double& loss) {
  auto buffer = std::make_shared<double>(loss);
  comm::Communicator* const training = configured().training;
  const absl::Status reduced =
      training->AllReduce(runtime::DoubleBuffer(buffer.get(), 1), comm::ReduceOp::kSum)->Wait();
  if (!reduced.ok()) {
    comm::KeepAliveAfterAbort(buffer);
    return reduced;
  }
  loss = *buffer;
  return absl::OkStatus();
}

}  // namespace tandem::elastic
