// Tagged messages (see mailbox.h).
#include "messenger/mailbox.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <vector>

#include "common/chunking.h"
#include "common/logging.h"
#include "common/object_meta.h"
#include "common/timeouts.h"

namespace hoplite {

struct Mailbox::Inbound {
  int source = -1;
  MessageKey key;
  uint64_t size = 0;
  std::string kind;
  uint64_t request = 0;             // the sender's, for answers
  std::weak_ptr<Connection> conn;   // where it came in, and answers go back
  bool eager = true;                // its bytes follow the announce unasked
  uint64_t expected = 0;  // next offset a data frame must carry
  bool discard = false;  // its receive was cancelled or of another size: bytes are dropped
  // Where bytes go: the receive's memory when it was matched before the first
  // data frame, else a mailbox buffer (allocated at that frame) that is copied
  // to the receive at the end.
  std::shared_ptr<Buffer> parked;
  std::optional<PostedReceive> receive;
  bool complete = false;
};

namespace {

// Larger messages are always deferred. The pipelined collectives send pieces of
// at most 4 MiB, so they stay eager while their receivers keep up.
constexpr uint64_t kEagerMessageBytes = 4u << 20;
// All messages to a peer are one flow of its connection (in order, sharing it
// with pulls it serves); pull streams use their request ids, which never reach this.
constexpr uint64_t kMessageFlow = ~uint64_t{0};
// Credits go back once an eighth of the sender's window is owed (a stream of
// pieces costs a credit per several MB, not an answer per piece) or this long
// after the first byte owed, so a quiet sender gets its whole window back.
constexpr uint64_t kCreditFraction = 8;
constexpr double kCreditDelaySeconds = 1e-3;

std::string describeMessage(uint64_t context, uint64_t tag) {
  return "message (context " + std::to_string(context) + ", tag " + std::to_string(tag) + ")";
}

// Why a receive cannot take a message (ok if it can).
Status mismatch(const std::pair<uint64_t, uint64_t>& key, int source, const std::string& sentKind, uint64_t sent,
                const std::string& kind, uint64_t expected) {
  const std::string what = describeMessage(key.first, key.second) + ": rank " + std::to_string(source);
  if (sentKind != kind) {
    return Status(Code::kInvalidArgument, what + " sent it in its " + sentKind + ", this rank receives it in its " +
                                              kind + ": the ranks are in different exchanges");
  }
  if (sent != expected) {
    return Status(Code::kInvalidArgument,
                  what + " sent " + std::to_string(sent) + " bytes, the receive expects " + std::to_string(expected));
  }
  return Status();
}

// Removes and returns the first entry of queues[key] that `matches`; std::nullopt if none.
template <typename Queues, typename Match>
std::optional<typename Queues::mapped_type::value_type> takeFirst(Queues& queues, const typename Queues::key_type& key,
                                                                  Match matches) {
  auto found = queues.find(key);
  if (found == queues.end()) return std::nullopt;
  auto& queue = found->second;
  for (auto it = queue.begin(); it != queue.end(); ++it) {
    if (!matches(*it)) continue;
    auto entry = std::move(*it);
    queue.erase(it);
    if (queue.empty()) queues.erase(found);
    return entry;
  }
  return std::nullopt;
}

// Removes and returns the queues of `context` whose tags are `stale`.
template <typename Queues>
std::vector<std::pair<typename Queues::key_type, typename Queues::mapped_type>> takeStale(
    Queues& queues, uint64_t context, const TaggedMessenger::StaleTags& stale) {
  std::vector<std::pair<typename Queues::key_type, typename Queues::mapped_type>> taken;
  for (auto it = queues.lower_bound({context, 0}); it != queues.end() && it->first.first == context;) {
    if (!stale(it->first.second)) {
      ++it;
      continue;
    }
    taken.emplace_back(it->first, std::move(it->second));
    it = queues.erase(it);
  }
  return taken;
}

// Why a receive of a stale tag fails (TaggedMessenger::discard).
Status staleReceive(const std::pair<uint64_t, uint64_t>& key) {
  return Status(Code::kShutdown, describeMessage(key.first, key.second) +
                                     ": will not come: its exchange was abandoned or its group closed");
}

// The keepalive of a message's frames: released when the last frame is written
// (the send succeeded) or dropped unwritten (its connection closed first).
class SendGuard {
 public:
  SendGuard(EventLoop& loop, std::shared_ptr<const void> keepalive, TaggedMessenger::Callback done, int rank,
            std::string what)
      : loop_(loop), keepalive_(std::move(keepalive)), done_(std::move(done)), rank_(rank), what_(std::move(what)) {}
  void started(const std::shared_ptr<Connection>& conn) { conn_ = conn; }
  // Reports `why` instead of the connection's fate (a deferred message refused or given up).
  void fail(const Status& why) { failure_ = why; }
  ~SendGuard() {
    auto conn = conn_.lock();
    Status status;
    if (failure_) {
      status = *failure_;
    } else if (!conn || !conn->isOpen() || conn->isEnding()) {  // its last frame was dropped unwritten
      status = Status(Code::kPeerFailed, what_ + " to rank " + std::to_string(rank_) + " was not sent: the connection closed");
    }
    // Later turn: the transport may be inside its write loop.
    auto done = std::move(done_);
    int rank = rank_;
    if (!loop_.post([done, status, rank] { done(status, rank); })) {
      done(Status(Code::kShutdown, what_ + " was not sent: the node shut down"), rank);
    }
  }

