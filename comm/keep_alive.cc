#include "comm/keep_alive.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::comm {

void KeepAliveAfterAbort(std::shared_ptr<void> memory) {
  if (memory == nullptr) return;
  struct Kept {
    absl::Mutex mu;
    std::vector<std::shared_ptr<void>> memory ABSL_GUARDED_BY(mu);
  };
  // Never destroyed, so that it serves until the very end (static destructors, threads still
  // inside the library at exit).
  static Kept* const kept = new Kept;
  absl::MutexLock lock(&kept->mu);
  kept->memory.push_back(std::move(memory));
}

}  // namespace tandem::comm
