#include "runtime/torch/torch_stage.h"

#include <algorithm>
#include <utility>

#include <torch/autograd.h>
#include <torch/nn/module.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "runtime/torch/auxiliary_loss.h"
#include "runtime/torch/device_ops.h"

namespace tandem::runtime::libtorch {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, "x"), "]");
}

}  // namespace

absl::StatusOr<comm::DataType> ToCommType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32: return comm::DataType::kFloat32;
    case torch::kFloat64: return comm::DataType::kFloat64;
    case torch::kBFloat16: return comm::DataType::kBFloat16;
    case torch::kFloat16: return comm::DataType::kFloat16;
    case torch::kInt8: return comm::DataType::kInt8;
    case torch::kUInt8: return comm::DataType::kUInt8;
    case torch::kInt32: return comm::DataType::kInt32;
    case torch::kInt64: return comm::DataType::kInt64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor type ", c10::toString(type), " cannot cross a stage boundary"));
  }
}

absl::StatusOr<torch::ScalarType> ToTorchType(comm::DataType type) {
  switch (type) {
    case comm::DataType::kFloat32: return torch::kFloat32;
    case comm::DataType::kFloat64: return torch::kFloat64;
    case comm::DataType::kBFloat16: return torch::kBFloat16;
    case comm::DataType::kFloat16: return torch::kFloat16;
    case comm::DataType::kInt8: return torch::kInt8;
    case comm::DataType::kUInt8: return torch::kUInt8;
    case comm::DataType::kInt32: return torch::kInt32;
    case comm::DataType::kInt64: return torch::kInt64;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown data type ", static_cast<int>(type)));
}

absl::StatusOr<std::unique_ptr<TorchStage>> TorchStage::Create(
    const LayeredModel& model, std::shared_ptr<const Dataset> data,
    const TorchStageOptions& options) {
  TANDEM_RETURN_IF_ERROR(model.CheckRange(options.first_layer, options.end_layer));
  if (options.data_parallel < 1 || options.microbatches < 1 || options.microbatch_size < 1 ||
      options.data_parallel_index < 0 || options.data_parallel_index >= options.data_parallel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage [", options.first_layer, ", ", options.end_layer, "): data-parallel index ",
        options.data_parallel_index, " of ", options.data_parallel, ", ", options.microbatches,
        " micro-batches of ", options.microbatch_size, " samples: counts must be positive"));
  }
  const bool needs_data = options.first_layer == 0 || options.end_layer == model.num_layers();
  if (needs_data && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("stage [", options.first_layer, ", ",
                                                   options.end_layer,
                                                   "): first and last stages need a data set"));
  }
  TANDEM_ASSIGN_OR_RETURN(
      std::vector<torch::nn::AnyModule> layers,
      model.CloneLayers(options.first_layer, options.end_layer, options.device));
  // A tied copy whose owner is on another stage starts as the owner (whole, before any
  // tensor-parallel cut: the two are cut alike).
  TANDEM_RETURN_IF_ERROR(
      InitializeTiedCopies(model, options.first_layer, options.end_layer, layers));
  TensorParallelLayout tensor_parallel;
  if (options.tensor_parallel.enabled() || options.tensor_parallel.experts_over_replicas()) {
    TANDEM_ASSIGN_OR_RETURN(tensor_parallel, ShardForTensorParallel(model, options, layers));
  }
  TANDEM_RETURN_IF_ERROR(
      ShareTiedWeights(model, options.first_layer, options.end_layer, layers));
  std::unique_ptr<TorchStage> stage(
      new TorchStage(model, std::move(data), options, std::move(layers)));
  stage->tensor_parallel_ = std::move(tensor_parallel);
  for (const TiedParameter& pair :
       SplitTiedPairs(model, options.first_layer, options.end_layer)) {
    const int owner = LayerOfParameter(pair.owner);
    const bool holds_owner = owner >= options.first_layer && owner < options.end_layer;
    stage->tied_[holds_owner ? pair.owner : pair.copy] = pair;
  }
  if (options.tensor_parallel.enabled() && stage->is_last_) {
    // The loss of the sharded logits; the group lives in the stage's options.
    const TensorParallel* tp = &stage->options_.tensor_parallel;
    stage->loss_ = [loss = model.tensor_parallel_loss, tp](const torch::Tensor& output,
                                                           const torch::Tensor& targets) {
      return loss(output, targets, *tp);
    };
    stage->loss_takes_compute_type_ = false;
  }
  for (auto& [name, parameter] : stage->parameters_) {
    if (parameter.scalar_type() != torch::kFloat32 || !parameter.is_contiguous()) {
      return absl::FailedPreconditionError(
          absl::StrCat("stage [", options.first_layer, ", ", options.end_layer, "): parameter ",
                       name, " is ", c10::toString(parameter.scalar_type()),
                       parameter.is_contiguous() ? "" : " (not contiguous)",
                       "; the runtime needs contiguous float32 parameters"));
    }
  }
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors("laying out parameters", [&] { stage->BuildArenas(); }));
  if (options.device.is_cuda() || options.libtorch_device_ops) {
    stage->device_ops_ = std::make_unique<TorchDeviceOps>(options.device, options.fused_adamw);
  }
  return stage;
}

