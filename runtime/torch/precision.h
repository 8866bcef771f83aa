// Mixed precision for the LibTorch adapter: which arithmetic a stage computes in.
//
//   kFloat32   everything in float32.
//   kBFloat16  LibTorch autocast (CUDA or CPU) to bfloat16 for the forward computation (and its
//              recomputation); parameters stay float32 (the master weights), gradients are
//              accumulated and reduced in float32, and the loss is computed in float32 from
//              float32 logits. Autocast's backward runs each op's gradient in the op's forward
//              precision, as PyTorch's torch.autocast does.
//
// Defaults: bf16 on CUDA devices, float32 on the CPU.
#pragma once

#include <optional>
#include <string>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::runtime::libtorch {

enum class Precision { kFloat32, kBFloat16 };

const char* PrecisionName(Precision precision);  // "fp32", "bf16"
// "fp32"/"float32", "bf16"/"bfloat16"; InvalidArgument lists the known names.
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);
Precision DefaultPrecision(torch::Device device);

// The type autocast computes matrix products in on `device`'s type at this moment (bfloat16
// inside an AutocastGuard of kBFloat16), or nullopt where autocast is off.
std::optional<torch::ScalarType> AutocastMatmulType(torch::Device device);

// Autocast to bfloat16 on `device`'s type while alive (nothing for kFloat32). Restores the
// previous autocast state; the outermost guard clears autocast's cast cache on exit (as
// torch.autocast does), so casts of weights are not kept across steps.
// Dense peak FLOP/s of a known GPU in `precision` (by its name, e.g. "NVIDIA H100 80GB HBM3":
// H100 SXM 989e12 bf16 and 67e12 fp32; A100 312e12 / 19.5e12; ...); 0 when unknown.
double KnownPeakFlops(absl::string_view device_name, Precision precision);

class AutocastGuard {
 public:
  AutocastGuard(torch::Device device, Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat32;
};

}  // namespace tandem::runtime::libtorch
