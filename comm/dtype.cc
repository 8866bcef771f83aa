#include "comm/dtype.h"

#include <cmath>

namespace tandem::comm {
namespace {

constexpr int kHalfExponentBias = 15;
constexpr int kFloatExponentBias = 127;
constexpr int kHalfMantissaBits = 10;
constexpr int kFloatMantissaBits = 23;

}  // namespace

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const int exponent = (bits >> kHalfMantissaBits) & 0x1f;
  const uint32_t mantissa = bits & 0x3ffu;
  uint32_t word;
  if (exponent == 0x1f) {  // inf or NaN
    word = sign | 0x7f800000u | (mantissa << (kFloatMantissaBits - kHalfMantissaBits));
  } else if (exponent == 0) {
    if (mantissa == 0) {
      word = sign;
    } else {  // subnormal half: value = mantissa * 2^-24, exact in float
      const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
      std::memcpy(&word, &magnitude, sizeof(word));
      word |= sign;
    }
  } else {
    word = sign |
           (static_cast<uint32_t>(exponent - kHalfExponentBias + kFloatExponentBias)
            << kFloatMantissaBits) |
           (mantissa << (kFloatMantissaBits - kHalfMantissaBits));
  }
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

uint16_t FloatToHalf(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  const uint32_t magnitude_bits = word & 0x7fffffffu;
  if (magnitude_bits >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (magnitude_bits > 0x7f800000u ? 0x200u : 0));
  }
  const float magnitude = std::fabs(value);
  constexpr float kHalfOverflow = 65520.0f;  // rounds to inf from here on
  if (magnitude >= kHalfOverflow) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude < std::ldexp(1.0f, -14)) {
    // Subnormal (or zero): units of 2^-24, round to nearest even.
    const float units = std::nearbyint(std::ldexp(magnitude, 24));  // default mode: even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  const int exponent = static_cast<int>((magnitude_bits >> kFloatMantissaBits)) -
                       kFloatExponentBias + kHalfExponentBias;
  const uint32_t mantissa = magnitude_bits & 0x7fffffu;
  constexpr int kShift = kFloatMantissaBits - kHalfMantissaBits;
  uint32_t half = (static_cast<uint32_t>(exponent) << kHalfMantissaBits) | (mantissa >> kShift);
  const uint32_t remainder = mantissa & ((1u << kShift) - 1);
  const uint32_t halfway = 1u << (kShift - 1);
  if (remainder > halfway || (remainder == halfway && (half & 1u))) {
    ++half;  // may carry into the exponent, which is the correct rounding
  }
  return static_cast<uint16_t>(sign | half);
}

}  // namespace tandem::comm