 private:
  EventLoop& loop_;
  std::shared_ptr<const void> keepalive_;
  TaggedMessenger::Callback done_;
  std::weak_ptr<Connection> conn_;
  int rank_;
  std::string what_;
  std::optional<Status> failure_;
};

void sendFrames(Connection& c, uint64_t request, const uint8_t* data, uint64_t size, uint64_t chunk,
                const std::shared_ptr<SendGuard>& frames) {
  for (uint64_t off = 0; off < size; off += chunk) {
    c.sendData(kMessageFlow, request, off, data + off, std::min(chunk, size - off), frames);
  }
}

}  // namespace

Mailbox::Mailbox(EventLoop& loop, PeerLinks& links, BufferPool& pool, MailboxConfig config)
    : loop_(loop), links_(links), pool_(pool), config_(config) {}

void Mailbox::registerHandlers(MessageRouter& router) {
  router.on<wire::Message>(Route::kOnAccepted, [this](Connection& c, const wire::Message& m) { onMessage(c, m); });
  router.on<wire::MessageWithdrawn>(Route::kOnAccepted,
                                    [this](Connection& c, const wire::MessageWithdrawn& m) { onWithdrawn(c, m); });
  router.on<wire::MessageReply>(Route::kOnDialed, [this](Connection& c, const wire::MessageReply& m) { onReply(c, m); });
  router.on<wire::MessageCredit>(Route::kOnDialed,
                                 [this](Connection& c, const wire::MessageCredit& m) { onCredit(c, m); });
}

uint64_t Mailbox::chunkFor(uint64_t size) const { return chunkSize(size, config_.chunkBytes); }

void Mailbox::shutDown(const Status& why) {
  shutDown_ = true;
  failFrom(-1, 0, why);
}

struct Mailbox::Outbound {
  int rank = -1;
  uint64_t size = 0;
  const uint8_t* data = nullptr;
  std::shared_ptr<SendGuard> frames;  // until its receiver answers
  std::weak_ptr<Connection> conn;     // the connection its announce went on
  std::string what;
};

Mailbox::Deadline Mailbox::withDeadline(Callback done, double timeoutSeconds, const std::string& what,
                                  std::function<bool(const Status&)> giveUp) {
  struct Once {
    Callback done;
    bool called = false;
    EventLoop::TimerId timer = 0;  // set on the loop thread, which alone then calls `wrapped`
  };
  auto once = std::make_shared<Once>();
  once->done = std::move(done);
  Callback wrapped = [this, once](const Status& status, int rank) {
    if (once->called) return;
    once->called = true;
    if (once->timer) loop_.cancelTimer(once->timer);
    auto cb = std::move(once->done);
    cb(status, rank);
  };
  Status late(Code::kTimeout, what + " timed out after " + printableSeconds(timeoutSeconds));
  auto arm = [this, once, wrapped, late, timeoutSeconds, giveUp] {
    if (once->called || !(timeoutSeconds > 0)) return;
    once->timer = loop_.addTimer(std::min(timeoutSeconds, kMaxTimeoutSeconds), [once, wrapped, late, giveUp] {
      once->timer = 0;
      if (giveUp(late)) wrapped(late, -1);
    });
  };
  return {wrapped, arm};
}

// A send from its start until it reports. Giving it up depends on whether it
// was announced: before, it is announced withdrawn (a receive already waiting
// for it fails now rather than at its own deadline); after, only a deferred
// one that no receive asked for yet can be withdrawn.
struct Mailbox::SendProgress {
  int rank = -1;
  bool announced = false;
  std::optional<Status> abandoned;  // why, if given up before its announce
  Callback done;  // runs at most once
};

uint64_t Mailbox::send(int rank, uint64_t context, uint64_t tag, const std::string& kind, const uint8_t* data,
                           uint64_t size, std::shared_ptr<const void> keepalive, Callback done,
                           double timeoutSeconds) {
  const uint64_t request = wire::kMessageRequestBit | next_++;
  const std::string what = describeMessage(context, tag);
  auto deadline = withDeadline(std::move(done), timeoutSeconds, what + " to rank " + std::to_string(rank),
                               [this, request](const Status& why) { return giveUpSend(request, why); });
  // Leaves the sends in flight as it reports.
  Callback reported = deadline.done;
  done = [this, request, reported](const Status& status, int peer) {
    sendsInFlight_.erase(request);
    reported(status, peer);
  };
  auto posted = loop_.post([=, this, keepalive = std::move(keepalive), arm = std::move(deadline.arm)]() mutable {
    auto progress = std::make_shared<SendProgress>(SendProgress{rank, false, std::nullopt, done});
    sendsInFlight_[request] = progress;
    arm();
    if (rank < 0 || rank >= config_.worldSize || rank == config_.rank) {
      done(Status(Code::kInvalidArgument, what + ": no peer rank " + std::to_string(rank) + " to send to"), rank);
      return;
    }
    if (kind.size() > wire::kMaxMessageKind) {
      done(Status(Code::kInvalidArgument, what + ": kind \"" + kind + "\" is longer than " +
                                              std::to_string(wire::kMaxMessageKind) + " bytes"),
           rank);
      return;
    }
    if (shutDown_) {
      done(Status(Code::kShutdown, what + " not sent: the node is shut down"), rank);
      return;
    }
    if (links_.hasFailed(rank)) {
      done(Status(Code::kPeerFailed, what + " not sent: " + links_.peerName(rank) + " has failed"), rank);
      return;
    }
    auto guard = std::make_shared<SendGuard>(loop_, std::move(keepalive), std::move(done), rank, what);
    links_.whenConnected(rank, [this, guard, progress, rank, request, context, tag, kind, data, size, what](Connection& c) mutable {
      if (progress->abandoned) {  // while it waited for the connection; its caller was told
        // An empty message completes at its announce: it is simply not sent.
        if (size == 0) return;
        c.sendControl(wire::MsgType::kMessage, wire::encode(wire::Message{request, context, tag, size, kind, false}));
        c.sendControl(wire::MsgType::kMessageWithdrawn,
                      wire::encode(wire::MessageWithdrawn{
                          request, progress->abandoned->message.substr(0, wire::kMaxMessageReason)}));
        return;
      }
      progress->announced = true;
      // From here on only the frames (or the deferred message) hold the guard:
      // it reports when the last frame is written.
      auto frames = std::move(guard);
      auto conn = links_.sharedConnection(c);
      frames->started(conn);
      const bool eager = size <= kEagerMessageBytes && eagerBytes_[rank] + size <= config_.windowBytes;
      c.sendControl(wire::MsgType::kMessage, wire::encode(wire::Message{request, context, tag, size, kind, eager}));
      // A failed write closes the connection at once, and the peer's failure
      // has then already cleaned up its messages and window: nothing to record.
      if (!c.isOpen()) return;
      counters_.sent++;
      if (eager) {
        eagerBytes_[rank] += size;
        sendFrames(c, request, data, size, chunkFor(size), frames);
        counters_.bytesSent += size;
      } else {
        outbound_[request] =
            std::make_shared<Outbound>(Outbound{rank, size, data, frames, conn, what + " to rank " + std::to_string(rank)});
        counters_.deferred++;
        counters_.deferredBytes += size;
      }
    });
  });
  // Not `done`: the loop thread may still touch sendsInFlight_ while it stops.
  if (!posted) reported(Status(Code::kShutdown, what + " not sent: the node is shut down"), rank);
  return request;
}

void Mailbox::cancelSend(uint64_t handle, const Status& why) {
  loop_.post([this, handle, why] { giveUpSend(handle, why); });
}

bool Mailbox::giveUpSend(uint64_t request, const Status& why) {
  auto it = sendsInFlight_.find(request);
  if (it == sendsInFlight_.end()) return false;  // it has reported
  if (it->second->announced) return dropOutbound(request, why);
  std::shared_ptr<SendProgress> send = it->second;
  send->abandoned = why;
  counters_.withdrawn++;
  send->done(why, send->rank);
  return true;
}

uint64_t Mailbox::receive(int rank, uint64_t context, uint64_t tag, const std::string& kind, uint8_t* dest,
                           uint64_t size,
                           std::shared_ptr<const void> keepalive, Callback done, double timeoutSeconds) {
  const uint64_t handle = next_++;
  const std::string what = describeMessage(context, tag) + " from rank " + (rank < 0 ? "any" : std::to_string(rank));
  auto deadline = withDeadline(std::move(done), timeoutSeconds, what, [this, handle](const Status& why) {
    cancelReceiveNow(handle, why);  // reports `why` through the receive's callback
    return true;
  });
  auto shared = std::make_shared<PostedReceive>(
      PostedReceive{handle, rank, dest, size, kind, std::move(keepalive), std::move(deadline.done)});
  // One task arms the deadline and posts the receive: its timer cannot find it not yet posted.
  if (!loop_.post([this, shared, context, tag, arm = std::move(deadline.arm)] {
        arm();
        matchReceive(std::move(*shared), {context, tag});
      })) {
    shared->done(Status(Code::kShutdown, what + " not received: the node is shut down"), -1);
  }
  return handle;
}

void Mailbox::matchReceive(PostedReceive receive, MessageKey key) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  const std::string what = describeMessage(key.first, key.second);
  auto fail = [&](Code code, const std::string& why) { receive.done(Status(code, what + ": " + why), receive.rank); };
  if (receive.rank >= config_.worldSize || receive.rank == config_.rank || receive.rank < -1) {
    fail(Code::kInvalidArgument, "no peer rank " + std::to_string(receive.rank) + " to receive from");
    return;
  }
  auto arrived = takeFirst(mailbox_, key, [&](const std::shared_ptr<Inbound>& in) {
    return receive.rank == -1 || in->source == receive.rank;
  });
  if (arrived) {
    auto inbound = *arrived;
    if (inbound->eager) counters_.waitingBytes -= inbound->size;
    if (!claim(*inbound, receive)) {
      if (auto conn = inbound->conn.lock(); conn && !inbound->eager) inbound_.erase({conn->id(), inbound->request});
      return;
    }
    if (inbound->complete) completeInbound(inbound);  // else when its last byte arrives
    return;
  }
  if (shutDown_) {
    fail(Code::kShutdown, "the node is shut down");
    return;
  }
  if (isStale(key)) {
    receive.done(staleReceive(key), receive.rank);
    return;
  }
  if (receive.rank >= 0 && links_.hasFailed(receive.rank)) {
    fail(Code::kPeerFailed, links_.peerName(receive.rank) + " has failed");
    return;
  }
  receives_[key].push_back(std::move(receive));
}

