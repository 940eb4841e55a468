// What a node asks of others: put, get (lookup + pull), delete.
#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "node/node.h"

namespace hoplite {
namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", s);
  return buf;
}

}  // namespace

uint64_t Node::chunkFor(uint64_t size) const {
  if (config_.chunkBytes > 0) return config_.chunkBytes;
  // About 64 chunks an object, between 256 KiB and 4 MiB: small enough that a
  // relay chain fills quickly, large enough that per-frame costs vanish.
  uint64_t chunk = 256u << 10;
  while (chunk < (4u << 20) && chunk * 64 < size) chunk *= 2;
  return chunk;
}

void Node::requestStatus(int rank, wire::MsgType type, std::string payload, uint64_t request, StatusCallback cb) {
  pending_[request] = Pending{rank, std::move(cb), nullptr};
  sendTo(rank, type, std::move(payload));
}

// ---------------------------------------------------------------- put

Status Node::put(const std::string& id, const ObjectMeta& meta, const uint8_t* src, uint64_t token,
                 double timeoutSeconds) {
  Status s = validateId(id);
  if (s.ok()) s = validateMeta(meta);
  if (!s.ok()) return s;
  std::shared_ptr<LocalObject> obj;
  s = store_->create(id, meta, /*primary=*/true, &obj);
  if (!s.ok()) return s;

  bool small = meta.nbytes <= config_.inlineThresholdBytes || meta.nbytes == 0;
  wire::Register reg;
  reg.id = id;
  reg.meta = meta;
  reg.holder = config_.rank;
  if (small) {
    if (meta.nbytes > 0) std::memcpy(obj->data(), src, meta.nbytes);
    reg.complete = true;
    reg.hasInline = true;
    if (meta.nbytes > 0) reg.inlineData.assign(reinterpret_cast<const char*>(src), meta.nbytes);
  }
  int shard = shardOf(id);
  s = callOnLoop(timeoutSeconds, "registering object " + printableId(id),
                 [this, reg = std::move(reg), shard, obj, small](std::function<void(Status)> done) mutable {
                   if (small) obj->advance(obj->size());
                   uint64_t request = newRequest();
                   reg.request = request;
                   requestStatus(shard, wire::MsgType::kRegister, wire::encode(reg), request, done);
                 });
  if (!s.ok()) {
    loop_.post([this, id, obj, s] {
      if (store_->find(id) == obj) store_->remove(id);
      obj->fail(s);
    });
    if (s.code == Code::kAlreadyExists) s.message = "put of object " + printableId(id) + " failed: it already exists";
    return s;
  }
  if (small) {
    pushCompletion(Completion{token, Completion::Kind::kPutCopied, Status(), nullptr, {}});
  } else {
    workers_->submit([this, obj, src, token] { copyIn(obj, src, token); });
  }
  return Status();
}

void Node::copyIn(std::shared_ptr<LocalObject> obj, const uint8_t* src, uint64_t token) {
  const uint64_t size = obj->size();
  const uint64_t chunk = chunkFor(size);
  uint64_t done = 0;
  while (done < size && !obj->abandoned.load()) {
    uint64_t n = std::min(chunk, size - done);
    std::memcpy(obj->data() + done, src + done, n);
    done += n;
    loop_.post([obj, done] { obj->advance(done); });
  }
  Status status;
  if (done < size) status = Status(Code::kDeleted, "object " + printableId(obj->id()) + " was deleted during put");
  if (status.ok()) {
    loop_.post([this, obj] {
      send(shardOf(obj->id()), wire::HolderUpdate{obj->id(), config_.rank, wire::HolderState::kComplete});
    });
  }
  pushCompletion(Completion{token, Completion::Kind::kPutCopied, status, nullptr, {}});
}

// ---------------------------------------------------------------- delete

Status Node::remove(const std::string& id, double timeoutSeconds) {
  Status s = validateId(id);
  if (!s.ok()) return s;
  int shard = shardOf(id);
  return callOnLoop(timeoutSeconds, "deleting object " + printableId(id),
                    [this, id, shard](std::function<void(Status)> done) {
                      uint64_t request = newRequest();
                      requestStatus(shard, wire::MsgType::kDelete, wire::encode(wire::Delete{request, id}), request,
                                    done);
                    });
}

