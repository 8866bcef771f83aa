// For tests of the validator: the reference execution on its own.
//
// ValidateSchedule first tries a quick proof (two passes that read memory mostly in order);
// only when that fails does it run the reference, a symbolic execution in a fixed order that
// finds and names the first error (see validator.cc). Both must accept exactly the same
// schedules; this entry point lets tests compare them on schedules the proof may get wrong.
#pragma once

#include "absl/status/status.h"
#include "pipeline/schedule.h"
#include "pipeline/validator.h"

namespace tandem::pipeline::internal {

// The reference execution alone: the same result as ValidateSchedule, always by executing.
absl::Status ValidateScheduleByExecution(const Schedule& schedule,
                                         const ValidationOptions& options);

}  // namespace tandem::pipeline::internal
