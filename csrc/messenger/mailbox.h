// The node's TaggedMessenger: an announce (control frame) followed by the
// bytes as data frames, read straight into the posted receive's memory, or
// into a mailbox buffer (from the node's BufferPool: mapped memory, reused,
// not malloc's heaps, which keep what is freed) when the message arrives
// before its receive. Only eager messages can wait in a mailbox: up to 4 MiB
// each, and at most `windowBytes` of them per sender not yet credited back
// (the receiver credits what receives took, in batches). The rest are
// deferred: announced at once, their bytes sent when the receiver answers that
// a receive took them, so nothing large waits in memory twice.
//
// The public TaggedMessenger calls may come from any thread; everything else
// runs on the node's loop thread, called by the node for the frames and
// connection events that concern messages.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "net/peer_links.h"
#include "messenger/tagged_messenger.h"
#include "net/event_loop.h"
#include "net/message_router.h"
#include "net/transport.h"
#include "store/buffer_pool.h"
#include "wire/messages.h"

namespace hoplite {

struct MailboxConfig {
  int rank = 0;
  int worldSize = 1;
  uint64_t windowBytes = 64ull << 20;  // eager bytes to one peer not yet credited
  uint64_t maxMessageBytes = 1ull << 34;  // larger announces are a protocol error
  uint64_t chunkBytes = 0;  // data frame size; 0: chosen from the size (common/chunking.h)
};

class Mailbox final : public TaggedMessenger {
 public:
  Mailbox(EventLoop& loop, PeerLinks& links, BufferPool& pool, MailboxConfig config);

  uint64_t send(int rank, uint64_t context, uint64_t tag, const std::string& kind, const uint8_t* data, uint64_t size,
                std::shared_ptr<const void> keepalive, Callback done, double timeoutSeconds = 0) override;
  uint64_t receive(int rank, uint64_t context, uint64_t tag, const std::string& kind, uint8_t* dest, uint64_t size,
                   std::shared_ptr<const void> keepalive, Callback done, double timeoutSeconds = 0) override;
  void cancelReceive(uint64_t handle, const Status& why) override;
  void cancelSend(uint64_t handle, const Status& why) override;
  void discard(uint64_t context, StaleTags stale) override;

  // Whether a data frame's request is a message's (else a pull's).
  static bool carriesMessage(uint64_t request) { return (request & wire::kMessageRequestBit) != 0; }

  // Routes the message frames to the handlers below: messages come on the
  // connection their sender dialed, answers and credits back on it.
  void registerHandlers(MessageRouter& router);

  // Frames (loop thread).
  void onMessage(Connection& conn, const wire::Message& msg);
  void onReply(Connection& conn, const wire::MessageReply& msg);
  void onCredit(Connection& conn, const wire::MessageCredit& msg);
  void onWithdrawn(Connection& conn, const wire::MessageWithdrawn& msg);
  uint8_t* dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                           std::shared_ptr<const void>* keepalive);
  void onDataReceived(Connection& conn, uint64_t request, uint64_t end);

  // A sender's connection closed (connectionId) or the peer failed
  // (connectionId 0; rank -1: every peer): its unfinished messages and the
  // receives waiting for it fail.
  void failFrom(int rank, uint64_t connectionId, const Status& why);
  // Fails everything in flight; later sends and receives fail at once.
  void shutDown(const Status& why);

  struct Counters {
    std::atomic<uint64_t> sent{0}, received{0};
    std::atomic<uint64_t> unexpected{0};  // arrived before their receive
    std::atomic<uint64_t> deferred{0};    // sent only once their receive was there
    std::atomic<uint64_t> withdrawn{0};   // sends given up before a receive asked for them
    std::atomic<uint64_t> discarded{0};   // received for tags no receive would take (discard())
    std::atomic<uint64_t> bytesSent{0}, bytesReceived{0};
    std::atomic<uint64_t> waitingBytes{0};  // eager bytes in the mailbox
    std::atomic<uint64_t> deferredBytes{0};  // of deferred sends still held, not asked for nor given up
  };
  const Counters& counters() const { return counters_; }

