// What a node does for others: its directory shard, pulls from its store, deletes.
#include "common/logging.h"
#include "node/node.h"

namespace hoplite {

void Node::handleRegister(Connection& conn, const wire::Register& msg) {
  Status s = directory_->registerObject(msg);
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, s}));
}

void Node::handleLookup(Connection& conn, const wire::Lookup& msg) {
  std::weak_ptr<Connection> weak = sharedConnection(conn);
  uint64_t request = msg.request;
  // The asker's timeout, within bounds: a peer must not park requests forever.
  double timeout = std::min(static_cast<double>(msg.timeoutMs) / 1000.0, kMaxTimeoutSeconds);
  directory_->lookup(msg.id, timeout, [weak, request](const Status& s, const DirectoryEntry* entry) {
    auto c = weak.lock();
    if (!c) return;  // the asker went away
    wire::LookupReply reply;
    reply.request = request;
    reply.status = s;
    if (entry != nullptr) {
      reply.meta = entry->meta;
      reply.hasInline = entry->hasInline;
      reply.inlineData = entry->inlineData;
      for (const auto& [rank, complete] : entry->holders) reply.holders.push_back({rank, complete});
    }
    c->sendControl(wire::MsgType::kLookupReply, wire::encode(reply));
  });
}

void Node::handleDelete(Connection& conn, const wire::Delete& msg) {
  std::vector<int> holders;
  Status s = directory_->remove(msg.id, &holders);
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
    requestStatus(holder, wire::MsgType::kDropCopy, wire::encode(wire::DropCopy{drop, msg.id}), drop,
                  [weak, request, remaining](const Status&) {
                    if (--*remaining > 0) return;
                    if (auto c = weak.lock()) {
                      c->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{request, Status()}));
                    }
                  });
  }
}

void Node::handleDropCopy(Connection& conn, const wire::DropCopy& msg) {
  dropLocalCopy(msg.id, Status(Code::kDeleted, "object " + printableId(msg.id) + " was deleted"));
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
    int rank = pulls_.at(request).rank;
    pulls_.erase(request);
    send(rank, wire::Cancel{request});
  }
  obj->fail(why);  // wakes gets waiting on it and streams serving from it
}

void Node::handlePull(Connection& conn, const wire::Pull& msg) {
  auto obj = store_->find(msg.id);
  if (!obj || obj->failed() || msg.offset > obj->size()) {
    Status s = !obj || obj->failed()
                   ? Status(Code::kNotFound, "rank " + std::to_string(config_.rank) + " holds no copy of object " +
                                                 printableId(msg.id))
                   : Status(Code::kInvalidArgument, "pull offset beyond the end of object " + printableId(msg.id));
    conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, s}));
    return;
  }
  StreamKey key{conn.id(), msg.request};
  endStream(key);  // a repeated request replaces the earlier stream
  ServingStream& stream = serving_[key];
  stream.conn = sharedConnection(conn);
  stream.request = msg.request;
  stream.object = obj;
  stream.next = msg.offset;
  stream.listener = obj->addListener([this, key] { pump(key); });
  counters_.pullsServed++;
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
  while (next < ready && conn->isOpen()) {
    uint64_t n = std::min(chunk, ready - next);
    conn->sendData(request, next, object->data() + next, n, object->buffer());
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
