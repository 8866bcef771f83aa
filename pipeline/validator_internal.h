// For tests of the validator: the reference execution on its own.
//
// ValidateSchedule first tries a quick proof (two passes that read memory mostly in order);
// only when that fails does it run the reference, a symbolic execution in a fixed order that
// finds and names the first error (see validator.cc). Both must accept exactly the same
// schedules; this entry point lets tests compare them on schedules the proof may get wrong.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/internal/emitted_actions.h"
#include "pipeline/schedule.h"
#include "pipeline/validator.h"

namespace tandem::pipeline::internal {

// The reference execution alone: the same result as ValidateSchedule, always by executing.
absl::Status ValidateScheduleByExecution(const Schedule& schedule,
                                         const ValidationOptions& options);

// The quick proof over actions taken as they are emitted (pipeline/streamed.cc), never held:
// the same checks as ValidateSchedule's, made as the actions come. It only says whether the
// schedule passes; to name an error, validate the whole programs.
class StreamedProof {
 public:
  // `shape`: the spec and placement, with one empty program per rank; it must outlive the
  // proof. InvalidArgument for a placement the validator refuses.
  static absl::StatusOr<std::unique_ptr<StreamedProof>> Create(const Schedule& shape,
                                                               const ValidationOptions& options);
  ~StreamedProof();
  // Checks a batch: each rank's actions must come in its program's order, ranks interleaved
  // in any order. False once a check has failed (later calls then do nothing).
  bool Take(const EmittedActions& batch);
  // After the last batch: whether every check of every action passed (the per-rank checks
  // and the counts: ValidateSchedule with buffered sends passes exactly when this holds and
  // the simulation of the programs finishes).
  bool ChecksPassed() const;
  // ... and whether every rank runs to its end in the options' mode.
  bool Finished() const;

 private:
  struct Impl;
  explicit StreamedProof(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::pipeline::internal
