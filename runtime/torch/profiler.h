// The layer profiler: measures a LayeredModel layer by layer at one micro-batch size and
// returns a pipeline::Profile (the planner's input; write it with pipeline::WriteProfileFile).
//
// For each layer l, on an input made by running layers [0, l) on a micro-batch of the data set:
//   forward_seconds          median over `repeats` forwards (after `warmup` untimed rounds),
//                            with autograd recording as in training
//   backward_seconds         median full backward (input and weight gradients); the last
//                            layer's forward and backward include the loss
//   backward_input_seconds   the zero-bubble split of backward_seconds, in the ratio of the
//   backward_weight_seconds  median input-gradient-only pass (graph kept) to the median
//                            weight-gradient pass on the same graph (they sum to the total)
//   output_activation_bytes  bytes of the layer's output (what crosses a stage boundary)
//   stashed_activation_bytes bytes the forward leaves allocated while its graph is alive
//                            (saved tensors plus output), measured through LibTorch's memory
//                            reporting hook (CPU and CUDA allocators report to it)
//   parameter_bytes, optimizer_state_bytes (2x parameters for Adam(W), 1x for SGD with
//                            momentum, 0 for plain SGD), recompute_seconds = forward_seconds,
//                            recompute_stashed_bytes = bytes of the layer's input.
//   optimizer_seconds        median step of the optimizer `optimizer_state` names (AdamW, SGD
//                            with momentum, SGD) over the layer's parameters, with the device
//                            operations the runtime uses there (CPU loops; LibTorch on CUDA)
// On a CUDA device every timed region is bracketed by torch::cuda::synchronize().
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "pipeline/profile.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"

namespace tandem::runtime::libtorch {

enum class OptimizerStateKind { kNone, kMomentum, kAdam };

struct ProfilerOptions {
  int64_t microbatch_size = 1;
  int warmup = 3;
  int repeats = 10;
  OptimizerStateKind optimizer_state = OptimizerStateKind::kAdam;
  torch::Device device = torch::kCPU;
  int64_t data_iteration = 0;  // which iteration's samples to feed
  // Tensor parallelism: the layers sharded over this group (the model must have a sharded
  // form) and the last one's loss the vocabulary-parallel one. Collective: every rank of the
  // group profiles together (the shards' collectives run inside the timed passes), and each
  // gets the profile of its shard; times include the collectives.
  TensorParallel tensor_parallel;
};

// Profiles a deep copy of `model` on options.device. InvalidArgument for bad options (or a
// model without a sharded form under tensor parallelism); LibTorch failures name the layer.
absl::StatusOr<pipeline::Profile> ProfileModel(const LayeredModel& model, const Dataset& data,
                                               const ProfilerOptions& options);

// Net bytes that `body` leaves allocated on any device (allocations minus frees that LibTorch's
// allocators report while it runs, on this thread and its intra-op workers). FailedPrecondition
// when the allocators do not report (then nothing can be measured).
absl::StatusOr<int64_t> MeasureRetainedBytes(const std::function<void()>& body);

}  // namespace tandem::runtime::libtorch
