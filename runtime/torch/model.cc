#include "runtime/torch/model.h"

#include <exception>
#include <stdexcept>

#include <torch/nn/module.h>
#include <torch/utils.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "runtime/torch/data.h"

namespace tandem::runtime::libtorch {

absl::Status LayeredModel::CheckRange(int first, int end) const {
  if (first < 0 || end > num_layers() || first >= end) {
    return absl::InvalidArgumentError(absl::StrCat("model ", name, ": layer range [", first, ", ",
                                                   end, ") is not a non-empty range of its ",
                                                   num_layers(), " layers"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<torch::nn::AnyModule>> LayeredModel::CloneLayers(
    int first, int end, torch::Device device) const {
  if (absl::Status range = CheckRange(first, end); !range.ok()) return range;
  std::vector<torch::nn::AnyModule> copies;
  copies.reserve(end - first);
  for (int layer = first; layer < end; ++layer) {
    if (HasLayer(layer)) {
      absl::Status cloned = CatchTorchErrors(
          absl::StrCat("model ", name, ": cloning layer ", layer, " (", layer_names[layer], ")"),
          [&] { copies.push_back(layers[layer].clone(device)); });
      if (!cloned.ok()) return absl::FailedPreconditionError(cloned.message());
      continue;
    }
    if (!build_layer) {
      return absl::FailedPreconditionError(absl::StrCat("model ", name, ": layer ", layer, " (",
                                                        layer_names[layer],
                                                        ") is not built here and the model has "
                                                        "no layer builder"));
    }
    absl::Status built = CatchTorchErrors(
        absl::StrCat("model ", name, ": building layer ", layer, " (", layer_names[layer], ")"),
        [&] {
          torch::nn::AnyModule module = build_layer(layer);
          if (module.is_empty()) throw std::invalid_argument("the builder made no module");
          module.ptr()->to(device);
          copies.push_back(std::move(module));
        });
    if (!built.ok()) return absl::FailedPreconditionError(built.message());
  }
  return copies;
}

int64_t LayeredModel::BuiltParameterBytes() const {
  int64_t bytes = 0;
  for (const torch::nn::AnyModule& layer : layers) {
    if (layer.is_empty()) continue;
    for (const auto& parameter : layer.ptr()->parameters()) {
      bytes += parameter.numel() * static_cast<int64_t>(parameter.element_size());
    }
  }
  return bytes;
}

torch::Tensor LayeredModel::Forward(torch::Tensor x, int first, int end) const {
  for (int layer = first; layer < end; ++layer) {
    torch::nn::AnyModule module = layers[layer];  // shares the module; forward is non-const
    x = module.forward<torch::Tensor>(x);
  }
  return x;
}

std::vector<std::pair<std::string, torch::Tensor>> NamedLayerParameters(
    const std::vector<torch::nn::AnyModule>& layers, int first) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string prefix = absl::StrCat("layers.", first + static_cast<int>(i), ".");
    for (const auto& item : layers[i].ptr()->named_parameters(/*recurse=*/true)) {
      named.emplace_back(prefix + item.key(), item.value());
    }
  }
  return named;
}

std::vector<std::pair<std::string, torch::Tensor>> LayeredModel::NamedParameters(int first,
                                                                                 int end) const {
  std::vector<torch::nn::AnyModule> range(layers.begin() + first, layers.begin() + end);
  return NamedLayerParameters(range, first);
}

int LayerOfParameter(const std::string& name) { return NumberAfterPrefix(name, "layers."); }

int NumberAfterPrefix(absl::string_view name, absl::string_view prefix, std::string* rest) {
  if (!absl::ConsumePrefix(&name, prefix)) return -1;
  const size_t dot = name.find('.');
  int number = -1;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &number)) {
    return -1;
  }
  if (rest != nullptr) *rest = std::string(name.substr(dot + 1));
  return number;
}

namespace {

bool InRange(int layer, int first, int end) { return layer >= first && layer < end; }

// Parameter `name` ("layers.<i>.<inner>") of `layer`, a module of layer i; null if absent.
torch::Tensor* FindParameter(torch::nn::AnyModule& layer, const std::string& name,
                             torch::OrderedDict<std::string, torch::Tensor>& storage) {
  const size_t dot = name.find('.', sizeof("layers.") - 1);
  if (dot == std::string::npos || layer.is_empty()) return nullptr;
  storage = layer.ptr()->named_parameters(/*recurse=*/true);
  return storage.find(name.substr(dot + 1));
}

}  // namespace

std::vector<TiedParameter> SplitTiedPairs(const LayeredModel& model, int first, int end) {
  std::vector<TiedParameter> split;
  for (const TiedParameter& pair : model.tied_weights.parameters) {
    const bool has_owner = InRange(LayerOfParameter(pair.owner), first, end);
    const bool has_copy = InRange(LayerOfParameter(pair.copy), first, end);
    if (has_owner != has_copy) split.push_back(pair);
  }
  return split;
}

absl::Status InitializeTiedCopies(const LayeredModel& model, int first, int end,
                                  std::vector<torch::nn::AnyModule>& layers) {
  for (const TiedParameter& pair : SplitTiedPairs(model, first, end)) {
    const int owner_layer = LayerOfParameter(pair.owner), copy_layer = LayerOfParameter(pair.copy);
    if (!InRange(copy_layer, first, end)) continue;  // the owner is here: it keeps its values
    if (owner_layer < 0 || owner_layer >= model.num_layers()) {
      return absl::InvalidArgumentError(absl::StrCat("model ", model.name, " ties ", pair.copy,
                                                     " to ", pair.owner,
                                                     ", which names no layer of the model"));
    }
    // The owner's layer as the stage holding it starts (cloned, or built from its seed).
    TANDEM_ASSIGN_OR_RETURN(std::vector<torch::nn::AnyModule> owner_layers,
                            model.CloneLayers(owner_layer, owner_layer + 1, torch::kCPU));
    torch::OrderedDict<std::string, torch::Tensor> owner_storage, copy_storage;
    torch::Tensor* owner = FindParameter(owner_layers.front(), pair.owner, owner_storage);
    torch::Tensor* copy = FindParameter(layers[copy_layer - first], pair.copy, copy_storage);
    if (owner == nullptr || copy == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model ", model.name, ": tied parameter ", owner == nullptr ? pair.owner : pair.copy,
          " is not a parameter of its layer"));
    }
    if (owner->sizes() != copy->sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", model.name, ": tied ", pair.copy, " [", absl::StrJoin(copy->sizes(), "x"),
          "] is not the shape of ", pair.owner, " [", absl::StrJoin(owner->sizes(), "x"), "]"));
    }
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(
        absl::StrCat("model ", model.name, ": starting ", pair.copy, " as ", pair.owner), [&] {
          torch::NoGradGuard no_grad;
          copy->copy_(*owner);
        }));
  }
  return absl::OkStatus();
}

