// Small, stable hashes (the same on every node and run). FNV-1a: for picking
// directory shards and naming process-group contexts.
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

// A 64-bit finalizer (SplitMix64's): spreads every input bit over the
// output, for tokens built from counters and process ids.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace hoplite
