// How objects and messages are cut into data frames.
#pragma once

#include <cstdint>

namespace hoplite {

// The frame size for `size` bytes: `configured` if set, else about 64 chunks
// an object between 256 KiB and 4 MiB, but at least 16 chunks (down to
// 64 KiB) for objects under 4 MiB. A relay chain of depth D ends D frames
// after its source: a 1 MB object in 4 frames of 256 KiB took 2.5-4x the
// ideal on 8 emulated nodes. Smaller frames for larger objects cost more
// CPU than the shorter fill saved (benchmarks/README.md, "Frame size").
inline uint64_t chunkSize(uint64_t size, uint64_t configured) {
  if (configured > 0) return configured;
  uint64_t chunk = 256u << 10;
  while (chunk < (4u << 20) && chunk * 64 < size) chunk *= 2;
  while (chunk > (64u << 10) && chunk * 16 > size) chunk /= 2;
  return chunk;
}

}  // namespace hoplite
