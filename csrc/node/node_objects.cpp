// The object API: put (registration, and the copy in), delete, dropping
// this node's copies, and get (transfer/client.h does its work).
#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "common/chunking.h"
#include "common/logging.h"
#include "common/step_trace.h"
#include "node/node.h"

namespace hoplite {
namespace {
// A put copies objects up to this size in the caller's thread, overlapped with
// the registration round trip; larger ones are copied in the background.
constexpr uint64_t kCallerCopyBytes = 1u << 20;
}  // namespace

uint64_t Node::chunkFor(uint64_t size) const { return chunkSize(size, config_.chunkBytes); }

// ---------------------------------------------------------------- put

Status Node::put(const std::string& id, const ObjectMeta& meta, const uint8_t* src, uint64_t token,
                 double timeoutSeconds, bool* copied, std::shared_ptr<Buffer> borrowed,
                 std::shared_ptr<DeviceSource> device) {
  *copied = false;
  Status s = validateId(id);
  if (s.ok()) s = validateMeta(meta);
  if (s.ok() && device && borrowed) s = Status(Code::kInvalidArgument, "put: a device source cannot be borrowed");
  if (!s.ok()) return s;
  if (stopped()) return Status(Code::kShutdown, "put of object " + printableId(id) + ": node is shut down");
  traceStep(Step::kPutCall, id);
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
    std::string id = reg.id;
    obj->registering = true;
    directory_->requestRegister(std::move(reg), [this, id, obj, decided, done](const Status& s) {
      obj->registering = false;
      traceStep(Step::kPutRegistered, id);
      if (decided->exchange(1) == 2 && s.ok()) directory_->deleteEverywhere(id);  // the put timed out before this answer came
      done(s);
    });
  });
  if (copyHere) {
    if (!readFirst) std::memcpy(obj->data(), src, meta.nbytes);
    loop_.post([obj] { obj->advance(obj->size()); });
  }
  // The shard's answer (which may itself be a timeout), including one that
  // came just as the wait ended; else the caller gives up.
  const bool answered = registered.wait_for(std::chrono::duration<double>(timeoutSeconds)) == std::future_status::ready;
  if (answered || decided->exchange(2) == 1) {
    s = registered.get();
  } else {
    s = Status(Code::kTimeout, "registering object " + printableId(id) + " timed out after " +
                                   printableSeconds(timeoutSeconds));
  }
  if (!s.ok()) {
    obj->abandoned = true;
    loop_.post([this, id, obj, s] {
      if (store_->find(id) == obj) store_->remove(id);
      obj->fail(s);
      // Listed meanwhile by a re-registration of this node's copies (its shard moved): no longer.
      directory_->updateHolder(id, wire::HolderState::kRemoved);
    });
    if (s.code == Code::kAlreadyExists) s.message = "put of object " + printableId(id) + " failed: it already exists";
    return s;
  }
  if (small || copyHere || zeroCopy) {
    if (copyHere) {
      loop_.post([this, obj] {
        directory_->updateHolder(obj->id(), wire::HolderState::kComplete);
      });
    }
    // Told here, not through a completion: waking the completion thread for it
    // cost more than a 1 KB put's own work on a 2-core host.
    *copied = true;
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
      directory_->deleteEverywhere(obj->id());
    });
  } else if (done < size) {
    status = Status(Code::kDeleted, "object " + printableId(obj->id()) + " was deleted during put");
  } else {
    loop_.post([this, obj] {
      directory_->updateHolder(obj->id(), wire::HolderState::kComplete);
    });
  }
  pushCompletion(Completion{token, Completion::Kind::kPutCopied, status, nullptr, {}});
}

// ---------------------------------------------------------------- delete

Status Node::remove(const std::vector<std::string>& ids, double timeoutSeconds) {
  for (const auto& id : ids) {
    Status s = validateId(id);
    if (!s.ok()) return s;
  }
  if (ids.empty()) return Status();
  const std::string what = ids.size() == 1 ? "object " + printableId(ids[0]) : std::to_string(ids.size()) + " objects";
  if (stopped()) return Status(Code::kShutdown, "delete of " + what + ": node is shut down");
  // Every request at once: one round trip for all, not one each.
  auto deleted = startOnLoop(loop_, [this, ids, what, timeoutSeconds](std::function<void(Status)> done) {
    auto outcomes = std::make_shared<std::vector<Status>>(ids.size());
    auto left = std::make_shared<size_t>(ids.size());
    auto requests = std::make_shared<std::vector<uint64_t>>();
    auto timer = std::make_shared<EventLoop::TimerId>(0);
    for (size_t i = 0; i < ids.size(); ++i) {
      requests->push_back(deleteOne(ids[i], [this, outcomes, left, timer, i, done](const Status& s) {
        (*outcomes)[i] = s;
        if (--*left > 0) return;
        if (*timer != 0) loop_.cancelTimer(*timer);
        for (const Status& outcome : *outcomes) {
          if (!outcome.ok()) return done(outcome);  // the first failure, in the order asked
        }
        done(Status());
      }));
    }
    if (*left == 0) return;  // answered already (e.g. the node is closing)
    // Given up on here, where the error can say whose answer it waited for.
    *timer = loop_.addTimer(timeoutSeconds, [this, requests, done, what, timeoutSeconds] {
      done(deleteTimedOut(what, timeoutSeconds, *requests));
    });
  });
  return awaitStatus(deleted, timeoutSeconds + kLoopAnswerGraceSeconds, "deleting " + what);
}

Status Node::deleteTimedOut(const std::string& what, double timeoutSeconds, const std::vector<uint64_t>& requests) {
  std::set<int> shards;
  for (uint64_t request : requests) {
    const int rank = directory_->requests().rankOf(request);
    if (rank >= 0) shards.insert(rank);
  }
  std::string message = "deleting " + what + " timed out after " + printableSeconds(timeoutSeconds);
  if (shards.empty()) return Status(Code::kTimeout, message);
  std::string names;
  for (int rank : shards) names += (names.empty() ? "" : ", ") + peers_->peerName(rank);
  return Status(Code::kTimeout, message + ": no answer from the directory shard" + (shards.size() > 1 ? "s" : "") +
                                    " at " + names + " (a shard answers once every holder dropped its copy)");
}

uint64_t Node::deleteOne(const std::string& id, std::function<void(const Status&)> done) {
  std::shared_ptr<LocalObject> held = store_->find(id);
  return directory_->requestDelete(id, /*retract=*/false, [this, id, held, done = std::move(done)](const Status& s) {
    if (s.code == Code::kNotFound && held && held->failed() && held->error().code == Code::kDeleted) {
      // A delete dropped this node's copy meanwhile: most likely this one,
      // applied by a shard host that failed before it answered, and asked
      // again at a successor that never heard of the id.
      return done(Status());
    }
    // The directory forgot this node's copy (its peers took this process
    // for failed while it was stalled, before it listed its copies again):
    // dropping the copy is the delete.
    auto obj = s.code == Code::kNotFound ? store_->find(id) : nullptr;
    if (obj && !obj->failed()) {
      dropLocalCopy(id, Status(Code::kDeleted, "object " + printableId(id) + " was deleted"));
      // Again, after any listing of this copy (or another holder's) that was on its way.
      directory_->deleteEverywhere(id);
      return done(Status());
    }
    done(s);
  });
}

// ---------------------------------------------------------------- dropping copies

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
  client_->endPullsOf(obj);
  obj->fail(why);  // wakes gets waiting on it and streams serving from it
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
  return client_->get(id, timeoutSeconds, copy, token, now, target, source);
}

}  // namespace hoplite
