#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

std::atomic<int> g_rank{-1};

LogLevel ThresholdFromEnv() {
  const char* v = std::getenv("TANDEM_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kInfo;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "warning") == 0) return LogLevel::kWarning;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

}  // namespace

void SetLogRank(int rank) { g_rank = rank; }

bool LogEnabled(LogLevel level) {
  static const LogLevel threshold = ThresholdFromEnv();
  return static_cast<int>(level) >= static_cast<int>(threshold);
}

void LogLine(LogLevel level, const std::string& message) {
  const char* tag = "";
  switch (level) {
    case LogLevel::kDebug: tag = "debug: "; break;
    case LogLevel::kInfo: tag = ""; break;
    case LogLevel::kWarning: tag = "warning: "; break;
    case LogLevel::kError: tag = "error: "; break;
  }
  int rank = g_rank.load();
  std::string line = rank >= 0 ? absl::StrCat("[rank ", rank, "] ", tag, message, "\n")
                               : absl::StrCat(tag, message, "\n");
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace tandem
