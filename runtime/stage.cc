#include "runtime/stage.h"

namespace tandem::runtime {

int64_t TensorMeta::NumElements() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

}  // namespace tandem::runtime
