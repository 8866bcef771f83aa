// A model as the runtime sees it: an ordered list of LibTorch modules (layers) plus a loss.
// The plan cuts the list into stages at [first_layer, end_layer) ranges; tensors between
// consecutive layers are single tensors. The first layer takes the data set's inputs, the loss
// takes the last layer's output and the data set's targets.
//
// Determinism: ModelSpec::Build seeds LibTorch's global generator and constructs the whole
// model, so every rank that builds from the same seed gets the same initial parameters as a
// single process, and then keeps only its own layers (TorchStage clones them). Building the
// full model on every rank costs its memory once; fine for the models tandem trains on CPUs,
// documented as the known limit for very large models.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/torch/tensor_parallel.h"

namespace tandem::runtime::libtorch {

// Loss of one micro-batch from the last layer's output and the targets. Must be the MEAN over
// the micro-batch's samples (and tokens): the runtime scales each micro-batch's loss by
// 1 / (micro-batches over all data-parallel replicas) so the summed gradients equal the
// gradient of the global-batch mean.
using LossFunction =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& targets)>;

struct LayeredModel {
  std::string name;
  std::vector<std::string> layer_names;      // one per layer ("embedding", "block3", ...)
  std::vector<torch::nn::AnyModule> layers;  // each maps one tensor to one tensor
  // Each layer's relative compute cost (forward FLOPs per sample, say) where the model can
  // estimate it: `tandem train --schedule` splits the layers by it. Empty: unknown (an even
  // split by layer count).
  std::vector<double> layer_costs;
  // The relative costs of a forward, an input-gradient and a weight-gradient pass over the
  // model (FLOPs, say), where the model can estimate them: ZB-V plans its order with them. All
  // zero: unknown (planned as equal).
  std::array<double, 3> split_pass_costs{};
  LossFunction loss;
  // Tensor parallelism (runtime/torch/tensor_parallel.h), for models that have a sharded form:
  // replaces `layers`, clones of layers [first, first + layers.size()), by this rank's shards
  // for `tp` (the layers keep `tp`'s address: it must outlive them); InvalidArgument when a
  // size does not divide. `tensor_parallel_loss` is the loss from a sharded last layer's
  // output. Both empty: the model runs with tensor_parallel = 1 only.
  std::function<absl::Status(std::vector<torch::nn::AnyModule>& layers, int first,
                             const TensorParallel& tp)>
      shard_for_tensor_parallel;
  std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& targets,
                              const TensorParallel& tp)>
      tensor_parallel_loss;

  int num_layers() const { return static_cast<int>(layers.size()); }

  // Checks 0 <= first < end <= num_layers(), naming the model.
  absl::Status CheckRange(int first, int end) const;

  // Deep copies of layers [first, end) on `device`, independent of this model and of each
  // other call. Every layer must be clonable (derive from torch::nn::Cloneable, as LibTorch's
  // own modules and Sequential do); otherwise FailedPrecondition names the layer.
  absl::StatusOr<std::vector<torch::nn::AnyModule>> CloneLayers(int first, int end,
                                                                torch::Device device) const;

  // Forward through layers [first, end) (no range check; throws c10::Error like LibTorch).
  torch::Tensor Forward(torch::Tensor x, int first, int end) const;

  // Parameters of layers [first, end) named "layers.<global index>.<parameter name>", the same
  // names a TorchStage holding these layers reports.
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters(int first, int end) const;
};

// Names of the parameters of `layers`, which are layers [first, first + layers.size()) of a
// model: "layers.<global index>.<parameter name>".
std::vector<std::pair<std::string, torch::Tensor>> NamedLayerParameters(
    const std::vector<torch::nn::AnyModule>& layers, int first);

// How to build a model. `build` draws every random initial value from LibTorch's global
// generator (torch::manual_seed is set by Build), so the result depends on the seed only.
struct ModelSpec {
  std::string name;
  std::function<LayeredModel()> build;

  // Seeds the global generator with `seed`, builds, and checks that the model has layers,
  // names for each and a loss. LibTorch exceptions become InvalidArgument. Not thread-safe
  // (the global generator is shared): build models from one thread.
  absl::StatusOr<LayeredModel> Build(uint64_t seed) const;
};

// A model from a Sequential: each child is one layer (named by its child name).
LayeredModel FromSequential(std::string name, const torch::nn::Sequential& sequential,
                            LossFunction loss);

// Runs `body` and turns a LibTorch exception (c10::Error, std::exception) into an Internal
// status with `context` ("stage [2, 4) ... micro-batch 3 forward: ...").
absl::Status CatchTorchErrors(const std::string& context, const std::function<void()>& body);

}  // namespace tandem::runtime::libtorch