absl::StatusOr<TorchStage::TensorParallelLayout> TorchStage::ShardForTensorParallel(
    const LayeredModel& model, const TorchStageOptions& options,
    std::vector<torch::nn::AnyModule>& layers) {
  const TensorParallel& tp = options.tensor_parallel;
  const std::string where = absl::StrCat("stage [", options.first_layer, ", ",
                                         options.end_layer, ")");
  if (!model.shard_for_tensor_parallel || !model.tensor_parallel_loss) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": model '", model.name, "' has no tensor-parallel form (it runs with ",
        "tensor_parallel = 1 only)"));
  }
  if (tp.enabled() &&
      (tp.group == nullptr || tp.group->size() != tp.size || tp.group->rank() != tp.rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor-parallel group of ", tp.size, " ranks (index ", tp.rank,
                     ") without a matching communicator"));
  }
  // A parameter that keeps its full shape is whole on every rank of the group.
  std::map<std::string, std::vector<int64_t>> full;
  for (const auto& [name, tensor] : NamedLayerParameters(layers, options.first_layer)) {
    full[name] = tensor.sizes().vec();
  }
  auto shard = [&](std::vector<torch::nn::AnyModule>& modules) -> absl::Status {
    absl::Status sharded = absl::OkStatus();
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat(where, ": tensor-parallel shards"), [&] {
      sharded = model.shard_for_tensor_parallel(modules, options.first_layer, tp);
    }));
    return Annotate(sharded, where);
  };
  TANDEM_RETURN_IF_ERROR(shard(layers));
  // A model's sharding may build its shard modules where LibTorch builds modules (the CPU):
  // every shard lives on the stage's device, as the whole layers did.
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat(where, ": moving shards to ",
                                                       options.device.str()),
                                          [&] {
                                            for (torch::nn::AnyModule& layer : layers) {
                                              layer.ptr()->to(options.device);
                                            }
                                          }));
  TensorParallelLayout layout;
  const auto sharded = NamedLayerParameters(layers, options.first_layer);
  // A parameter whole on this rank is replicated when every rank holds it whole. Expert
  // parallelism places an expert whole on some ranks and empty on the others: the group
  // counts each parameter's elements over its ranks to tell.
  std::vector<char> whole_everywhere(sharded.size(), 1);
  if (tp.experts_over_replicas()) {
    // Experts spread over replicas: a parameter some replicas hold empty in some lane of the
    // group is placed (in every lane: an expert the group places on another part is empty on
    // every replica of this lane, and must still be gathered and synchronised as the others).
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat(where, ": experts over replicas"), [&] {
      const int64_t n = static_cast<int64_t>(sharded.size());
      torch::Tensor counts = torch::empty({n}, torch::kLong);
      for (int64_t i = 0; i < n; ++i) counts[i] = sharded[static_cast<size_t>(i)].second.numel();
      const torch::Tensor all = GatherExpertCounts(counts, options.device, tp);
      torch::Tensor differs =
          (std::get<0>(all.min(0)) != std::get<0>(all.max(0))).to(torch::kDouble);
      differs = ReduceFromTensorParallel(differs.to(options.device), tp).to(torch::kCPU);
      for (int64_t i = 0; i < n; ++i) {
        if (differs[i].item<double>() > 0) {
          layout.placed.insert(sharded[static_cast<size_t>(i)].first);
          whole_everywhere[static_cast<size_t>(i)] = 0;
        }
      }
    }));
  }
  if (tp.expert_parallel > 1) {
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat(where, ": expert placement"), [&] {
      torch::NoGradGuard no_grad;
      torch::Tensor counts = torch::empty({static_cast<int64_t>(sharded.size())}, torch::kDouble);
      for (size_t i = 0; i < sharded.size(); ++i) {
        counts[static_cast<int64_t>(i)] = static_cast<double>(sharded[i].second.numel());
      }
      counts = ReduceFromTensorParallel(counts.to(options.device), tp).to(torch::kCPU);
      for (size_t i = 0; i < sharded.size(); ++i) {
        whole_everywhere[i] = counts[static_cast<int64_t>(i)].item<double>() ==
                              static_cast<double>(sharded[i].second.numel()) * tp.size;
      }
    }));
  }
  for (size_t i = 0; i < sharded.size(); ++i) {
    const auto& [name, tensor] = sharded[i];
    if (full[name] == tensor.sizes().vec() && whole_everywhere[i] &&
        layout.placed.count(name) == 0) {
      layout.replicated.insert(name);
    }
  }
  // Where each shard element comes from, whatever the model's split: shard copies whose
  // elements hold their own index in the whole parameter, 20 bits at a time (exact in
  // float32), through the same sharding.
  constexpr int kBits = 20;
  for (int shift = 0; shift < 63; shift += kBits) {
    int64_t largest = 0;
    for (const auto& [name, dims] : full) {
      int64_t count = 1;
      for (int64_t d : dims) count *= d;
      largest = std::max(largest, count);
    }
    if (shift > 0 && (largest - 1) >> shift == 0) break;
    TANDEM_ASSIGN_OR_RETURN(std::vector<torch::nn::AnyModule> probe,
                            model.CloneLayers(options.first_layer, options.end_layer, torch::kCPU));
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat(where, ": tensor-parallel layout"), [&] {
      torch::NoGradGuard no_grad;
      for (auto& [name, tensor] : NamedLayerParameters(probe, options.first_layer)) {
        const auto index = torch::arange(tensor.numel(), torch::kLong);
        tensor.copy_(index.bitwise_right_shift(shift)
                         .bitwise_and((int64_t{1} << kBits) - 1)
                         .to(torch::kFloat)
                         .view(tensor.sizes()));
      }
    }));
    TANDEM_RETURN_IF_ERROR(shard(probe));
    for (const auto& [name, tensor] : NamedLayerParameters(probe, options.first_layer)) {
      if (layout.replicated.count(name) > 0) continue;
      const torch::Tensor bits = tensor.detach().reshape({-1}).to(torch::kLong).contiguous();
      std::vector<int64_t>& index = layout.index[name];
      index.resize(static_cast<size_t>(bits.numel()), 0);
      const int64_t* b = bits.data_ptr<int64_t>();
      for (size_t i = 0; i < index.size(); ++i) index[i] |= b[i] << shift;
      int64_t count = 1;
      for (int64_t d : full[name]) count *= d;
      layout.whole_count[name] = count;
      layout.whole_shape[name] = full[name];
    }
  }
  return layout;
}

