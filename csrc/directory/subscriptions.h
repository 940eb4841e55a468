// A node's subscriptions to where objects are: the object's directory shard
// sends the locations at once (whether the object exists yet or not) and
// after every change (DirectoryShard::subscribe); callers on any thread wait
// for news. A subscription follows its id's share of the directory when that
// moves (rehome sends it again to the new shard).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "net/event_loop.h"
#include "net/transport.h"
#include "wire/messages.h"

namespace hoplite {

class LocationSubscriptions {
 public:
  using ShardOf = std::function<int(const std::string& id)>;  // loop thread
  using Send = std::function<void(int rank, const wire::Subscribe& msg)>;  // loop thread

  LocationSubscriptions(EventLoop& loop, int rank, ShardOf shardOf, Send send);

  // Any thread. Returns a handle for next/unsubscribe.
  uint64_t subscribe(const std::string& id);
  // Waits up to the timeout for locations newer than version `seen` (0: the
  // first), and gives the latest (changes close together arrive merged).
  Status next(uint64_t handle, uint64_t seen, double timeoutSeconds, wire::Locations* out, uint64_t* version);
  void unsubscribe(uint64_t handle);
  size_t count();
  // Waiters return at once (kShutdown), now and later.
  void stop();

  // Loop thread.
  void onLocations(Connection& conn, const wire::Locations& msg);
  // A shard moved or returned: subscriptions whose id is hosted elsewhere
  // now are sent there (what their old shard still says is ignored).
  void rehome();

 private:
  struct Subscription {
    std::string id;
    int shard = -1;        // the rank it was sent to, whose news count
    uint64_t version = 0;  // news received so far
    wire::Locations latest;
  };
  EventLoop& loop_;
  const int rank_;
  ShardOf shardOf_;
  Send send_;
  std::mutex mutex_;  // subscriptions are read by callers, written by the loop
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Subscription> subscriptions_;
  uint64_t next_ = 1;
  bool stopped_ = false;
};

}  // namespace hoplite