void Mailbox::cancelReceive(uint64_t handle, const Status& why) {
  loop_.post([this, handle, why] { cancelReceiveNow(handle, why); });
}

void Mailbox::cancelReceiveNow(uint64_t handle, const Status& why) {
  for (auto it = receives_.begin(); it != receives_.end(); ++it) {
    auto& queue = it->second;
    for (auto r = queue.begin(); r != queue.end(); ++r) {
      if (r->handle != handle) continue;
      PostedReceive receive = std::move(*r);
      queue.erase(r);
      if (queue.empty()) receives_.erase(it);
      receive.done(why, receive.rank);
      return;
    }
  }
  for (auto& [key, inbound] : inbound_) {
    if (!inbound->receive || inbound->receive->handle != handle) continue;
    const StreamKey stream = key;
    std::shared_ptr<Inbound> cancelled = inbound;
    PostedReceive receive = std::move(*cancelled->receive);
    cancelled->receive.reset();
    cancelled->discard = true;
    // Its caller may reuse the memory once told: not one more byte goes there.
    // (Abandoning may close the connection, and its failure then forgets the
    // message: `inbound_` is looked up again after.)
    if (auto conn = cancelled->conn.lock()) conn->abandonData(cancelled->request);
    // Every frame has started: no later one will come to forget the message.
    auto still = inbound_.find(stream);
    if (still != inbound_.end() && still->second == cancelled && cancelled->expected == cancelled->size) {
      inbound_.erase(still);
    }
    receive.done(why, receive.rank);
    return;
  }
}