 private:
  using MessageKey = std::pair<uint64_t, uint64_t>;  // (context, tag)
  using StreamKey = std::pair<uint64_t, uint64_t>;   // (connection id, request)
  struct PostedReceive {
    uint64_t handle = 0;
    int rank = -1;
    uint8_t* dest = nullptr;
    uint64_t size = 0;
    std::string kind;
    std::shared_ptr<const void> keepalive;
    Callback done;
  };
  struct SendProgress;
  struct Inbound;   // a message arriving, or waiting in the mailbox
  struct Outbound;  // a deferred message, until its receiver lets it come or refuses it
  struct CreditOwed {  // eager bytes taken from one connection, not yet credited
    std::weak_ptr<Connection> conn;
    uint64_t bytes = 0;
    EventLoop::TimerId timer = 0;  // the delayed credit, while armed
  };
  // `done`, run at most once; with timeoutSeconds > 0, `arm` (run on the loop
  // in the task that starts the operation) starts a timer that reports a
  // timeout if `giveUp` could still stop the operation (returns true).
  struct Deadline {
    Callback done;
    std::function<void()> arm;
  };
  Deadline withDeadline(Callback done, double timeoutSeconds, const std::string& what,
                        std::function<bool(const Status&)> giveUp);
  // An eager message left the mailbox window (taken, or refused and dropped):
  // its bytes are credited back to the sender, batched.
  void creditEager(const Inbound& inbound);
  void sendCredit(uint64_t connectionId);
  // Gives an inbound message to `receive`, or fails the receive when the
  // message is of another kind or size; tells the sender either way (an eager
  // one's sender through a credit).
  bool claim(Inbound& inbound, PostedReceive& receive);
  // Tells a deferred inbound message's sender what became of it.
  void answer(const Inbound& inbound, wire::MessageAnswer answer, const std::string& reason = "");
  // A deferred message's sender gave up: its memory is let go, and the
  // receiver told to forget it. False if it was not waiting to be asked for
  // (eager, under way, or over): then it reports its own outcome.
  bool dropOutbound(uint64_t request, const Status& why);
  // A send's caller gave up (timeout, cancelSend): reports `why` unless the
  // send has reported or its bytes are on their way (then returns false).
  bool giveUpSend(uint64_t request, const Status& why);
  // cancelReceive, on the loop thread: the receive's memory is not written once it returns.
  void cancelReceiveNow(uint64_t handle, const Status& why);
  void matchReceive(PostedReceive receive, MessageKey key);
  bool isStale(const MessageKey& key) const;
  // Drops an inbound message of a stale tag (not in the mailbox): its bytes,
  // if any follow, are read and forgotten.
  void dropStale(const std::shared_ptr<Inbound>& inbound);
  void completeInbound(const std::shared_ptr<Inbound>& inbound);
  uint64_t chunkFor(uint64_t size) const;

  EventLoop& loop_;
  PeerLinks& links_;
  BufferPool& pool_;
  const MailboxConfig config_;
  std::atomic<uint64_t> next_{1};  // message requests and receive handles
  bool shutDown_ = false;

  // Loop-thread state.
  std::map<StreamKey, std::shared_ptr<Inbound>> inbound_;  // arriving, by (connection id, request)
  std::map<MessageKey, std::deque<std::shared_ptr<Inbound>>> mailbox_;  // unmatched, arrival order
  std::map<MessageKey, std::deque<PostedReceive>> receives_;           // unmatched, post order
  std::unordered_map<uint64_t, std::shared_ptr<Outbound>> outbound_;  // deferred, by request
  std::unordered_map<uint64_t, CreditOwed> credits_;  // by connection id
  std::unordered_map<uint64_t, std::shared_ptr<SendProgress>> sendsInFlight_;  // by request, until they report
  std::unordered_map<int, uint64_t> eagerBytes_;  // per peer: sent eagerly, not yet credited
  std::unordered_map<uint64_t, StaleTags> stale_;  // by context (discard())
  Counters counters_;
};

}  // namespace hoplite
