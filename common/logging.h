// Minimal leveled logging to stderr with an optional rank prefix. Thread-safe: each message
// is formatted first and written with one call.
//
//   TANDEM_LOG(INFO) << "planned " << n << " stages";
//
// TANDEM_LOG_LEVEL (env: debug, info, warning, error) sets the threshold; default info.
#pragma once

#include <sstream>
#include <string>

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Sets the "[rank N]" prefix for this process (-1: none).
void SetLogRank(int rank);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& message);

namespace internal {
class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage() { LogLine(level_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace tandem

#define TANDEM_LOG_LEVEL_DEBUG ::tandem::LogLevel::kDebug
#define TANDEM_LOG_LEVEL_INFO ::tandem::LogLevel::kInfo
#define TANDEM_LOG_LEVEL_WARNING ::tandem::LogLevel::kWarning
#define TANDEM_LOG_LEVEL_ERROR ::tandem::LogLevel::kError
#define TANDEM_LOG(level)                                    \
  if (!::tandem::LogEnabled(TANDEM_LOG_LEVEL_##level)) {     \
  } else                                                     \
    ::tandem::internal::LogMessage(TANDEM_LOG_LEVEL_##level).stream()
