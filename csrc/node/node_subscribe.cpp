// Subscriptions to where objects are. The directory shard pushes Locations
// frames (see DirectoryShard::subscribe); callers on any thread wait for them.
#include "node/node.h"

namespace hoplite {

uint64_t Node::subscribe(const std::string& id) {
  uint64_t handle;
  {
    std::lock_guard<std::mutex> lock(subscriptionMutex_);
    handle = nextSubscription_++;
    subscriptions_[handle].id = id;
  }
  loop_.post([this, handle, id] {
    int shard = shardOf(id);
    {
      std::lock_guard<std::mutex> lock(subscriptionMutex_);
      auto it = subscriptions_.find(handle);
      if (it == subscriptions_.end()) return;  // cancelled already
      it->second.shard = shard;
    }
    send(shard, wire::Subscribe{handle, id, false});
  });
  return handle;
}

Status Node::nextLocations(uint64_t handle, uint64_t seen, double timeoutSeconds, wire::Locations* out,
                           uint64_t* version) {
  std::unique_lock<std::mutex> lock(subscriptionMutex_);
  auto it = subscriptions_.find(handle);
  if (it == subscriptions_.end()) return Status(Code::kNotFound, "the subscription was cancelled");
  const std::string id = it->second.id;
  auto news = [&] {
    it = subscriptions_.find(handle);
    return stopped() || it == subscriptions_.end() || it->second.version > seen;
  };
  if (!subscriptionCv_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds), news)) {
    return Status(Code::kTimeout, "no news of where object " + printableId(id) + " is within " +
                                      std::to_string(timeoutSeconds) + " s");
  }
  if (it == subscriptions_.end()) return Status(Code::kNotFound, "the subscription to object " + printableId(id) + " was cancelled");
  if (it->second.version <= seen) return Status(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " shut down");
  *out = it->second.latest;
  *version = it->second.version;
  return Status();
}

void Node::unsubscribe(uint64_t handle) {
  int shard;
  wire::Subscribe cancel{handle, {}, true};
  {
    std::lock_guard<std::mutex> lock(subscriptionMutex_);
    auto it = subscriptions_.find(handle);
    if (it == subscriptions_.end()) return;
    shard = it->second.shard;
    cancel.id = std::move(it->second.id);
    subscriptions_.erase(it);
  }
  subscriptionCv_.notify_all();
  if (shard < 0) return;  // not sent yet: subscribe()'s post finds it gone and sends nothing
  loop_.post([this, shard, cancel] { send(shard, cancel); });
}

void Node::handleSubscribe(Connection& conn, const wire::Subscribe& msg) {
  if (msg.cancel) {
    directory_->unsubscribe(msg.id, conn.peerRank(), msg.request);
  } else {
    directory_->subscribe(msg.id, conn.peerRank(), msg.request);
  }
}

void Node::onLocations(Connection& conn, const wire::Locations& msg) {
  {
    std::lock_guard<std::mutex> lock(subscriptionMutex_);
    auto it = subscriptions_.find(msg.request);
    // News from a shard it was moved away from, or after unsubscribing, is stale.
    if (it == subscriptions_.end() || it->second.id != msg.id || it->second.shard != conn.peerRank()) return;
    it->second.latest = msg;
    it->second.version++;
  }
  subscriptionCv_.notify_all();
}

void Node::resubscribeFrom(int rank) {
  std::vector<std::pair<int, wire::Subscribe>> moved;
  {
    std::lock_guard<std::mutex> lock(subscriptionMutex_);
    for (auto& [handle, sub] : subscriptions_) {
      if (sub.shard != rank) continue;
      sub.shard = shardOf(sub.id);
      moved.emplace_back(sub.shard, wire::Subscribe{handle, sub.id, false});
    }
  }
  for (const auto& [shard, msg] : moved) send(shard, msg);
}

}  // namespace hoplite
