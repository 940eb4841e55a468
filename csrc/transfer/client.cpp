// Gets: a lookup at the directory, then a local copy to follow (see client.h).
#include "transfer/client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/chunking.h"
#include "common/logging.h"
#include "common/step_trace.h"

namespace hoplite {
namespace {
// A get copies pieces up to this size on the loop thread; larger go to a worker.
constexpr uint64_t kLoopCopyBytes = 256u << 10;
// Lookups one get may make when holders turn out to have dropped their copy.
constexpr int kMaxLookups = 3;
// A get of an object being recomputed looks it up again after this delay,
// doubled each time up to kMaxRetryDelay (its own timeout still applies).
constexpr double kRetryDelay = 0.01;
constexpr double kMaxRetryDelay = 1.0;
constexpr const char* kRecomputing = "waiting for the object to be recomputed after a participant failed";

// Why the caller's `target` cannot receive object `id` (ok if it can).
Status checkTarget(const std::string& id, const ObjectMeta& meta, const GetTarget& target) {
  if (target.dtype == meta.dtype && target.buffer->size() == meta.nbytes) return Status();
  return Status(Code::kInvalidArgument, "get of object " + printableId(id) + " into out=: the object is " +
                                            describeMeta(meta) + " (" + std::to_string(meta.nbytes) +
                                            " bytes), out= is " + target.dtype + " with " +
                                            std::to_string(target.buffer->size()) + " bytes");
}
}  // namespace

// ---------------------------------------------------------------- get

TransferClient::TransferClient(EventLoop& loop, Peers& peers, DirectoryAccess& directory, ObjectStore& store,
                               BufferPool& pool, WorkerPool& copies, TransferServer& server,
                               TransferClientConfig config, CompletionSink complete)
    : loop_(loop),
      peers_(peers),
      directory_(directory),
      store_(store),
      pool_(pool),
      copies_(copies),
      server_(server),
      config_(config),
      complete_(std::move(complete)) {}

void TransferClient::registerHandlers(MessageRouter& router) {
  router.on<wire::DataAt>(Route::kOnEither, [this](Connection& c, const wire::DataAt& m) { handleDataAt(c, m); });
}

uint64_t TransferClient::chunkFor(uint64_t size) const { return chunkSize(size, config_.chunkBytes); }

void TransferClient::shutDown(const Status& why) {
  closing_ = true;
  std::vector<uint64_t> gets;
  for (const auto& entry : gets_) gets.push_back(entry.first);
  for (uint64_t token : gets) finishGet(token, why);
}

bool TransferClient::get(const std::string& id, double timeoutSeconds, bool copy, uint64_t token, Completion* now,
                         const GetTarget* target, int source) {
  // Fast path, on the caller's thread: a complete local copy. Its memory is
  // pinned while found, so the loop cannot hand that copy to a get meanwhile.
  std::shared_ptr<Buffer> pinned;
  if (auto obj = store_.find(id, &pinned); obj && obj->complete()) {
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
        now->buffer = pool_.allocate(obj->size());
        std::memcpy(now->buffer->data(), obj->data(), obj->size());
      } catch (const std::bad_alloc&) {
        *now = Completion{token, Completion::Kind::kGet,
                          Status(Code::kCapacity, "out of memory for a copy of object " + printableId(id)), nullptr, {}};
      }
    }
    return true;
  }
  traceStep(Step::kGetCall, id);
  bool posted = loop_.post([this, id, timeoutSeconds, copy, token, target = target ? *target : GetTarget{}, source] {
    if (closing_) {
      complete_(Completion{token, Completion::Kind::kGet, Status(Code::kShutdown, "node is shut down"), nullptr, {}});
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
      finishGet(token, timedOut(it->second));
    });
    startGet(token);
  });
  if (!posted) {
    *now = Completion{token, Completion::Kind::kGet,
                      Status(Code::kShutdown, "get of object " + printableId(id) + ": node is shut down"), nullptr, {}};
  }
  return !posted;
}

std::string TransferClient::describePullOf(const LocalObject& object) const {
  if (auto it = resuming_.find(&object); it != resuming_.end()) {
    return "asking the directory for another holder than " + peers_.peerName(it->second);
  }
  for (const auto& [request, pull] : pulls_) {
    if (pull.object.get() != &object) continue;
    std::string s = "transfer from " + peers_.peerName(pull.rank);
    // A relay that crawls may only pass on its own sender's slowness.
    if (pull.senderSource >= 0) {
      s += ", a relay still receiving it from " + peers_.peerName(pull.senderSource) + " when assigned";
    }
    return s;
  }
  return "";
}

