// Helpers for comm tests: typed element access on a Buffer through double, and owning buffers.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/communicator.h"
#include "comm/dtype.h"

namespace tandem::comm::testing {

inline const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                                     DataType::kFloat16, DataType::kInt8,    DataType::kUInt8,
                                     DataType::kInt32,   DataType::kInt64};

// Bytes plus a Buffer view of them.
struct OwnedBuffer {
  std::vector<unsigned char> bytes;
  Buffer buffer;
  OwnedBuffer(DataType type, int64_t count) : bytes(static_cast<size_t>(count) * SizeOf(type) + 1) {
    buffer = Buffer{bytes.data(), count, type};
  }
  Buffer Slice(int64_t offset, int64_t count) const {
    return Buffer{const_cast<unsigned char*>(bytes.data()) + offset * SizeOf(buffer.dtype), count,
                  buffer.dtype};
  }
};

inline void SetElement(const Buffer& b, int64_t i, double v) {
  switch (b.dtype) {
    case DataType::kFloat32: static_cast<float*>(b.data)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(b.data)[i] = v; break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(b.data)[i] = FloatToBFloat16(static_cast<float>(v));
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(b.data)[i] = FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kInt8: static_cast<int8_t*>(b.data)[i] = static_cast<int8_t>(v); break;
    case DataType::kUInt8: static_cast<uint8_t*>(b.data)[i] = static_cast<uint8_t>(v); break;
    case DataType::kInt32: static_cast<int32_t*>(b.data)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(b.data)[i] = static_cast<int64_t>(v); break;
  }
}

inline double GetElement(const Buffer& b, int64_t i) {
  switch (b.dtype) {
    case DataType::kFloat32: return static_cast<const float*>(b.data)[i];
    case DataType::kFloat64: return static_cast<const double*>(b.data)[i];
    case DataType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(b.data)[i]);
    case DataType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(b.data)[i]);
    case DataType::kInt8: return static_cast<const int8_t*>(b.data)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(b.data)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(b.data)[i];
    case DataType::kInt64: return static_cast<const int64_t*>(b.data)[i];
  }
  return 0;
}

// Rounds `v` to what `type` stores (the reference does its arithmetic in double, then rounds).
inline double RoundTo(DataType type, double v) {
  unsigned char scratch[8];
  Buffer b{scratch, 1, type};
  SetElement(b, 0, v);
  return GetElement(b, 0);
}

}  // namespace tandem::comm::testing
