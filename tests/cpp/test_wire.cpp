// Unit tests of the wire decoder: every truncation, oversized lengths and bad
// fields must give a DecodeError or an error Status, never a crash, an
// out-of-bounds read or a huge allocation. Built with ASan + UBSan by
// tests/test_cpp_units.py.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "wire/frame.h"
#include "wire/messages.h"

#include "check.h"

using namespace hoplite;
using namespace hoplite::wire;


static ObjectMeta sampleMeta() {
  ObjectMeta m;
  m.dtype = "float32";
  m.itemsize = 4;
  m.shape = {2, 3};
  m.nbytes = 24;
  m.device = "cpu";
  return m;
}

template <typename Decode>
static bool throwsDecodeError(const std::string& bytes, Decode decode) {
  // Copy into an exactly sized heap block so ASan catches any over-read.
  std::vector<uint8_t> buf(bytes.begin(), bytes.end());
  uint8_t* heap = static_cast<uint8_t*>(std::malloc(buf.size() + 1));
  std::copy(buf.begin(), buf.end(), heap);
  bool threw = false;
  try {
    Reader r(heap, buf.size());
    decode(r);
  } catch (const DecodeError&) {
    threw = true;
  }
  std::free(heap);
  return threw;
}

// A valid encoding decodes; each strict prefix of it and each extension by a byte fails.
template <typename M, typename Decode>
static void checkTruncations(const M& msg, Decode decode, const char* name) {
  std::string bytes = encode(msg);
  CHECK(!throwsDecodeError(bytes, decode));
  for (size_t n = 0; n < bytes.size(); ++n) {
    if (!throwsDecodeError(bytes.substr(0, n), decode)) {
      std::fprintf(stderr, "%s: prefix of %zu/%zu bytes decoded\n", name, n, bytes.size());
      ++checkFailures();
    }
  }
  CHECK(throwsDecodeError(bytes + '\0', decode));
}

static void testHeaders() {
  FrameLimits limits{1 << 20, 4 << 20};
  uint8_t h[kHeaderSize];
  FrameHeader out;

  encodeHeader(h, MsgType::kLookup, 100);
  CHECK(decodeHeader(h, limits, &out).ok());
  CHECK(out.length == 100 && out.type == static_cast<uint8_t>(MsgType::kLookup));

  encodeHeader(h, MsgType::kLookup, (1 << 20) + 1);  // oversized control frame
  CHECK(decodeHeader(h, limits, &out).code == Code::kProtocol);

  encodeHeader(h, MsgType::kData, kDataSubheaderSize + (4 << 20) + 1);  // oversized data frame
  CHECK(decodeHeader(h, limits, &out).code == Code::kProtocol);

  encodeHeader(h, MsgType::kData, kDataSubheaderSize - 1);  // too short for its sub-header
  CHECK(decodeHeader(h, limits, &out).code == Code::kProtocol);

  encodeHeader(h, MsgType::kData, ~0ull);  // length that would overflow
  CHECK(decodeHeader(h, limits, &out).code == Code::kProtocol);

  encodeHeader(h, MsgType::kLookup, 10);
  h[0] ^= 0xff;  // bad magic
  CHECK(decodeHeader(h, limits, &out).code == Code::kProtocol);

  encodeHeader(h, MsgType::kLookup, 10);
  h[4] = kVersion + 1;  // future version
  CHECK(decodeHeader(h, limits, &out).code == Code::kProtocol);

  for (int type : {0, kMaxMsgType + 1, 255}) {
    encodeHeader(h, MsgType::kLookup, 10);
    h[5] = static_cast<uint8_t>(type);
    CHECK(decodeHeader(h, limits, &out).code == Code::kProtocol);
  }

  encodeHeader(h, MsgType::kLookup, 10);
  h[6] = 1;  // reserved bits
  CHECK(decodeHeader(h, limits, &out).code == Code::kProtocol);
}

