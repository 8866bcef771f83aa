#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace tandem {

absl::StatusOr<double> ParseBytes(absl::string_view text) {
  std::string s(absl::StripAsciiWhitespace(text));
  if (s.empty()) return absl::InvalidArgumentError("empty size");
  const char* begin = s.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("not a size: '", text, "'"));
  }
  std::string suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(end));
  double scale = 1;
  if (suffix.empty() || suffix == "b") scale = 1;
  else if (suffix == "k" || suffix == "kb") scale = 1e3;
  else if (suffix == "kib") scale = 1024.0;
  else if (suffix == "m" || suffix == "mb") scale = 1e6;
  else if (suffix == "mib") scale = 1024.0 * 1024;
  else if (suffix == "g" || suffix == "gb") scale = 1e9;
  else if (suffix == "gib") scale = 1024.0 * 1024 * 1024;
  else if (suffix == "t" || suffix == "tb") scale = 1e12;
  else if (suffix == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else return absl::InvalidArgumentError(absl::StrCat("unknown size suffix in '", text, "'"));
  if (value < 0) return absl::InvalidArgumentError(absl::StrCat("negative size: '", text, "'"));
  return value * scale;
}

absl::StatusOr<double> ParseBytesPerSecond(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  absl::ConsumeSuffix(&t, "/s");
  absl::ConsumeSuffix(&t, "ps");
  return ParseBytes(t);
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return absl::StrFormat("%.0f B", v);
  return absl::StrFormat("%.2f %s", v, units[u]);
}

std::string FormatSeconds(double seconds) {
  double a = std::fabs(seconds);
  if (a >= 1) return absl::StrFormat("%.3f s", seconds);
  if (a >= 1e-3) return absl::StrFormat("%.3f ms", seconds * 1e3);
  return absl::StrFormat("%.1f us", seconds * 1e6);
}

}  // namespace tandem
