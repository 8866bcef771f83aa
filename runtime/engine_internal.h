// Internals of the engine shared by its files: engine.cc (creation, checkpoints, gathers) and
// engine_program.cc (the program interpreter). Not part of the API.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/keep_alive.h"
#include "common/status.h"
#include "runtime/devices.h"
#include "runtime/engine.h"
#include "runtime/grad_sync.h"
#include "runtime/transfer.h"

namespace tandem::runtime {
namespace engine_internal {

// Tags on the engine's pipeline communicators (kGatherTag, 2, and the notices' 3 are taken on
// the control communicator).
constexpr int kTransferTag = 1;  // payloads
constexpr int kHeaderTag = 4;    // transfer headers (first exchange of each kind)
constexpr int kTiedTag = 6;      // gradients of tied parameters (Engine::SumTiedGradients)

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

inline std::string KeyText(const TensorKey& k) {
  return absl::StrCat("stage ", k.stage, " micro-batch ", k.microbatch,
                      k.replica != 0 ? absl::StrCat(" replica ", k.replica) : "");
}

}  // namespace engine_internal

// A stage this rank runs, with its gradient group and synchroniser.
struct Engine::Local {
  StageSpec spec;
  std::unique_ptr<Stage> impl;
  std::unique_ptr<comm::Communicator> group;  // every copy of this stage
  std::unique_ptr<runtime::GradientSync> sync;
  // Experts over replicas: the members of `group` holding the same experts (on CUDA stages
  // through host staging), over which the placed parameters are synchronised.
  std::unique_ptr<comm::Communicator> expert_data_group;
  bool sync_started = false;
  bool parameters_current = false;  // WaitForParameters done since the last step
  // Indices in device.parameters of the parameters tied to other stages' (tied_owner): their
  // gradients are summed at the optimizer step (Engine::SumTiedGradients), and the stage's
  // buckets are handed to the synchroniser only then.
  std::vector<int> tied;
  // Device operations, parameters on the device and, on CUDA, the gradient group for device
  // buffers (runtime/devices.h).
  StageDevice device;
};

// Tensors produced on this rank and not yet consumed or sent, and sends in flight.
struct Engine::Transfers {
  // Sends still in flight when the engine is destroyed after an error: their memory may yet be
  // read by the communication library, so it is kept alive (comm/keep_alive.h).
  ~Transfers() {
    if (!sends.empty()) {
      comm::KeepAliveAfterAbort(std::make_shared<std::deque<PendingSend>>(std::move(sends)));
    }
  }

  // Output of stage `key.stage` / gradient of stage `key.stage`'s input, produced here or
  // (still) arriving from a neighbour.
  std::map<engine_internal::TensorKey, ArrivingTensors> activations;
  std::map<engine_internal::TensorKey, ArrivingTensors> gradients;
  std::deque<PendingSend> sends;
  std::unique_ptr<TransferBatcher> batcher;

  // Removes the tensors of `key` and waits for them if they are still arriving.
  absl::StatusOr<std::vector<Tensor>> Take(std::map<engine_internal::TensorKey, ArrivingTensors>& from,
                                           const engine_internal::TensorKey& key, const char* what) {
    auto it = from.find(key);
    if (it == from.end()) {
      return absl::InternalError(absl::StrCat("no ", what, " of ", engine_internal::KeyText(key),
                                              " on this rank (schedule out of order)"));
    }
    ArrivingTensors tensors = std::move(it->second);
    from.erase(it);
    return tensors.Take();
  }
  absl::Status Put(std::map<engine_internal::TensorKey, ArrivingTensors>& into, const engine_internal::TensorKey& key,
                   ArrivingTensors tensors, const char* what) {
    if (!into.emplace(key, std::move(tensors)).second) {
      return absl::InternalError(absl::StrCat(what, " of ", engine_internal::KeyText(key), " produced twice"));
    }
    return absl::OkStatus();
  }
  absl::Status Put(std::map<engine_internal::TensorKey, ArrivingTensors>& into, const engine_internal::TensorKey& key,
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

}  // namespace tandem::runtime