Status TransferClient::timedOut(const GetOp& op, const std::string& directorySaid) const {
  // The copy's pull as it is now (it may have resumed from another holder since the get began);
  // no pull: the copy is this node's own, being written (a put or a reduce's output).
  std::string stage = op.object ? describePullOf(*op.object) : op.stage;
  if (stage.empty() && op.object) stage = "this node's own copy, still being written";
  if (stage.empty()) {
    // The shard is named now: it may have moved since the lookup was sent.
    const int shard = directory_.shardOf(op.id), home = directory_.homeShardOf(op.id);
    stage = std::string(op.retries ? kRecomputing : "waiting for the object to be put") + "; directory shard on " +
            peers_.peerName(shard);
    if (shard != home) {
      stage += ", standing in for " + peers_.peerName(home) +
               ", which is gone: an object whose every copy was lost with it is not known there";
    }
    if (!directorySaid.empty()) stage += ": " + directorySaid;
  } else if (op.object) {
    // Nothing at all, or a stream that crawls: a silent sender, or a slow link (or its own sender's).
    stage += ": " + std::to_string(op.object->watermark()) + " of " + std::to_string(op.object->size()) +
             " bytes arrived";
  }
  return Status(Code::kTimeout, "get of object " + printableId(op.id) + " timed out after " +
                                    printableSeconds(op.timeoutSeconds) + " (" + stage + ")");
}

void TransferClient::startGet(uint64_t token) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  GetOp& op = gets_.at(token);
  op.state = GetState::kLookingUp;
  op.stage.clear();  // at the directory
  op.lookups++;
  const int preferred = std::exchange(op.source, -1);  // asked for once
  traceStep(Step::kGetLookup, op.id);
  fetch(op.id, op.timeoutSeconds, [this, token](const Status& status, std::shared_ptr<LocalObject> obj, int sender) {
    auto it = gets_.find(token);
    if (it == gets_.end()) return;  // timed out meanwhile
    GetOp& op = it->second;
    if (!status.ok()) {
      finishGet(token, status.code == Code::kTimeout
                           ? timedOut(op, status.message)
                           : Status(status.code, "get of object " + printableId(op.id) + " failed: " + status.message));
      return;
    }
    waitForLocal(token, std::move(obj), sender);
  }, preferred, /*forGet=*/true);
}

void TransferClient::fetch(const std::string& id, double timeoutSeconds, FetchCallback done, int preferred,
                           bool forGet) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (auto obj = store_.find(id); obj && !closing_) {
    if (forGet) traceStep(Step::kGetLocated, id, -1);
    keepCopy(*obj);
    counters_.localGets++;
    done(Status(), obj, -1);
    return;
  }
  directory_.requestLookup(
      id, timeoutSeconds, /*locate=*/false, /*failedHolder=*/-1,
      [this, id, forGet, done = std::move(done)](const Status& s, const wire::LookupReply* reply) {
        onFetchLookup(id, s, reply, done, forGet);
      },
      preferred);
}

