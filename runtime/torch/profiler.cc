#include "runtime/torch/profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "runtime/device_ops.h"
#include "runtime/optimizer.h"
#include "runtime/torch/device_ops.h"

namespace tandem::runtime::libtorch {
namespace {

// Counts what LibTorch's allocators report while installed as the thread's memory reporter
// (the hook the autograd profiler uses; CPU and CUDA caching allocators call it).
class AllocationCounter final : public c10::MemoryReportingInfoBase {
 public:
  // LibTorch 1.x signature (int64_t totals).
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, int64_t /*total_allocated*/,
                         int64_t /*total_reserved*/, c10::Device /*device*/) {
    Count(alloc_size);
  }
  // LibTorch 2.x signature (size_t totals). Exactly one of the two overrides the base.
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device /*device*/) {
    Count(alloc_size);
  }
  bool memoryProfilingEnabled() const override { return true; }

  int64_t net_bytes() const { return net_bytes_.load(); }
  int64_t reports() const { return reports_.load(); }

 private:
  void Count(int64_t bytes) {
    net_bytes_ += bytes;
    ++reports_;
  }
  std::atomic<int64_t> net_bytes_{0};
  std::atomic<int64_t> reports_{0};
};

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

double TensorBytes(const torch::Tensor& tensor) {
  return static_cast<double>(tensor.numel()) * static_cast<double>(tensor.element_size());
}

// Times one region, synchronising the device around it.
class RegionTimer {
 public:
  explicit RegionTimer(const torch::Device& device) : device_(device) {}
  template <typename Body>
  double Seconds(Body&& body) const {
    Synchronize();
    const auto start = Clock::now();
    body();
    Synchronize();
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

 private:
  void Synchronize() const {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.has_index() ? device_.index() : -1);
  }
  torch::Device device_;
};

// Measurements of one layer.
struct LayerTimes {
  std::vector<double> forward, backward, backward_input, backward_weight;
};

double OptimizerStateFactor(OptimizerStateKind kind) {
  switch (kind) {
    case OptimizerStateKind::kNone: return 0;
    case OptimizerStateKind::kMomentum: return 1;
    case OptimizerStateKind::kAdam: return 2;
  }
  return 0;
}

// The optimizer the runtime would step a stage's parameters with (its device operations: the
// CPU loops on the CPU, LibTorch's fused multi-tensor kernels on a GPU), for the profile.
OptimizerConfig ProfiledOptimizer(OptimizerStateKind kind) {
  switch (kind) {
    case OptimizerStateKind::kNone: return OptimizerConfig::Sgd(/*momentum=*/0.0);
    case OptimizerStateKind::kMomentum: return OptimizerConfig::Sgd(/*momentum=*/0.9);
    case OptimizerStateKind::kAdam: return OptimizerConfig::AdamW();
  }
  return OptimizerConfig::AdamW();
}

// Median time of one optimizer step over `count` float32 parameters on `device`.
absl::StatusOr<double> OptimizerStepSeconds(int64_t count, const ProfilerOptions& options,
                                            const RegionTimer& timer) {
  if (count == 0) return 0.0;
  std::unique_ptr<TorchDeviceOps> torch_ops;
  DeviceOps* ops = &DefaultCpuDeviceOps();
  if (options.device.is_cuda()) {
    torch_ops = std::make_unique<TorchDeviceOps>(options.device);
    ops = torch_ops.get();
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceOptimizer> optimizer,
                          ops->NewOptimizer(ProfiledOptimizer(options.optimizer_state), {count}));
  torch::Tensor params, grads;
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors("profiler: optimizer buffers", [&] {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(options.device);
    params = torch::randn({count}, f32);
    grads = torch::randn({count}, f32);
  }));
  float* p = params.data_ptr<float>();
  float* g = grads.data_ptr<float>();
  std::vector<double> seconds;
  absl::Status status = absl::OkStatus();
  for (int round = 0; round < options.warmup + options.repeats && status.ok(); ++round) {
    const double t = timer.Seconds([&] {
      status = optimizer->Step(0, absl::MakeConstSpan(&p, 1), absl::MakeConstSpan(&g, 1), 1e-4,
                               1.0);
    });
    if (round >= options.warmup) seconds.push_back(t);
  }
  TANDEM_RETURN_IF_ERROR(status);
  return Median(seconds);
}

}  // namespace

