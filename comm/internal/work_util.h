// Helpers shared by the backends (not part of the public interface).
#pragma once

#include <memory>
#include <vector>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "comm/communicator.h"

namespace tandem::comm::internal {

// A Work that is already finished with `status` (OK or an error found before posting).
class CompletedWork : public Work {
 public:
  CompletedWork(absl::Status status, std::string description)
      : status_(std::move(status)), description_(std::move(description)) {}
  bool Test() override { return true; }
  absl::Status Wait(absl::Duration) override { return status_; }
  absl::Status Wait() override { return status_; }
  absl::Status error() override { return status_; }
  std::string Describe() const override { return description_; }

 private:
  absl::Status status_;
  std::string description_;
};

// Several Works as one: done when all are; the first error wins.
class CombinedWork : public Work {
 public:
  CombinedWork(std::vector<WorkPtr> parts, std::string description)
      : parts_(std::move(parts)), description_(std::move(description)) {}
  bool Test() override;
  absl::Status Wait(absl::Duration timeout) override;
  absl::Status Wait() override;
  absl::Status error() override;
  std::string Describe() const override { return description_; }

 private:
  std::vector<WorkPtr> parts_;
  std::string description_;
};

inline WorkPtr MakeCompletedWork(absl::Status status, std::string description) {
  return std::make_shared<CompletedWork>(std::move(status), std::move(description));
}

// "1024 x float32".
inline std::string DescribeBuffer(const Buffer& buffer) {
  return absl::StrCat(buffer.count, " x ", DataTypeName(buffer.dtype));
}

// Checks shared by every backend: non-negative count, data present when count > 0.
inline absl::Status CheckBuffer(const Buffer& buffer, const char* what) {
  if (buffer.count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative element count ", buffer.count));
  }
  if (buffer.count > 0 && buffer.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": null data pointer for ", DescribeBuffer(buffer)));
  }
  return absl::OkStatus();
}

// Whether the byte ranges of two buffers overlap.
inline bool Overlaps(const Buffer& a, const Buffer& b) {
  if (a.bytes() == 0 || b.bytes() == 0) return false;
  const char* a_begin = static_cast<const char*>(a.data);
  const char* b_begin = static_cast<const char*>(b.data);
  return a_begin < b_begin + b.bytes() && b_begin < a_begin + a.bytes();
}

inline bool IsFloatingPoint(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64 ||
         type == DataType::kBFloat16 || type == DataType::kFloat16;
}

const char* ReduceOpName(ReduceOp op);

// Divides every element of `buffer` (CPU memory, floating point) by `divisor`.
void DivideInPlace(const Buffer& buffer, int divisor);

}  // namespace tandem::comm::internal
