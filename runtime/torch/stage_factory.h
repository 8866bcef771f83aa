// The bridge from the engine (runtime/engine.h) to LibTorch: a StageFactory that builds a
// TorchStage for every StageSpec the engine asks for (one per chunk and pipeline replica this
// rank runs), each with its own copy of the spec's layers. Header-only, so only programs that
// run the engine (and link tandem_runtime) include it.
//
//   auto model = std::make_shared<LayeredModel>(*spec.Build(seed));   // same seed on all ranks
//   auto engine = runtime::Engine::Create(plan, world, MakeTorchStageFactory(model, data), ...);
#pragma once

#include <memory>
#include <utility>

#include "runtime/engine.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"
#include "runtime/torch/torch_stage.h"

namespace tandem::runtime::libtorch {

// TorchStageOptions for what the engine asks (layers, recomputation, replica and batch
// shape), on `device`.
inline TorchStageOptions TorchStageOptionsFor(const StageSpec& spec, torch::Device device) {
  TorchStageOptions options;
  options.first_layer = spec.first_layer;
  options.end_layer = spec.end_layer;
  options.recompute_layers = spec.recompute_layers;
  options.data_parallel_index = spec.data_parallel_index;
  options.data_parallel = spec.data_parallel;
  options.microbatches = spec.num_microbatches;
  options.microbatch_size = spec.microbatch_size;
  options.sample_offset = spec.sample_offset;
  options.loss_microbatches = spec.loss_microbatches;
  options.device = device;
  options.tensor_parallel.size = spec.tensor_parallel;
  options.tensor_parallel.rank = spec.tensor_parallel_index;
  options.tensor_parallel.group = spec.tensor_group;
  options.tensor_parallel.expert_replicas = spec.expert_replicas;
  options.tensor_parallel.expert_replica = spec.expert_replica;
  options.tensor_parallel.expert_group = spec.expert_group;
  return options;
}

// `model` and `data` are shared by the stages' factory calls; the stages copy their layers.
inline StageFactory MakeTorchStageFactory(std::shared_ptr<const LayeredModel> model,
                                          std::shared_ptr<const Dataset> data,
                                          torch::Device device = torch::kCPU) {
  return [model = std::move(model), data = std::move(data),
          device](const StageSpec& spec) -> absl::StatusOr<std::unique_ptr<Stage>> {
    auto stage = TorchStage::Create(*model, data, TorchStageOptionsFor(spec, device));
    if (!stage.ok()) return stage.status();
    return std::unique_ptr<Stage>(*std::move(stage));
  };
}

}  // namespace tandem::runtime::libtorch
