// FNV-1a: a small, stable string hash (the same on every node and run), for
// picking directory shards and naming process-group contexts.
#pragma once

#include <cstdint>
#include <string>

namespace hoplite {

inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace hoplite
