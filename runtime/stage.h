// Stage: what the runtime executes — forward, backward (or backward-input and backward-weight)
// of one pipeline stage (or chunk) for one micro-batch, plus parameter access for gradient
// synchronisation, the optimizer and state transfer. The engine (runtime/engine.h) knows
// nothing of LibTorch: tensors cross this seam as Tensor values (shape, dtype, memory).
//
// Implementations: the LibTorch adapter (runtime/torch/torch_stage.h) and the emulated-compute
// stage (runtime/emulated_stage.h), which sleeps or spins for the profiled time.
//
// Threading: a Stage is driven by one engine thread; implementations need no locking.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "runtime/device_ops.h"

namespace tandem::runtime {

// Shape and element type of a tensor crossing a stage boundary.
struct TensorMeta {
  std::vector<int64_t> shape;
  comm::DataType dtype = comm::DataType::kFloat32;
  int64_t NumElements() const;
  bool operator==(const TensorMeta& o) const { return shape == o.shape && dtype == o.dtype; }
};

// Memory of a tensor; `holder` keeps the owner (e.g. a torch::Tensor) alive.
struct Tensor {
  TensorMeta meta;
  comm::Buffer buffer;  // data pointer, element count, dtype, device
  std::shared_ptr<void> holder;
};

// One named parameter as flat buffers, for gradient synchronisation and the optimizer.
// `value` and `grad` stay valid (same address) for the stage's lifetime.
struct ParameterView {
  std::string name;
  comm::Buffer value;
  comm::Buffer grad;
  // Tensor parallelism: the same parameter (and gradient) on every rank of the stage's
  // tensor-parallel group (a layer norm, a bias added after a reduction), not a shard.
  bool tensor_parallel_replicated = false;
  // A shard: element i of `value` is element (*tensor_parallel_index)[i] of the whole
  // parameter, of whole_count elements (null when the parameter is not split). Checkpoints
  // hold whole parameters and cut them with it, so they load onto any layout.
  const std::vector<int64_t>* tensor_parallel_index = nullptr;
  // Expert parallelism across data-parallel replicas (TensorParallel::expert_replicas): an
  // expert's parameter that one replica of each expert group holds and the others hold empty
  // (a shard of no elements there). Its gradient sums every replica's tokens already; only
  // the replicas holding the same experts share it.
  bool placed_over_replicas = false;
  int64_t whole_count = 0;
  // The whole parameter's dimensions (not a tensor-parallel shard's): their product is
  // whole_count for a shard, value.count otherwise. Checkpoints record it with the values.
  // Empty: the stage does not know them (checkpoints then record [count]).
  std::vector<int64_t> shape;
  // A parameter tied to parameters of other stages (an LM head that is the token embedding,
  // held by the first and the last stage): every member names the group's owner here and
  // lists the model layers holding the members, the owner's first. Empty:
  // not tied across stages. The members start equal (the stages' doing); the engine sums
  // their gradients over the stages of each pipeline that hold them before the gradient
  // synchronisation, so they take identical steps; the norm counts the owner alone, and
  // checkpoints hold the owner alone (a copy loads the owner's state).
  std::string tied_owner;
  std::vector<int> tied_layers;
  int tied_layer = -1;  // the layer holding this member (one of tied_layers)
  bool is_tied_copy() const { return !tied_owner.empty() && tied_owner != name; }
};

class Stage {
 public:
  virtual ~Stage() = default;

  // Called before the first micro-batch of an iteration: the stage starts new gradients
  // (complete at FinishGradients) and, if it is the first or last stage, selects the
  // iteration's data (micro-batch `m` of the iteration is the m-th slice of this data-parallel
  // replica's share of the global batch).
  virtual absl::Status BeginIteration(int64_t iteration) = 0;

  // Forward of `microbatch`. The first stage ignores `inputs` (reads its data); the last stage
  // computes the loss and returns no tensors. The stage stashes what backward needs (or only
  // its input when recomputing).
  virtual absl::StatusOr<std::vector<Tensor>> Forward(int microbatch,
                                                      std::vector<Tensor> inputs) = 0;
  // Full backward of `microbatch`: `output_grads` (empty on the last stage, which starts from
  // its loss) in, gradients of the stage's inputs out (empty on the first stage). Frees the
  // micro-batch's stash.
  virtual absl::StatusOr<std::vector<Tensor>> Backward(int microbatch,
                                                       std::vector<Tensor> output_grads) = 0;
  // Split backward (zero-bubble): input gradients now, weight gradients later. BackwardWeight
  // frees the stash. Stages that cannot split may compute everything in BackwardInput.
  virtual absl::StatusOr<std::vector<Tensor>> BackwardInput(int microbatch,
                                                            std::vector<Tensor> output_grads) = 0;
  virtual absl::Status BackwardWeight(int microbatch) = 0;
  // Called once per iteration after the stage's last backward work and before its gradients
  // are read (the engine: at the gradient synchronisation). A stage that writes each
  // parameter's first gradient of an iteration over the old one, instead of zeroing first,
  // zeroes here those that got none.
  virtual absl::Status FinishGradients() { return absl::OkStatus(); }

  // A tensor to receive into, for an activation or gradient of the given meta.
  virtual absl::StatusOr<Tensor> NewTensor(const TensorMeta& meta) = 0;

  // Sum of this stage's micro-batch losses in the current iteration (last stage only), each
  // already scaled as it entered backward.
  virtual double IterationLoss() const = 0;
  // Starts moving IterationLoss to the host, so that reading it after more work is queued
  // (the optimizer step) waits for the loss alone. By default nothing.
  virtual absl::Status StartReadingIterationLoss() { return absl::OkStatus(); }

  // Evaluation (a validation loss): selects batch `batch` of the stage's validation data (the
  // first and last stage; the same slicing as BeginIteration). Until the next BeginIteration,
  // Forward runs without gradients and stashes nothing, and the last stage sums its scaled
  // losses for IterationLoss (so the world's sum is the batch's mean loss, as in training).
  // Unimplemented by default: the stage has no validation data.
  virtual absl::Status BeginEvaluation(int64_t batch) {
    return absl::UnimplementedError("this stage has no validation data to evaluate");
  }

  virtual std::vector<ParameterView> Parameters() = 0;
  virtual comm::Device device() const = 0;
  // Memory operations and optimizer on the stage's device (runtime/device_ops.h), owned by
  // the stage; null: the CPU loops (DefaultCpuDeviceOps), which only CPU stages may use.
  virtual DeviceOps* device_ops() { return nullptr; }
};

}  // namespace tandem::runtime