void Mailbox::onMessage(Connection& conn, const wire::Message& msg) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (msg.size > config_.maxMessageBytes || inbound_.count({conn.id(), msg.request})) {
    conn.close(Status(Code::kProtocol, msg.size > config_.maxMessageBytes ? "message larger than the store capacity"
                                                                         : "message request reused"));
    return;
  }
  auto inbound = std::make_shared<Inbound>();
  inbound->source = conn.peerRank();
  inbound->key = {msg.context, msg.tag};
  inbound->size = msg.size;
  inbound->kind = msg.kind;
  inbound->request = msg.request;
  inbound->conn = links_.sharedConnection(conn);
  inbound->eager = msg.eager;
  counters_.received++;
  if (isStale(inbound->key)) {
    dropStale(inbound);
    if (msg.eager && msg.size > 0 && conn.isOpen()) inbound_[{conn.id(), msg.request}] = inbound;
    return;
  }
  auto posted = takeFirst(receives_, inbound->key, [&](const PostedReceive& r) {
    return r.rank == -1 || r.rank == inbound->source;
  });
  if (posted && !claim(*inbound, *posted) && !msg.eager) return;  // refused: no bytes follow
  if (!inbound->receive && !inbound->discard) {
    counters_.unexpected++;
    mailbox_[inbound->key].push_back(inbound);
    if (msg.eager) counters_.waitingBytes += msg.size;
  }
  if (msg.size == 0) {
    completeInbound(inbound);
  } else if (conn.isOpen()) {
    inbound_[{conn.id(), msg.request}] = inbound;
  } else if (inbound->receive) {
    // Writing the answer closed the connection, whose failure did not know of
    // this message yet: none of its bytes will come.
    PostedReceive receive = std::move(*inbound->receive);
    inbound->receive.reset();
    receive.done(Status(Code::kPeerFailed, describeMessage(msg.context, msg.tag) + ": the connection from " +
                                               links_.peerName(inbound->source) + " closed"),
                 inbound->source);
  }
}

