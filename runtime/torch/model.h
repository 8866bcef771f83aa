// A model as the runtime sees it: an ordered list of LibTorch modules (layers) plus a loss.
// The plan cuts the list into stages at [first_layer, end_layer) ranges; tensors between
// consecutive layers are single tensors. The first layer takes the data set's inputs, the loss
// takes the last layer's output and the data set's targets.
//
// Determinism and memory: a model given layer by layer (ModelSpec::describe + build_layer)
// draws layer i's initial values from LibTorch's global generator seeded with
// LayerSeed(seed, i), so a rank that builds only its own layers (ModelSpec::BuildLayers) gets
// bit for bit the layers of a whole-model build or a single process, and never allocates the
// others: the memory of a stage is that of its layers. A model given whole (ModelSpec::build,
// FromSequential) is built whole on every rank from the seed, and each stage clones its layers:
// its memory is the whole model's on every rank.
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
#include "absl/strings/string_view.h"
#include "runtime/torch/tensor_parallel.h"

namespace tandem::runtime::libtorch {

// Loss of one micro-batch from the last layer's output and the targets. Must be the MEAN over
// the micro-batch's samples (and tokens): the runtime scales each micro-batch's loss by
// 1 / (micro-batches over all data-parallel replicas) so the summed gradients equal the
// gradient of the global-batch mean.
using LossFunction =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& targets)>;

// One tied pair, named as LayeredModel::NamedParameters names parameters
// ("layers.<global index>.<name>"): `copy` starts as `owner`'s values and their gradients are
// summed every step.
struct TiedParameter {
  std::string owner;  // "layers.0.embed_tokens.weight"
  std::string copy;   // "layers.<last>.lm_head.weight"

  bool operator==(const TiedParameter& other) const {
    return owner == other.owner && copy == other.copy;
  }
};

struct TiedWeights {
  std::vector<TiedParameter> parameters;  // empty: nothing tied
  // For `layers`, layers [first, first + layers.size()) of the model (after CloneLayers, and
  // after shard_for_tensor_parallel where it runs, before training): every copy whose owner is
  // among them stops being a parameter and uses the owner's tensor. Pairs not both in range are
  // left as they are. A layer that shares cannot be cloned afterwards (LibTorch's clone finds
  // a parameter missing): clone first, then share. Empty where nothing is tied.
  std::function<absl::Status(std::vector<torch::nn::AnyModule>& layers, int first)> share;
};

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
  // Whether `loss` takes the last layer's output in the type it was computed in (bfloat16
  // under autocast) and works in float32 itself (TokenCrossEntropyLoss: without a float32 copy
  // of the logits). Otherwise the runtime hands it the output converted to float32.
  bool loss_takes_compute_type = false;
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

  // Parameters tied across layers (an LM head that is the token embedding): a stage holding
  // both ends shares one tensor (ShareTiedWeights); stages that split a pair each hold one
  // end, the copy starting as the owner's values (InitializeTiedCopies), and the engine sums
  // their gradients every step (runtime::ParameterView::tied_owner). Empty: nothing tied.
  TiedWeights tied_weights;

  // For a model built layer by layer (ModelSpec::BuildLayers): makes layer `layer` afresh,
  // equal bit for bit to the whole build's (it seeds LibTorch's global generator with the
  // layer's seed, so it is not thread-safe). `layers` holds empty modules for the layers not
  // built on this rank; CloneLayers builds those with it. Empty for a model built whole.
  std::function<torch::nn::AnyModule(int layer)> build_layer;

  int num_layers() const { return static_cast<int>(layers.size()); }

  // Whether layer `layer` is built here (not an empty module).
  bool HasLayer(int layer) const { return !layers[layer].is_empty(); }

  // Checks 0 <= first < end <= num_layers(), naming the model.
  absl::Status CheckRange(int first, int end) const;

  // Deep copies of layers [first, end) on `device`, independent of this model and of each
  // other call: a layer built here is cloned (every such layer must derive from
  // torch::nn::Cloneable, as LibTorch's own modules and Sequential do; otherwise
  // FailedPrecondition names the layer), one that is not is built afresh with build_layer
  // (FailedPrecondition naming it where there is no builder).
  absl::StatusOr<std::vector<torch::nn::AnyModule>> CloneLayers(int first, int end,
                                                                torch::Device device) const;

  // Bytes of the parameters of the layers built here (what building the model allocated).
  int64_t BuiltParameterBytes() const;

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

