// Host mirrors of a stage's device parameters: the runtime's device layer.
//
// The gradient synchronisers and optimizers (comm/grad_sync.h) work on float32 CPU buffers.
// When a stage lives on a CUDA device, the engine gives the synchroniser pinned host copies of
// the stage's parameters and gradients instead: at the stage's GradientSync action the
// gradients are copied device-to-host (after the stage's backward work on the device, which
// the copy is ordered after), and after the optimizer step (and after DeAR's all-gathers) the
// updated values are copied back before the next forward. Pinned (page-locked) memory makes
// these copies direct DMA transfers.
//
// Built with the CUDA toolkit: runtime/cuda/parameter_mirror.cc. Without it, Create returns
// FailedPrecondition ("this build has no CUDA support"), and CUDA stages cannot occur.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/stage.h"

namespace tandem::runtime {

class ParameterMirror {
 public:
  // Pinned host buffers for every parameter of `device_parameters` (CUDA float32 buffers, as
  // Stage::Parameters() reports them); the values are copied to the host now.
  static absl::StatusOr<std::unique_ptr<ParameterMirror>> Create(
      std::vector<ParameterView> device_parameters);
  virtual ~ParameterMirror() = default;

  // The host copies, with the device parameters' names: what the synchroniser works on.
  virtual const std::vector<ParameterView>& host() const = 0;
  // Device gradients -> host (waits for the device work queued before it).
  virtual absl::Status GradientsToHost() = 0;
  // Host values -> device (after the optimizer step or a checkpoint load).
  virtual absl::Status ValuesToDevice() = 0;
};

}  // namespace tandem::runtime
