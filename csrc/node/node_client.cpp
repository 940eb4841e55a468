// What a node asks of others: put, get (lookup + pull), delete.
#include <algorithm>
#include <cstring>
#include <utility>

#include "common/chunking.h"
#include "common/logging.h"
#include "node/node.h"

namespace hoplite {
namespace {
// A put copies objects up to this size in the caller's thread, overlapped with
// the registration round trip; larger ones are copied in the background.
constexpr uint64_t kCallerCopyBytes = 1u << 20;
// A get copies pieces up to this size on the loop thread; larger go to a worker.
constexpr uint64_t kLoopCopyBytes = 256u << 10;
// Lookups one get may make when holders turn out to have dropped their copy.
constexpr int kMaxLookups = 3;
// Senders one pull may lose and replace before it fails.
constexpr int kMaxResumes = 3;
// A get of an object being recomputed looks it up again after this delay,
// doubled each time up to kMaxRetryDelay (its own timeout still applies).
constexpr double kRetryDelay = 0.01;
constexpr double kMaxRetryDelay = 1.0;

// Why the caller's `target` cannot receive object `id` (ok if it can).
Status checkTarget(const std::string& id, const ObjectMeta& meta, const GetTarget& target) {
  if (target.dtype == meta.dtype && target.buffer->size() == meta.nbytes) return Status();
  return Status(Code::kInvalidArgument, "get of object " + printableId(id) + " into out=: the object is " +
                                            describeMeta(meta) + " (" + std::to_string(meta.nbytes) +
                                            " bytes), out= is " + target.dtype + " with " +
                                            std::to_string(target.buffer->size()) + " bytes");
}
}  // namespace

uint64_t Node::chunkFor(uint64_t size) const { return chunkSize(size, config_.chunkBytes); }

void Node::requestStatus(int rank, wire::MsgType type, std::string payload, uint64_t request, StatusCallback cb) {
  if (shuttingDown_) {
    cb(Status(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " is shut down"));
    return;
  }
  requests_.expectStatus(request, rank, std::move(cb));
  peers_->sendTo(rank, type, std::move(payload));
}

void Node::requestShard(const std::string& id, wire::MsgType type, std::string payload, uint64_t request,
                        StatusCallback cb) {
  const int shard = shardOf(id);
  requestStatus(shard, type, payload, request,
                [this, id, type, payload, request, shard, cb = std::move(cb)](const Status& s) mutable {
                  if (s.code == Code::kPeerFailed && !shuttingDown_ && shardOf(id) != shard) {
                    return requestShard(id, type, std::move(payload), request, std::move(cb));
                  }
                  cb(s);
                });
}

uint64_t Node::requestLookup(const std::string& id, double timeoutSeconds, bool locate, int failedHolder,
                             LookupCallback cb, int preferred) {
  const uint64_t request = newRequest();
  if (shuttingDown_) {
    cb(Status(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " is shut down"), nullptr);
    return request;
  }
  sendLookup(
      wire::Lookup{request, id, static_cast<uint64_t>(timeoutSeconds * 1000) + 1, locate, failedHolder, preferred},
      std::move(cb));
  return request;
}

void Node::sendLookup(const wire::Lookup& msg, LookupCallback cb) {
  const int shard = shardOf(msg.id);
  requests_.expectLookup(msg.request, shard, [this, msg, shard, cb](const Status& s, const wire::LookupReply* r) {
    if (s.code == Code::kPeerFailed && !shuttingDown_ && shardOf(msg.id) != shard) {
      // Its shard failed: ask the one that took over, under the same request
      // number, so the caller can still cancel it.
      return sendLookup(msg, cb);
    }
    cb(s, r);
  });
  send(shard, msg);
}

void Node::deleteEverywhere(const std::string& id) {
  uint64_t request = newRequest();
  requestShard(id, wire::MsgType::kDelete, wire::encode(wire::Delete{request, id}), request, [](const Status&) {});
}

// ---------------------------------------------------------------- put

Status Node::put(const std::string& id, const ObjectMeta& meta, const uint8_t* src, uint64_t token,
                 double timeoutSeconds, std::shared_ptr<Buffer> borrowed, std::shared_ptr<DeviceSource> device) {
  Status s = validateId(id);
  if (s.ok()) s = validateMeta(meta);
  if (s.ok() && device && borrowed) s = Status(Code::kInvalidArgument, "put: a device source cannot be borrowed");
  if (!s.ok()) return s;
  if (stopped()) return Status(Code::kShutdown, "put of object " + printableId(id) + ": node is shut down");
  const bool zeroCopy = borrowed != nullptr;
  std::shared_ptr<LocalObject> obj;
  s = store_->create(id, meta, /*primary=*/true, &obj, std::move(borrowed));
  if (!s.ok()) return s;

  const bool small = meta.nbytes <= config_.inlineThresholdBytes || meta.nbytes == 0;
  // Mid-sized objects are copied here while the registration is in flight; the
  // copy of large ones continues in the background after put returns.
  const bool copyHere = !small && !zeroCopy && meta.nbytes <= kCallerCopyBytes;
  // A device's copy can fail: read it before registering, so nothing is undone.
  const bool readFirst = device && (small || copyHere) && meta.nbytes > 0;
  if (readFirst) s = fillFrom(*obj, src, device.get(), 0, meta.nbytes);
  if (!s.ok()) {
    loop_.post([this, id, obj, s] {
      if (store_->find(id) == obj) store_->remove(id);
      obj->fail(s);
    });
    return s;
  }
  wire::Register reg;
  reg.id = id;
  reg.meta = meta;
  reg.holder = config_.rank;
  if (small) {
    if (meta.nbytes > 0) {
      if (!zeroCopy && !readFirst) std::memcpy(obj->data(), src, meta.nbytes);
      reg.inlineData.assign(reinterpret_cast<const char*>(obj->data()), meta.nbytes);
    }
    reg.hasInline = true;
  }
  reg.complete = small || zeroCopy;
  // Whoever comes first, the shard's answer (1) or the caller giving up (2), decides.
  auto decided = std::make_shared<std::atomic<int>>(0);
  auto registered = startOnLoop(loop_, [this, reg = std::move(reg), obj, decided](std::function<void(Status)> done) mutable {
    if (reg.complete) obj->advance(obj->size());
    uint64_t request = newRequest();
    reg.request = request;
    std::string id = reg.id;
    requestShard(id, wire::MsgType::kRegister, wire::encode(reg), request, [this, id, decided, done](const Status& s) {
      if (decided->exchange(1) == 2 && s.ok()) deleteEverywhere(id);  // the put timed out before this answer came
      done(s);
    });
  });
  if (copyHere) {
    if (!readFirst) std::memcpy(obj->data(), src, meta.nbytes);
    loop_.post([obj] { obj->advance(obj->size()); });
  }
  s = awaitStatus(registered, timeoutSeconds, "registering object " + printableId(id));
  if (s.code == Code::kTimeout && decided->exchange(2) == 1) s = registered.get();  // answered just in time
  if (!s.ok()) {
    obj->abandoned = true;
    loop_.post([this, id, obj, s] {
      if (store_->find(id) == obj) store_->remove(id);
      obj->fail(s);
    });
    if (s.code == Code::kAlreadyExists) s.message = "put of object " + printableId(id) + " failed: it already exists";
    return s;
  }
  if (small || copyHere || zeroCopy) {
    if (copyHere) {
      loop_.post([this, obj] {
        send(shardOf(obj->id()), wire::HolderUpdate{obj->id(), config_.rank, wire::HolderState::kComplete, -1});
      });
    }
    pushCompletion(Completion{token, Completion::Kind::kPutCopied, Status(), nullptr, {}});
  } else {
    putCopies_->submit([this, obj, src, device = std::move(device), token] { copyIn(obj, src, device, token); });
  }
  return Status();
}

Status Node::fillFrom(LocalObject& obj, const uint8_t* src, DeviceSource* device, uint64_t from, uint64_t n) {
  if (!device) {
    std::memcpy(obj.data() + from, src + from, n);
    return Status();
  }
  pool_->pageLock(*obj.buffer());
  Status s = device->read(from, n, obj.data() + from);
  if (!s.ok()) s.message = "put of object " + printableId(obj.id()) + ": copy from the device failed: " + s.message;
  return s;
}

void Node::copyIn(std::shared_ptr<LocalObject> obj, const uint8_t* src, std::shared_ptr<DeviceSource> device,
                  uint64_t token) {
  const uint64_t size = obj->size();
  const uint64_t chunk = chunkFor(size);
  uint64_t done = 0;
  Status status;
  while (done < size && !obj->abandoned.load() && status.ok()) {
    uint64_t n = std::min(chunk, size - done);
    status = fillFrom(*obj, src, device.get(), done, n);
    if (!status.ok()) break;
    done += n;
    loop_.post([obj, done] { obj->advance(done); });
  }
  if (!status.ok()) {
    // Registered already and perhaps partly read by others: gone everywhere.
    HLOG(kWarn, "%s", status.message.c_str());
    loop_.post([this, obj, status] {
      obj->fail(status);
      deleteEverywhere(obj->id());
    });
  } else if (done < size) {
    status = Status(Code::kDeleted, "object " + printableId(obj->id()) + " was deleted during put");
  } else {
    loop_.post([this, obj] {
      send(shardOf(obj->id()), wire::HolderUpdate{obj->id(), config_.rank, wire::HolderState::kComplete, -1});
    });
  }
  pushCompletion(Completion{token, Completion::Kind::kPutCopied, status, nullptr, {}});
}

// ---------------------------------------------------------------- delete

Status Node::remove(const std::string& id, double timeoutSeconds) {
  Status s = validateId(id);
  if (!s.ok()) return s;
  if (stopped()) return Status(Code::kShutdown, "delete of object " + printableId(id) + ": node is shut down");
  auto deleted = startOnLoop(loop_, [this, id](std::function<void(Status)> done) {
    uint64_t request = newRequest();
    requestShard(id, wire::MsgType::kDelete, wire::encode(wire::Delete{request, id}), request, done);
  });
  return awaitStatus(deleted, timeoutSeconds, "deleting object " + printableId(id));
}

// ---------------------------------------------------------------- get

bool Node::get(const std::string& id, double timeoutSeconds, bool copy, uint64_t token, Completion* now,
               const GetTarget* target, int source) {
  Status s = validateId(id);
  if (s.ok() && stopped()) s = Status(Code::kShutdown, "get of object " + printableId(id) + ": node is shut down");
  if (!s.ok()) {
    *now = Completion{token, Completion::Kind::kGet, s, nullptr, {}};
    return true;
  }
  // Fast path, on the caller's thread: a complete local copy. Its memory is
  // pinned while found, so the loop cannot hand that copy to a get meanwhile.
  std::shared_ptr<Buffer> pinned;
  if (auto obj = store_->find(id, &pinned); obj && obj->complete()) {
    counters_.localGets++;
    *now = Completion{token, Completion::Kind::kGet, Status(), pinned, obj->meta()};
    if (target && target->device) {
      now->buffer = nullptr;
      now->status = target->device->prepare(id, obj->meta());
      if (now->status.ok() && obj->size() > 0) now->status = writeToDevice(*target->device, *obj, 0, obj->size());
    } else if (target) {
      now->status = checkTarget(id, obj->meta(), *target);
      now->buffer = now->status.ok() ? target->buffer : nullptr;
      if (now->status.ok() && obj->size() > 0) std::memcpy(target->buffer->data(), obj->data(), obj->size());
    } else if (copy && obj->size() > 0) {
      try {
        now->buffer = pool_->allocate(obj->size());
        std::memcpy(now->buffer->data(), obj->data(), obj->size());
      } catch (const std::bad_alloc&) {
        *now = Completion{token, Completion::Kind::kGet,
                          Status(Code::kCapacity, "out of memory for a copy of object " + printableId(id)), nullptr, {}};
      }
    }
    return true;
  }
  bool posted = loop_.post([this, id, timeoutSeconds, copy, token, target = target ? *target : GetTarget{}, source] {
    if (shuttingDown_) {
      pushCompletion(Completion{token, Completion::Kind::kGet, Status(Code::kShutdown, "node is shut down"), nullptr, {}});
      return;
    }
    GetOp& op = gets_[token];
    op.id = id;
    op.copy = copy || target.buffer || target.device;
    op.target = target;
    op.timeoutSeconds = timeoutSeconds;
    op.source = source;
    op.timer = loop_.addTimer(timeoutSeconds, [this, token] {
      auto it = gets_.find(token);
      if (it == gets_.end()) return;
      it->second.timer = 0;
      const GetOp& op = it->second;
      // Named now: the shard may have moved since the lookup was sent.
      const std::string stage =
          op.stage.empty() ? "waiting for the object to be put; directory shard on " + peers_->peerName(shardOf(op.id)) : op.stage;
      finishGet(token, Status(Code::kTimeout, "get of object " + printableId(op.id) + " timed out after " +
                                                  printableSeconds(op.timeoutSeconds) + " (" + stage + ")"));
    });
    startGet(token);
  });
  if (!posted) {
    *now = Completion{token, Completion::Kind::kGet,
                      Status(Code::kShutdown, "get of object " + printableId(id) + ": node is shut down"), nullptr, {}};
  }
  return !posted;
}

void Node::startGet(uint64_t token) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  GetOp& op = gets_.at(token);
  op.stage.clear();  // at the directory
  op.lookups++;
  const int preferred = std::exchange(op.source, -1);  // asked for once
  fetch(op.id, op.timeoutSeconds, [this, token](const Status& status, std::shared_ptr<LocalObject> obj, int sender) {
    auto it = gets_.find(token);
    if (it == gets_.end()) return;  // timed out meanwhile
    GetOp& op = it->second;
    if (!status.ok()) {
      Status s = status;
      if (s.code == Code::kTimeout) {
        s.message = "get of object " + printableId(op.id) + " timed out after " + printableSeconds(op.timeoutSeconds) +
                    " (the object was never put)";
      } else {
        s.message = "get of object " + printableId(op.id) + " failed: " + s.message;
      }
      finishGet(token, s);
      return;
    }
    if (sender >= 0) op.stage = "transfer from " + peers_->peerName(sender);
    waitForLocal(token, std::move(obj), sender);
  }, preferred);
}