void TorchStage::BuildArenas() {
  torch::NoGradGuard no_grad;
  int64_t total = 0;
  for (const auto& named : parameters_) total += named.second.numel();
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(options_.device);
  value_arena_ = torch::empty({total}, options);
  grad_arena_ = torch::zeros({total}, options);
  int64_t offset = 0;
  for (auto it = parameters_.rbegin(); it != parameters_.rend(); ++it) {  // backward order
    torch::Tensor& parameter = it->second;
    TORCH_CHECK(parameter.device() == options_.device, "parameter ", it->first, " is on ",
                parameter.device().str(), ", the stage on ", options_.device.str());
    const int64_t count = parameter.numel();
    value_arena_.narrow(0, offset, count).copy_(parameter.reshape({count}));
    parameter.set_(value_arena_.storage(), offset, parameter.sizes(), parameter.strides());
    parameter.mutable_grad() = grad_arena_.narrow(0, offset, count).view(parameter.sizes());
    offset += count;
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    parameter_index_[parameters_[i].second.data_ptr()] = static_cast<int>(i);
  }
  unwritten_.assign(parameters_.size(), 0);  // zeros until the first iteration
}

bool TorchStage::TakeFirst(const torch::Tensor& parameter) {
  auto it = parameter_index_.find(parameter.data_ptr());
  if (it == parameter_index_.end() || !unwritten_[it->second]) return false;
  unwritten_[it->second] = 0;
  return true;
}

