// What a node serves to others' pulls: the bytes of its copies, sent as they
// become ready (a copy still arriving is relayed chunk by chunk), or, to a
// reader on the same host, announced where they lie in memory (DataAt) and
// lent until the reader is done. Loop thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "net/event_loop.h"
#include "net/message_router.h"
#include "net/peer_links.h"
#include "store/object_store.h"
#include "wire/messages.h"

namespace hoplite {

struct TransferServerConfig {
  int rank = 0;
  bool sameHost = false;    // same-host readers may be offered memory instead of bytes
  uint64_t chunkBytes = 0;  // data frame size; 0: chosen from the object's size
};

class TransferServer {
 public:
  TransferServer(EventLoop& loop, PeerLinks& peers, ObjectStore& store, TransferServerConfig config);

  // Pull and Cancel.
  void registerHandlers(MessageRouter& router);
  // A copy of `obj` now exists here: the pulls that reached this node before
  // it did (the directory lists a relay as soon as it asks) are served.
  void serveParkedPulls(const std::shared_ptr<LocalObject>& obj);
  // This node's copy of `id` went to a local get (bounded memory of them): a
  // pull for it is told the copy moved, instead of waiting for it.
  void noteHandedOver(const std::string& id);
  // A new copy of `id` is coming: pulls wait for it again.
  void forgetHandedOver(const std::string& id) { handedOver_.erase(id); }
  // A connection closed: its streams end and what was lent to it is released.
  void onConnectionClosed(uint64_t connectionId);

  struct Counters {
    std::atomic<uint64_t> pullsServed{0};
    std::atomic<uint64_t> relaysServed{0};  // pulls served from a copy still arriving
    std::atomic<uint64_t> bytesSent{0};
    std::atomic<uint64_t> bytesSentSameHost{0};  // of bytesSent, announced to same-host readers
    std::atomic<uint64_t> lent{0};  // pulls whose memory is lent to a same-host reader now
  };
  const Counters& counters() const { return counters_; }

 private:
  using StreamKey = std::pair<uint64_t, uint64_t>;  // (connection id, request)
  struct Stream {
    std::weak_ptr<Connection> conn;
    uint64_t request;
    std::shared_ptr<LocalObject> object;
    uint64_t listener = 0;
    uint64_t next = 0;
    bool sameHost = false;  // announce where the bytes are (DataAt) instead of sending them
  };
  struct ParkedPull {
    std::weak_ptr<Connection> conn;
    wire::Pull msg;
    EventLoop::TimerId timer;
  };
  void handlePull(Connection& conn, const wire::Pull& msg);
  // The puller stopped (or a same-host reader is done with the memory lent to it).
  void handleCancel(Connection& conn, const wire::Cancel& msg);
  void start(const std::shared_ptr<Connection>& conn, const wire::Pull& msg, const std::shared_ptr<LocalObject>& obj);
  void pump(const StreamKey& key);
  void end(const StreamKey& key);

  EventLoop& loop_;
  PeerLinks& peers_;
  ObjectStore& store_;
  const TransferServerConfig config_;
  std::map<StreamKey, Stream> streams_;
  std::unordered_map<std::string, std::vector<ParkedPull>> parked_;
  std::unordered_set<std::string> handedOver_;
  std::deque<std::string> handedOverOrder_;
  // Memory lent to same-host readers, until they cancel or their connection closes.
  std::map<StreamKey, std::shared_ptr<const Buffer>> lent_;
  Counters counters_;
};

}  // namespace hoplite