void Node::fetch(const std::string& id, double timeoutSeconds, FetchCallback done, int preferred) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (auto obj = store_->find(id); obj && !shuttingDown_) {
    keepCopy(*obj);
    counters_.localGets++;
    done(Status(), obj, -1);
    return;
  }
  requestLookup(
      id, timeoutSeconds, /*locate=*/false, /*failedHolder=*/-1,
      [this, id, done = std::move(done)](const Status& s, const wire::LookupReply* reply) { onFetchLookup(id, s, reply, done); },
      preferred);
}

void Node::onFetchLookup(const std::string& id, const Status& status, const wire::LookupReply* reply,
                         const FetchCallback& done) {
  if (!status.ok() || reply == nullptr) {
    done(status.ok() ? Status(Code::kProtocol, "lookup of " + printableId(id) + " answered without a location")
                     : status,
         nullptr, -1);
    return;
  }
  const int shard = shardOf(id);
  if (reply->hasInline) {
    // Served from the directory: a standalone copy, not a store entry (the
    // shard does not list this node, so a delete would not reach one).
    counters_.inlineGets++;
    std::shared_ptr<Buffer> buffer = pool_->allocate(reply->meta.nbytes);
    if (reply->meta.nbytes > 0) std::memcpy(buffer->data(), reply->inlineData.data(), reply->meta.nbytes);
    auto obj = std::make_shared<LocalObject>(id, reply->meta, std::move(buffer), /*primary=*/false);
    obj->advance(obj->size());
    done(Status(), obj, -1);
    return;
  }
  // The directory assigned a sender and now lists this node as a partial
  // holder. A copy may have appeared here meanwhile (another get, or a reduce
  // task's output): use it, and give the assigned sender back.
  const int sender = reply->sender;
  if (sender >= config_.worldSize) {
    done(Status(Code::kProtocol, "the directory named rank " + std::to_string(sender) + " as holder of object " +
                                     printableId(id) + ", which does not exist"),
         nullptr, -1);
    return;
  }
  if (auto obj = store_->find(id)) {
    keepCopy(*obj);
    if (sender >= 0) {
      send(shard, wire::HolderUpdate{id, config_.rank,
                                     obj->complete() ? wire::HolderState::kComplete : wire::HolderState::kPartial, sender});
    }
    counters_.localGets++;
    done(Status(), obj, -1);
    return;
  }
  if (sender < 0) {
    done(Status(Code::kNotFound, "no node holds a copy of object " + printableId(id)), nullptr, -1);
    return;
  }
  std::shared_ptr<LocalObject> obj;
  Status s = store_->create(id, reply->meta, /*primary=*/false, &obj);
  if (!s.ok()) {
    send(shard, wire::HolderUpdate{id, config_.rank, wire::HolderState::kRemoved, sender});
    done(s, nullptr, -1);
    return;
  }
  obj->recomputable = reply->recomputable;
  server_->forgetHandedOver(id);  // pulls for this id wait for the new copy again
  counters_.remoteGets++;
  startPull(sender, obj);
  serveParkedPulls(obj);  // later receivers that reached us first
  done(Status(), obj, sender);
}

