// Built instead of gavel.cc when GLPK is missing: Gavel's policy needs its LP solver.
#include "cluster/policies.h"

namespace tandem::cluster {

bool GavelPolicyAvailable() { return false; }

absl::StatusOr<std::unique_ptr<Policy>> MakeGavelPolicy(const GavelPolicyOptions& /*options*/) {
  return absl::FailedPreconditionError(
      "policy 'gavel' needs GLPK for its linear program, and tandem was built without it "
      "(install libglpk-dev, then reconfigure and rebuild)");
}

}  // namespace tandem::cluster