void Mailbox::discard(uint64_t context, StaleTags stale) {
  loop_.post([this, context, stale = std::move(stale)]() mutable {
    if (!stale) {
      stale_.erase(context);
      return;
    }
    auto dropped = takeStale(mailbox_, context, stale);
    auto refused = takeStale(receives_, context, stale);
    stale_[context] = std::move(stale);
    for (auto& [key, queue] : dropped) {
      for (auto& inbound : queue) {
        if (inbound->eager) counters_.waitingBytes -= inbound->size;
        dropStale(inbound);
      }
    }
    for (auto& [key, queue] : refused) {
      for (auto& receive : queue) receive.done(staleReceive(key), receive.rank);
    }
  });
}

bool Mailbox::isStale(const MessageKey& key) const {
  auto it = stale_.find(key.first);
  return it != stale_.end() && it->second(key.second);
}

void Mailbox::dropStale(const std::shared_ptr<Inbound>& inbound) {
  counters_.discarded++;
  inbound->discard = true;  // bytes still to come are read and forgotten (dataDestination)
  inbound->parked.reset();
  if (inbound->eager) {
    creditEager(*inbound);
    return;
  }
  answer(*inbound, wire::MessageAnswer::kRefused, "its receiver abandoned the exchange or closed its group");
  if (auto conn = inbound->conn.lock()) inbound_.erase({conn->id(), inbound->request});
}