static void testMessages() {
  const uint64_t maxInline = 1 << 16;
  Register reg;
  reg.request = 7;
  reg.id = "object-1";
  reg.meta = sampleMeta();
  reg.holder = 3;
  reg.complete = true;
  reg.recomputable = true;
  reg.reannounce = true;
  reg.primary = false;
  reg.putPending = true;
  reg.token = 0x1234567890abcdefull;
  reg.hasInline = true;
  reg.inlineData = std::string(24, 'x');
  checkTruncations(reg, [&](Reader& r) { Register::decode(r, maxInline); }, "register");

  std::string ok = encode(reg);
  Reader r(reinterpret_cast<const uint8_t*>(ok.data()), ok.size());
  Register back = Register::decode(r, maxInline);
  CHECK(back.id == reg.id && back.meta.shape == reg.meta.shape && back.inlineData == reg.inlineData);
  CHECK(back.holder == 3 && back.complete && back.recomputable && back.request == 7);
  CHECK(back.reannounce && !back.primary && back.putPending && back.token == 0x1234567890abcdefull);

  LookupReply lr;
  lr.request = 9;
  lr.meta = sampleMeta();
  lr.sender = 2;
  lr.senderSource = 5;
  lr.recomputable = true;
  checkTruncations(lr, [&](Reader& r) { LookupReply::decode(r, maxInline); }, "lookup reply");
  {
    std::string bytes = encode(lr);
    Reader lrr(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    LookupReply lrBack = LookupReply::decode(lrr, maxInline);
    CHECK(lrBack.sender == 2 && lrBack.senderSource == 5 && lrBack.recomputable);
  }
  LookupReply err;
  err.request = 9;
  err.status = Status(Code::kDeleted, "gone");
  checkTruncations(err, [&](Reader& r) { LookupReply::decode(r, maxInline); }, "lookup error reply");

  checkTruncations(Hello{kVersion, 2, "cluster", std::string(kNonceSize, 'n'), "10.0.0.1", 4242, 77},
                   [](Reader& r) { Hello::decode(r); },
                   "hello");
  CHECK(throwsDecodeError(encode(Hello{kVersion, 2, "cluster", "short"}), [](Reader& r) { Hello::decode(r); }));
  checkTruncations(Challenge{std::string(kNonceSize, 'n'), std::string(kProofSize, 'p')},
                   [](Reader& r) { Challenge::decode(r); }, "challenge");

  checkTruncations(Auth{std::string(kProofSize, 'p')}, [](Reader& r) { Auth::decode(r); }, "auth");
  CHECK(throwsDecodeError(encode(Auth{std::string(kProofSize + 1, 'p')}), [](Reader& r) { Auth::decode(r); }));
  checkTruncations(HelloAck{2, {{1, 9}, {5, 0}}}, [](Reader& r) { HelloAck::decode(r); }, "hello ack");
  checkTruncations(HelloAck{2, {}, 0x99, "boot/net:1/pid:2", 4242, 0x7f0012345000ull, std::string(kNonceSize, 'q')},
                   [](Reader& r) { HelloAck::decode(r); }, "hello ack offering same-host reads");
  CHECK(throwsDecodeError(encode(HelloAck{2, {}, 0x99, "h", 1, 2, std::string(kNonceSize + 1, 'q')}),
                          [](Reader& r) { HelloAck::decode(r); }));
  {
    HelloAck shares{2, {{1, 0x1234567890ull, 3}, {5, 0, 0}}, 0xfeedull};
    shares.returnedShards = {{4, 0x77ull, 2}};
    std::string bytes = encode(shares);
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    HelloAck back = HelloAck::decode(r);
    CHECK(back.rank == 2 && back.incarnation == 0xfeedull && back.deadShards.size() == 2 && back.deadShards[0].rank == 1 &&
          back.deadShards[0].incarnation == 0x1234567890ull && back.deadShards[1].rank == 5 &&
          back.deadShards[0].epoch == 3 && back.deadShards[1].incarnation == 0);
    CHECK(back.returnedShards.size() == 1 && back.returnedShards[0].rank == 4 &&
          back.returnedShards[0].incarnation == 0x77ull && back.returnedShards[0].epoch == 2);
    checkTruncations(HelloAck{2, {{1, 7, 1}}}, [](Reader& r) { HelloAck::decode(r); }, "hello ack naming a dead shard");
    checkTruncations(shares, [](Reader& r) { HelloAck::decode(r); }, "hello ack naming a returned shard");
    HelloAck listing{2};
    listing.members = {{1, 0xabcull, "10.0.0.2", 4100}, {3, 7, "", 0}};
    std::string listed = encode(listing);
    Reader lr(reinterpret_cast<const uint8_t*>(listed.data()), listed.size());
    HelloAck members = HelloAck::decode(lr);
    CHECK(members.members.size() == 2 && members.members[0].rank == 1 && members.members[0].incarnation == 0xabcull &&
          members.members[0].host == "10.0.0.2" && members.members[0].port == 4100 && members.members[1].rank == 3);
    checkTruncations(listing, [](Reader& r) { HelloAck::decode(r); }, "hello ack listing members");
    CHECK(throwsDecodeError(encode(Hello{kVersion, 2, "c", std::string(kNonceSize, 'n'), "h", 70000}),
                            [](Reader& r) { Hello::decode(r); }));
  }
  checkTruncations(ShardMoved{{3, 0xabcdefull, 1}}, [](Reader& r) { ShardMoved::decode(r); }, "shard moved");
  checkTruncations(ShardReturned{{3, 0xabcdefull, 2}}, [](Reader& r) { ShardReturned::decode(r); }, "shard returned");
  checkTruncations(Subscribe{7, "id", true}, [](Reader& r) { Subscribe::decode(r); }, "subscribe");
  {
    Locations loc{7, "id", LocationState::kPresent, {0, 3}, {2}, true, -1};
    checkTruncations(loc, [](Reader& r) { Locations::decode(r); }, "locations");
    std::string bytes = encode(loc);
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    Locations back = Locations::decode(r);
    CHECK(back.request == 7 && back.state == LocationState::kPresent && back.inlined && back.lastHolder == -1);
    CHECK(back.complete == std::vector<int32_t>({0, 3}) && back.partial == std::vector<int32_t>({2}));
    bytes[8 + 4 + 2] = 4;  // state after request, id length and id: out of range
    CHECK(throwsDecodeError(bytes, [](Reader& r) { Locations::decode(r); }));
  }
  checkTruncations(StatusReply{1, Status(Code::kTimeout, "late")}, [](Reader& r) { StatusReply::decode(r); },
                   "status reply");
  checkTruncations(HolderUpdate{"id", 1, HolderState::kRemoved, 3}, [](Reader& r) { HolderUpdate::decode(r); },
                   "holder update");
  checkTruncations(Lookup{1, "id", 500, true, 2, 3}, [](Reader& r) { Lookup::decode(r); }, "lookup");
  checkTruncations(Delete{1, "id"}, [](Reader& r) { Delete::decode(r); }, "delete");
  checkTruncations(DropCopy{1, "id", true}, [](Reader& r) { DropCopy::decode(r); }, "drop copy");
  {
    std::string bytes = encode(Delete{3, "id", true, 77});
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    Delete back = Delete::decode(r);
    CHECK(back.request == 3 && back.id == "id" && back.retract && back.ifToken == 77);
    bytes[bytes.size() - 9] = 2;  // `retract`, not a boolean
    CHECK(throwsDecodeError(bytes, [](Reader& r) { Delete::decode(r); }));
  }
  checkTruncations(Pull{1, "id", 4, true}, [](Reader& r) { Pull::decode(r); }, "pull");
  checkTruncations(DataAt{1, 4096, 65536, 0x7f0012345000ull}, [](Reader& r) { DataAt::decode(r); }, "data at");
  CHECK(throwsDecodeError(encode(DataAt{1, 0, 0, 8}), [](Reader& r) { DataAt::decode(r); }));  // empty range
  CHECK(throwsDecodeError(encode(DataAt{1, ~0ull, 2, 8}), [](Reader& r) { DataAt::decode(r); }));  // wraps around
  checkTruncations(Cancel{1}, [](Reader& r) { Cancel::decode(r); }, "cancel");
  ReduceTask task;
  task.request = 9;
  task.reduceId = "sum";
  task.inputId = "x";
  task.outputId = "p/1";
  task.childIds = {"p/0", "p/2"};
  task.meta = sampleMeta();
  task.op = 4;
  task.count = 3;
  task.root = true;
  task.timeoutMs = 1000;
  task.endRequest = 10;
  task.stallRequest = 11;
  task.stallNoteMs = 800;
  checkTruncations(task, [](Reader& r) { ReduceTask::decode(r); }, "reduce task");
  {
    std::string bytes = encode(task);
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ReduceTask back = ReduceTask::decode(r);
    CHECK(back.childIds == task.childIds && back.outputId == "p/1" && back.root && back.count == 3 && back.op == 4 &&
          back.endRequest == 10 && back.stallRequest == 11 && back.stallNoteMs == 800);
  }
  checkTruncations(ReduceAbort{0, "sum", false, Status(Code::kInvalidArgument, "inputs differ")},
                   [](Reader& r) { ReduceAbort::decode(r); }, "reduce abort");
  {
    std::string bytes = encode(ReduceAbort{9, "sum", true, Status(Code::kInvalidArgument, "inputs differ")});
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ReduceAbort back = ReduceAbort::decode(r);
    CHECK(back.request == 9 && back.id == "sum" && back.retract && back.refused.code == Code::kInvalidArgument &&
          back.refused.message == "inputs differ");
  }
  checkTruncations(Probe{1, std::string(100, 'x')}, [](Reader& r) { Probe::decode(r, 1000); }, "probe");
  checkTruncations(Message{kMessageRequestBit | 7, 3, 5, 1 << 20, "allreduce"}, [](Reader& r) { Message::decode(r); }, "message");
  CHECK(throwsDecodeError(encode(Message{7, 3, 5, 0}), [](Reader& r) { Message::decode(r); }));
  {
    Message deferred{kMessageRequestBit | 9, 3, 5, 64 << 20, "send/recv", false};
    std::string bytes = encode(deferred);
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    Message back = Message::decode(r);
    CHECK(back.kind == "send/recv" && !back.eager && back.size == (64u << 20));
  }
  checkTruncations(MessageReply{kMessageRequestBit | 7, MessageAnswer::kRefused, "another size"},
                   [](Reader& r) { MessageReply::decode(r); }, "message reply");
  CHECK(throwsDecodeError(encode(MessageReply{7, MessageAnswer::kSend, ""}), [](Reader& r) { MessageReply::decode(r); }));
  {
    std::string bad = encode(MessageReply{kMessageRequestBit | 7, MessageAnswer::kSend, ""});
    bad[8] = 3;  // no such answer
    CHECK(throwsDecodeError(bad, [](Reader& r) { MessageReply::decode(r); }));
    bad[8] = 0;  // eager messages are credited, never answered
    CHECK(throwsDecodeError(bad, [](Reader& r) { MessageReply::decode(r); }));
  }
  checkTruncations(MessageCredit{3u << 20}, [](Reader& r) { MessageCredit::decode(r); }, "message credit");
  CHECK(throwsDecodeError(encode(MessageCredit{0}), [](Reader& r) { MessageCredit::decode(r); }));
  {
    std::string bytes = encode(MessageCredit{(8ull << 20) + 5});
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    CHECK(MessageCredit::decode(r).bytes == (8ull << 20) + 5);
  }
  checkTruncations(MessageWithdrawn{kMessageRequestBit | 7, "timed out"}, [](Reader& r) { MessageWithdrawn::decode(r); },
                   "message withdrawal");
  CHECK(throwsDecodeError(encode(MessageWithdrawn{7, ""}), [](Reader& r) { MessageWithdrawn::decode(r); }));
  {
    std::string bytes = encode(MessageWithdrawn{kMessageRequestBit | 9, "its send timed out"});
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    MessageWithdrawn back = MessageWithdrawn::decode(r);
    CHECK(back.request == (kMessageRequestBit | 9) && back.reason == "its send timed out");
  }
  checkTruncations(Leave{4, 9}, [](Reader& r) { Leave::decode(r); }, "leave");
  {
    std::string bytes = encode(RelistCopies{0x1122334455667788ull});
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    CHECK(RelistCopies::decode(r).incarnation == 0x1122334455667788ull);
  }
  checkTruncations(RelistCopies{7}, [](Reader& r) { RelistCopies::decode(r); }, "relist copies");
  {
    std::string bytes = encode(ResultFailed{"out", Status(Code::kInvalidArgument, "inputs differ")});
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ResultFailed back = ResultFailed::decode(r);
    CHECK(back.id == "out" && back.status.code == Code::kInvalidArgument && back.status.message == "inputs differ");
    CHECK(throwsDecodeError(encode(ResultFailed{"out", Status()}), [](Reader& r) { ResultFailed::decode(r); }));
  }
  checkTruncations(ResultFailed{"out", Status(Code::kInvalidArgument, "x")}, [](Reader& r) { ResultFailed::decode(r); },
                   "result failure");
  {
    ShardHandOver handOver;
    handOver.standby = true;
    handOver.gone = {GoneId{"deleted-one", true, -1, false, 0x8877665544332211ull}, GoneId{"lost-one", false, 3, true}};
    checkTruncations(handOver, [](Reader& r) { ShardHandOver::decode(r); }, "shard hand-over");
    std::string bytes = encode(handOver);
    Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ShardHandOver back = ShardHandOver::decode(r);
    CHECK(back.standby && back.gone.size() == 2 && back.gone[0].id == "deleted-one" && back.gone[0].deleted &&
          back.gone[0].deletedBy == 0x8877665544332211ull && back.gone[1].deletedBy == 0 && back.gone[1].id == "lost-one" && !back.gone[1].deleted && back.gone[1].lastHolder == 3 && back.gone[1].lastHolderLeft);
    // A count the payload cannot hold is refused before allocating.
    Writer w;
    w.u8(0);
    w.u32(1u << 30);
    CHECK(throwsDecodeError(w.take(), [](Reader& r) { ShardHandOver::decode(r); }));
  }
  // A child count that the payload cannot hold is refused before allocating.
  {
    Writer w;
    w.u64(1);
    encodeId(w, "r");
    encodeId(w, "i");
    encodeId(w, "o");
    w.u32(0xffffffffu);
    std::string bytes = w.take();
    CHECK(throwsDecodeError(bytes, [](Reader& r) { ReduceTask::decode(r); }));
  }
  CHECK(throwsDecodeError(encode(Probe{1, std::string(1001, 'x')}), [](Reader& r) { Probe::decode(r, 1000); }));
}

static void testBadFields() {
  const uint64_t maxInline = 1 << 16;
  auto registerWith = [](const std::function<void(Register&)>& edit) {
    Register reg;
    reg.id = "x";
    reg.meta = sampleMeta();
    reg.holder = 0;
    edit(reg);
    return encode(reg);
  };
  auto decodeRegister = [&](Reader& r) { Register::decode(r, maxInline); };

  // nbytes that does not match the shape
  CHECK(throwsDecodeError(registerWith([](Register& m) { m.meta.nbytes = 25; }), decodeRegister));
  // a shape whose product overflows 64 bits
  CHECK(throwsDecodeError(registerWith([](Register& m) {
                            m.meta.shape = {1ll << 40, 1ll << 40, 1ll << 40};
                            m.meta.nbytes = 0;
                          }),
                          decodeRegister));
  CHECK(throwsDecodeError(registerWith([](Register& m) { m.meta.shape = {-1}; }), decodeRegister));
  CHECK(throwsDecodeError(registerWith([](Register& m) { m.meta.itemsize = 0; }), decodeRegister));
  CHECK(throwsDecodeError(registerWith([](Register& m) { m.id.clear(); }), decodeRegister));
  CHECK(throwsDecodeError(registerWith([](Register& m) { m.id = std::string(kMaxIdBytes + 1, 'i'); }),
                          decodeRegister));
  // inline bytes that disagree with the metadata, or exceed the inline bound
  CHECK(throwsDecodeError(registerWith([](Register& m) {
                            m.hasInline = true;
                            m.inlineData = "short";
                          }),
                          decodeRegister));
  CHECK(throwsDecodeError(registerWith([&](Register& m) {
                            m.meta.shape = {static_cast<int64_t>(maxInline)};
                            m.meta.nbytes = maxInline * 4;
                            m.hasInline = true;
                            m.inlineData = std::string(maxInline * 4, 'z');
                          }),
                          decodeRegister));

  // A string length prefix far beyond the frame must not allocate or read.
  Writer w;
  w.u64(1);
  w.u32(0xfffffff0u);
  std::string bytes = w.take();
  CHECK(throwsDecodeError(bytes, [](Reader& r) { Delete::decode(r); }));

  // Inline bytes whose length prefix runs past the frame.
  LookupReply lr;
  lr.meta = sampleMeta();
  lr.hasInline = true;
  lr.inlineData = std::string(24, 'q');
  std::string enc = encode(lr);
  const size_t inlineAt = enc.find(lr.inlineData);  // cut within the inline bytes, whatever follows them
  CHECK(inlineAt != std::string::npos);
  CHECK(throwsDecodeError(enc.substr(0, inlineAt + 14), [&](Reader& r) { LookupReply::decode(r, maxInline); }));

  // Unknown status code, bad boolean, bad holder state.
  std::string sr = encode(StatusReply{1, Status()});
  sr[8] = static_cast<char>(kMaxCode + 1);
  CHECK(throwsDecodeError(sr, [](Reader& r) { StatusReply::decode(r); }));
  std::string hu = encode(HolderUpdate{"id", 1, HolderState::kComplete, -1});
  hu[4 + 2 + 4] = 7;  // the state byte, after the id (u32 length + 2 bytes) and the holder
  CHECK(throwsDecodeError(hu, [](Reader& r) { HolderUpdate::decode(r); }));
}

static void testRandomBytes() {
  // Arbitrary bytes fed to every decoder: errors are fine, crashes are not.
  uint64_t state = 88172645463325252ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(next() % 96, '\0');
    for (auto& c : bytes) c = static_cast<char>(next() & 0xff);
    throwsDecodeError(bytes, [](Reader& r) { Register::decode(r, 1 << 16); });
    throwsDecodeError(bytes, [](Reader& r) { LookupReply::decode(r, 1 << 16); });
    throwsDecodeError(bytes, [](Reader& r) { Hello::decode(r); });
    throwsDecodeError(bytes, [](Reader& r) { Pull::decode(r); });
    throwsDecodeError(bytes, [](Reader& r) { HolderUpdate::decode(r); });
  }
}

int main() {
  testHeaders();
  testMessages();
  testBadFields();
  testRandomBytes();
  return finish("wire decoder");
}