// ---------------------------------------------------------------- get

void Node::get(const std::string& id, double timeoutSeconds, bool copy, uint64_t token) {
  Status s = validateId(id);
  if (!s.ok()) {
    pushCompletion(Completion{token, Completion::Kind::kGet, s, nullptr, {}});
    return;
  }
  loop_.post([this, id, timeoutSeconds, copy, token] {
    if (shuttingDown_) {
      pushCompletion(Completion{token, Completion::Kind::kGet, Status(Code::kShutdown, "node is shut down"), nullptr, {}});
      return;
    }
    GetOp& op = gets_[token];
    op.id = id;
    op.copy = copy;
    op.timeoutSeconds = timeoutSeconds;
    op.timer = loop_.addTimer(timeoutSeconds, [this, token] {
      auto it = gets_.find(token);
      if (it == gets_.end()) return;
      it->second.timer = 0;
      finishGet(token, Status(Code::kTimeout, "get of object " + printableId(it->second.id) + " timed out after " +
                                                  seconds(it->second.timeoutSeconds) + " (" + it->second.stage + ")"));
    });
    startGet(token);
  });
}

void Node::startGet(uint64_t token) {
  GetOp& op = gets_.at(token);
  if (auto obj = store_->find(op.id)) {
    counters_.localGets++;
    waitForLocal(token, obj);
    return;
  }
  uint64_t request = newRequest();
  int shard = shardOf(op.id);
  op.stage = "waiting for the object to be put; directory shard on " + peerName(shard);
  pending_[request] = Pending{shard, nullptr, [this, token](const Status& s, const wire::LookupReply* reply) {
                                onLookupReply(token, s, reply);
                              }};
  uint64_t timeoutMs = static_cast<uint64_t>(op.timeoutSeconds * 1000) + 1;
  send(shard, wire::Lookup{request, op.id, timeoutMs});
}

void Node::onLookupReply(uint64_t token, const Status& status, const wire::LookupReply* reply) {
  auto it = gets_.find(token);
  if (it == gets_.end()) return;  // timed out meanwhile
  GetOp& op = it->second;
  if (!status.ok()) {
    Status s = status;
    if (s.code == Code::kTimeout) {
      s.message = "get of object " + printableId(op.id) + " timed out after " + seconds(op.timeoutSeconds) +
                  " (the object was never put)";
    } else {
      s.message = "get of object " + printableId(op.id) + " failed: " + s.message;
    }
    finishGet(token, s);
    return;
  }
  if (reply->hasInline) {
    counters_.inlineGets++;
    std::shared_ptr<Buffer> buffer = pool_->allocate(reply->meta.nbytes);
    if (reply->meta.nbytes > 0) std::memcpy(buffer->data(), reply->inlineData.data(), reply->meta.nbytes);
    if (op.timer) loop_.cancelTimer(op.timer);
    pushCompletion(Completion{token, Completion::Kind::kGet, Status(), std::move(buffer), reply->meta});
    gets_.erase(it);
    return;
  }
  // Another get on this node may have started a copy meanwhile.
  if (auto obj = store_->find(op.id)) {
    counters_.localGets++;
    waitForLocal(token, obj);
    return;
  }
  // Prefer a complete copy; a partial one streams as it fills.
  int holder = -1;
  for (const auto& h : reply->holders) {
    if (h.rank == config_.rank) continue;
    if (holder < 0 || h.complete) holder = h.rank;
    if (h.complete) break;
  }
  if (holder < 0) {
    finishGet(token, Status(Code::kNotFound, "get of object " + printableId(op.id) + " failed: no node holds a copy"));
    return;
  }
  std::shared_ptr<LocalObject> obj;
  Status s = store_->create(op.id, reply->meta, /*primary=*/false, &obj);
  if (!s.ok()) {
    finishGet(token, Status(s.code, "get of object " + printableId(op.id) + " failed: " + s.message));
    return;
  }
  counters_.remoteGets++;
  op.stage = "transfer from " + peerName(holder);
  startPull(holder, obj);
  waitForLocal(token, obj);
}

