// Control messages: one struct per message type, each with encode() and a
// bounds-checked decode() that throws DecodeError on malformed input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/object_meta.h"
#include "wire/codec.h"
#include "wire/frame.h"

namespace hoplite {
namespace wire {

void encodeId(Writer& w, const std::string& id);
std::string decodeId(Reader& r);  // throws DecodeError for empty or oversized ids
bool decodeBool(Reader& r);       // throws DecodeError for anything but 0 and 1

// The handshake: Hello (client) → Challenge (server) → Auth (client) →
// HelloAck (server). Each side proves it knows the cluster secret with an HMAC
// over both nonces and both ranks, so the secret never crosses the wire and a
// proof cannot be replayed on another connection.
constexpr size_t kNonceSize = 16;
constexpr size_t kProofSize = 32;

// Client → server, first frame on every connection.
struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  uint32_t protocol = kVersion;
  int32_t rank = -1;
  std::string cluster;  // id of the cluster this node joined; mismatches are refused
  std::string nonce;    // kNonceSize random bytes
  // Where the client listens: a rank restarted elsewhere is reached there from
  // now on (applied only once the client proved it knows the secret; both
  // proofs cover it).
  std::string host;
  uint32_t port = 0;
  uint64_t incarnation = 0;  // random per process: a new one from the same address is a restart
  void encode(Writer& w) const;
  static Hello decode(Reader& r);
};

// Server → client: its nonce and its proof.
struct Challenge {
  static constexpr MsgType kType = MsgType::kChallenge;
  std::string nonce;
  std::string proof;
  void encode(Writer& w) const;
  static Challenge decode(Reader& r);
};

// Client → server: the client's proof.
struct Auth {
  static constexpr MsgType kType = MsgType::kAuth;
  std::string proof;
  void encode(Writer& w) const;
  static Auth decode(Reader& r);
};

// Server → client, once the client's proof checked out. Also what the client
// needs to read the server's memory when both run on one host
// (net/same_host/): the server's host identity (empty: it offers no such
// reads), its pid, and the address of `probe`, bytes the client reads there
// to check that it can. Only an authenticated peer learns them.
// A rank's share of the directory as a member knows it: moved away from, or
// returned to, the rank's process `incarnation` (0: never heard from it).
// `epoch` counts the times that process took its share back after it was
// stalled or cut off: news of a move made before the latest return is stale.
struct ShareState {
  int32_t rank = -1;
  uint64_t incarnation = 0;
  uint64_t epoch = 0;
};

// A live peer's process, as another member knows it.
struct MemberAddress {
  int32_t rank = -1;
  uint64_t incarnation = 0;
  std::string host;
  uint32_t port = 0;
};

struct HelloAck {
  static constexpr MsgType kType = MsgType::kHelloAck;
  int32_t rank = -1;
  std::vector<ShareState> deadShards;  // ranks whose directory shard moved on, as the server knows them
  uint64_t incarnation = 0;            // of the server's process
  std::string host;
  uint32_t pid = 0;
  uint64_t probeAddress = 0;
  std::string probe;
  // The peers the server has not given up on: a client that missed a rank's
  // rejoin (it was stalled then) learns the new process's address.
  std::vector<MemberAddress> members;
  std::vector<ShareState> returnedShards;  // the latest return of each rank's share the server heard of
  void encode(Writer& w) const;
  static HelloAck decode(Reader& r);
};

// One-way, spread by whoever learns it: the share's process failed (or
// left), and its share of the directory moved on to the next live rank until
// a new process of that rank joins, or this one takes it back (ShardReturned).
struct ShardMoved {
  static constexpr MsgType kType = MsgType::kShardMoved;
  ShareState share;
  void encode(Writer& w) const;
  static ShardMoved decode(Reader& r);
};

// One-way, from the share's process and spread by whoever learns it: that
// process, taken for failed while it was stalled or cut off, takes its share
// of the directory back (share.epoch is new).
struct ShardReturned {
  static constexpr MsgType kType = MsgType::kShardReturned;
  ShareState share;
  void encode(Writer& w) const;
  static ShardReturned decode(Reader& r);
};

// A node that had taken the receiver for failed, and so dropped the copies
// the receiver listed at the shards it hosts, has taken it back: the receiver
// lists them there again. `incarnation`: the receiver's process as the sender
// knows it (one meant for an earlier process is ignored).
struct RelistCopies {
  static constexpr MsgType kType = MsgType::kRelistCopies;
  uint64_t incarnation = 0;
  void encode(Writer& w) const;
  static RelistCopies decode(Reader& r);
};

// What a shard remembers of an id that is gone: deleted, or lost with its
// last holder (`lastHolder`, -1 if unknown), which failed or left.
struct GoneId {
  std::string id;
  bool deleted = false;
  int32_t lastHolder = -1;
  bool lastHolderLeft = false;  // it shut down (else it failed)
  uint64_t deletedBy = 0;       // the delete that removed it (ShardServer::deleteToken), 0 if unknown
};

// Old host → new host of some ids' directory entries (the old host leaves,
// or their home rank rejoined): the ids among them that are gone, so that
// gets of them keep failing at once instead of waiting for a put.
// `standby`: host → the rank that takes its share over should it die, as
// ids are deleted (`deleted`), put (not `deleted`, `lastHolder` holds the
// put's copy) or retracted (neither: forget it).
struct ShardHandOver {
  static constexpr MsgType kType = MsgType::kShardHandOver;
  bool standby = false;
  std::vector<GoneId> gone;
  void encode(Writer& w) const;
  static ShardHandOver decode(Reader& r);
};

// A process that shuts down → each peer: process `incarnation` leaves. Its
// share of the directory moves on as after a failure, its copies leave the
// lists, and what waits for it fails saying it left. Answered by a StatusReply.
struct Leave {
  static constexpr MsgType kType = MsgType::kLeave;
  uint64_t request = 0;
  uint64_t incarnation = 0;
  void encode(Writer& w) const;
  static Leave decode(Reader& r);
};

// Register an object at its directory shard. Small objects carry their bytes inline.
struct Register {
  static constexpr MsgType kType = MsgType::kRegister;
  uint64_t request = 0;
  std::string id;
  ObjectMeta meta;
  int32_t holder = -1;
  bool complete = false;
  // A reduce's result: if its holder dies, its coordinator computes it again,
  // so readers wait for it instead of failing.
  bool recomputable = false;
  // Sent again to the shard that took over from a failed one: adds the holder
  // to an existing entry instead of failing (`primary`: it holds the put's copy).
  bool reannounce = false;
  bool primary = true;
  // With `reannounce`: the put of this copy is still waiting for its answer
  // (its own request lists it too): a new object, not a copy listed again.
  bool putPending = false;
  // Names a reduce result's registration (0: none): a cleanup of one
  // computation of it removes no later one's entry (IdRequest::ifToken).
  uint64_t token = 0;
  bool hasInline = false;
  std::string inlineData;
  void encode(Writer& w) const;
  static Register decode(Reader& r, uint64_t maxInline);
};

// Generic reply: the outcome of a request.
struct StatusReply {
  static constexpr MsgType kType = MsgType::kStatusReply;
  uint64_t request = 0;
  Status status;
  void encode(Writer& w) const;
  static StatusReply decode(Reader& r);
};

enum class HolderState : uint8_t { kPartial = 0, kComplete = 1, kRemoved = 2 };

// One-way: a node's copy of an object changed state, and/or it no longer pulls
// from the sender the directory assigned it (`released`, -1 for none), which
// becomes free to serve another receiver.
struct HolderUpdate {
  static constexpr MsgType kType = MsgType::kHolderUpdate;
  std::string id;
  int32_t holder = -1;
  HolderState state = HolderState::kComplete;
  int32_t released = -1;
  void encode(Writer& w) const;
  static HolderUpdate decode(Reader& r);
};

// One-way, a reduce's coordinator to its result's shard: the reduce failed
// in a way a retry of the same call fails too (its inputs differ, say).
// Lookups of `id` fail with `status` until `id` is registered again.
struct ResultFailed {
  static constexpr MsgType kType = MsgType::kResultFailed;
  std::string id;
  Status status;
  void encode(Writer& w) const;
  static ResultFailed decode(Reader& r);
};

// Ask the shard for an object; answered once it exists, or at the deadline. The
// answer assigns the asker one sender and lists the asker as a partial holder,
// so that receivers arriving later may relay through it. A `locate` lookup only
// asks where the object is: the answer names a holder and changes nothing.
// `failedHolder` (>= 0): the asker's sender died mid-transfer; the shard drops
// it and assigns another, never one whose supply runs through the asker.
struct Lookup {
  static constexpr MsgType kType = MsgType::kLookup;
  uint64_t request = 0;
  std::string id;
  uint64_t timeoutMs = 0;
  bool locate = false;
  int32_t failedHolder = -1;
  int32_t preferred = -1;  // the sender the asker would like (see DirectoryShard::lookup)
  void encode(Writer& w) const;
  static Lookup decode(Reader& r);
};

struct LookupReply {
  static constexpr MsgType kType = MsgType::kLookupReply;
  uint64_t request = 0;
  Status status;
  ObjectMeta meta;  // the rest is meaningful only when status is ok
  bool hasInline = false;
  std::string inlineData;
  int32_t sender = -1;  // who to pull from (-1 with inline data, or when no copy is left)
  // Whom `sender` itself still receives the object from (-1: its copy is
  // complete, or not fed by a pull): a timeout can then name a slow relay's source.
  int32_t senderSource = -1;
  bool recomputable = false;  // see Register
  void encode(Writer& w) const;
  static LookupReply decode(Reader& r, uint64_t maxInline);
};

// A request that names one object. `retract`: the object is being recomputed
// (a reduce recovering from a failure), not deleted: its id is not remembered
// as deleted, and whoever reads it looks it up again. `ifToken` (deletes):
// only an entry registered under that token, or under none, is removed.
template <MsgType T>
struct IdRequest {
  static constexpr MsgType kType = T;
  uint64_t request = 0;
  std::string id;
  bool retract = false;
  uint64_t ifToken = 0;
  void encode(Writer& w) const {
    w.u64(request);
    encodeId(w, id);
    w.u8(retract);
    w.u64(ifToken);
  }
  static IdRequest decode(Reader& r) {
    IdRequest m;
    m.request = r.u64();
    m.id = decodeId(r);
    m.retract = decodeBool(r);
    m.ifToken = r.u64();
    r.expectEnd("request");
    return m;
  }
};

// Delete everywhere (to the shard), or drop one node's copy (shard → holder).
using Delete = IdRequest<MsgType::kDelete>;
using DropCopy = IdRequest<MsgType::kDropCopy>;

// Subscriber → shard: report where the object is, now and after every change,
// until a Subscribe with `cancel`. `request` names the subscription at the
// subscriber (answered by Locations frames carrying it, never by a StatusReply).
struct Subscribe {
  static constexpr MsgType kType = MsgType::kSubscribe;
  uint64_t request = 0;
  std::string id;
  bool cancel = false;
  void encode(Writer& w) const;
  static Subscribe decode(Reader& r);
};

enum class LocationState : uint8_t { kAbsent = 0, kPresent = 1, kDeleted = 2, kLost = 3 };
constexpr uint8_t kMaxLocationState = 3;

// Shard → subscriber: where the object is now. Sent when a subscription starts
// and after each change; changes close together may arrive as one.
// kAbsent: not put yet (or being recomputed by its reduce); kLost: its last
// holder died (`lastHolder`, -1 if unknown).
struct Locations {
  static constexpr MsgType kType = MsgType::kLocations;
  uint64_t request = 0;
  std::string id;
  LocationState state = LocationState::kAbsent;
  std::vector<int32_t> complete;  // holders of every byte
  std::vector<int32_t> partial;   // holders still receiving (they relay what they have)
  bool inlined = false;           // the shard keeps the bytes too (a small object)
  int32_t lastHolder = -1;
  void encode(Writer& w) const;
  static Locations decode(Reader& r);
};

// Receiver → holder: stream the object from `offset`. Answered by data frames
// until the end of the object, or by a StatusReply carrying the error. With
// `sameHost` (the receiver can read the holder's memory) the holder sends
// DataAt frames instead of the bytes.
struct Pull {
  static constexpr MsgType kType = MsgType::kPull;
  uint64_t request = 0;
  std::string id;
  uint64_t offset = 0;
  bool sameHost = false;
  void encode(Writer& w) const;
  static Pull decode(Reader& r);
};

// Holder → receiver of a same-host pull: bytes [offset, offset + length) of
// the object are ready at `address` in the holder's memory. The holder keeps
// that memory as it is until the receiver cancels the pull (which it does
// when done reading, also after a failure) or the connection closes.
struct DataAt {
  static constexpr MsgType kType = MsgType::kDataAt;
  uint64_t request = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t address = 0;
  void encode(Writer& w) const;
  static DataAt decode(Reader& r);
};

// Receiver → holder: stop a pull early, or, for a same-host pull, release the
// memory it lent.
struct Cancel {
  static constexpr MsgType kType = MsgType::kCancel;
  uint64_t request = 0;
  void encode(Writer& w) const;
  static Cancel decode(Reader& r);
};

// Coordinator → the holder of one reduce input: compute one tree position.
// The task registers `outputId` (answering `request` with a StatusReply once it
// has), then streams input op children into it; children are the outputs of
// other positions, fetched as they appear. When it ends it answers
// `endRequest`; a task that finished deletes its children's outputs.
struct ReduceTask {
  static constexpr MsgType kType = MsgType::kReduceTask;
  uint64_t request = 0;
  std::string reduceId;  // the result's id: names the whole reduce
  std::string inputId;
  std::string outputId;
  std::vector<std::string> childIds;
  ObjectMeta meta;  // every input's, checked again by the task
  uint8_t op = 0;   // ReduceOp
  uint32_t count = 0;  // inputs in the whole reduce (AVG divides by it at the root)
  bool root = false;
  uint64_t timeoutMs = 0;  // how long to wait for children to appear
  uint64_t endRequest = 0;
  // If the task has not started (its input fetched, its output registered)
  // `stallNoteMs` after it arrived, it answers `stallRequest` with a status
  // saying what it waits for, so that the coordinator's timeout can name it.
  // 0: never.
  uint64_t stallRequest = 0;
  uint64_t stallNoteMs = 0;
  void encode(Writer& w) const;
  static ReduceTask decode(Reader& r);
};

// Coordinator → a task's holder: stop the task computing `id` (`retract`: the
// reduce goes on without it and recomputes that output elsewhere). `refused`
// (not ok): the reduce's inputs cannot be reduced, and why; the task fails
// with it, so that readers of its output hear the reason.
struct ReduceAbort {
  static constexpr MsgType kType = MsgType::kReduceAbort;
  uint64_t request = 0;
  std::string id;
  bool retract = false;
  Status refused;
  void encode(Writer& w) const;
  static ReduceAbort decode(Reader& r);
};

// Measures the link: answered by an empty StatusReply; `padding` makes it a
// bandwidth probe.
struct Probe {
  static constexpr MsgType kType = MsgType::kProbe;
  uint64_t request = 0;
  std::string padding;
  void encode(Writer& w) const;
  static Probe decode(Reader& r, uint64_t maxPadding);
};

// Announces a tagged message (messenger/); its bytes follow as data frames
// for `request`, a number the sender chose with kMessageRequestBit set so it
// never collides with the receiver's own pulls: at once when `eager`, else
// once the receiver answers kSend.
constexpr uint64_t kMessageRequestBit = 1ull << 63;
constexpr size_t kMaxMessageKind = 64;
constexpr size_t kMaxMessageReason = 1024;
struct Message {
  static constexpr MsgType kType = MsgType::kMessage;
  uint64_t request = 0;
  uint64_t context = 0;  // the sender's tag space (a process group, say)
  uint64_t tag = 0;
  uint64_t size = 0;
  // The exchange the sender takes part in; a receive of another kind refuses
  // the message.
  std::string kind;
  bool eager = true;
  void encode(Writer& w) const;
  static Message decode(Reader& r);
};

// The receiver's answer to a deferred Message, on the connection it came in
// on: a receive took it and its bytes may come, or a receive refused it
// (another size or kind; `reason` says which). Eager messages get no answer:
// their bytes come back as MessageCredit.
enum class MessageAnswer : uint8_t { kSend = 1, kRefused = 2 };
struct MessageReply {
  static constexpr MsgType kType = MsgType::kMessageReply;
  uint64_t request = 0;
  MessageAnswer answer = MessageAnswer::kSend;
  std::string reason;
  void encode(Writer& w) const;
  static MessageReply decode(Reader& r);
};

// Eager bytes that left the receiver's mailbox window since its last credit on
// this connection (taken by receives, or refused and dropped): the sender may
// send that many more eagerly. Batched, so a stream of pieces is not answered
// message by message.
struct MessageCredit {
  static constexpr MsgType kType = MsgType::kMessageCredit;
  uint64_t bytes = 0;
  void encode(Writer& w) const;
  static MessageCredit decode(Reader& r);
};

// A deferred message's sender gave up on it (its send timed out) before the
// receiver asked for its bytes: the receiver forgets it, and fails the receive
// that asked meanwhile.
struct MessageWithdrawn {
  static constexpr MsgType kType = MsgType::kMessageWithdrawn;
  uint64_t request = 0;
  std::string reason;
  void encode(Writer& w) const;
  static MessageWithdrawn decode(Reader& r);
};

template <typename M>
std::string encode(const M& m) {
  Writer w;
  m.encode(w);
  return w.take();
}

}  // namespace wire
}  // namespace hoplite