void Node::waitForLocal(uint64_t token, std::shared_ptr<LocalObject> obj, int sender) {
  GetOp& op = gets_.at(token);
  op.object = obj;
  op.meta = obj->meta();
  // Only a pull from a holder whose memory this node reads. That is known once
  // connected: until then the get hopes, and startPull ends the hope if not.
  const bool readable = sender >= 0 && peers_->sameHostEnabled() &&
                        (peers_->memoryOf(sender) || !peers_->isReady(sender));
  const bool mayTakeOver = readable && op.copy && !op.target.buffer && !op.target.device && obj->size() > 0 &&
                           obj->handOverTo == 0;
  if (mayTakeOver) {
    op.takeOver = true;
    obj->handOverTo = token;
  } else if (op.target.device) {
    Status s = op.target.device->prepare(op.id, op.meta);
    if (!s.ok()) return finishGet(token, s);
  } else if (op.target.buffer) {
    Status s = checkTarget(op.id, op.meta, op.target);
    if (!s.ok()) return finishGet(token, s);
    op.result = op.target.buffer;
  } else if (op.copy && obj->size() > 0 && !allocateResult(token)) {
    return;
  }
  op.listener = obj->addListener([this, token] { progressGet(token); });
  progressGet(token);
}

// Runs whenever the local copy advances: copies what arrived into the caller's
// buffer (so the copy overlaps the transfer) and completes the get at the end.
void Node::progressGet(uint64_t token) {
  auto it = gets_.find(token);
  if (it == gets_.end()) return;
  GetOp& op = it->second;
  const auto& obj = op.object;
  const bool evicted = obj->failed() && obj->error().code == Code::kNotFound && op.lookups < kMaxLookups;
  const bool recomputed = obj->failed() && obj->error().code == Code::kRetry;
  if ((evicted || recomputed) && op.copyInFlight) return;  // its end calls this again
  if (evicted || recomputed) {
    // The chosen holder no longer had a copy (evicted since the directory
    // answered), or the object is being recomputed (a reduce lost a
    // participant): look the object up again, from its first byte.
    obj->removeListener(op.listener);
    if (obj->handOverTo == token) obj->handOverTo = 0;
    op.listener = 0;
    op.object.reset();
    op.result.reset();
    op.copied = 0;
    op.takeOver = false;
    if (!recomputed) return startGet(token);
    op.lookups = 0;
    op.stage = "waiting for the object to be recomputed after a participant failed";
    const double delay = std::min(kMaxRetryDelay, kRetryDelay * static_cast<double>(1u << std::min(op.retries++, 16)));
    loop_.addTimer(delay, [this, token] {
      if (gets_.count(token)) startGet(token);
    });
    return;
  }
  if (obj->failed()) {
    finishGet(token, Status(obj->error().code, "get of object " + printableId(op.id) + " failed: " + obj->error().message));
    return;
  }
  if (!op.copy) {
    if (obj->complete()) finishGet(token, Status(), obj->buffer());
    return;
  }
  if (op.takeOver) {
    // Waits for the pull's end (finishPull), unless another reader came.
    if (onlyItsGetUses(*obj)) return;
    return stopTakeOver(token);
  }
  while (!op.copyInFlight) {
    const uint64_t size = obj->size();
    if (op.copied == size) {
      if (obj->complete()) finishGet(token, Status(), op.result);
      return;
    }
    const uint64_t from = op.copied;
    const uint64_t to = obj->watermark();
    // Copy in pieces of at least a chunk, or what is left at the end.
    if (to - from < std::min(chunkFor(size), size - from)) return;
    const auto& device = op.target.device;
    if (to - from <= kLoopCopyBytes && !device) {
      std::memcpy(op.result->data() + from, obj->data() + from, to - from);
      op.copied = to;
      continue;
    }
    op.copyInFlight = true;
    workers_->submit([this, token, obj, result = op.result, device, from, to] {
      Status s;
      if (device) {
        s = writeToDevice(*device, *obj, from, to - from);
      } else {
        std::memcpy(result->data() + from, obj->data() + from, to - from);
      }
      loop_.post([this, token, to, s] {
        auto it = gets_.find(token);
        if (it == gets_.end()) return;  // timed out or failed meanwhile
        it->second.copyInFlight = false;
        if (it->second.ending) return finishGet(token, *it->second.ending);
        if (!s.ok()) return finishGet(token, s);
        it->second.copied = to;
        progressGet(token);
      });
    });
  }
}

