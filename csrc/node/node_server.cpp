// What a node does for others: its directory shard, pulls from its store, deletes.
#include "common/logging.h"
#include "node/node.h"

namespace hoplite {
namespace {
constexpr uint64_t kMinRelayFrame = 256u << 10;
}

void Node::handleRegister(Connection& conn, const wire::Register& msg) {
  Status s = directory_->registerObject(msg);
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, s}));
}

void Node::handleLookup(Connection& conn, const wire::Lookup& msg) {
  std::weak_ptr<Connection> weak = sharedConnection(conn);
  uint64_t request = msg.request;
  // The asker's timeout, within bounds: a peer must not park requests forever.
  double timeout = std::min(static_cast<double>(msg.timeoutMs) / 1000.0, kMaxTimeoutSeconds);
  const int preferred = msg.preferred < config_.worldSize ? msg.preferred : -1;
  directory_->lookup(msg.id, conn.peerRank(), msg.locate, timeout, [weak, request](const Status& s, const DirectoryEntry* entry,
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
  Status s = directory_->remove(msg.id, msg.retract, &holders);
  if (msg.retract && s.code == Code::kNotFound) s = Status();  // nothing to take back
  auto c = sharedConnection(conn);
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
    uint64_t drop = newRequest();
    requestStatus(holder, wire::MsgType::kDropCopy, wire::encode(wire::DropCopy{drop, msg.id, msg.retract}), drop,
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

void Node::dropLocalCopy(const std::string& id, const Status& why) {
  auto obj = store_->remove(id);
  if (!obj) return;
  obj->abandoned = true;  // stops a put still copying in
  std::vector<uint64_t> pulls;
  for (const auto& [request, pull] : pulls_) {
    if (pull.object == obj) pulls.push_back(request);
  }
  for (uint64_t request : pulls) {
    auto it = pulls_.find(request);
    if (it == pulls_.end()) continue;
    if (it->second.reading) {  // it ends when the read returns
      it->second.dropped = true;
      continue;
    }
    const int rank = it->second.rank;
    pulls_.erase(it);
    releaseHolder(request, rank);
  }
  obj->fail(why);  // wakes gets waiting on it and streams serving from it
}

namespace {
constexpr double kParkSeconds = 5.0;
}

void Node::handleCancel(Connection& conn, const wire::Cancel& msg) {
  endStream({conn.id(), msg.request});
  lent_.erase({conn.id(), msg.request});
  lentCount_ = lent_.size();
}

void Node::handlePull(Connection& conn, const wire::Pull& msg) {
  auto shared = sharedConnection(conn);
  if (auto obj = store_->find(msg.id)) {
    startServing(shared, msg, obj);
    return;
  }
  if (handedOver_.count(msg.id)) {  // gone, not yet arrived: the reader asks the directory again
    const Status moved(Code::kMoved, peerName(config_.rank) + " handed its copy of object " + printableId(msg.id) +
                                         " to a get");
    conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, moved}));
    return;
  }
  auto& parked = parkedPulls_[msg.id];
  if (parked.size() >= 1024) {  // bounded: a peer cannot park requests without limit
    startServing(shared, msg, nullptr);
    return;
  }
  std::string id = msg.id;
  uint64_t request = msg.request;
  auto timer = loop_.addTimer(kParkSeconds, [this, id, request] {
    auto it = parkedPulls_.find(id);
    if (it == parkedPulls_.end()) return;
    auto& list = it->second;
    for (auto p = list.begin(); p != list.end(); ++p) {
      if (p->msg.request != request) continue;
      ParkedPull pull = std::move(*p);
      list.erase(p);
      if (list.empty()) parkedPulls_.erase(it);
      if (auto c = pull.conn.lock()) startServing(c, pull.msg, store_->find(pull.msg.id));
      return;
    }
  });
  parked.push_back(ParkedPull{shared, msg, timer});
}

void Node::serveParkedPulls(const std::shared_ptr<LocalObject>& obj) {
  auto it = parkedPulls_.find(obj->id());
  if (it == parkedPulls_.end()) return;
  auto list = std::move(it->second);
  parkedPulls_.erase(it);
  for (auto& pull : list) {
    loop_.cancelTimer(pull.timer);
    if (auto c = pull.conn.lock()) startServing(c, pull.msg, obj);
  }
}

void Node::startServing(const std::shared_ptr<Connection>& conn, const wire::Pull& msg,
                        const std::shared_ptr<LocalObject>& obj) {
  if (!conn || !conn->isOpen()) return;
  if (!obj || obj->failed() || msg.offset > obj->size()) {
    Status s = !obj || obj->failed()
                   ? Status(Code::kNotFound, "rank " + std::to_string(config_.rank) + " holds no copy of object " +
                                                 printableId(msg.id))
                   : Status(Code::kInvalidArgument, "pull offset beyond the end of object " + printableId(msg.id));
    conn->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, s}));
    return;
  }
  StreamKey key{conn->id(), msg.request};
  endStream(key);  // a repeated request replaces the earlier stream
  ServingStream& stream = serving_[key];
  stream.conn = conn;
  stream.request = msg.request;
  stream.object = obj;
  stream.next = msg.offset;
  stream.sameHost = msg.sameHost && !hostIdentity_.empty();  // offered only then
  if (stream.sameHost) {
    lent_[key] = obj->buffer();
    lentCount_ = lent_.size();
  }
  stream.listener = obj->addListener([this, key] { pump(key); });
  counters_.pullsServed++;
  if (!obj->complete()) counters_.relaysServed++;
  pump(key);
}

void Node::pump(const StreamKey& key) {
  auto it = serving_.find(key);
  if (it == serving_.end()) return;
  ServingStream& stream = it->second;
  auto conn = stream.conn.lock();
  if (!conn || !conn->isOpen()) {
    endStream(key);
    return;
  }
  const auto& obj = stream.object;
  if (obj->failed()) {
    conn->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{stream.request, obj->error()}));
    endStream(key);
    return;
  }
  // Sending may close the connection, whose onClosed ends this stream: work on
  // copies and look the stream up again afterwards.
  const auto object = obj;
  const uint64_t request = stream.request;
  const uint64_t chunk = chunkFor(object->size());
  const uint64_t ready = object->watermark();
  uint64_t next = stream.next;
  // A copy still arriving advances a few KB at a time: relay it in frames of
  // at least kMinRelayFrame (or the rest), not one small frame per advance.
  if (ready < object->size() && ready - next < std::min(chunk, kMinRelayFrame)) return;
  const bool sameHost = stream.sameHost;
  while (next < ready && conn->isOpen()) {
    // A same-host reader cuts what is ready into reads of its own.
    uint64_t n = sameHost ? ready - next : std::min(chunk, ready - next);
    if (sameHost) {
      conn->sendControl(wire::MsgType::kDataAt,
                        wire::encode(wire::DataAt{request, next, n, reinterpret_cast<uintptr_t>(object->data() + next)}));
      counters_.bytesSentSameHost += n;
    } else {
      conn->sendData(request, request, next, object->data() + next, n, object->buffer());
    }
    counters_.bytesSent += n;
    next += n;
  }
  it = serving_.find(key);
  if (it == serving_.end()) return;
  it->second.next = next;
  if (next == object->size() || !conn->isOpen()) endStream(key);
}

void Node::endStream(const StreamKey& key) {
  auto it = serving_.find(key);
  if (it == serving_.end()) return;
  it->second.object->removeListener(it->second.listener);
  serving_.erase(it);
}

}  // namespace hoplite
