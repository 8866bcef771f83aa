// Conversions between float32 and the 16-bit floating formats that have no C++ type here,
// with round-to-nearest-even (as PyTorch and CUDA convert). Used by the MPI backend's
// reduction operators for bfloat16/float16 and by tests that build reference data.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem::comm {

inline float BFloat16ToFloat(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

inline uint16_t FloatToBFloat16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7f800000u) == 0x7f800000u && (word & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((word >> 16) | 0x0040u);  // keep NaN a (quiet) NaN
  }
  const uint32_t rounding_bias = 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>((word + rounding_bias) >> 16);
}

// IEEE 754 binary16.
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

}  // namespace tandem::comm
