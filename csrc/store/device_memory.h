// Memory the node's threads cannot read or write directly (a CUDA tensor).
// A put copies its object from a DeviceSource into the store, a get from the
// store into a DeviceTarget, chunk by chunk, so the network and the device
// copies overlap. The CUDA implementations live in cuda/staging.*; the core
// sees only these interfaces and never includes a CUDA header.
#pragma once

#include <cstdint>
#include <string>

#include "common/object_meta.h"
#include "common/status.h"

namespace hoplite {

class DeviceSource {
 public:
  virtual ~DeviceSource() = default;
  // Copies bytes [offset, offset + n) of the source to `to` (host memory);
  // blocks until they are there. Called from one thread at a time.
  virtual Status read(uint64_t offset, uint64_t n, uint8_t* to) = 0;
};

class DeviceTarget {
 public:
  virtual ~DeviceTarget() = default;
  // The object's metadata, once the get knows it: checks the destination can
  // take it (loop thread; must not block).
  virtual Status prepare(const std::string& id, const ObjectMeta& meta) = 0;
  // Copies `n` bytes from `from` (host memory) to the destination at `offset`;
  // blocks until they are there. Called from one thread at a time, after prepare.
  virtual Status write(uint64_t offset, uint64_t n, const uint8_t* from) = 0;
};

}  // namespace hoplite