bool Node::onlyItsGetUses(const LocalObject& obj) {
  return !obj.primary() && obj.listenerCount() == 1 && obj.buffer().use_count() == 1;
}

void Node::keepCopy(LocalObject& obj) {
  if (obj.handOverTo) stopTakeOver(obj.handOverTo);
}

void Node::stopTakeOver(uint64_t token) {
  auto it = gets_.find(token);
  if (it == gets_.end() || !it->second.takeOver) return;
  GetOp& op = it->second;
  op.takeOver = false;
  if (op.object->handOverTo == token) op.object->handOverTo = 0;
  if (allocateResult(token)) progressGet(token);
}

bool Node::allocateResult(uint64_t token) {
  GetOp& op = gets_.at(token);
  try {
    op.result = pool_->allocate(op.object->size());
    return true;
  } catch (const std::bad_alloc&) {
    finishGet(token, Status(Code::kCapacity, "out of memory for a copy of object " + printableId(op.id)));
    return false;
  }
}

bool Node::handOver(uint64_t token, const std::shared_ptr<LocalObject>& obj, int sender) {
  auto it = gets_.find(token);
  // The store checks the memory's owners again under its lock, which readers
  // on callers' threads take their pin under.
  if (it == gets_.end() || !it->second.takeOver || it->second.object != obj || !obj->complete() ||
      !onlyItsGetUses(*obj) || !store_->removeUnshared(*obj)) {
    return false;
  }
  counters_.copiesHandedOver++;  // before the caller can look
  finishGet(token, Status(), obj->buffer());
  server_->noteHandedOver(obj->id());
  // One message drops this node from the holders and frees its sender.
  send(shardOf(obj->id()), wire::HolderUpdate{obj->id(), config_.rank, wire::HolderState::kRemoved, sender});
  return true;
}