absl::Status ShareTiedWeights(const LayeredModel& model, int first, int end,
                              std::vector<torch::nn::AnyModule>& layers) {
  bool share = false;
  for (const TiedParameter& pair : model.tied_weights.parameters) {
    if (InRange(LayerOfParameter(pair.owner), first, end) &&
        InRange(LayerOfParameter(pair.copy), first, end)) {
      share = true;
    }
  }
  if (!share) return absl::OkStatus();
  if (!model.tied_weights.share) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", model.name, " has tied weights but no way to share them"));
  }
  return model.tied_weights.share(layers, first);
}

uint64_t LayerSeed(uint64_t seed, int layer) {
  // A stream of its own, apart from the data sets' MixSeed(seed, iteration, sample).
  constexpr uint64_t kLayerStream = 0x6c617965720000ull;  // "layer"
  return MixSeed(seed, kLayerStream, static_cast<uint64_t>(layer)) >> 1;  // torch wants < 2^63
}

absl::StatusOr<LayeredModel> ModelSpec::Build(uint64_t seed) const {
  return BuildLayers(seed, 0, /*end=*/-1);  // -1: every layer
}

absl::StatusOr<LayeredModel> ModelSpec::BuildLayers(uint64_t seed, int first, int end) const {
  if (!build && !layer_by_layer()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", name, ": no builder"));
  }
  LayeredModel model;
  absl::Status built;
  if (layer_by_layer()) {
    built = CatchTorchErrors(absl::StrCat("describing model ", name), [&] { model = describe(); });
    if (!built.ok()) return absl::InvalidArgumentError(built.message());
    const int layers = static_cast<int>(model.layer_names.size());
    if (end < 0) end = layers;  // Build: every layer
    if (!model.layers.empty() && static_cast<int>(model.layers.size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", name, ": described with ", model.layers.size(), " modules for ", layers,
          " layer names (describe leaves the modules to build_layer)"));
    }
    model.layers.assign(layers, torch::nn::AnyModule());
    if (first < 0 || end > layers || first > end) {
      return absl::InvalidArgumentError(absl::StrCat("model ", name, ": layer range [", first,
                                                     ", ", end, ") is not within its ", layers,
                                                     " layers"));
    }
    model.build_layer = [build_layer = build_layer, seed](int layer) {
      torch::manual_seed(LayerSeed(seed, layer));
      return build_layer(layer);
    };
    for (int layer = first; layer < end && built.ok(); ++layer) {
      built = CatchTorchErrors(
          absl::StrCat("building model ", name, " layer ", layer, " (",
                       model.layer_names[layer], ")"),
          [&] { model.layers[layer] = model.build_layer(layer); });
    }
  } else {
    built = CatchTorchErrors(absl::StrCat("building model ", name), [&] {
      torch::manual_seed(seed);
      model = build();
    });
    first = 0;
    end = static_cast<int>(model.layers.size());
  }
  if (!built.ok()) return absl::InvalidArgumentError(built.message());
  if (model.layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", name, ": has no layers"));
  }
  if (model.layer_names.size() != model.layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", name, ": ", model.layers.size(),
                                                   " layers but ", model.layer_names.size(),
                                                   " layer names"));
  }
  if (!model.loss) return absl::InvalidArgumentError(absl::StrCat("model ", name, ": no loss"));
  for (int layer = first; layer < end; ++layer) {
    if (model.layers[layer].is_empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", name, ": layer ", layer, " holds no module"));
    }
  }
  if (model.name.empty()) model.name = name;
  return model;
}

