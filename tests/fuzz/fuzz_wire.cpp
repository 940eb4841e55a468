// libFuzzer target for the wire decoder: every frame header and every control
// message decoder gets arbitrary bytes. Decoding must throw DecodeError or
// succeed; a message that decodes must survive encode + decode unchanged in
// size. Built and run with ASan + UBSan by `make fuzz` (tests/fuzz/run.sh).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "wire/frame.h"
#include "wire/messages.h"

using namespace hoplite;
using namespace hoplite::wire;

namespace {

constexpr uint64_t kMaxInline = 1 << 16;

template <typename M, typename Decode>
void roundTrip(const uint8_t* data, size_t size, Decode decode) {
  M msg;
  try {
    Reader r(data, size);
    msg = decode(r);
  } catch (const DecodeError&) {
    return;  // refused: fine
  }
  std::string again = encode(msg);
  Reader r(reinterpret_cast<const uint8_t*>(again.data()), again.size());
  M back = decode(r);  // must not throw: we produced it
  if (encode(back) != again) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0];
  ++data;
  --size;
  switch (which % 26) {
    case 0: {
      FrameHeader h;
      if (size >= kHeaderSize) (void)decodeHeader(data, FrameLimits{1 << 20, 4 << 20}, &h);
      return 0;
    }
    case 1: roundTrip<Hello>(data, size, [](Reader& r) { return Hello::decode(r); }); return 0;
    case 2: roundTrip<HelloAck>(data, size, [](Reader& r) { return HelloAck::decode(r); }); return 0;
    case 3: roundTrip<Register>(data, size, [](Reader& r) { return Register::decode(r, kMaxInline); }); return 0;
    case 4: roundTrip<StatusReply>(data, size, [](Reader& r) { return StatusReply::decode(r); }); return 0;
    case 5: roundTrip<HolderUpdate>(data, size, [](Reader& r) { return HolderUpdate::decode(r); }); return 0;
    case 6: roundTrip<Lookup>(data, size, [](Reader& r) { return Lookup::decode(r); }); return 0;
    case 7: roundTrip<LookupReply>(data, size, [](Reader& r) { return LookupReply::decode(r, kMaxInline); }); return 0;
    case 8: roundTrip<Delete>(data, size, [](Reader& r) { return Delete::decode(r); }); return 0;
    case 9: roundTrip<DropCopy>(data, size, [](Reader& r) { return DropCopy::decode(r); }); return 0;
    case 10: roundTrip<Pull>(data, size, [](Reader& r) { return Pull::decode(r); }); return 0;
    case 11: roundTrip<Cancel>(data, size, [](Reader& r) { return Cancel::decode(r); }); return 0;
    case 12: roundTrip<ReduceTask>(data, size, [](Reader& r) { return ReduceTask::decode(r); }); return 0;
    case 13: roundTrip<ReduceAbort>(data, size, [](Reader& r) { return ReduceAbort::decode(r); }); return 0;
    case 14: roundTrip<Probe>(data, size, [](Reader& r) { return Probe::decode(r, kMaxInline); }); return 0;
    case 15: roundTrip<Message>(data, size, [](Reader& r) { return Message::decode(r); }); return 0;
    case 16: roundTrip<Challenge>(data, size, [](Reader& r) { return Challenge::decode(r); }); return 0;
    case 17: roundTrip<Auth>(data, size, [](Reader& r) { return Auth::decode(r); }); return 0;
    case 18: roundTrip<ShardMoved>(data, size, [](Reader& r) { return ShardMoved::decode(r); }); return 0;
    case 19: roundTrip<Subscribe>(data, size, [](Reader& r) { return Subscribe::decode(r); }); return 0;
    case 20: roundTrip<Locations>(data, size, [](Reader& r) { return Locations::decode(r); }); return 0;
    case 21: roundTrip<MessageReply>(data, size, [](Reader& r) { return MessageReply::decode(r); }); return 0;
    case 22: roundTrip<MessageWithdrawn>(data, size, [](Reader& r) { return MessageWithdrawn::decode(r); }); return 0;
    case 23: roundTrip<DataAt>(data, size, [](Reader& r) { return DataAt::decode(r); }); return 0;
    case 24: roundTrip<ResultFailed>(data, size, [](Reader& r) { return ResultFailed::decode(r); }); return 0;
    default: {
      if (size >= kDataSubheaderSize) {
        uint64_t request, offset;
        decodeDataSubheader(data, &request, &offset);
      }
      return 0;
    }
  }
}
