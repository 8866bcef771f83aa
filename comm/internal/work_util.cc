#include "comm/internal/work_util.h"

#include <algorithm>
#include <cstdint>

#include "absl/time/clock.h"

#include "comm/dtype.h"

namespace tandem::comm::internal {

bool CombinedWork::Test() {
  bool all = true;
  for (const WorkPtr& part : parts_) all = part->Test() && all;
  return all;
}

absl::Status CombinedWork::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status first_error;
  for (const WorkPtr& part : parts_) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::Status status = part->Wait(left);
    if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(
          absl::StrCat(description_, " timed out after ", absl::FormatDuration(timeout),
                       " (waiting for ", part->Describe(), ")"));
    }
    if (!status.ok() && first_error.ok()) first_error = std::move(status);
  }
  return first_error;
}

absl::Status CombinedWork::Wait() {
  absl::Status first_error;
  for (const WorkPtr& part : parts_) {
    absl::Status status = part->Wait();
    if (!status.ok() && first_error.ok()) first_error = std::move(status);
  }
  return first_error;
}

absl::Status CombinedWork::error() {
  for (const WorkPtr& part : parts_) {
    absl::Status status = part->error();
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

void DivideInPlace(const Buffer& buffer, int divisor) {
  const int64_t n = buffer.count;
  switch (buffer.dtype) {
    case DataType::kFloat32: {
      float* p = static_cast<float*>(buffer.data);
      const float d = static_cast<float>(divisor);
      for (int64_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case DataType::kFloat64: {
      double* p = static_cast<double*>(buffer.data);
      const double d = divisor;
      for (int64_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case DataType::kBFloat16: {
      uint16_t* p = static_cast<uint16_t*>(buffer.data);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToBFloat16(BFloat16ToFloat(p[i]) / divisor);
      break;
    }
    case DataType::kFloat16: {
      uint16_t* p = static_cast<uint16_t*>(buffer.data);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToHalf(HalfToFloat(p[i]) / divisor);
      break;
    }
    default:
      break;  // callers refuse averages of integer types
  }
}

}  // namespace tandem::comm::internal