uint8_t* Mailbox::dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                                  std::shared_ptr<const void>* keepalive) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = inbound_.find({conn.id(), request});
  if (it == inbound_.end()) return nullptr;
  Inbound& inbound = *it->second;
  if (offset != inbound.expected || size > inbound.size - offset) {
    conn.close(Status(Code::kProtocol, "message data frame out of order"));
    return nullptr;
  }
  if (!inbound.eager && !inbound.receive && !inbound.discard) {  // not asked for yet
    conn.close(Status(Code::kProtocol, "message bytes sent before the receiver asked for them"));
    return nullptr;
  }
  const bool first = inbound.expected == 0;
  inbound.expected += size;
  if (inbound.discard) {
    // Dropped bytes are not reported as they arrive: forget the message at its last frame.
    if (inbound.expected == inbound.size) inbound_.erase(it);
    return nullptr;
  }
  if (first && !inbound.receive) {
    try {
      inbound.parked = pool_.allocate(inbound.size);
    } catch (const std::bad_alloc&) {
      conn.close(Status(Code::kCapacity, "no memory for a message of " + std::to_string(inbound.size) + " bytes"));
      return nullptr;
    }
  }
  if (inbound.parked) {
    *keepalive = inbound.parked;
    return inbound.parked->data() + offset;
  }
  *keepalive = inbound.receive->keepalive;
  return inbound.receive->dest + offset;
}

void Mailbox::onDataReceived(Connection& conn, uint64_t request, uint64_t end) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = inbound_.find({conn.id(), request});
  if (it == inbound_.end() || end != it->second->size) return;
  auto inbound = it->second;
  inbound_.erase(it);
  counters_.bytesReceived += inbound->size;
  completeInbound(inbound);
}

void Mailbox::completeInbound(const std::shared_ptr<Inbound>& inbound) {
  inbound->complete = true;
  if (!inbound->receive) return;  // waits in the mailbox
  PostedReceive receive = std::move(*inbound->receive);
  inbound->receive.reset();
  if (inbound->parked && inbound->size > 0) std::memcpy(receive.dest, inbound->parked->data(), inbound->size);
  inbound->parked.reset();
  receive.done(Status(), inbound->source);
}