absl::Status TorchStage::FinishGradients() {
  return CatchTorchErrors(Where(-1), [&] {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (!unwritten_[i]) continue;
      parameters_[i].second.grad().zero_();  // no gradient this iteration
      unwritten_[i] = 0;
    }
  });
}

TorchStage::TorchStage(const LayeredModel& model, std::shared_ptr<const Dataset> data,
                       TorchStageOptions options, std::vector<torch::nn::AnyModule> layers)
    : options_(std::move(options)),
      is_last_(options_.end_layer == model.num_layers()),
      data_(std::move(data)),
      loss_(model.loss),
      loss_takes_compute_type_(model.loss_takes_compute_type),
      layers_(std::move(layers)),
      parameters_(NamedLayerParameters(layers_, options_.first_layer)),
      loss_scale_(1.0 / (options_.loss_microbatches > 0
                             ? static_cast<double>(options_.loss_microbatches)
                             : static_cast<double>(options_.microbatches) *
                                   options_.data_parallel)) {
  const int count = static_cast<int>(layers_.size());
  auto recomputed = [&](int local) {
    const auto& list = options_.recompute_layers;
    return std::find(list.begin(), list.end(), options_.first_layer + local) != list.end();
  };
  for (int local = 0; local < count; ++local) {
    if (segments_.empty() || segments_.back().recompute != recomputed(local)) {
      segments_.push_back(Segment{local, local + 1, recomputed(local), false});
    } else {
      segments_.back().end = local + 1;
    }
  }
  segments_.back().computes_loss = is_last_;
  for (const Segment& segment : segments_) {
    std::vector<torch::nn::AnyModule> range(layers_.begin() + segment.begin,
                                            layers_.begin() + segment.end);
    std::vector<torch::Tensor> tensors;
    for (auto& named : NamedLayerParameters(range, 0)) tensors.push_back(named.second);
    segment_parameters_.push_back(std::move(tensors));
  }
}

std::vector<std::pair<std::pair<int, int>, bool>> TorchStage::segments() const {
  std::vector<std::pair<std::pair<int, int>, bool>> result;
  for (const Segment& segment : segments_) {
    result.push_back({{options_.first_layer + segment.begin, options_.first_layer + segment.end},
                      segment.recompute});
  }
  return result;
}

std::string TorchStage::Where(int microbatch) const {
  std::string where = absl::StrCat("stage [", options_.first_layer, ", ", options_.end_layer,
                                   ") replica ", options_.data_parallel_index, " iteration ",
                                   iteration_);
  if (microbatch >= 0) absl::StrAppend(&where, " micro-batch ", microbatch);
  return where;
}

comm::Device TorchStage::device() const {
  if (options_.device.is_cuda()) {
    return comm::Device::Cuda(options_.device.has_index() ? options_.device.index() : 0);
  }
  return comm::Device::Cpu();
}

