#include "common/object_meta.h"

#include <cstdio>

namespace hoplite {

Status validateMeta(const ObjectMeta& meta) {
  if (meta.dtype.empty() || meta.dtype.size() > kMaxNameBytes) {
    return Status(Code::kInvalidArgument, "dtype name must have 1.." + std::to_string(kMaxNameBytes) + " bytes");
  }
  if (meta.device.size() > kMaxNameBytes) return Status(Code::kInvalidArgument, "device name too long");
  if (meta.itemsize == 0 || meta.itemsize > 16) {
    return Status(Code::kInvalidArgument, "itemsize " + std::to_string(meta.itemsize) + " out of range");
  }
  if (meta.shape.size() > kMaxDims) return Status(Code::kInvalidArgument, "too many dimensions");
  unsigned __int128 total = meta.itemsize;
  for (int64_t d : meta.shape) {
    if (d < 0) return Status(Code::kInvalidArgument, "negative dimension");
    total *= static_cast<uint64_t>(d);
    if (total > (static_cast<unsigned __int128>(1) << 62)) {
      total = static_cast<unsigned __int128>(1) << 63;  // saturate; compared below
    }
  }
  if (total != meta.nbytes) {
    return Status(Code::kInvalidArgument, "size " + std::to_string(meta.nbytes) + " does not match shape and itemsize");
  }
  return Status();
}

Status validateId(const std::string& id) {
  if (id.empty()) return Status(Code::kInvalidArgument, "object id must not be empty");
  if (id.size() > kMaxIdBytes) {
    return Status(Code::kInvalidArgument, "object id longer than " + std::to_string(kMaxIdBytes) + " bytes");
  }
  return Status();
}

std::string printableId(const std::string& id) {
  std::string out = "'";
  size_t n = 0;
  for (unsigned char c : id) {
    if (++n > 80) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char esc[5];
      std::snprintf(esc, sizeof(esc), "\\x%02x", c);
      out += esc;
    }
  }
  return out + "'";
}

std::string printableSeconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", seconds);
  return buf;
}

bool sameContents(const ObjectMeta& a, const ObjectMeta& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes;
}

std::string describeMeta(const ObjectMeta& m) {
  std::string shape;
  for (size_t i = 0; i < m.shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(m.shape[i]);
  return m.dtype + "[" + shape + "] on " + m.device;
}

}  // namespace hoplite
