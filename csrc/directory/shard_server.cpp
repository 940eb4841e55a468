// This node's share of the directory, serving its peers' requests.
#include "directory/shard_server.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "common/timeouts.h"

namespace hoplite {

ShardServer::ShardServer(EventLoop& loop, PeerLinks& peers, DirectoryClient& directory, int worldSize)
    : peers_(peers),
      directory_(directory),
      worldSize_(worldSize),
      shard_(loop, [this](int rank, const wire::Locations& msg) { peers_.send(rank, msg); }) {}

void ShardServer::registerHandlers(MessageRouter& router) {
  router.on<wire::Register>(Route::kOnEither, [this](Connection& c, const wire::Register& m) { handleRegister(c, m); });
  router.on<wire::HolderUpdate>(Route::kOnEither,
                                [this](Connection& c, const wire::HolderUpdate& m) { handleHolderUpdate(c, m); });
  router.on<wire::Lookup>(Route::kOnEither, [this](Connection& c, const wire::Lookup& m) { handleLookup(c, m); });
  router.on<wire::Delete>(Route::kOnEither, [this](Connection& c, const wire::Delete& m) { handleDelete(c, m); });
  router.on<wire::Subscribe>(Route::kOnEither, [this](Connection& c, const wire::Subscribe& m) { handleSubscribe(c, m); });
}

void ShardServer::dropCopyAt(int holder, const std::string& id, bool retract, RequestTracker::StatusCallback done) {
  uint64_t drop = directory_.newRequest();
  directory_.requestStatus(holder, wire::MsgType::kDropCopy, wire::encode(wire::DropCopy{drop, id, retract}), drop,
                           std::move(done));
}

Status ShardServer::notHostedHere(const std::string& id) const {
  // The asker and this node disagree on where the id's entry lives, for as
  // long as one of them has not heard that a shard moved or returned: it asks
  // again shortly (DirectoryClient::requestShard and sendLookup).
  return Status(Code::kMoved,
                "rank " + std::to_string(directory_.rank()) + " does not host the directory entry of " + printableId(id));
}

void ShardServer::handleRegister(Connection& conn, const wire::Register& msg) {
  Status s = directory_.hosts(msg.id) ? shard_.registerObject(msg) : notHostedHere(msg.id);
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, s}));
}

void ShardServer::handleHolderUpdate(Connection& conn, const wire::HolderUpdate& msg) {
  // Not hosted here: its sender lists its copies again where the entry went
  // once it hears of the move (unknown here is no sign of a delete).
  if (!directory_.hosts(msg.id)) return;
  bool known = shard_.updateHolder(msg);
  if (!known && msg.state != wire::HolderState::kRemoved && msg.holder == conn.peerRank()) {
    // A copy finished after its object was deleted: it must not outlive the delete.
    dropCopyAt(msg.holder, msg.id, /*retract=*/false, [](const Status&) {});
  }
}

void ShardServer::handOver() {
  shard_.handOver([this](const std::string& id) { return !directory_.hosts(id); });
}

void ShardServer::handleLookup(Connection& conn, const wire::Lookup& msg) {
  if (!directory_.hosts(msg.id)) {
    wire::LookupReply reply;
    reply.request = msg.request;
    reply.status = notHostedHere(msg.id);
    conn.sendControl(wire::MsgType::kLookupReply, wire::encode(reply));
    return;
  }
  std::weak_ptr<Connection> weak = peers_.sharedConnection(conn);
  uint64_t request = msg.request;
  // The asker's timeout, within bounds: a peer must not park requests forever.
  double timeout = std::min(static_cast<double>(msg.timeoutMs) / 1000.0, kMaxTimeoutSeconds);
  const int preferred = msg.preferred < worldSize_ ? msg.preferred : -1;
  shard_.lookup(
      msg.id, conn.peerRank(), msg.locate, timeout,
      [weak, request](const Status& s, const DirectoryEntry* entry, int sender) {
        auto c = weak.lock();
        if (!c) return;  // the asker went away
        wire::LookupReply reply;
        reply.request = request;
        reply.status = s;
        if (entry != nullptr) {
          reply.meta = entry->meta;
          reply.hasInline = entry->hasInline;
          reply.inlineData = entry->inlineData;
          reply.sender = sender;
          reply.recomputable = entry->recomputable;
        }
        c->sendControl(wire::MsgType::kLookupReply, wire::encode(reply));
      },
      msg.failedHolder, preferred);
}

void ShardServer::handleDelete(Connection& conn, const wire::Delete& msg) {
  if (!directory_.hosts(msg.id)) {
    conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, notHostedHere(msg.id)}));
    return;
  }
  std::vector<int> holders;
  Status s = shard_.remove(msg.id, msg.retract, &holders);
  if (msg.retract && s.code == Code::kNotFound) s = Status();  // nothing to take back
  uint64_t request = msg.request;
  if (!s.ok() || holders.empty()) {
    conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{request, s}));
    return;
  }
  // Answer once every holder dropped its copy (or is gone), so no later get
  // anywhere can still see the object.
  auto remaining = std::make_shared<size_t>(holders.size());
  std::weak_ptr<Connection> weak = peers_.sharedConnection(conn);
  for (int holder : holders) {
    dropCopyAt(holder, msg.id, msg.retract, [weak, request, remaining](const Status&) {
      if (--*remaining > 0) return;
      if (auto c = weak.lock()) {
        c->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{request, Status()}));
      }
    });
  }
}

void ShardServer::handleSubscribe(Connection& conn, const wire::Subscribe& msg) {
  if (msg.cancel) {
    shard_.unsubscribe(msg.id, conn.peerRank(), msg.request);
  } else {
    shard_.subscribe(msg.id, conn.peerRank(), msg.request);
  }
}

}  // namespace hoplite
