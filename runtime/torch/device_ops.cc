#include "runtime/torch/device_ops.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>
#include <torch/version.h>
#if TANDEM_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "runtime/torch/model.h"

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/profiler_kineto.h>
#define TANDEM_TORCH_HAS_FUSED_ADAMW 1
#else
#define TANDEM_TORCH_HAS_FUSED_ADAMW 0
#endif

namespace tandem::runtime::libtorch {
namespace {

torch::TensorOptions FloatOn(torch::Device device) {
  return torch::TensorOptions().dtype(torch::kFloat32).device(device);
}

// Optimizer state as tensors on the device, one entry per span.
class TorchOptimizer final : public DeviceOptimizer {
 public:
  TorchOptimizer(const TorchDeviceOps& ops, torch::Device device, const OptimizerConfig& config,
                 std::vector<int64_t> counts, bool fused)
      : ops_(ops), device_(device), config_(config), counts_(std::move(counts)),
        fused_(fused && config.kind == OptimizerKind::kAdamW),
        steps_(counts_.size(), 0) {
    const size_t n = counts_.size();
    first_.resize(n);
    second_.resize(n);
    if (config_.kind == OptimizerKind::kAdamW) {
      for (size_t i = 0; i < n; ++i) {
        first_[i] = torch::zeros({counts_[i]}, FloatOn(device_));
        second_[i] = torch::zeros({counts_[i]}, FloatOn(device_));
      }
    }
    if (fused_) {
      for (size_t i = 0; i < n; ++i) step_tensors_.push_back(torch::zeros({}, FloatOn(device_)));
    }
  }

  absl::Status Step(int first_span, absl::Span<float* const> params,
                    absl::Span<float* const> grads, double lr, double grad_scale) override {
    TANDEM_RETURN_IF_ERROR(CheckStep(first_span, params.size(), grads.size(), lr, grad_scale));
    return CatchTorchErrors("optimizer step", [&] {
      torch::NoGradGuard no_grad;
      Views& views = views_[first_span];
      if (!std::equal(params.begin(), params.end(), views.params.begin(), views.params.end()) ||
          !std::equal(grads.begin(), grads.end(), views.grads.begin(), views.grads.end())) {
        views = Views{{params.begin(), params.end()}, {grads.begin(), grads.end()}, {}, {}};
        for (size_t i = 0; i < params.size(); ++i) {
          const int64_t n = counts_[first_span + i];
          views.p.push_back(ops_.View(params[i], n));
          views.g.push_back(ops_.View(grads[i], n));
        }
      }
      std::vector<torch::Tensor>& p = views.p;
      std::vector<torch::Tensor>& g = views.g;
      if (grad_scale != 1.0 && !g.empty()) torch::_foreach_mul_(g, grad_scale);
      if (config_.kind == OptimizerKind::kSgd) {
        SgdStep(first_span, p, g, lr);
      } else {
        AdamWStep(first_span, p, g, lr);
      }
    });
  }

