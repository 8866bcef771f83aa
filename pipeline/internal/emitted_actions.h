// Actions handed to readers as the program builder emits them (pipeline/streamed.h): at
// p=1024, m=4096 a schedule's programs are up to 10^8 actions, and written out and read back
// they cost the command more (the writing itself, and the caches it empties for the list
// scheduler's tables) than its readers' work. Private to pipeline/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pipeline/schedule.h"

namespace tandem::pipeline::internal {

// A batch of emitted actions, in the order of emission: each rank's in its program's order,
// and ranks interleaved in order of start in the list scheduler's timeline, so that every
// receive comes after the send it pairs with (the builder places a receive before the
// receiver's first compute starting at or after the send's end). The readers rely on the
// first order; the second lets the simulator take the actions as they come, with no rank ever
// waiting (a receive met before its send stops the streamed reading: see streamed.cc).
struct EmittedActions {
  const int32_t* ranks = nullptr;  // the rank of each action
  const Action* actions = nullptr;
  size_t size = 0;
  bool last = false;  // the final batch: every program is complete after it
};

// Takes the batches: Consume is called every few thousand actions and once more with
// `last`, and keeps nothing of the batch.
class ActionConsumer {
 public:
  virtual ~ActionConsumer() = default;
  virtual void Consume(const EmittedActions& batch) = 0;
};

}  // namespace tandem::pipeline::internal
