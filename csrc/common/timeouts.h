#pragma once

namespace hoplite {

// Longest timeout honoured anywhere (a day); longer ones are clamped.
constexpr double kMaxTimeoutSeconds = 86400.0;

}  // namespace hoplite
