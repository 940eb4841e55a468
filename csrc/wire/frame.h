// Frame layout on a connection: a fixed 16-byte header, then `length` payload bytes.
//   u32 magic | u8 version | u8 type | u16 reserved (0) | u64 length
// Data frames start their payload with a 16-byte sub-header (u64 request, u64 offset)
// followed by raw object bytes, which the receiver reads straight into the object buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace hoplite {
namespace wire {

constexpr uint32_t kMagic = 0x544c5048;  // "HPLT" little-endian
constexpr uint8_t kVersion = 21;  // 2: authenticated handshake; 3: recovery and rejoin fields; 4: subscriptions;
                                  // 5: message kinds; 6: message withdrawal; 7: same-host reads;
                                  // 8: status kMoved (a copy handed to a get); 9: a lookup's preferred sender;
                                  // 10: the proofs cover the hello's listen address;
                                  // 11: moved shards name the incarnation that died (and return after a rejoin)
                                  // 12: leaves, and shards hand over what they remember of gone ids
                                  // 13: standbys hear where each put's copy is
                                  // 14: hello acks list the members the server reaches
                                  // 15: remembered deletes name the delete that made them
                                  // 16: a process back from a stall takes its share back (share epochs)
                                  // 17: a rank taken back lists its copies again where they were forgotten
                                  // 18: a reduce task that has not started says what it waits for
                                  // 19: a lookup names the relay's own sender; copies listed again say if their put is pending
                                  // 20: a failed reduce tells its result's shard
                                  // 21: an abort says why the inputs were refused
constexpr size_t kHeaderSize = 16;
constexpr size_t kDataSubheaderSize = 16;

enum class MsgType : uint8_t {
  kHello = 1,
  kHelloAck = 2,
  kRegister = 3,
  kStatusReply = 4,
  kHolderUpdate = 5,
  kLookup = 6,
  kLookupReply = 7,
  kDelete = 8,
  kDropCopy = 9,
  kPull = 10,
  kData = 11,
  kCancel = 12,
  kReduceTask = 13,
  kReduceAbort = 14,
  kProbe = 15,
  kMessage = 16,
  kChallenge = 17,
  kAuth = 18,
  kShardMoved = 19,
  kSubscribe = 20,
  kLocations = 21,
  kMessageReply = 22,
  kMessageWithdrawn = 23,
  kDataAt = 24,
  kMessageCredit = 25,
  kShardHandOver = 26,
  kLeave = 27,
  kShardReturned = 28,
  kRelistCopies = 29,
  kResultFailed = 30,
};
constexpr uint8_t kMaxMsgType = 30;

struct FrameHeader {
  uint8_t type = 0;
  uint64_t length = 0;
};

struct FrameLimits {
  uint64_t maxControl;  // bytes of a control payload
  uint64_t maxData;     // object bytes in one data frame
};
// What a connection takes before its handshake, on any transport: small
// control frames only, so that a stranger cannot make us allocate or write.
constexpr FrameLimits kHandshakeLimits{4096, 0};

void encodeHeader(uint8_t* out, MsgType type, uint64_t length);
// Checks magic, version, type and length against the limits.
Status decodeHeader(const uint8_t* in, const FrameLimits& limits, FrameHeader* out);
void encodeDataSubheader(uint8_t* out, uint64_t request, uint64_t offset);
void decodeDataSubheader(const uint8_t* in, uint64_t* request, uint64_t* offset);

}  // namespace wire
}  // namespace hoplite
