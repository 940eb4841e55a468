#include "directory/subscriptions.h"

#include <chrono>
#include <utility>
#include <vector>

#include "common/object_meta.h"

namespace hoplite {

LocationSubscriptions::LocationSubscriptions(EventLoop& loop, int rank, ShardOf shardOf, Send send)
    : loop_(loop), rank_(rank), shardOf_(std::move(shardOf)), send_(std::move(send)) {}

uint64_t LocationSubscriptions::subscribe(const std::string& id) {
  uint64_t handle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    handle = next_++;
    subscriptions_[handle].id = id;
  }
  loop_.post([this, handle, id] {
    int shard = shardOf_(id);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = subscriptions_.find(handle);
      if (it == subscriptions_.end()) return;  // cancelled already
      it->second.shard = shard;
    }
    send_(shard, wire::Subscribe{handle, id, false});
  });
  return handle;
}

Status LocationSubscriptions::next(uint64_t handle, uint64_t seen, double timeoutSeconds, wire::Locations* out,
                                   uint64_t* version) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = subscriptions_.find(handle);
  if (it == subscriptions_.end()) return Status(Code::kNotFound, "the subscription was cancelled");
  const std::string id = it->second.id;
  auto news = [&] {
    it = subscriptions_.find(handle);
    return stopped_ || it == subscriptions_.end() || it->second.version > seen;
  };
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds), news)) {
    return Status(Code::kTimeout, "no news of where object " + printableId(id) + " is within " +
                                      std::to_string(timeoutSeconds) + " s");
  }
  if (it == subscriptions_.end()) {
    return Status(Code::kNotFound, "the subscription to object " + printableId(id) + " was cancelled");
  }
  if (it->second.version <= seen) return Status(Code::kShutdown, "node on rank " + std::to_string(rank_) + " shut down");
  *out = it->second.latest;
  *version = it->second.version;
  return Status();
}

void LocationSubscriptions::unsubscribe(uint64_t handle) {
  int shard;
  wire::Subscribe cancel{handle, {}, true};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = subscriptions_.find(handle);
    if (it == subscriptions_.end()) return;
    shard = it->second.shard;
    cancel.id = std::move(it->second.id);
    subscriptions_.erase(it);
  }
  cv_.notify_all();
  if (shard < 0) return;  // not sent yet: subscribe()'s post finds it gone and sends nothing
  loop_.post([this, shard, cancel] { send_(shard, cancel); });
}

size_t LocationSubscriptions::count() {
  std::lock_guard<std::mutex> lock(mutex_);
  return subscriptions_.size();
}

void LocationSubscriptions::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  cv_.notify_all();
}

void LocationSubscriptions::onLocations(Connection& conn, const wire::Locations& msg) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = subscriptions_.find(msg.request);
    // News from a shard it was moved away from, or after unsubscribing, is stale.
    if (it == subscriptions_.end() || it->second.id != msg.id || it->second.shard != conn.peerRank()) return;
    it->second.latest = msg;
    it->second.version++;
  }
  cv_.notify_all();
}

void LocationSubscriptions::rehome() {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  std::vector<std::pair<int, wire::Subscribe>> moved;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [handle, sub] : subscriptions_) {
      const int shard = shardOf_(sub.id);
      if (sub.shard < 0 || sub.shard == shard) continue;  // (< 0: not sent yet; subscribe()'s post sends it)
      sub.shard = shard;
      moved.emplace_back(sub.shard, wire::Subscribe{handle, sub.id, false});
    }
  }
  for (const auto& [shard, msg] : moved) send_(shard, msg);
}

}  // namespace hoplite
