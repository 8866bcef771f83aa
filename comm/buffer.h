// Typed helpers to describe memory as a comm::Buffer:
//   std::vector<float> v(n);  comm.AllReduce(comm::CpuBuffer(v.data(), n));
#pragma once

#include <cstdint>
#include <type_traits>

#include "comm/communicator.h"

namespace tandem::comm {

template <typename T>
constexpr DataType DataTypeOf() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DataType::kFloat32;
  else if constexpr (std::is_same_v<U, double>) return DataType::kFloat64;
  else if constexpr (std::is_same_v<U, int8_t>) return DataType::kInt8;
  else if constexpr (std::is_same_v<U, uint8_t>) return DataType::kUInt8;
  else if constexpr (std::is_same_v<U, int32_t>) return DataType::kInt32;
  else if constexpr (std::is_same_v<U, int64_t>) return DataType::kInt64;
  else static_assert(sizeof(U) == 0, "no comm::DataType for this C++ type (16-bit floats: "
                                     "use Buffer with DataType::kBFloat16/kFloat16)");
}

// `count` elements of T in CPU memory (const is cast away: sends do not write).
template <typename T>
Buffer CpuBuffer(T* data, int64_t count) {
  Buffer buffer;
  buffer.data = const_cast<std::remove_cv_t<T>*>(data);
  buffer.count = count;
  buffer.dtype = DataTypeOf<T>();
  buffer.device = Device::Cpu();
  return buffer;
}

// Untyped: `count` elements of `dtype` at `data`, on `device`.
inline Buffer MakeBuffer(void* data, int64_t count, DataType dtype,
                         Device device = Device::Cpu()) {
  Buffer buffer;
  buffer.data = data;
  buffer.count = count;
  buffer.dtype = dtype;
  buffer.device = device;
  return buffer;
}

}  // namespace tandem::comm