Status Node::writeToDevice(DeviceTarget& device, const LocalObject& obj, uint64_t from, uint64_t n) {
  pool_->pageLock(*obj.buffer());
  Status s = device.write(from, n, obj.data() + from);
  if (!s.ok()) s.message = "get of object " + printableId(obj.id()) + ": copy to the device failed: " + s.message;
  return s;
}

void Node::finishGet(uint64_t token, const Status& status, std::shared_ptr<Buffer> result) {
  auto it = gets_.find(token);
  if (it == gets_.end()) return;
  if (it->second.copyInFlight && (it->second.target.buffer || it->second.target.device)) {
    GetOp& op = it->second;
    if (op.timer) loop_.cancelTimer(op.timer);
    if (op.listener) op.object->removeListener(op.listener);
    op.timer = 0;
    op.listener = 0;
    if (!op.ending) op.ending = status;
    return;
  }
  GetOp op = std::move(it->second);
  gets_.erase(it);
  if (op.timer) loop_.cancelTimer(op.timer);
  if (op.listener) op.object->removeListener(op.listener);
  Completion c{token, Completion::Kind::kGet, status, nullptr, {}};
  if (status.ok()) {
    c.buffer = std::move(result);
    c.meta = std::move(op.meta);
  }
  pushCompletion(std::move(c));
}