  const std::vector<int64_t>& counts() const override { return counts_; }
  int64_t steps() const override { return steps_.empty() ? 0 : steps_[0]; }
  void set_steps(int64_t steps) override {
    std::fill(steps_.begin(), steps_.end(), steps);
    for (torch::Tensor& t : step_tensors_) t.fill_(static_cast<double>(steps));
  }
  std::vector<std::string> BufferNames() const override {
    if (config_.kind == OptimizerKind::kSgd) return {"momentum_buffer"};
    return {"exp_avg", "exp_avg_sq"};
  }
  absl::StatusOr<float*> StateBuffer(int span, absl::string_view name, bool create) override {
    TANDEM_ASSIGN_OR_RETURN(torch::Tensor * buffer, Find(span, name));
    if (!buffer->defined()) {
      if (!create) return nullptr;
      *buffer = torch::zeros({counts_[span]}, FloatOn(device_));
    }
    return buffer->data_ptr<float>();
  }
  absl::Status ResetStateBuffer(int span, absl::string_view name) override {
    TANDEM_ASSIGN_OR_RETURN(torch::Tensor * buffer, Find(span, name));
    if (config_.kind == OptimizerKind::kAdamW) {
      *buffer = torch::zeros({counts_[span]}, FloatOn(device_));
    } else {
      *buffer = torch::Tensor();
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<torch::Tensor*> Find(int span, absl::string_view name) {
    if (span < 0 || span >= static_cast<int>(counts_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer span ", span, " out of range [0, ", counts_.size(), ")"));
    }
    if (config_.kind == OptimizerKind::kSgd && name == "momentum_buffer") return &first_[span];
    if (config_.kind == OptimizerKind::kAdamW && name == "exp_avg") return &first_[span];
    if (config_.kind == OptimizerKind::kAdamW && name == "exp_avg_sq") return &second_[span];
    return absl::InvalidArgumentError(absl::StrCat("optimizer has no state buffer '", name, "'"));
  }

  // torch::optim::SGD (dampening 0, no Nesterov), tensor by tensor.
  void SgdStep(int first_span, std::vector<torch::Tensor>& p, std::vector<torch::Tensor>& g,
               double lr) {
    for (size_t i = 0; i < p.size(); ++i) {
      const size_t span = first_span + i;
      ++steps_[span];
      torch::Tensor d = g[i];
      if (config_.weight_decay != 0) d = d.add(p[i], config_.weight_decay);
      if (config_.momentum != 0) {
        torch::Tensor& buffer = first_[span];
        if (!buffer.defined()) {
          buffer = torch::clone(d).detach();
        } else {
          buffer.mul_(config_.momentum).add_(d, 1.0);
        }
        d = buffer;
      }
      p[i].add_(d, -lr);
    }
  }

  void AdamWStep(int first_span, std::vector<torch::Tensor>& p, std::vector<torch::Tensor>& g,
                 double lr) {
    for (size_t i = 0; i < p.size(); ++i) ++steps_[first_span + i];
#if TANDEM_TORCH_HAS_FUSED_ADAMW
    if (fused_) {
      std::vector<torch::Tensor> m(first_.begin() + first_span,
                                   first_.begin() + first_span + p.size());
      std::vector<torch::Tensor> v(second_.begin() + first_span,
                                   second_.begin() + first_span + p.size());
      std::vector<torch::Tensor> t(step_tensors_.begin() + first_span,
                                   step_tensors_.begin() + first_span + p.size());
      // The kernel reads the step counts (bias corrections) but does not advance them: as
      // torch.optim's fused path, count this step first (at step 0 the corrections divide by 0).
      torch::_foreach_add_(t, 1);
      at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, t, lr, config_.beta1, config_.beta2,
                        config_.weight_decay, config_.eps, /*amsgrad=*/false,
                        /*maximize=*/false);
      return;
    }
#endif
    // torch::optim::AdamW's operations, in its order.
    for (size_t i = 0; i < p.size(); ++i) {
      const size_t span = first_span + i;
      const double step = static_cast<double>(steps_[span]);
      if (config_.weight_decay != 0) p[i].mul_(1 - lr * config_.weight_decay);
      torch::Tensor& exp_avg = first_[span];
      torch::Tensor& exp_avg_sq = second_[span];
      exp_avg.mul_(config_.beta1).add_(g[i], 1 - config_.beta1);
      exp_avg_sq.mul_(config_.beta2).addcmul_(g[i], g[i], 1 - config_.beta2);
      const double bias_correction1 = 1 - std::pow(config_.beta1, step);
      const double bias_correction2 = 1 - std::pow(config_.beta2, step);
      torch::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(config_.eps);
      p[i].addcdiv_(exp_avg, denom, -(lr / bias_correction1));
    }
  }

  const TorchDeviceOps& ops_;
  torch::Device device_;
  OptimizerConfig config_;
  std::vector<int64_t> counts_;
  bool fused_;
  std::vector<int64_t> steps_;
  std::vector<torch::Tensor> first_;   // SGD momentum buffer (undefined before step 1), exp_avg
  std::vector<torch::Tensor> second_;  // exp_avg_sq
  std::vector<torch::Tensor> step_tensors_;  // fused AdamW's per-tensor step counts
  // The tensors over the parameters and gradients of the last step from each first span:
  // their buffers stay where they are from step to step, so the views are built again only
  // when a pointer changes (a few microseconds each, hundreds a step otherwise).
  struct Views {
    std::vector<float*> params, grads;
    std::vector<torch::Tensor> p, g;
  };
  std::map<int, Views> views_;
};

}  // namespace

bool HasFusedAdamW() { return TANDEM_TORCH_HAS_FUSED_ADAMW != 0; }

double PeakMemoryBytes(torch::Device device) {
  if (device.is_cuda()) {
#if TANDEM_TORCH_HAS_CUDA
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        device.has_index() ? device.index() : 0);
    return static_cast<double>(stats.allocated_bytes[0].peak);  // [0]: all pools
#else
    return 0;
#endif
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux reports KiB
}

double DeviceMemoryBytes(torch::Device device) {
  if (device.is_cuda()) {
#if TANDEM_TORCH_HAS_CUDA
    size_t free_bytes = 0, total_bytes = 0;
    c10::cuda::CUDAGuard guard(device.has_index() ? device.index() : 0);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
    return static_cast<double>(total_bytes);
#else
    return 0;
#endif
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

TorchDeviceOps::TorchDeviceOps(torch::Device device, bool fused_adamw)
    : device_(device), fused_adamw_(fused_adamw && HasFusedAdamW()) {}

comm::Device TorchDeviceOps::device() const {
  if (device_.is_cuda()) return comm::Device::Cuda(device_.has_index() ? device_.index() : 0);
  return comm::Device::Cpu();
}

std::string TorchDeviceOps::name() const {
  return absl::StrCat("libtorch on ", device_.str(), fused_adamw_ ? " (fused AdamW)" : "");
}

torch::Tensor TensorOver(void* data, at::IntArrayRef shape, const torch::TensorOptions& options,
                         std::function<void(void*)> deleter) {
  at::TensorMaker maker = at::for_blob(data, shape);
  maker.options(options);
  if (deleter) maker.deleter(std::move(deleter));
  // An index-less CUDA device names no device: the driver is asked then.
  if (!options.device().is_cuda() || options.device().has_index()) {
    maker.target_device(options.device());
  }
  return maker.make_tensor();
}

torch::Tensor TorchDeviceOps::View(const float* data, int64_t count) const {
  return TensorOver(const_cast<float*>(data), {count}, FloatOn(device_));
}

absl::StatusOr<DeviceArray> TorchDeviceOps::Zeros(int64_t count) {
  if (count < 0) return absl::InvalidArgumentError("negative array size");
  DeviceArray array;
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors("allocating device memory", [&] {
    auto tensor = std::make_shared<torch::Tensor>(torch::zeros({count}, FloatOn(device_)));
    array.data = tensor->data_ptr<float>();
    array.count = count;
    array.holder = std::move(tensor);
  }));
  return array;
}

absl::Status TorchDeviceOps::Copy(float* dst, const float* src, int64_t count) {
  if (count <= 0 || dst == src) return absl::OkStatus();
  return CatchTorchErrors("device copy", [&] { View(dst, count).copy_(View(src, count)); });
}

absl::Status TorchDeviceOps::CopyFromHost(float* dst, const float* host, int64_t count) {
  if (count <= 0) return absl::OkStatus();
  return CatchTorchErrors("copy to the device", [&] {
    torch::Tensor source = torch::from_blob(const_cast<float*>(host), {count}, torch::kFloat32);
    View(dst, count).copy_(source);
  });
}

absl::Status TorchDeviceOps::CopyToHost(float* host, const float* src, int64_t count) {
  if (count <= 0) return absl::OkStatus();
  return CatchTorchErrors("copy to the host", [&] {
    torch::Tensor target = torch::from_blob(host, {count}, torch::kFloat32);
    target.copy_(View(src, count));  // from the device into pageable memory: synchronous
  });
}

absl::Status TorchDeviceOps::AverageAndAddSquaredNorm(float* dst, const float* src,
                                                      int64_t count, float divisor, bool divide,
                                                      bool add_to_norm) {
  if (count <= 0) return absl::OkStatus();
  return CatchTorchErrors("averaging gradients", [&] {
    torch::NoGradGuard no_grad;
    torch::Tensor out = View(dst, count);
    if (dst != src) out.copy_(View(src, count));
    if (divide) out.div_(divisor);
    if (!add_to_norm) return;
    // Asking linalg_vector_norm for a float64 result makes it convert the whole buffer to
    // float64 first: on a GPU (where the reduction is a tree, accurate in float32) that copy
    // took twice as long as the norm, so the GPU sums in float32, as clip_grad_norm_ does.
    // On the CPU a float32 norm put a bf16 test model's norm 1.3% off the float64 reference
    // (LibTorch 2.11): the CPU keeps float64.
    torch::Tensor squares =
        out.is_cuda()
            ? at::linalg_vector_norm(out, 2).to(torch::kFloat64).square()
            : at::linalg_vector_norm(out, 2, c10::nullopt, false, torch::kFloat64).square();
    norm_ = norm_.defined() ? norm_.add_(squares) : squares;
  });
}

absl::Status TorchDeviceOps::ToBFloat16(uint16_t* dst, const float* src, int64_t count) {
  if (count <= 0) return absl::OkStatus();
  return CatchTorchErrors("rounding gradients to bfloat16", [&] {
    torch::NoGradGuard no_grad;
    TensorOver(dst, {count}, FloatOn(device_).dtype(torch::kBFloat16))
        .copy_(View(src, count));
  });
}

absl::Status TorchDeviceOps::FromBFloat16(float* dst, const uint16_t* src, int64_t count) {
  if (count <= 0) return absl::OkStatus();
  return CatchTorchErrors("widening bfloat16 gradients", [&] {
    torch::NoGradGuard no_grad;
    View(dst, count).copy_(TensorOver(const_cast<uint16_t*>(src), {count},
                                            FloatOn(device_).dtype(torch::kBFloat16)));
  });
}

absl::StatusOr<double> TorchDeviceOps::TakeSquaredNorm() {
  double total = 0;
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors("reading the gradient norm", [&] {
    if (norm_on_its_way_.started()) {
      total = norm_on_its_way_.Take();
    } else if (norm_.defined()) {
      total = norm_.item<double>();
    }
  }));
  norm_ = torch::Tensor();
  return total;
}

absl::StatusOr<bool> TorchDeviceOps::StartTakingSquaredNorm() {
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors("copying the gradient norm to the host", [&] {
    if (norm_.defined()) norm_on_its_way_.Start(norm_);
  }));
  return true;
}

void HostScalar::Start(const torch::Tensor& value) {
  ready_.reset();
  if (!value.is_cuda()) {
    host_ = value.detach().clone();
    return;
  }
  host_ = torch::empty(value.sizes(), value.options().device(torch::kCPU).pinned_memory(true));
  host_.copy_(value.detach(), /*non_blocking=*/true);
  const c10::impl::VirtualGuardImpl guard(value.device().type());
  ready_.emplace(value.device().type());
  ready_->record(guard.getStream(value.device()));
}

double HostScalar::Take() {
  if (ready_.has_value()) {
#if TORCH_VERSION_MAJOR >= 2
    ready_->synchronize();
#else
    while (!ready_->query()) std::this_thread::yield();
#endif
  }
  const double value = host_.item<double>();
  host_ = torch::Tensor();
  ready_.reset();
  return value;
}

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> TorchDeviceOps::NewOptimizer(
    const OptimizerConfig& config, std::vector<int64_t> counts) {
  TANDEM_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  std::unique_ptr<DeviceOptimizer> optimizer;
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors("creating optimizer state", [&] {
    optimizer = std::make_unique<TorchOptimizer>(*this, device_, config, std::move(counts),
                                                 fused_adamw_);
  }));
  return optimizer;
}

bool HasTorchTrace() { return TORCH_VERSION_MAJOR >= 2; }

absl::Status StartTorchTrace(bool cuda) {
#if TORCH_VERSION_MAJOR >= 2
  return CatchTorchErrors("starting the LibTorch profiler", [&] {
    namespace profiler = torch::autograd::profiler;
    using torch::profiler::impl::ActivityType;
    const torch::profiler::impl::ProfilerConfig config(
        torch::profiler::impl::ProfilerState::KINETO);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda) activities.insert(ActivityType::CUDA);
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
  });
#else
  (void)cuda;
  return absl::UnimplementedError("tracing needs LibTorch 2 or later (its Kineto profiler)");
#endif
}

absl::Status StopTorchTrace(const std::string& path) {
#if TORCH_VERSION_MAJOR >= 2
  return CatchTorchErrors(absl::StrCat("writing the LibTorch trace ", path), [&] {
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
        torch::autograd::profiler::disableProfiler();
    if (result != nullptr) result->save(path);
  });
#else
  (void)path;
  return absl::UnimplementedError("tracing needs LibTorch 2 or later (its Kineto profiler)");
#endif
}

absl::Status TorchDeviceOps::Synchronize() {
  return CatchTorchErrors("synchronising the device", [&] {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  });
}

}  // namespace tandem::runtime::libtorch