Tensor TorchStage::ToRuntime(torch::Tensor tensor) const {
  tensor = tensor.contiguous();
  Tensor result;
  result.meta.shape = tensor.sizes().vec();
  // Types reaching here come from ToTorchType or the model's activations.
  result.meta.dtype = ToCommType(tensor.scalar_type()).value_or(comm::DataType::kFloat32);
  result.buffer.data = tensor.data_ptr();
  result.buffer.count = tensor.numel();
  result.buffer.dtype = result.meta.dtype;
  result.buffer.device = device();
  result.holder = std::make_shared<torch::Tensor>(std::move(tensor));
  return result;
}

absl::StatusOr<torch::Tensor> TorchStage::FromRuntime(const Tensor& tensor) const {
  TANDEM_ASSIGN_OR_RETURN(const torch::ScalarType type, ToTorchType(tensor.meta.dtype));
  int64_t count = 1;
  for (int64_t dim : tensor.meta.shape) count *= dim;
  if (tensor.buffer.data == nullptr || tensor.buffer.count != count ||
      tensor.buffer.dtype != tensor.meta.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", ShapeString(tensor.meta.shape), " of ", c10::toString(type),
                     " has a buffer of ", tensor.buffer.count,
                     " elements of another type or no memory"));
  }
  if (tensor.buffer.device.kind != device().kind ||
      (device().kind == comm::DeviceKind::kCuda && tensor.buffer.device.index != device().index)) {
    return absl::InvalidArgumentError("tensor is on another device than the stage");
  }
  std::shared_ptr<void> holder = tensor.holder;
  return TensorOver(tensor.buffer.data, tensor.meta.shape,
                    torch::TensorOptions().dtype(type).device(options_.device),
                    [holder](void*) {});
}

absl::StatusOr<Tensor> TorchStage::NewTensor(const TensorMeta& meta) {
  TANDEM_ASSIGN_OR_RETURN(const torch::ScalarType type, ToTorchType(meta.dtype));
  Tensor result;
  TANDEM_RETURN_IF_ERROR(
      CatchTorchErrors(absl::StrCat("allocating ", ShapeString(meta.shape)), [&] {
        result = ToRuntime(
            torch::empty(meta.shape, torch::TensorOptions().dtype(type).device(options_.device)));
      }));
  return result;
}

std::vector<ParameterView> TorchStage::Parameters() {
  std::vector<ParameterView> views;
  views.reserve(parameters_.size());
  for (auto& [name, parameter] : parameters_) {
    ParameterView view;
    view.name = name;
    view.value = comm::Buffer{parameter.data_ptr(), parameter.numel(), comm::DataType::kFloat32,
                              device()};
    view.grad = comm::Buffer{parameter.grad().data_ptr(), parameter.numel(),
                             comm::DataType::kFloat32, device()};
    view.shape = parameter.sizes().vec();
    view.tensor_parallel_replicated = tensor_parallel_.replicated.count(name) > 0;
    view.placed_over_replicas = tensor_parallel_.placed.count(name) > 0;
    auto index = tensor_parallel_.index.find(name);
    if (index != tensor_parallel_.index.end()) {
      view.tensor_parallel_index = &index->second;
      view.whole_count = tensor_parallel_.whole_count.at(name);
      view.shape = tensor_parallel_.whole_shape.at(name);  // the whole parameter's
    }
    auto tied = tied_.find(name);
    if (tied != tied_.end()) {
      view.tied_owner = tied->second.owner;
      view.tied_layers = {LayerOfParameter(tied->second.owner),
                          LayerOfParameter(tied->second.copy)};
      view.tied_layer = LayerOfParameter(name);
    }
    views.push_back(std::move(view));
  }
  return views;
}

absl::Status TorchStage::BeginIteration(int64_t iteration) {
  if (!stash_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(stash_.begin()->first), ": iteration ", iteration, " begins while ",
        stash_.size(), " micro-batch(es) still wait for backward"));
  }
  iteration_ = iteration;
  evaluating_ = false;
  std::fill(unwritten_.begin(), unwritten_.end(), 1);  // each first gradient writes over
  return SelectBatch(*data_, iteration);
}

