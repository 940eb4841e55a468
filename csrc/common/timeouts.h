#pragma once

#include <chrono>

namespace hoplite {

// Longest timeout honoured anywhere (a day); longer ones are clamped.
constexpr double kMaxTimeoutSeconds = 86400.0;

// Seconds on the steady clock: what deadlines and heartbeats are measured in.
inline double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace hoplite