void Mailbox::failFrom(int rank, uint64_t connectionId, const Status& why) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto from = [&](int source) { return rank < 0 || source == rank; };
  std::vector<PostedReceive> failed;
  for (auto it = inbound_.begin(); it != inbound_.end();) {
    auto& inbound = it->second;
    const bool onConnection = connectionId == 0 || it->first.first == connectionId;
    if (!from(inbound->source) || !onConnection) {
      ++it;
      continue;
    }
    if (inbound->receive) {
      failed.push_back(std::move(*inbound->receive));
      inbound->receive.reset();
    }
    auto box = mailbox_.find(inbound->key);
    if (box != mailbox_.end()) {
      if (std::erase(box->second, inbound) > 0 && inbound->eager) counters_.waitingBytes -= inbound->size;
      if (box->second.empty()) mailbox_.erase(box);
    }
    it = inbound_.erase(it);
  }
  // Receives not yet matched wait for the peer, not for a connection: only the
  // peer's failure, or the close of the connection it opened last, fails them
  // (an older one closing late is its previous process's, and the rank may
  // have rejoined since).
  const bool peerGone = connectionId == 0 || (rank >= 0 && links_.latestIncoming(rank) == connectionId);
  for (auto it = receives_.begin(); peerGone && it != receives_.end();) {
    auto& queue = it->second;
    for (auto r = queue.begin(); r != queue.end();) {
      // A receive from any source may still be served by someone else.
      if (rank < 0 || r->rank == rank) {
        failed.push_back(std::move(*r));
        r = queue.erase(r);
      } else {
        ++r;
      }
    }
    it = queue.empty() ? receives_.erase(it) : std::next(it);
  }
  for (auto& receive : failed) receive.done(why, receive.rank);
  if (connectionId != 0) return;  // one connection from the peer closed; what this node sends goes on its own
  for (auto it = outbound_.begin(); it != outbound_.end();) {
    if (rank >= 0 && it->second->rank != rank) {
      ++it;
      continue;
    }
    it->second->frames->fail(why);
    counters_.deferredBytes -= it->second->size;
    it = outbound_.erase(it);
  }
  if (rank < 0) {
    eagerBytes_.clear();
  } else {
    eagerBytes_.erase(rank);
  }
}

bool Mailbox::claim(Inbound& inbound, PostedReceive& receive) {
  Status refused = mismatch(inbound.key, inbound.source, inbound.kind, inbound.size, receive.kind, receive.size);
  if (!refused.ok()) {
    inbound.discard = true;  // consumed by the receive it failed: its bytes are dropped
    inbound.parked.reset();
    receive.done(refused, inbound.source);
    if (inbound.eager) {
      creditEager(inbound);
    } else {
      answer(inbound, wire::MessageAnswer::kRefused, refused.message);
    }
    return false;
  }
  inbound.receive = std::move(receive);
  if (inbound.eager) {
    creditEager(inbound);
  } else {
    answer(inbound, wire::MessageAnswer::kSend);
  }
  return true;
}

void Mailbox::answer(const Inbound& inbound, wire::MessageAnswer answer, const std::string& reason) {
  if (auto conn = inbound.conn.lock()) {
    conn->sendControl(wire::MsgType::kMessageReply,
                      wire::encode(wire::MessageReply{inbound.request, answer, reason.substr(0, wire::kMaxMessageReason)}));
  }
}

void Mailbox::onReply(Connection& conn, const wire::MessageReply& msg) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = outbound_.find(msg.request);
  if (it == outbound_.end()) return;  // its sender gave up, or the peer failed, meanwhile
  std::shared_ptr<Outbound> out = it->second;
  if (out->conn.lock().get() != &conn) {
    conn.close(Status(Code::kProtocol, "answer to a message sent on another connection"));
    return;
  }
  outbound_.erase(it);
  counters_.deferredBytes -= out->size;
  switch (msg.answer) {
    case wire::MessageAnswer::kSend:
      sendFrames(conn, msg.request, out->data, out->size, chunkFor(out->size), out->frames);
      counters_.bytesSent += out->size;
      return;
    case wire::MessageAnswer::kRefused:
      out->frames->fail(Status(Code::kInvalidArgument, out->what + " was refused: " + msg.reason));
      return;
  }
}