absl::Status TorchStage::BeginEvaluation(int64_t batch) {
  if (!stash_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(stash_.begin()->first), ": evaluation begins while ", stash_.size(),
        " micro-batch(es) still wait for backward"));
  }
  if ((is_first() || is_last_) && options_.validation_data == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(Where(-1), ": no validation data"));
  }
  evaluating_ = true;
  if (iteration_ < 0) iteration_ = 0;  // a forward needs a begun iteration
  if (!is_first() && !is_last_) return SelectBatch(*data_, batch);
  return SelectBatch(*options_.validation_data, batch);
}

absl::Status TorchStage::SelectBatch(const Dataset& data, int64_t iteration) {
  iteration_loss_ = torch::Tensor();
  if (loss_on_its_way_.started()) loss_on_its_way_.Take();  // one nobody read
  microbatch_losses_.clear();
  if (!is_first() && !is_last_) return absl::OkStatus();
  const int64_t replica_samples = options_.microbatches * options_.microbatch_size;
  absl::StatusOr<Batch> batch = data.Samples(
      iteration,
      options_.sample_offset >= 0 ? options_.sample_offset
                                  : options_.data_parallel_index * replica_samples,
      replica_samples);
  if (!batch.ok()) return Annotate(batch.status(), Where(-1));
  replica_batch_ = *std::move(batch);
  if (!options_.device.is_cuda()) return absl::OkStatus();
  // The iteration's samples go to the GPU at once, from pinned memory without waiting: a
  // copy from pageable memory per micro-batch would make the host wait for the GPU to finish
  // all queued work before every first-stage forward (and every last-stage loss).
  return CatchTorchErrors(Where(-1), [&] {
    auto to_device = [&](const torch::Tensor& t) {
      if (!t.is_cpu()) return t.to(options_.device);  // a data set on a device already
      const torch::Tensor pinned = t.is_pinned() ? t : t.pin_memory();
      return pinned.to(torch::TensorOptions().device(options_.device), /*non_blocking=*/true);
    };
    if (is_first()) replica_batch_.inputs = to_device(replica_batch_.inputs);
    if (is_last_) replica_batch_.targets = to_device(replica_batch_.targets);
  });
}

torch::Tensor TorchStage::RunSegment(const Segment& segment, torch::Tensor input,
                                     const torch::Tensor& targets) const {
  {
    AutocastGuard autocast(options_.device, options_.precision);
    // Layers' auxiliary losses (experts' load balancing) scaled as the loss is.
    AuxiliaryLossScale auxiliary_scale(loss_scale_);
    for (int local = segment.begin; local < segment.end; ++local) {
      torch::nn::AnyModule module = layers_[local];  // shares the module; forward is non-const
      input = module.forward<torch::Tensor>(input);
    }
  }
  // The loss in float32, from float32 logits (a no-op conversion in float32 runs).
  if (segment.computes_loss) {
    input = loss_(loss_takes_compute_type_ ? input : input.to(torch::kFloat32), targets) *
            loss_scale_;
  }
  return input;
}

