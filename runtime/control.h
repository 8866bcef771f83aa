// Control-plane helpers over a world communicator (the engine's private duplicate): every
// rank agreeing on the success of a local step, strings gathered on rank 0 and rank 0's string
// on every rank. Collective.
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

// Rank 0's `text` on every rank (its size, then its bytes; the other ranks' `text` is ignored).
// Collective. After a failed broadcast the buffers are kept alive (comm/keep_alive.h).
absl::StatusOr<std::string> BroadcastString(comm::Communicator& comm, std::string text);

}  // namespace tandem::runtime
