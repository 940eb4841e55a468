#include "wire/frame.h"

#include <string>

namespace hoplite {
namespace wire {
namespace {

void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

void encodeHeader(uint8_t* out, MsgType type, uint64_t length) {
  put32(out, kMagic);
  out[4] = kVersion;
  out[5] = static_cast<uint8_t>(type);
  out[6] = 0;
  out[7] = 0;
  put64(out + 8, length);
}

Status decodeHeader(const uint8_t* in, const FrameLimits& limits, FrameHeader* out) {
  if (get32(in) != kMagic) return Status(Code::kProtocol, "bad frame magic");
  if (in[4] != kVersion) {
    return Status(Code::kProtocol, "unsupported protocol version " + std::to_string(in[4]));
  }
  uint8_t type = in[5];
  if (type == 0 || type > kMaxMsgType) {
    return Status(Code::kProtocol, "unknown message type " + std::to_string(type));
  }
  if (in[6] != 0 || in[7] != 0) return Status(Code::kProtocol, "reserved header bits set");
  uint64_t length = get64(in + 8);
  if (static_cast<MsgType>(type) == MsgType::kData) {
    if (length < kDataSubheaderSize || length - kDataSubheaderSize > limits.maxData) {
      return Status(Code::kProtocol, "data frame of " + std::to_string(length) + " bytes is out of bounds");
    }
  } else if (length > limits.maxControl) {
    return Status(Code::kProtocol, "control frame of " + std::to_string(length) + " bytes exceeds the limit");
  }
  out->type = type;
  out->length = length;
  return Status();
}

void encodeDataSubheader(uint8_t* out, uint64_t request, uint64_t offset) {
  put64(out, request);
  put64(out + 8, offset);
}

void decodeDataSubheader(const uint8_t* in, uint64_t* request, uint64_t* offset) {
  *request = get64(in);
  *offset = get64(in + 8);
}

}  // namespace wire
}  // namespace hoplite