absl::StatusOr<std::vector<Tensor>> TorchStage::Forward(int microbatch,
                                                        std::vector<Tensor> inputs) {
  if (iteration_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(microbatch), ": forward before BeginIteration"));
  }
  if (microbatch < 0 || microbatch >= options_.microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(microbatch), ": micro-batch out of [0, ", options_.microbatches, ")"));
  }
  if (stash_.count(microbatch) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(microbatch), ": forwarded twice without backward"));
  }
  torch::Tensor x;
  MicrobatchStash stash;
  const int64_t offset = microbatch * options_.microbatch_size;
  if (is_first()) {
    x = replica_batch_.inputs.narrow(0, offset, options_.microbatch_size).to(options_.device);
  } else {
    if (inputs.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(microbatch), ": expected 1 input, got ", inputs.size()));
    }
    absl::StatusOr<torch::Tensor> received = FromRuntime(inputs[0]);
    if (!received.ok()) return Annotate(received.status(), Where(microbatch));
    if (!received->is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(microbatch), ": input of type ", c10::toString(received->scalar_type()),
          " cannot carry a gradient; only the first stage takes integer inputs"));
    }
    x = received->clone();  // our own copy: the caller may reuse its receive buffer
  }
  if (is_last_) {
    stash.targets =
        replica_batch_.targets.narrow(0, offset, options_.microbatch_size).to(options_.device);
  }
  if (evaluating_) {
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat(Where(microbatch), " evaluation"), [&] {
      torch::NoGradGuard no_grad;
      for (const Segment& segment : segments_) x = RunSegment(segment, x, stash.targets);
    }));
    std::vector<Tensor> outputs;
    if (!is_last_) {
      outputs.push_back(ToRuntime(x));
      return outputs;
    }
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(Where(microbatch), [&] {
      const torch::Tensor scaled = x.to(torch::kFloat64);
      iteration_loss_ = iteration_loss_.defined() ? iteration_loss_ + scaled : scaled;
    }));
    return outputs;
  }
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat(Where(microbatch), " forward"), [&] {
    torch::AutoGradMode grad_mode(true);
    for (const Segment& segment : segments_) {
      SegmentStash kept;
      kept.input = x.detach();
      if (kept.input.is_floating_point()) kept.input.requires_grad_(true);
      if (segment.recompute) {
        torch::NoGradGuard no_grad;
        x = RunSegment(segment, kept.input, stash.targets);
      } else {
        kept.output = RunSegment(segment, kept.input, stash.targets);
        x = kept.output.detach();
      }
      stash.segments.push_back(std::move(kept));
    }
  }));
  std::vector<Tensor> outputs;
  if (is_last_) {
    // Kept on the device and read once, when the iteration's loss is asked for: reading it
    // here would make the host wait for every forward before launching the next pass.
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(Where(microbatch), [&] {
      const torch::Tensor scaled = x.detach().to(torch::kFloat64);
      microbatch_losses_[microbatch] = scaled;
      iteration_loss_ = iteration_loss_.defined() ? iteration_loss_ + scaled : scaled;
    }));
  } else {
    outputs.push_back(ToRuntime(x));
  }
  stash_.emplace(microbatch, std::move(stash));
  return outputs;
}

double TorchStage::IterationLoss() const {
  if (loss_on_its_way_.started()) return loss_on_its_way_.Take();
  return iteration_loss_.defined() ? iteration_loss_.item<double>() : 0.0;
}

absl::Status TorchStage::StartReadingIterationLoss() {
  return CatchTorchErrors("copying the loss to the host", [&] {
    if (iteration_loss_.defined()) loss_on_its_way_.Start(iteration_loss_);
  });
}

std::map<int, double> TorchStage::microbatch_losses() const {
  std::map<int, double> losses;
  for (const auto& [microbatch, scaled] : microbatch_losses_) {
    losses[microbatch] = scaled.item<double>() / loss_scale_;
  }
  return losses;
}

absl::StatusOr<TorchStage::MicrobatchStash*> TorchStage::FindStash(int microbatch) {
  auto it = stash_.find(microbatch);
  if (it == stash_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(microbatch), ": backward without a forward"));
  }
  return &it->second;
}

void TorchStage::EnsureGraph(const Segment& segment, SegmentStash& stash,
                             const torch::Tensor& targets) const {
  if (stash.output.defined()) return;
  torch::AutoGradMode grad_mode(true);
  stash.output = RunSegment(segment, stash.input, targets);
}

void TorchStage::AccumulateGrads(const std::vector<torch::Tensor>& parameters,
                                 const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (grads[i].defined()) AccumulateGradient(this, parameters[i], grads[i]);
  }
}

absl::StatusOr<torch::Tensor> TorchStage::StartGradient(
    int microbatch, MicrobatchStash& stash, const std::vector<Tensor>& output_grads) const {
  const torch::Tensor& output = stash.segments.back().output;
  if (is_last_) {
    if (!output_grads.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(microbatch), ": the last stage takes no output gradients"));
    }
    return torch::ones_like(output);
  }
  if (output_grads.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(microbatch), ": expected 1 output gradient, got ", output_grads.size()));
  }
  if (output_grads[0].meta.shape != output.sizes().vec()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(microbatch), ": output gradient ",
                     ShapeString(output_grads[0].meta.shape), " does not match the output ",
                     ShapeString(output.sizes().vec())));
  }
  absl::StatusOr<torch::Tensor> grad = FromRuntime(output_grads[0]);
  if (!grad.ok()) return Annotate(grad.status(), Where(microbatch));
  return grad->to(output.scalar_type()).clone();
}

