#include "common/logging.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace hoplite {
namespace {

std::atomic<int> gRank{-1};

LogLevel levelFromEnv() {
  const char* v = std::getenv("HOPLITE_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kWarn;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  if (std::strcmp(v, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  return LogLevel::kWarn;
}

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "E";
    case LogLevel::kWarn: return "W";
    case LogLevel::kInfo: return "I";
    case LogLevel::kDebug: return "D";
  }
  return "?";
}

}  // namespace

void setLogRank(int rank) { gRank = rank; }

bool logEnabled(LogLevel level) {
  static const LogLevel threshold = levelFromEnv();
  return static_cast<int>(level) <= static_cast<int>(threshold);
}

void logf(LogLevel level, const char* fmt, ...) {
  char line[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(line, sizeof(line), fmt, args);
  va_end(args);
  // Wall-clock time (UTC), so that the logs of several processes line up.
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  std::fprintf(stderr, "[hoplite %s rank %d %02d:%02d:%02d.%03ld] %s\n", levelName(level), gRank.load(), utc.tm_hour,
               utc.tm_min, utc.tm_sec, now.tv_nsec / 1000000, line);
}

}  // namespace hoplite