// ---------------------------------------------------------------- pulls

void Node::startPull(int holder, const std::shared_ptr<LocalObject>& obj, int resumes) {
  uint64_t request = newRequest();
  const uint64_t offset = obj->watermark();  // 0, or where a failed sender stopped
  pulls_[request] = PullState{holder, obj, offset, resumes};
  // Whether the holder's memory can be read is known once it is connected.
  peers_->whenConnected(holder, [this, request, holder, id = obj->id(), offset](Connection& conn) {
    auto it = pulls_.find(request);
    if (it == pulls_.end()) return;
    it->second.holderMemory = peers_->memoryOf(holder);
    const bool sameHost = it->second.holderMemory != nullptr;
    const uint64_t get = it->second.object->handOverTo;
    conn.sendControl(wire::MsgType::kPull, wire::encode(wire::Pull{request, id, offset, sameHost}));
    if (!sameHost && get) stopTakeOver(get);  // over TCP: the copy stays, the get copies as bytes arrive
  });
}

uint8_t* Node::dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                               std::shared_ptr<const void>* keepalive) {
  if (Mailbox::carriesMessage(request)) return mailbox_->dataDestination(conn, request, offset, size, keepalive);
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return nullptr;  // cancelled or failed: discard
  PullState& pull = it->second;
  if (conn.peerRank() != pull.rank || offset != pull.expected || size > pull.object->size() - offset) {
    HLOG(kWarn, "out-of-order data for %s from %s: offset %llu, expected %llu from rank %d",
         printableId(pull.object->id()).c_str(), conn.describe().c_str(), static_cast<unsigned long long>(offset),
         static_cast<unsigned long long>(pull.expected), pull.rank);
    conn.close(Status(Code::kProtocol, "data frame out of order"));
    return nullptr;
  }
  pull.expected += size;
  *keepalive = pull.object->buffer();
  return pull.object->data() + offset;
}

