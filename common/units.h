// Units: bytes, seconds and bandwidths as plain doubles/ints with unit-bearing names, plus
// parsing and formatting of human-readable sizes ("8GiB", "25GB", "1.5e9").
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;

// Parses a byte count: a plain number (scientific notation allowed) with an optional suffix
// B, K/KB (1e3), KiB (2^10), M/MB, MiB, G/GB, GiB, T/TB, TiB (case-insensitive). Negative
// values and garbage give InvalidArgument naming the text.
absl::StatusOr<double> ParseBytes(absl::string_view text);

// Same as ParseBytes but for rates: accepts a trailing "/s" ("25GiB/s").
absl::StatusOr<double> ParseBytesPerSecond(absl::string_view text);

// "1.50 GiB", "512 B".
std::string FormatBytes(double bytes);
// "12.3 ms", "1.20 s", "850 us".
std::string FormatSeconds(double seconds);

}  // namespace tandem