// For `layers`, clones of layers [first, end) of `model` (after tensor-parallel sharding): a
// tied pair with both ends among them shares one tensor (TiedWeights::share); a pair with one
// end among them is left as it is (SplitTiedPairs: the runtime keeps the two ends equal).
absl::Status ShareTiedWeights(const LayeredModel& model, int first, int end,
                              std::vector<torch::nn::AnyModule>& layers);

// The tied pairs of `model` with exactly one end in layers [first, end): a stage boundary
// between their ends.
std::vector<TiedParameter> SplitTiedPairs(const LayeredModel& model, int first, int end);

// For `layers`, clones of layers [first, end) of `model` before tensor-parallel sharding:
// every tied copy among them whose owner is not gets the owner's initial values (the owner's
// layer is cloned, or built from its seed, for the purpose and dropped), so that the stage
// holding the copy starts as a single process sharing one tensor does. InvalidArgument where
// the shapes differ; FailedPrecondition where a parameter is missing.
absl::Status InitializeTiedCopies(const LayeredModel& model, int first, int end,
                                  std::vector<torch::nn::AnyModule>& layers);

// The layer of a parameter named "layers.<index>.<name>"; -1 for another form.
int LayerOfParameter(const std::string& name);

// The number in a name of the form "<prefix><n>.<rest>" (a parameter's layer or block), with
// <rest> in `rest` when it is not null; -1 for another form.
int NumberAfterPrefix(absl::string_view name, absl::string_view prefix,
                      std::string* rest = nullptr);

// The seed of layer `layer` of a model built layer by layer from `seed`.
uint64_t LayerSeed(uint64_t seed, int layer);

// How to build a model: layer by layer (`describe` and `build_layer`; preferred: each rank then
// builds only its own layers) or whole (`build`). Either draws every random initial value from
// LibTorch's global generator, which Build and BuildLayers seed, so the result depends on the
// seed only.
struct ModelSpec {
  std::string name;
  // The whole model at once.
  std::function<LayeredModel()> build;
  // Layer by layer: `describe` returns the model with everything but its modules (layer names,
  // one per layer; costs; loss; tensor-parallel hooks; `layers` left empty), `build_layer(i)`
  // makes layer i. Build and BuildLayers seed the generator with LayerSeed(seed, i) before each.
  std::function<LayeredModel()> describe;
  std::function<torch::nn::AnyModule(int layer)> build_layer;

  bool layer_by_layer() const { return describe && build_layer; }

  // Every layer (BuildLayers over the whole model). Checks that the model has layers, names
  // for each and a loss; LibTorch exceptions become InvalidArgument. Not thread-safe (the
  // global generator is shared): build models from one thread.
  absl::StatusOr<LayeredModel> Build(uint64_t seed) const;

  // Only layers [first, end) (first == end: none, the model's description alone; end -1: to the
  // last): the others stay empty modules that the model's CloneLayers builds on demand, bit for
  // bit as here. A model given whole is built whole whatever the range.
  absl::StatusOr<LayeredModel> BuildLayers(uint64_t seed, int first, int end) const;
};

// The layer-by-layer spec of a model whose layers are made by `layer_builders` (one each, in
// order, named by `layer_names`), with `loss`.
ModelSpec LayerByLayerSpec(std::string name, std::vector<std::string> layer_names,
                           std::vector<std::function<torch::nn::AnyModule()>> layer_builders,
                           LossFunction loss);

// A model from a Sequential: each child is one layer (named by its child name).
LayeredModel FromSequential(std::string name, const torch::nn::Sequential& sequential,
                            LossFunction loss);

// Runs `body` and turns a LibTorch exception (c10::Error, std::exception) into an Internal
// status with `context` ("stage [2, 4) ... micro-batch 3 forward: ...").
absl::Status CatchTorchErrors(const std::string& context, const std::function<void()>& body);

}  // namespace tandem::runtime::libtorch