void Node::onDataReceived(Connection& conn, uint64_t request, uint64_t end) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (Mailbox::carriesMessage(request)) {
    mailbox_->onDataReceived(conn, request, end);
    return;
  }
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
  int sender = it->second.rank;
  const bool sameHost = it->second.holderMemory != nullptr;
  pulls_.erase(it);  // first: telling the holder may close the connection, which fails its pulls
  counters_.pullsCompleted++;
  HLOG(kDebug, "pull of %s from rank %d done at %.3f s (steady clock)", printableId(obj->id()).c_str(), sender, now());
  const uint64_t get = std::exchange(obj->handOverTo, 0);
  const bool handedOver = get && sameHost && handOver(get, obj, sender);  // the get completes first
  if (sameHost) releaseHolder(request, sender);
  if (handedOver) return;
  if (get) stopTakeOver(get);
  // This node now holds a complete copy, and its sender is free for others.
  send(shardOf(obj->id()), wire::HolderUpdate{obj->id(), config_.rank, wire::HolderState::kComplete, sender});
}

void Node::failPull(uint64_t request, const Status& why) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return;
  if (it->second.reading) {  // it ends when the read returns: nothing may resume under it
    if (!it->second.failure) it->second.failure = why;
    return;
  }
  auto obj = it->second.object;
  int rank = it->second.rank;
  int resumes = it->second.resumes;
  const bool sameHost = it->second.holderMemory != nullptr;
  pulls_.erase(it);  // first: telling the holder may close the connection, which fails its pulls
  if (sameHost) releaseHolder(request, rank);
  // A holder that handed its copy to a get is no failure: not counted.
  const bool moved = why.code == Code::kMoved;
  if ((moved || (why.code == Code::kPeerFailed && resumes < kMaxResumes)) && !shuttingDown_ &&
      store_->find(obj->id()) == obj) {
    resumePull(obj, rank, moved ? resumes : resumes + 1, why);
    return;
  }
  dropFailedCopy(obj, rank, why);
}

