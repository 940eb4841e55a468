// How objects and messages are cut into data frames.
#pragma once

#include <cstdint>

namespace hoplite {

// The frame size for `size` bytes: `configured` if set, else 64 KiB for
// objects up to 16 MiB, and about 64 chunks an object above, up to 4 MiB.
// A relay chain of depth D delays its end by D frames, which for objects up
// to 16 MiB is most of their fixed cost: on 8 emulated nodes at 1 Gbit/s,
// 64 KiB frames beat 256 KiB ones at 1 and 16 MB, and 16 or 32 KiB ones
// cost more CPU for no gain (benchmarks/README.md, "Frame size").
inline uint64_t chunkSize(uint64_t size, uint64_t configured) {
  if (configured > 0) return configured;
  constexpr uint64_t kSmallObjectFrame = 64u << 10;
  if (size <= (16u << 20)) return kSmallObjectFrame;
  uint64_t chunk = 256u << 10;
  while (chunk < (4u << 20) && chunk * 64 < size) chunk *= 2;
  return chunk;
}

}  // namespace hoplite
