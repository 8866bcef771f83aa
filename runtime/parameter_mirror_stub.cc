// ParameterMirror in a build without the CUDA toolkit: no CUDA stage can exist.
#include "runtime/parameter_mirror.h"

namespace tandem::runtime {

absl::StatusOr<std::unique_ptr<ParameterMirror>> ParameterMirror::Create(
    std::vector<ParameterView>) {
  return absl::FailedPreconditionError(
      "parameter mirror: this build has no CUDA support (stages on a CUDA device need it)");
}

}  // namespace tandem::runtime
