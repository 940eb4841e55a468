// Where ids' directory entries live, and the requests this node makes.
#include "directory/directory_client.h"

#include <utility>

#include "common/hash.h"
#include "common/logging.h"

namespace hoplite {

DirectoryClient::DirectoryClient(EventLoop& loop, PeerLinks& peers, ObjectStore& store, DirectoryClientConfig config,
                                 std::function<void(int rank)> onShardMoved)
    : loop_(loop), peers_(peers), store_(store), config_(config), onShardMoved_(std::move(onShardMoved)) {}

Status DirectoryClient::closedError() const {
  return Status(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " is shut down");
}

int DirectoryClient::shardOf(const std::string& id) const {
  return shardHost(static_cast<int>(fnv1a(id) % static_cast<uint64_t>(config_.worldSize)));
}

int DirectoryClient::shardHost(int rank) const {
  while (moved_.count(rank)) rank = (rank + 1) % config_.worldSize;  // one always stays (moveShardFrom)
  return rank;
}

void DirectoryClient::moveShardFrom(int rank) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  // One shard always stays (a member could claim every rank failed).
  if (rank < 0 || rank >= config_.worldSize || moved_.count(rank) || moved_.size() + 1 >= static_cast<size_t>(config_.worldSize) || closing_) {
    return;
  }
  std::vector<std::shared_ptr<LocalObject>> moved;
  for (auto& obj : store_.snapshot()) {
    if (!obj->failed() && shardOf(obj->id()) == rank) moved.push_back(std::move(obj));
  }
  moved_.insert(rank);
  onShardMoved_(rank);
  HLOG(kInfo, "%s is gone (failed or left): its directory shard moves on; re-registering %zu local copies",
       peers_.peerName(rank).c_str(), moved.size());
  // Everyone must agree where ids go: tell the others (who pass it on once).
  for (int r = 0; r < config_.worldSize; ++r) {
    if (r != config_.rank && r != rank && !moved_.count(r) && !peers_.hasFailed(r)) peers_.send(r, wire::ShardMoved{rank});
  }
  for (const auto& obj : moved) {
    wire::Register reg;
    reg.id = obj->id();
    reg.meta = obj->meta();
    reg.holder = config_.rank;
    reg.complete = obj->complete();
    reg.recomputable = obj->recomputable;
    reg.reannounce = true;
    reg.primary = obj->primary();
    if (reg.complete && obj->size() <= config_.inlineThresholdBytes) {
      reg.hasInline = true;
      reg.inlineData.assign(reinterpret_cast<const char*>(obj->data()), obj->size());
    }
    requestRegister(std::move(reg), [id = obj->id()](const Status& s) {
      if (!s.ok()) HLOG(kDebug, "re-registering %s: %s", printableId(id).c_str(), s.message.c_str());
    });
  }
}

void DirectoryClient::requestStatus(int rank, wire::MsgType type, std::string payload, uint64_t request,
                                    StatusCallback cb) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (closing_) {
    cb(closedError());
    return;
  }
  requests_.expectStatus(request, rank, std::move(cb));
  peers_.sendTo(rank, type, std::move(payload));
}

void DirectoryClient::requestShard(const std::string& id, wire::MsgType type, std::string payload, uint64_t request,
                        StatusCallback cb) {
  const int shard = shardOf(id);
  requestStatus(shard, type, payload, request,
                [this, id, type, payload, request, shard, cb = std::move(cb)](const Status& s) mutable {
                  if (s.code == Code::kPeerFailed && !closing_ && shardOf(id) != shard) {
                    return requestShard(id, type, std::move(payload), request, std::move(cb));
                  }
                  cb(s);
                });
}

uint64_t DirectoryClient::requestLookup(const std::string& id, double timeoutSeconds, bool locate, int failedHolder,
                             LookupCallback cb, int preferred) {
  const uint64_t request = newRequest();
  if (closing_) {
    cb(closedError(), nullptr);
    return request;
  }
  sendLookup(
      wire::Lookup{request, id, static_cast<uint64_t>(timeoutSeconds * 1000) + 1, locate, failedHolder, preferred},
      std::move(cb));
  return request;
}

void DirectoryClient::sendLookup(const wire::Lookup& msg, LookupCallback cb) {
  const int shard = shardOf(msg.id);
  requests_.expectLookup(msg.request, shard, [this, msg, shard, cb](const Status& s, const wire::LookupReply* r) {
    if (s.code == Code::kPeerFailed && !closing_ && shardOf(msg.id) != shard) {
      // Its shard failed: ask the one that took over, under the same request
      // number, so the caller can still cancel it.
      return sendLookup(msg, cb);
    }
    cb(s, r);
  });
  peers_.send(shard, msg);
}

void DirectoryClient::updateHolder(const std::string& id, wire::HolderState state, int sender) {
  peers_.send(shardOf(id), wire::HolderUpdate{id, config_.rank, state, sender});
}

void DirectoryClient::requestDelete(const std::string& id, bool retract, StatusCallback cb) {
  const uint64_t request = newRequest();
  requestShard(id, wire::MsgType::kDelete, wire::encode(wire::Delete{request, id, retract}), request, std::move(cb));
}

void DirectoryClient::requestRegister(wire::Register reg, StatusCallback cb) {
  reg.request = newRequest();
  requestShard(reg.id, wire::MsgType::kRegister, wire::encode(reg), reg.request, std::move(cb));
}

void DirectoryClient::probe(int rank, std::string padding, StatusCallback cb) {
  const uint64_t request = newRequest();
  requestStatus(rank, wire::MsgType::kProbe, wire::encode(wire::Probe{request, std::move(padding)}), request,
                std::move(cb));
}

}  // namespace hoplite
