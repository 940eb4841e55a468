// What a node does for others: its directory shard, and dropping its copies. Pulls are served by
// transfer/server.cpp.
#include "common/logging.h"
#include "node/node.h"

namespace hoplite {
void Node::handleRegister(Connection& conn, const wire::Register& msg) {
  Status s = shard_->registerObject(msg);
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, s}));
}

void Node::handleLookup(Connection& conn, const wire::Lookup& msg) {
  std::weak_ptr<Connection> weak = peers_->sharedConnection(conn);
  uint64_t request = msg.request;
  // The asker's timeout, within bounds: a peer must not park requests forever.
  double timeout = std::min(static_cast<double>(msg.timeoutMs) / 1000.0, kMaxTimeoutSeconds);
  const int preferred = msg.preferred < config_.worldSize ? msg.preferred : -1;
  shard_->lookup(msg.id, conn.peerRank(), msg.locate, timeout, [weak, request](const Status& s, const DirectoryEntry* entry,
                                                                      int sender) {
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
  }, msg.failedHolder, preferred);
}

void Node::handleDelete(Connection& conn, const wire::Delete& msg) {
  std::vector<int> holders;
  Status s = shard_->remove(msg.id, msg.retract, &holders);
  if (msg.retract && s.code == Code::kNotFound) s = Status();  // nothing to take back
  auto c = peers_->sharedConnection(conn);
  uint64_t request = msg.request;
  if (!s.ok() || holders.empty()) {
    conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{request, s}));
    return;
  }
  // Answer once every holder dropped its copy (or is gone), so no later get
  // anywhere can still see the object.
  auto remaining = std::make_shared<size_t>(holders.size());
  std::weak_ptr<Connection> weak = c;
  for (int holder : holders) {
    uint64_t drop = directory_->newRequest();
    directory_->requestStatus(holder, wire::MsgType::kDropCopy, wire::encode(wire::DropCopy{drop, msg.id, msg.retract}), drop,
                  [weak, request, remaining](const Status&) {
                    if (--*remaining > 0) return;
                    if (auto c = weak.lock()) {
                      c->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{request, Status()}));
                    }
                  });
  }
}

void Node::handleDropCopy(Connection& conn, const wire::DropCopy& msg) {
  dropLocalCopy(msg.id, msg.retract ? Status(Code::kRetry, "object " + printableId(msg.id) +
                                                            " is being recomputed after a participant failed")
                                    : Status(Code::kDeleted, "object " + printableId(msg.id) + " was deleted"));
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, Status()}));
}

void Node::handleSubscribe(Connection& conn, const wire::Subscribe& msg) {
  if (msg.cancel) {
    shard_->unsubscribe(msg.id, conn.peerRank(), msg.request);
  } else {
    shard_->subscribe(msg.id, conn.peerRank(), msg.request);
  }
}

void Node::dropLocalCopy(const std::string& id, const Status& why) {
  auto obj = store_->remove(id);
  if (!obj) return;
  obj->abandoned = true;  // stops a put still copying in
  client_->endPullsOf(obj);
  obj->fail(why);  // wakes gets waiting on it and streams serving from it
}

}  // namespace hoplite