void TransferClient::onFetchLookup(const std::string& id, const Status& status, const wire::LookupReply* reply,
                                   const FetchCallback& done, bool forGet) {
  if (forGet) traceStep(Step::kGetLocated, id, status.ok() && reply != nullptr ? reply->sender : -1);
  if (!status.ok() || reply == nullptr) {
    done(status.ok() ? Status(Code::kProtocol, "lookup of " + printableId(id) + " answered without a location")
                     : status,
         nullptr, -1);
    return;
  }
  if (reply->hasInline) {
    // Served from the directory: a standalone copy, not a store entry (the
    // shard does not list this node, so a delete would not reach one).
    counters_.inlineGets++;
    std::shared_ptr<Buffer> buffer = pool_.allocate(reply->meta.nbytes);
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
  if (auto obj = store_.find(id)) {
    keepCopy(*obj);
    if (sender >= 0) {
      directory_.updateHolder(id, obj->complete() ? wire::HolderState::kComplete : wire::HolderState::kPartial, sender);
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
  Status s = store_.create(id, reply->meta, /*primary=*/false, &obj);
  if (!s.ok()) {
    directory_.updateHolder(id, wire::HolderState::kRemoved, sender);
    done(s, nullptr, -1);
    return;
  }
  obj->recomputable = reply->recomputable;
  server_.forgetHandedOver(id);  // pulls for this id wait for the new copy again
  counters_.remoteGets++;
  startPull(sender, reply->senderSource, obj);
  server_.serveParkedPulls(obj);  // later receivers that reached us first
  done(Status(), obj, sender);
}

void TransferClient::waitForLocal(uint64_t token, std::shared_ptr<LocalObject> obj, int sender) {
  GetOp& op = gets_.at(token);
  op.object = obj;
  op.meta = obj->meta();
  // Only a pull from a holder whose memory this node reads. That is known once
  // connected: until then the get hopes, and startPull ends the hope if not.
  const bool readable = sender >= 0 && sender != config_.rank && peers_.sameHostEnabled() &&
                        (peers_.memoryOf(sender) || !peers_.isReady(sender));
  const bool mayTakeOver = readable && op.copy && !op.target.buffer && !op.target.device && obj->size() > 0 &&
                           obj->handOverTo == 0;
  if (mayTakeOver) {
    op.state = GetState::kTakingOver;
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
  if (!mayTakeOver) op.state = GetState::kFollowing;
  op.listener = obj->addListener([this, token] { progressGet(token); });
  progressGet(token);
}

// Runs whenever the local copy advances: copies what arrived into the caller's
// buffer (so the copy overlaps the transfer) and completes the get at the end.
void TransferClient::progressGet(uint64_t token) {
  auto it = gets_.find(token);
  if (it == gets_.end()) return;
  GetOp& op = it->second;
  if (op.state == GetState::kEnding) return;  // its copy's end delivers it
  const auto& obj = op.object;
  const bool evicted = obj->failed() && obj->error().code == Code::kNotFound && op.lookups < kMaxLookups;
  const bool recomputed = obj->failed() && obj->error().code == Code::kRetry;
  if ((evicted || recomputed) && op.state == GetState::kCopying) return;  // its end calls this again
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
    if (!recomputed) return startGet(token);
    op.state = GetState::kWaitingRetry;
    op.lookups = 0;
    op.stage = kRecomputing;
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
  if (op.state == GetState::kTakingOver) {
    // Waits for the pull's end (finishPull), unless another reader came.
    if (onlyItsGetUses(*obj)) return;
    return stopTakeOver(token);
  }
  while (op.state == GetState::kFollowing) {
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
    op.state = GetState::kCopying;
    copies_.submit([this, token, obj, result = op.result, device, from, to] {
      Status s;
      if (device) {
        s = writeToDevice(*device, *obj, from, to - from);
      } else {
        std::memcpy(result->data() + from, obj->data() + from, to - from);
      }
      loop_.post([this, token, to, s] {
        auto it = gets_.find(token);
        if (it == gets_.end()) return;  // timed out or failed meanwhile
        GetOp& op = it->second;
        const bool ended = op.state == GetState::kEnding;
        op.state = GetState::kFollowing;
        if (ended) return finishGet(token, op.ending);
        if (!s.ok()) return finishGet(token, s);
        op.copied = to;
        progressGet(token);
      });
    });
  }
}

bool TransferClient::onlyItsGetUses(const LocalObject& obj) {
  return !obj.primary() && obj.listenerCount() == 1 && obj.buffer().use_count() == 1;
}

void TransferClient::keepCopy(LocalObject& obj) {
  if (obj.handOverTo) stopTakeOver(obj.handOverTo);
}

void TransferClient::stopTakeOver(uint64_t token) {
  auto it = gets_.find(token);
  if (it == gets_.end() || it->second.state != GetState::kTakingOver) return;
  GetOp& op = it->second;
  op.state = GetState::kFollowing;
  if (op.object->handOverTo == token) op.object->handOverTo = 0;
  if (allocateResult(token)) progressGet(token);
}

bool TransferClient::allocateResult(uint64_t token) {
  GetOp& op = gets_.at(token);
  try {
    op.result = pool_.allocate(op.object->size());
    return true;
  } catch (const std::bad_alloc&) {
    finishGet(token, Status(Code::kCapacity, "out of memory for a copy of object " + printableId(op.id)));
    return false;
  }
}

bool TransferClient::handOver(uint64_t token, const std::shared_ptr<LocalObject>& obj, int sender) {
  auto it = gets_.find(token);
  // The store checks the memory's owners again under its lock, which readers
  // on callers' threads take their pin under.
  if (it == gets_.end() || it->second.state != GetState::kTakingOver || it->second.object != obj || !obj->complete() ||
      !onlyItsGetUses(*obj) || !store_.removeUnshared(*obj)) {
    return false;
  }
  counters_.copiesHandedOver++;  // before the caller can look
  finishGet(token, Status(), obj->buffer());
  server_.noteHandedOver(obj->id());
  // One message drops this node from the holders and frees its sender.
  directory_.updateHolder(obj->id(), wire::HolderState::kRemoved, sender);
  return true;
}

Status TransferClient::writeToDevice(DeviceTarget& device, const LocalObject& obj, uint64_t from, uint64_t n) {
  pool_.pageLock(*obj.buffer());
  Status s = device.write(from, n, obj.data() + from);
  if (!s.ok()) s.message = "get of object " + printableId(obj.id()) + ": copy to the device failed: " + s.message;
  return s;
}

void TransferClient::finishGet(uint64_t token, Status status, std::shared_ptr<Buffer> result) {
  auto it = gets_.find(token);
  if (it == gets_.end()) return;
  GetOp& running = it->second;
  const bool writing = running.state == GetState::kCopying || running.state == GetState::kEnding;
  if (writing && (running.target.buffer || running.target.device)) {
    // No write into the caller's memory may follow its completion.
    if (running.timer) loop_.cancelTimer(running.timer);
    if (running.listener) running.object->removeListener(running.listener);
    running.timer = 0;
    running.listener = 0;
    if (running.state == GetState::kCopying) {
      running.state = GetState::kEnding;
      running.ending = status;
    }
    return;
  }
  GetOp op = std::move(it->second);
  gets_.erase(it);
  traceStep(Step::kGetDone, op.id);
  if (op.timer) loop_.cancelTimer(op.timer);
  if (op.listener) op.object->removeListener(op.listener);
  Completion c{token, Completion::Kind::kGet, status, nullptr, {}};
  if (status.ok()) {
    c.buffer = std::move(result);
    c.meta = std::move(op.meta);
  }
  complete_(std::move(c));
}

}  // namespace hoplite
