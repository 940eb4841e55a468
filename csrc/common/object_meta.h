// What the directory knows about an object's contents: enough to rebuild the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace hoplite {

constexpr size_t kMaxIdBytes = 1024;
constexpr size_t kMaxDims = 64;
constexpr size_t kMaxNameBytes = 32;  // dtype and device names

struct ObjectMeta {
  std::string dtype;            // torch dtype name, e.g. "float32"
  uint32_t itemsize = 0;        // bytes per element
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;          // numel * itemsize
  std::string device;           // device the object was put from, e.g. "cpu"
};

// Same dtype and shape: objects that can be reduced together. The device they
// were put from does not matter: every store copy is in host memory.
bool sameContents(const ObjectMeta& a, const ObjectMeta& b);
// For error messages, e.g. "float32[4x8] on cpu".
std::string describeMeta(const ObjectMeta& meta);

// Checks the bounds and that nbytes == prod(shape) * itemsize without overflow.
Status validateMeta(const ObjectMeta& meta);
Status validateId(const std::string& id);
// Printable form of an id for error messages (escapes bytes, truncates long ids).
std::string printableId(const std::string& id);
// A duration for error messages, e.g. "1.5 s".
std::string printableSeconds(double seconds);

}  // namespace hoplite