// The sender died mid-transfer, or had handed its copy to a get (kMoved): ask
// the shard for another holder (it skips that one and never picks one fed
// through this node) and continue from the bytes already here, so only what
// was in flight moves again.
void Node::resumePull(std::shared_ptr<LocalObject> obj, int deadRank, int resumes, Status why) {
  requestLookup(obj->id(), config_.connectTimeoutSeconds, /*locate=*/false, deadRank,
                [this, obj, deadRank, resumes, why](const Status& s, const wire::LookupReply* reply) {
                  if (store_->find(obj->id()) != obj) return;  // dropped meanwhile
                  if (!s.ok() || reply == nullptr || reply->sender < 0 || reply->sender == config_.rank ||
                      reply->sender >= config_.worldSize) {
                    if (why.code != Code::kMoved) return dropFailedCopy(obj, -1, why);
                    // Nothing failed: what the directory said is the news (deleted, no copy left).
                    const Status none(Code::kNotFound, "no node holds a copy of object " + printableId(obj->id()));
                    return dropFailedCopy(obj, -1, s.ok() ? none : s);
                  }
                  if (why.code == Code::kMoved) {
                    HLOG(kDebug, "pull of %s goes to %s instead: %s", printableId(obj->id()).c_str(),
                         peers_->peerName(reply->sender).c_str(), why.message.c_str());
                  } else {
                    counters_.pullResumes++;
                    HLOG(kInfo, "resuming %s from %s at byte %llu after %s failed", printableId(obj->id()).c_str(),
                         peers_->peerName(reply->sender).c_str(), static_cast<unsigned long long>(obj->watermark()),
                         peers_->peerName(deadRank).c_str());
                  }
                  startPull(reply->sender, obj, resumes);
                });
}

void Node::dropFailedCopy(const std::shared_ptr<LocalObject>& obj, int rank, const Status& why) {
  if (store_->find(obj->id()) == obj) store_->remove(obj->id());
  send(shardOf(obj->id()), wire::HolderUpdate{obj->id(), config_.rank, wire::HolderState::kRemoved, rank});
  std::string where = why.code == Code::kPeerFailed || rank < 0
                          ? why.message
                          : "transfer from " + peers_->peerName(rank) + " failed: " + why.message;
  // No copy left to resume from, but its reduce recomputes it: its readers wait.
  const bool recomputed = obj->recomputable && why.code == Code::kPeerFailed;
  obj->fail(Status(recomputed ? Code::kRetry : why.code, where));
}

}  // namespace hoplite