void Mailbox::onCredit(Connection& conn, const wire::MessageCredit& msg) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = eagerBytes_.find(conn.peerRank());
  // The window was reset when the peer failed: nothing is owed any more.
  if (it != eagerBytes_.end()) it->second -= std::min(it->second, msg.bytes);
}

void Mailbox::creditEager(const Inbound& inbound) {
  auto conn = inbound.conn.lock();
  if (inbound.size == 0 || !conn || !conn->isOpen()) return;  // nothing owed, or no one to tell
  CreditOwed& owed = credits_[conn->id()];
  owed.conn = conn;
  owed.bytes += inbound.size;
  if (owed.bytes >= std::max<uint64_t>(1, config_.windowBytes / kCreditFraction)) {
    sendCredit(conn->id());
  } else if (owed.timer == 0) {
    owed.timer = loop_.addTimer(kCreditDelaySeconds, [this, id = conn->id()] {
      auto it = credits_.find(id);
      if (it == credits_.end()) return;
      it->second.timer = 0;
      sendCredit(id);
    });
  }
}

void Mailbox::sendCredit(uint64_t connectionId) {
  auto it = credits_.find(connectionId);
  if (it == credits_.end()) return;
  if (it->second.timer != 0) loop_.cancelTimer(it->second.timer);
  auto conn = it->second.conn.lock();
  const uint64_t bytes = it->second.bytes;
  credits_.erase(it);
  if (conn && conn->isOpen()) conn->sendControl(wire::MsgType::kMessageCredit, wire::encode(wire::MessageCredit{bytes}));
}

bool Mailbox::dropOutbound(uint64_t request, const Status& why) {
  auto it = outbound_.find(request);
  if (it == outbound_.end()) return false;  // eager (its bytes are on their way), answered, or over
  std::shared_ptr<Outbound> out = it->second;
  outbound_.erase(it);
  counters_.deferredBytes -= out->size;
  counters_.withdrawn++;
  out->frames->fail(why);
  // Else a receive could take it later and wait for bytes that never come.
  // Written last: a failed write closes the connection, failing what was on it.
  if (auto conn = out->conn.lock(); conn && conn->isOpen()) {
    conn->sendControl(wire::MsgType::kMessageWithdrawn,
                      wire::encode(wire::MessageWithdrawn{request, why.message.substr(0, wire::kMaxMessageReason)}));
  }
  return true;
}

void Mailbox::onWithdrawn(Connection& conn, const wire::MessageWithdrawn& msg) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = inbound_.find({conn.id(), msg.request});
  if (it == inbound_.end()) return;  // refused meanwhile
  std::shared_ptr<Inbound> inbound = it->second;
  if (inbound->eager || inbound->expected > 0) {
    conn.close(Status(Code::kProtocol, "withdrew a message whose bytes it had sent"));
    return;
  }
  inbound_.erase(it);
  auto box = mailbox_.find(inbound->key);
  if (box != mailbox_.end()) {
    std::erase(box->second, inbound);
    if (box->second.empty()) mailbox_.erase(box);
  }
  if (!inbound->receive) return;  // as if never sent
  // A receive took it while the withdrawal was on its way.
  PostedReceive receive = std::move(*inbound->receive);
  inbound->receive.reset();
  if (receive.rank == -1) return matchReceive(std::move(receive), inbound->key);  // another sender may serve it
  receive.done(Status(Code::kPeerFailed, describeMessage(inbound->key.first, inbound->key.second) + ": " +
                                             links_.peerName(inbound->source) + " withdrew it: " + msg.reason),
               inbound->source);
}

}  // namespace hoplite
