#include "runtime/torch/precision.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::runtime::libtorch {
namespace {

// LibTorch 2.x keys autocast state by device type; 1.13 has one function per device.
bool AutocastEnabled(bool cuda) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

void SetAutocastEnabled(bool cuda, bool enabled) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, enabled);
#else
  if (cuda) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

torch::ScalarType AutocastDtype(bool cuda) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}

void SetAutocastDtype(bool cuda, torch::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_dtype(cuda ? at::kCUDA : at::kCPU, dtype);
#else
  if (cuda) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

}  // namespace

const char* PrecisionName(Precision precision) {
  return precision == Precision::kBFloat16 ? "bf16" : "fp32";
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name == "fp32" || name == "float32") return Precision::kFloat32;
  if (name == "bf16" || name == "bfloat16") return Precision::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "' (known: fp32, bf16)"));
}

double KnownPeakFlops(absl::string_view device_name, Precision precision) {
  // Dense tensor-core bf16 and plain fp32 (no TF32) peaks from the vendors' data sheets, most
  // specific names first.
  struct Peak {
    const char* name;
    double bf16;
    double fp32;
  };
  static constexpr Peak kPeaks[] = {
      {"H200", 989e12, 67e12},      {"H100 PCIe", 756e12, 51e12}, {"H100", 989e12, 67e12},
      {"GH200", 989e12, 67e12},     {"B200", 2250e12, 80e12},     {"A100", 312e12, 19.5e12},
      {"A10G", 70e12, 31.2e12},     {"L40S", 362e12, 91.6e12},    {"L4", 121e12, 30.3e12},
      {"V100", 125e12, 15.7e12},  // V100: fp16 tensor cores (no bf16)
  };
  for (const Peak& peak : kPeaks) {
    if (absl::StrContains(device_name, peak.name)) {
      return precision == Precision::kBFloat16 ? peak.bf16 : peak.fp32;
    }
  }
  return 0;
}

Precision DefaultPrecision(torch::Device device) {
  return device.is_cuda() ? Precision::kBFloat16 : Precision::kFloat32;
}

std::optional<torch::ScalarType> AutocastMatmulType(torch::Device device) {
  if (!device.is_cuda() && !device.is_cpu()) return std::nullopt;
  if (!AutocastEnabled(device.is_cuda())) return std::nullopt;
  return AutocastDtype(device.is_cuda());
}

AutocastGuard::AutocastGuard(torch::Device device, Precision precision) {
  if (precision != Precision::kBFloat16) return;
  active_ = true;
  cuda_ = device.is_cuda();
  previous_enabled_ = AutocastEnabled(cuda_);
  previous_dtype_ = AutocastDtype(cuda_);
  SetAutocastEnabled(cuda_, true);
  SetAutocastDtype(cuda_, torch::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocastEnabled(cuda_, previous_enabled_);
  SetAutocastDtype(cuda_, previous_dtype_);
}

}  // namespace tandem::runtime::libtorch
