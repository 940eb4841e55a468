#include "wire/messages.h"

namespace hoplite {
namespace wire {
namespace {

constexpr size_t kMaxMessageText = 4096;

void encodeMeta(Writer& w, const ObjectMeta& m) {
  w.str(m.dtype);
  w.u32(m.itemsize);
  w.u32(static_cast<uint32_t>(m.shape.size()));
  for (int64_t d : m.shape) w.i64(d);
  w.u64(m.nbytes);
  w.str(m.device);
}

ObjectMeta decodeMeta(Reader& r) {
  ObjectMeta m;
  m.dtype = r.str(kMaxNameBytes, "dtype name");
  m.itemsize = r.u32();
  uint32_t ndim = r.u32();
  if (ndim > kMaxDims) throw DecodeError("too many dimensions");
  m.shape.resize(ndim);
  for (auto& d : m.shape) d = r.i64();
  m.nbytes = r.u64();
  m.device = r.str(kMaxNameBytes, "device name");
  Status s = validateMeta(m);
  if (!s.ok()) throw DecodeError("object metadata: " + s.message);
  return m;
}

void encodeStatus(Writer& w, const Status& s) {
  w.u8(static_cast<uint8_t>(s.code));
  w.str(s.message);
}

void encodeRanks(Writer& w, const std::vector<int32_t>& ranks) {
  w.u32(static_cast<uint32_t>(ranks.size()));
  for (int32_t rank : ranks) w.i32(rank);
}

std::vector<int32_t> decodeRanks(Reader& r, const char* what) {
  uint32_t n = r.u32();
  if (n > r.remaining() / 4) throw DecodeError(std::string(what) + " lists more ranks than it holds");
  std::vector<int32_t> ranks(n);
  for (auto& rank : ranks) rank = r.i32();
  return ranks;
}

Status decodeStatus(Reader& r) {
  uint8_t code = r.u8();
  if (code > kMaxCode) throw DecodeError("unknown status code");
  return Status(static_cast<Code>(code), r.str(kMaxMessageText, "status message"));
}

}  // namespace

bool decodeBool(Reader& r) {
  uint8_t v = r.u8();
  if (v > 1) throw DecodeError("bad boolean");
  return v == 1;
}

void encodeId(Writer& w, const std::string& id) { w.str(id); }

std::string decodeId(Reader& r) {
  std::string id = r.str(kMaxIdBytes, "object id");
  if (id.empty()) throw DecodeError("empty object id");
  return id;
}

namespace {
std::string fixedBytes(Reader& r, size_t size, const char* what) {
  std::string s = r.str(size, what);
  if (s.size() != size) throw DecodeError(std::string(what) + " has the wrong length");
  return s;
}
}  // namespace

void Hello::encode(Writer& w) const {
  w.u32(protocol);
  w.i32(rank);
  w.str(cluster);
  w.str(nonce);
  w.str(host);
  w.u32(port);
  w.u64(incarnation);
}
Hello Hello::decode(Reader& r) {
  Hello m;
  m.protocol = r.u32();
  m.rank = r.i32();
  m.cluster = r.str(256, "cluster id");
  m.nonce = fixedBytes(r, kNonceSize, "hello nonce");
  m.host = r.str(256, "hello host");
  m.port = r.u32();
  if (m.port > 65535) throw DecodeError("hello port out of range");
  m.incarnation = r.u64();
  r.expectEnd("hello");
  return m;
}

void Challenge::encode(Writer& w) const {
  w.str(nonce);
  w.str(proof);
}
Challenge Challenge::decode(Reader& r) {
  Challenge m;
  m.nonce = fixedBytes(r, kNonceSize, "challenge nonce");
  m.proof = fixedBytes(r, kProofSize, "challenge proof");
  r.expectEnd("challenge");
  return m;
}

void Auth::encode(Writer& w) const { w.str(proof); }
Auth Auth::decode(Reader& r) {
  Auth m;
  m.proof = fixedBytes(r, kProofSize, "auth proof");
  r.expectEnd("auth");
  return m;
}

namespace {
void encodeShare(Writer& w, const ShareState& s) {
  w.i32(s.rank);
  w.u64(s.incarnation);
  w.u64(s.epoch);
}
ShareState decodeShare(Reader& r) {
  ShareState s;
  s.rank = r.i32();
  s.incarnation = r.u64();
  s.epoch = r.u64();
  return s;
}
constexpr size_t kShareStateBytes = 20;
void encodeShares(Writer& w, const std::vector<ShareState>& shares) {
  w.u32(static_cast<uint32_t>(shares.size()));
  for (const ShareState& s : shares) encodeShare(w, s);
}
std::vector<ShareState> decodeShares(Reader& r, const char* what) {
  const uint32_t n = r.u32();
  if (n > r.remaining() / kShareStateBytes) throw DecodeError(std::string("hello ack lists more ") + what + " than it holds");
  std::vector<ShareState> shares(n);
  for (ShareState& s : shares) s = decodeShare(r);
  return shares;
}
}  // namespace

void HelloAck::encode(Writer& w) const {
  w.i32(rank);
  encodeShares(w, deadShards);
  encodeShares(w, returnedShards);
  w.u64(incarnation);
  w.str(host);
  w.u32(pid);
  w.u64(probeAddress);
  w.str(probe);
  w.u32(static_cast<uint32_t>(members.size()));
  for (const MemberAddress& m : members) {
    w.i32(m.rank);
    w.u64(m.incarnation);
    w.str(m.host);
    w.u32(m.port);
  }
}
HelloAck HelloAck::decode(Reader& r) {
  HelloAck m;
  m.rank = r.i32();
  m.deadShards = decodeShares(r, "dead shards");
  m.returnedShards = decodeShares(r, "returned shards");
  m.incarnation = r.u64();
  m.host = r.str(256, "host identity");
  m.pid = r.u32();
  m.probeAddress = r.u64();
  m.probe = r.str(kNonceSize, "memory probe");
  uint32_t members = r.u32();
  if (members > r.remaining() / 20) throw DecodeError("hello ack lists more members than it holds");
  m.members.resize(members);
  for (MemberAddress& a : m.members) {
    a.rank = r.i32();
    a.incarnation = r.u64();
    a.host = r.str(256, "member host");
    a.port = r.u32();
  }
  r.expectEnd("hello ack");
  return m;
}

void ShardMoved::encode(Writer& w) const { encodeShare(w, share); }
ShardMoved ShardMoved::decode(Reader& r) {
  ShardMoved m{decodeShare(r)};
  r.expectEnd("shard moved");
  return m;
}

void ShardReturned::encode(Writer& w) const { encodeShare(w, share); }
ShardReturned ShardReturned::decode(Reader& r) {
  ShardReturned m{decodeShare(r)};
  r.expectEnd("shard returned");
  return m;
}

void RelistCopies::encode(Writer& w) const { w.u64(incarnation); }
RelistCopies RelistCopies::decode(Reader& r) {
  RelistCopies m;
  m.incarnation = r.u64();
  r.expectEnd("relist copies");
  return m;
}

void ShardHandOver::encode(Writer& w) const {
  w.u8(standby);
  w.u32(static_cast<uint32_t>(gone.size()));
  for (const GoneId& g : gone) {
    encodeId(w, g.id);
    w.u8(g.deleted);
    w.i32(g.lastHolder);
    w.u8(g.lastHolderLeft);
    w.u64(g.deletedBy);
  }
}
ShardHandOver ShardHandOver::decode(Reader& r) {
  ShardHandOver m;
  m.standby = decodeBool(r);
  const uint32_t count = r.u32();
  if (count > r.remaining() / 19) throw DecodeError("shard hand-over lists more ids than it holds");
  m.gone.resize(count);
  for (GoneId& g : m.gone) {
    g.id = decodeId(r);
    g.deleted = decodeBool(r);
    g.lastHolder = r.i32();
    g.lastHolderLeft = decodeBool(r);
    g.deletedBy = r.u64();
  }
  r.expectEnd("shard hand-over");
  return m;
}

void Leave::encode(Writer& w) const {
  w.u64(request);
  w.u64(incarnation);
}
Leave Leave::decode(Reader& r) {
  Leave m;
  m.request = r.u64();
  m.incarnation = r.u64();
  r.expectEnd("leave");
  return m;
}

void Register::encode(Writer& w) const {
  w.u64(request);
  encodeId(w, id);
  encodeMeta(w, meta);
  w.i32(holder);
  w.u8(complete);
  w.u8(recomputable);
  w.u8(reannounce);
  w.u8(primary);
  w.u8(putPending);
  w.u64(token);
  w.u8(hasInline);
  if (hasInline) w.str(inlineData);
}
Register Register::decode(Reader& r, uint64_t maxInline) {
  Register m;
  m.request = r.u64();
  m.id = decodeId(r);
  m.meta = decodeMeta(r);
  m.holder = r.i32();
  m.complete = decodeBool(r);
  m.recomputable = decodeBool(r);
  m.reannounce = decodeBool(r);
  m.primary = decodeBool(r);
  m.putPending = decodeBool(r);
  m.token = r.u64();
  m.hasInline = decodeBool(r);
  if (m.hasInline) {
    m.inlineData = r.str(maxInline, "inline object");
    if (m.inlineData.size() != m.meta.nbytes) throw DecodeError("inline object size does not match metadata");
  }
  r.expectEnd("register");
  return m;
}

void StatusReply::encode(Writer& w) const {
  w.u64(request);
  encodeStatus(w, status);
}
StatusReply StatusReply::decode(Reader& r) {
  StatusReply m;
  m.request = r.u64();
  m.status = decodeStatus(r);
  r.expectEnd("status reply");
  return m;
}

void HolderUpdate::encode(Writer& w) const {
  encodeId(w, id);
  w.i32(holder);
  w.u8(static_cast<uint8_t>(state));
  w.i32(released);
}
HolderUpdate HolderUpdate::decode(Reader& r) {
  HolderUpdate m;
  m.id = decodeId(r);
  m.holder = r.i32();
  uint8_t st = r.u8();
  if (st > static_cast<uint8_t>(HolderState::kRemoved)) throw DecodeError("bad holder state");
  m.state = static_cast<HolderState>(st);
  m.released = r.i32();
  r.expectEnd("holder update");
  return m;
}

void ReduceAbort::encode(Writer& w) const {
  w.u64(request);
  encodeId(w, id);
  w.u8(retract);
  encodeStatus(w, refused);
}
ReduceAbort ReduceAbort::decode(Reader& r) {
  ReduceAbort m;
  m.request = r.u64();
  m.id = decodeId(r);
  m.retract = decodeBool(r);
  m.refused = decodeStatus(r);
  r.expectEnd("reduce abort");
  return m;
}

void ResultFailed::encode(Writer& w) const {
  encodeId(w, id);
  encodeStatus(w, status);
}
ResultFailed ResultFailed::decode(Reader& r) {
  ResultFailed m;
  m.id = decodeId(r);
  m.status = decodeStatus(r);
  if (m.status.ok()) throw DecodeError("result failure without an error");
  r.expectEnd("result failure");
  return m;
}

void Lookup::encode(Writer& w) const {
  w.u64(request);
  encodeId(w, id);
  w.u64(timeoutMs);
  w.u8(locate);
  w.i32(failedHolder);
  w.i32(preferred);
}
Lookup Lookup::decode(Reader& r) {
  Lookup m;
  m.request = r.u64();
  m.id = decodeId(r);
  m.timeoutMs = r.u64();
  m.locate = decodeBool(r);
  m.failedHolder = r.i32();
  m.preferred = r.i32();
  r.expectEnd("lookup");
  return m;
}

void LookupReply::encode(Writer& w) const {
  w.u64(request);
  encodeStatus(w, status);
  if (!status.ok()) return;
  encodeMeta(w, meta);
  w.u8(hasInline);
  if (hasInline) w.str(inlineData);
  w.i32(sender);
  w.i32(senderSource);
  w.u8(recomputable);
}
LookupReply LookupReply::decode(Reader& r, uint64_t maxInline) {
  LookupReply m;
  m.request = r.u64();
  m.status = decodeStatus(r);
  if (m.status.ok()) {
    m.meta = decodeMeta(r);
    m.hasInline = decodeBool(r);
    if (m.hasInline) {
      m.inlineData = r.str(maxInline, "inline object");
      if (m.inlineData.size() != m.meta.nbytes) throw DecodeError("inline object size does not match metadata");
    }
    m.sender = r.i32();
    m.senderSource = r.i32();
    m.recomputable = decodeBool(r);
  }
  r.expectEnd("lookup reply");
  return m;
}

void Subscribe::encode(Writer& w) const {
  w.u64(request);
  encodeId(w, id);
  w.u8(cancel);
}
Subscribe Subscribe::decode(Reader& r) {
  Subscribe m;
  m.request = r.u64();
  m.id = decodeId(r);
  m.cancel = decodeBool(r);
  r.expectEnd("subscribe");
  return m;
}

void Locations::encode(Writer& w) const {
  w.u64(request);
  encodeId(w, id);
  w.u8(static_cast<uint8_t>(state));
  encodeRanks(w, complete);
  encodeRanks(w, partial);
  w.u8(inlined);
  w.i32(lastHolder);
}
Locations Locations::decode(Reader& r) {
  Locations m;
  m.request = r.u64();
  m.id = decodeId(r);
  uint8_t state = r.u8();
  if (state > kMaxLocationState) throw DecodeError("unknown location state");
  m.state = static_cast<LocationState>(state);
  m.complete = decodeRanks(r, "locations");
  m.partial = decodeRanks(r, "locations");
  m.inlined = decodeBool(r);
  m.lastHolder = r.i32();
  r.expectEnd("locations");
  return m;
}

void Pull::encode(Writer& w) const {
  w.u64(request);
  encodeId(w, id);
  w.u64(offset);
  w.u8(sameHost ? 1 : 0);
}
Pull Pull::decode(Reader& r) {
  Pull m;
  m.request = r.u64();
  m.id = decodeId(r);
  m.offset = r.u64();
  m.sameHost = decodeBool(r);
  r.expectEnd("pull");
  return m;
}

void DataAt::encode(Writer& w) const {
  w.u64(request);
  w.u64(offset);
  w.u64(length);
  w.u64(address);
}
DataAt DataAt::decode(Reader& r) {
  DataAt m;
  m.request = r.u64();
  m.offset = r.u64();
  m.length = r.u64();
  m.address = r.u64();
  if (m.length == 0 || m.offset + m.length < m.offset) throw DecodeError("bad data range");
  r.expectEnd("data at");
  return m;
}

void Cancel::encode(Writer& w) const { w.u64(request); }
Cancel Cancel::decode(Reader& r) {
  Cancel m;
  m.request = r.u64();
  r.expectEnd("cancel");
  return m;
}

namespace {
constexpr uint32_t kMaxReduceChildren = 1u << 16;
}

void ReduceTask::encode(Writer& w) const {
  w.u64(request);
  encodeId(w, reduceId);
  encodeId(w, inputId);
  encodeId(w, outputId);
  w.u32(static_cast<uint32_t>(childIds.size()));
  for (const auto& c : childIds) encodeId(w, c);
  encodeMeta(w, meta);
  w.u8(op);
  w.u32(count);
  w.u8(root);
  w.u64(timeoutMs);
  w.u64(endRequest);
  w.u64(stallRequest);
  w.u64(stallNoteMs);
}
ReduceTask ReduceTask::decode(Reader& r) {
  ReduceTask m;
  m.request = r.u64();
  m.reduceId = decodeId(r);
  m.inputId = decodeId(r);
  m.outputId = decodeId(r);
  uint32_t n = r.u32();
  if (n > kMaxReduceChildren || n > r.remaining() / 5) throw DecodeError("too many reduce children");
  m.childIds.resize(n);
  for (auto& c : m.childIds) c = decodeId(r);
  m.meta = decodeMeta(r);
  m.op = r.u8();
  m.count = r.u32();
  m.root = decodeBool(r);
  m.timeoutMs = r.u64();
  m.endRequest = r.u64();
  m.stallRequest = r.u64();
  m.stallNoteMs = r.u64();
  r.expectEnd("reduce task");
  return m;
}

void Probe::encode(Writer& w) const {
  w.u64(request);
  w.str(padding);
}
Probe Probe::decode(Reader& r, uint64_t maxPadding) {
  Probe m;
  m.request = r.u64();
  m.padding = r.str(maxPadding, "probe padding");
  r.expectEnd("probe");
  return m;
}

void Message::encode(Writer& w) const {
  w.u64(request);
  w.u64(context);
  w.u64(tag);
  w.u64(size);
  w.str(kind);
  w.u8(eager ? 1 : 0);
}
Message Message::decode(Reader& r) {
  Message m;
  m.request = r.u64();
  if (!(m.request & kMessageRequestBit)) throw DecodeError("message request without its marker bit");
  m.context = r.u64();
  m.tag = r.u64();
  m.size = r.u64();
  m.kind = r.str(kMaxMessageKind, "message kind");
  const uint8_t eager = r.u8();
  if (eager > 1) throw DecodeError("bad message eager flag");
  m.eager = eager == 1;
  r.expectEnd("message");
  return m;
}

void MessageReply::encode(Writer& w) const {
  w.u64(request);
  w.u8(static_cast<uint8_t>(answer));
  w.str(reason);
}
MessageReply MessageReply::decode(Reader& r) {
  MessageReply m;
  m.request = r.u64();
  if (!(m.request & kMessageRequestBit)) throw DecodeError("message reply without the request's marker bit");
  const uint8_t answer = r.u8();
  if (answer < static_cast<uint8_t>(MessageAnswer::kSend) || answer > static_cast<uint8_t>(MessageAnswer::kRefused)) {
    throw DecodeError("bad message answer");
  }
  m.answer = static_cast<MessageAnswer>(answer);
  m.reason = r.str(kMaxMessageReason, "message refusal reason");
  r.expectEnd("message reply");
  return m;
}

void MessageCredit::encode(Writer& w) const { w.u64(bytes); }
MessageCredit MessageCredit::decode(Reader& r) {
  MessageCredit m;
  m.bytes = r.u64();
  if (m.bytes == 0) throw DecodeError("message credit of 0 bytes");
  r.expectEnd("message credit");
  return m;
}

void MessageWithdrawn::encode(Writer& w) const {
  w.u64(request);
  w.str(reason);
}
MessageWithdrawn MessageWithdrawn::decode(Reader& r) {
  MessageWithdrawn m;
  m.request = r.u64();
  if (!(m.request & kMessageRequestBit)) throw DecodeError("message withdrawal without the request's marker bit");
  m.reason = r.str(kMaxMessageReason, "message withdrawal reason");
  r.expectEnd("message withdrawal");
  return m;
}

}  // namespace wire
}  // namespace hoplite
