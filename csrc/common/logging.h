// Minimal leveled logging to stderr; level from HOPLITE_LOG_LEVEL (error|warn|info|debug).
#pragma once

namespace hoplite {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void setLogRank(int rank);
bool logEnabled(LogLevel level);
void logf(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace hoplite

#define HLOG(level, ...)                                        \
  do {                                                          \
    if (::hoplite::logEnabled(::hoplite::LogLevel::level)) {    \
      ::hoplite::logf(::hoplite::LogLevel::level, __VA_ARGS__); \
    }                                                           \
  } while (0)