ModelSpec LayerByLayerSpec(std::string name, std::vector<std::string> layer_names,
                           std::vector<std::function<torch::nn::AnyModule()>> layer_builders,
                           LossFunction loss) {
  ModelSpec spec;
  spec.name = name;
  spec.describe = [name, layer_names = std::move(layer_names), loss = std::move(loss)] {
    LayeredModel model;
    model.name = name;
    model.layer_names = layer_names;
    model.loss = loss;
    return model;
  };
  // A layer without a builder throws std::out_of_range when built: an InvalidArgument then.
  spec.build_layer = [builders = std::move(layer_builders)](int layer) {
    return builders.at(static_cast<size_t>(layer))();
  };
  return spec;
}

LayeredModel FromSequential(std::string name, const torch::nn::Sequential& sequential,
                            LossFunction loss) {
  LayeredModel model;
  model.name = std::move(name);
  model.loss = std::move(loss);
  const auto children = sequential->named_children();
  size_t index = 0;
  for (const torch::nn::AnyModule& layer : *sequential) {
    model.layers.push_back(layer);
    model.layer_names.push_back(index < children.size() ? children[index].key()
                                                        : std::to_string(index));
    ++index;
  }
  return model;
}

absl::Status CatchTorchErrors(const std::string& context, const std::function<void()>& body) {
  try {
    body();
  } catch (const c10::Error& error) {
    return absl::InternalError(absl::StrCat(context, ": ", error.what_without_backtrace()));
  } catch (const std::exception& error) {
    return absl::InternalError(absl::StrCat(context, ": ", error.what()));
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime::libtorch
