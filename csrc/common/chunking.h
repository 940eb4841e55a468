// How objects and messages are cut into data frames.
#pragma once

#include <cstdint>

namespace hoplite {

// The frame size for `size` bytes: `configured` if set, else about 128 chunks
// an object between 128 KiB and 4 MiB, but at least 16 chunks (down to
// 64 KiB) for objects under 2 MiB. A relay chain of depth D ends D frames
// after its source, so the fill costs D/chunks of the transfer: a 16 MB
// broadcast in 64 frames took 1.13x the ideal on 8 emulated nodes, in 128
// 1.08x. Smaller frames at 16 MB saved nothing more and cost CPU, and made
// the allreduce's 2 MiB pieces slower (benchmarks/README.md, "Frame size").
inline uint64_t chunkSize(uint64_t size, uint64_t configured) {
  if (configured > 0) return configured;
  uint64_t chunk = 128u << 10;
  while (chunk < (4u << 20) && chunk * 128 < size) chunk *= 2;
  while (chunk > (64u << 10) && chunk * 16 > size) chunk /= 2;
  return chunk;
}

}  // namespace hoplite
