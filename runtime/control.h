// Control-plane helpers over a world communicator (the engine's private duplicate): every
// rank agreeing on the success of a local step, and strings gathered on rank 0. Collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"

namespace tandem::runtime {

// Tag of GatherStrings' messages (the engine's control communicator uses 2 for them).
inline constexpr int kGatherTag = 2;

comm::Buffer DoubleBuffer(double* data, int64_t count);

// Every rank learns whether any rank failed a local step; the failing ranks keep their own
// error, the others get one naming the lowest failing rank, with that rank's status code (so
// every rank exits alike). Collective over `world`.
absl::Status AgreeOnSuccess(comm::Communicator* world, const absl::Status& local,
                            absl::string_view what);

// Strings of all ranks on rank 0 (index = rank); empty elsewhere. Collective.
absl::StatusOr<std::vector<std::string>> GatherStrings(comm::Communicator& comm,
                                                       const std::string& mine);

}  // namespace tandem::runtime