absl::StatusOr<std::vector<Tensor>> TorchStage::Backward(int microbatch,
                                                         std::vector<Tensor> output_grads) {
  TANDEM_ASSIGN_OR_RETURN(MicrobatchStash * stash, FindStash(microbatch));
  if (stash->input_grads_done) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(microbatch), ": full backward after BackwardInput (call BackwardWeight)"));
  }
  const std::string where = absl::StrCat(Where(microbatch), " backward");
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors(where, [&] {
    EnsureGraph(segments_.back(), stash->segments.back(), stash->targets);
  }));
  TANDEM_ASSIGN_OR_RETURN(torch::Tensor grad, StartGradient(microbatch, *stash, output_grads));
  TANDEM_RETURN_IF_ERROR(
      CatchTorchErrors(where, [&] { grad = RunBackward(*stash, grad, /*deferred=*/nullptr); }));
  stash_.erase(microbatch);
  if (is_first()) return std::vector<Tensor>{};
  return std::vector<Tensor>{ToRuntime(grad)};
}

torch::Tensor TorchStage::RunBackward(MicrobatchStash& stash, torch::Tensor grad,
                                      DeferredWeightGrads* deferred) {
  LinearGradScope linear_grads(this, deferred);
  for (int k = static_cast<int>(segments_.size()) - 1; k >= 0; --k) {
    SegmentStash& kept = stash.segments[k];
    EnsureGraph(segments_[k], kept, stash.targets);
    std::vector<torch::Tensor> wrt = segment_parameters_[k];
    const bool wants_input = kept.input.requires_grad();
    if (wants_input) wrt.push_back(kept.input);
    if (wrt.empty()) break;  // token ids in and no parameters: nothing to compute
    std::vector<torch::Tensor> grads =
        torch::autograd::grad({kept.output}, wrt, {grad}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    if (wants_input) {
      grad = grads.back().defined() ? grads.back() : torch::zeros_like(kept.input);
      grads.pop_back();
    }
    AccumulateGrads(segment_parameters_[k], grads);
    kept = SegmentStash{};
  }
  return grad;
}

absl::StatusOr<std::vector<Tensor>> TorchStage::BackwardInput(int microbatch,
                                                              std::vector<Tensor> output_grads) {
  TANDEM_ASSIGN_OR_RETURN(MicrobatchStash * stash, FindStash(microbatch));
  if (stash->input_grads_done) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(microbatch), ": BackwardInput called twice"));
  }
  const std::string where = absl::StrCat(Where(microbatch), " backward-input");
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors(where, [&] {
    EnsureGraph(segments_.back(), stash->segments.back(), stash->targets);
  }));
  TANDEM_ASSIGN_OR_RETURN(torch::Tensor grad, StartGradient(microbatch, *stash, output_grads));
  // B: the graph is walked once; the linear layers keep what their weight gradients need.
  TANDEM_RETURN_IF_ERROR(
      CatchTorchErrors(where, [&] { grad = RunBackward(*stash, grad, &stash->deferred); }));
  stash->input_grads_done = true;
  if (is_first()) return std::vector<Tensor>{};
  return std::vector<Tensor>{ToRuntime(grad)};
}

absl::Status TorchStage::BackwardWeight(int microbatch) {
  TANDEM_ASSIGN_OR_RETURN(MicrobatchStash * stash, FindStash(microbatch));
  if (!stash->input_grads_done) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(microbatch), ": BackwardWeight before BackwardInput"));
  }
  // W: one product per deferred linear layer, no graph.
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat(Where(microbatch), " backward-weight"),
                                          [&] { stash->deferred.Apply(this); }));
  stash_.erase(microbatch);
  return absl::OkStatus();
}

}  // namespace tandem::runtime::libtorch