absl::StatusOr<int64_t> MeasureRetainedBytes(const std::function<void()>& body) {
  auto counter = std::make_shared<AllocationCounter>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, counter);
    body();
    if (counter->reports() == 0) {
      // Nothing reported: either nothing was allocated, or the allocator does not report.
      const auto probe = torch::empty({1}, torch::kFloat32);
      (void)probe;
    }
  }
  if (counter->reports() == 0) {
    return absl::FailedPreconditionError(
        "this LibTorch's allocator does not report allocations; cannot measure stashed bytes");
  }
  return counter->net_bytes();
}

absl::StatusOr<pipeline::Profile> ProfileModel(const LayeredModel& model, const Dataset& data,
                                               const ProfilerOptions& options) {
  if (options.microbatch_size < 1 || options.warmup < 0 || options.repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profiler: micro-batch size (", options.microbatch_size, ") and repeats (",
        options.repeats, ") must be positive, warm-up (", options.warmup, ") not negative"));
  }
  // One layer at a time: each is cloned (or, for a model built layer by layer, built) when it
  // is measured and dropped after, so profiling holds one layer's parameters, not the model's.
  LayeredModel copy = model;
  copy.layers.assign(model.layers.size(), torch::nn::AnyModule());
  const TensorParallel& tp = options.tensor_parallel;
  if (tp.enabled()) {
    if (!model.shard_for_tensor_parallel || !model.tensor_parallel_loss) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profiler: ", model.name, " has no tensor-parallel form to profile"));
    }
    copy.loss = [loss = model.tensor_parallel_loss, &tp](const torch::Tensor& output,
                                                         const torch::Tensor& targets) {
      return loss(output, targets, tp);
    };
  }
  TANDEM_ASSIGN_OR_RETURN(const Batch batch,
                          data.Samples(options.data_iteration, 0, options.microbatch_size));

  pipeline::Profile profile;
  profile.model = tp.enabled() ? absl::StrCat(model.name, " (tensor-parallel shard ", tp.rank,
                                              " of ", tp.size, ")")
                               : model.name;
  profile.microbatch_size = options.microbatch_size;
  profile.device = options.device.is_cuda()
                       ? absl::StrCat("cuda:", options.device.has_index() ? options.device.index()
                                                                           : 0)
                       : "cpu";
  const RegionTimer timer(options.device);
  const int last = copy.num_layers() - 1;
  torch::Tensor input;
  torch::Tensor targets;
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors("profiler: preparing inputs", [&] {
    input = batch.inputs.to(options.device);
    targets = batch.targets.to(options.device);
  }));

  for (int layer = 0; layer <= last; ++layer) {
    {
      TANDEM_ASSIGN_OR_RETURN(std::vector<torch::nn::AnyModule> held,
                              model.CloneLayers(layer, layer + 1, options.device));
      if (tp.enabled()) {
        TANDEM_RETURN_IF_ERROR(Annotate(model.shard_for_tensor_parallel(held, layer, tp),
                                        "profiler: sharding for tensor parallelism"));
      }
      copy.layers[layer] = held[0];
    }
    pipeline::LayerProfile measured;
    measured.name = copy.layer_names[layer];
    torch::Tensor next_input;
    const std::string where =
        absl::StrCat("profiler: layer ", layer, " (", copy.layer_names[layer], ")");
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(where, [&] {
      torch::AutoGradMode grad_mode(true);
      torch::nn::AnyModule module = copy.layers[layer];
      std::vector<torch::Tensor> parameters;
      for (const auto& parameter : module.ptr()->parameters()) parameters.push_back(parameter);
      const torch::Tensor leaf = input.detach();
      if (leaf.is_floating_point()) leaf.requires_grad_(true);
      const bool has_input_grad = leaf.requires_grad();
      auto forward = [&]() {
        torch::Tensor out = module.forward<torch::Tensor>(leaf);
        if (layer == last) out = copy.loss(out, targets);
        return out;
      };
      {
        torch::NoGradGuard no_grad;
        const torch::Tensor output = module.forward<torch::Tensor>(leaf);
        measured.output_activation_bytes = TensorBytes(output);
        next_input = output;
      }
      // A fixed upstream gradient of the output's shape (the loss: 1).
      const torch::Tensor upstream =
          layer == last
              ? torch::ones({}, torch::TensorOptions().dtype(torch::kFloat32).device(options.device))
              : torch::randn_like(next_input);
      std::vector<torch::Tensor> all = parameters;
      if (has_input_grad) all.push_back(leaf);
      LayerTimes times;
      for (int round = 0; round < options.warmup + options.repeats; ++round) {
        const bool timed = round >= options.warmup;
        torch::Tensor out;
        const double forward_seconds = timer.Seconds([&] { out = forward(); });
        double backward_seconds = 0;
        if (!all.empty()) {
          backward_seconds = timer.Seconds([&] {
            torch::autograd::grad({out}, all, {upstream}, /*retain_graph=*/false,
                                  /*create_graph=*/false, /*allow_unused=*/true);
          });
        }
        out = forward();
        double input_seconds = 0, weight_seconds = 0;
        if (has_input_grad) {
          input_seconds = timer.Seconds([&] {
            torch::autograd::grad({out}, {leaf}, {upstream}, /*retain_graph=*/true,
                                  /*create_graph=*/false, /*allow_unused=*/true);
          });
        }
        if (!parameters.empty()) {
          weight_seconds = timer.Seconds([&] {
            torch::autograd::grad({out}, parameters, {upstream}, /*retain_graph=*/false,
                                  /*create_graph=*/false, /*allow_unused=*/true);
          });
        }
        if (!timed) continue;
        times.forward.push_back(forward_seconds);
        times.backward.push_back(backward_seconds);
        times.backward_input.push_back(input_seconds);
        times.backward_weight.push_back(weight_seconds);
      }
      measured.forward_seconds = Median(times.forward);
      measured.backward_seconds = Median(times.backward);
      // The split is timed separately; its medians set the shares of the measured total.
      const double input_median = Median(times.backward_input);
      const double weight_median = Median(times.backward_weight);
      if (input_median + weight_median > 0) {
        measured.backward_input_seconds =
            measured.backward_seconds * input_median / (input_median + weight_median);
        measured.backward_weight_seconds =
            measured.backward_seconds - measured.backward_input_seconds;
      }
      measured.recompute_seconds = measured.forward_seconds;
      measured.recompute_stashed_bytes = TensorBytes(leaf);
      double parameter_bytes = 0;
      for (const auto& parameter : parameters) parameter_bytes += TensorBytes(parameter);
      measured.parameter_bytes = parameter_bytes;
      measured.optimizer_state_bytes =
          OptimizerStateFactor(options.optimizer_state) * parameter_bytes;
    }));
    // What the forward leaves allocated while its graph lives (outside CatchTorchErrors' lambda
    // so the status of the measurement itself propagates).
    torch::Tensor kept;
    absl::StatusOr<int64_t> retained = absl::InternalError("not measured");
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(where, [&] {
      torch::AutoGradMode grad_mode(true);
      torch::nn::AnyModule module = copy.layers[layer];
      const torch::Tensor leaf = input.detach();
      if (leaf.is_floating_point()) leaf.requires_grad_(true);
      retained = MeasureRetainedBytes([&] {
        kept = module.forward<torch::Tensor>(leaf);
        if (layer == last) kept = copy.loss(kept, targets);
      });
    }));
    if (!retained.ok()) return Annotate(retained.status(), where);
    int64_t parameter_count = 0;
    TANDEM_RETURN_IF_ERROR(CatchTorchErrors(where, [&] {
      for (const auto& parameter : copy.layers[layer].ptr()->parameters()) {
        parameter_count += parameter.numel();
      }
    }));
    auto step = OptimizerStepSeconds(parameter_count, options, timer);
    if (!step.ok()) return Annotate(step.status(), where);
    measured.optimizer_seconds = *step;
    measured.stashed_activation_bytes = static_cast<double>(std::max<int64_t>(0, *retained));
    kept = torch::Tensor();
    copy.layers[layer] = torch::nn::AnyModule();
    profile.layers.push_back(std::move(measured));
    input = next_input;
  }
  return profile;
}

}  // namespace tandem::runtime::libtorch