void Node::waitForLocal(uint64_t token, std::shared_ptr<LocalObject> obj) {
  GetOp& op = gets_.at(token);
  op.object = obj;
  if (obj->complete() || obj->failed()) {
    deliver(token);
    return;
  }
  op.listener = obj->addListener([this, token] {
    auto it = gets_.find(token);
    if (it == gets_.end()) return;
    const auto& o = it->second.object;
    if (o->complete() || o->failed()) deliver(token);
  });
}

void Node::deliver(uint64_t token) {
  auto it = gets_.find(token);
  GetOp op = std::move(it->second);
  gets_.erase(it);
  if (op.timer) loop_.cancelTimer(op.timer);
  if (op.listener) op.object->removeListener(op.listener);
  if (op.object->failed()) {
    pushCompletion(Completion{token, Completion::Kind::kGet,
                              Status(op.object->error().code, "get of object " + printableId(op.id) +
                                                                  " failed: " + op.object->error().message),
                              nullptr, {}});
    return;
  }
  if (!op.copy) {
    pushCompletion(Completion{token, Completion::Kind::kGet, Status(), op.object->buffer(), op.object->meta()});
    return;
  }
  workers_->submit([this, token, obj = op.object] {
    Completion c{token, Completion::Kind::kGet, Status(), nullptr, obj->meta()};
    try {
      c.buffer = pool_->allocate(obj->size());
      if (obj->size() > 0) std::memcpy(c.buffer->data(), obj->data(), obj->size());
    } catch (const std::bad_alloc&) {
      c.status = Status(Code::kCapacity, "out of memory copying object " + printableId(obj->id()));
    }
    pushCompletion(std::move(c));
  });
}

void Node::finishGet(uint64_t token, const Status& status) {
  auto it = gets_.find(token);
  if (it == gets_.end()) return;
  GetOp& op = it->second;
  if (op.timer) loop_.cancelTimer(op.timer);
  if (op.listener) op.object->removeListener(op.listener);
  gets_.erase(it);
  pushCompletion(Completion{token, Completion::Kind::kGet, status, nullptr, {}});
}

// ---------------------------------------------------------------- pulls

void Node::startPull(int holder, const std::shared_ptr<LocalObject>& obj) {
  uint64_t request = newRequest();
  pulls_[request] = PullState{holder, obj, 0};
  send(holder, wire::Pull{request, obj->id(), 0});
}

uint8_t* Node::dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return nullptr;  // cancelled or failed: discard
  PullState& pull = it->second;
  if (conn.peerRank() != pull.rank || offset != pull.expected || size > pull.object->size() - offset) {
    HLOG(kWarn, "out-of-order data for %s from %s", printableId(pull.object->id()).c_str(), conn.describe().c_str());
    conn.close(Status(Code::kProtocol, "data frame out of order"));
    return nullptr;
  }
  pull.expected += size;
  return pull.object->data() + offset;
}

void Node::onDataReceived(Connection&, uint64_t request, uint64_t end) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return;
  auto obj = it->second.object;
  counters_.bytesReceived += end - obj->watermark();
  obj->advance(end);
  if (end == obj->size()) finishPull(request);
}

void Node::finishPull(uint64_t request) {
  auto it = pulls_.find(request);
  auto obj = it->second.object;
  pulls_.erase(it);
  counters_.pullsCompleted++;
  // This node now holds a complete copy and can serve later gets of it.
  send(shardOf(obj->id()), wire::HolderUpdate{obj->id(), config_.rank, wire::HolderState::kComplete});
}

void Node::failPull(uint64_t request, const Status& why) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return;
  auto obj = it->second.object;
  int rank = it->second.rank;
  pulls_.erase(it);
  if (store_->find(obj->id()) == obj) store_->remove(obj->id());
  std::string where = why.code == Code::kPeerFailed ? why.message
                                                     : "transfer from " + peerName(rank) + " failed: " + why.message;
  obj->fail(Status(why.code, where));
}

}  // namespace hoplite
