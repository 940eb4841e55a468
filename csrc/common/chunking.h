// How objects and messages are cut into data frames.
#pragma once

#include <cstdint>

namespace hoplite {

// The frame size for `size` bytes: `configured` if set, else about 64 chunks
// an object, between 256 KiB and 4 MiB: small enough that a relay chain fills
// quickly, large enough that per-frame costs vanish.
inline uint64_t chunkSize(uint64_t size, uint64_t configured) {
  if (configured > 0) return configured;
  uint64_t chunk = 256u << 10;
  while (chunk < (4u << 20) && chunk * 64 < size) chunk *= 2;
  return chunk;
}

}  // namespace hoplite
