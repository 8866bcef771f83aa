#include "runtime/torch/model.h"

#include <exception>

#include <torch/nn/module.h>
#include <torch/utils.h>

#include "absl/strings/str_cat.h"

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
    absl::Status cloned = CatchTorchErrors(
        absl::StrCat("model ", name, ": cloning layer ", layer, " (", layer_names[layer], ")"),
        [&] { copies.push_back(layers[layer].clone(device)); });
    if (!cloned.ok()) return absl::FailedPreconditionError(cloned.message());
  }
  return copies;
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

absl::StatusOr<LayeredModel> ModelSpec::Build(uint64_t seed) const {
  if (!build) return absl::InvalidArgumentError(absl::StrCat("model ", name, ": no builder"));
  LayeredModel model;
  absl::Status built = CatchTorchErrors(absl::StrCat("building model ", name), [&] {
    torch::manual_seed(seed);
    model = build();
  });
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
  for (int layer = 0; layer < model.num_layers(); ++layer) {
    if (model.layers[layer].is_empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", name, ": layer ", layer, " holds no module"));
    }
  }
  if (model.name.empty()) model.name = name;
  return model;
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
