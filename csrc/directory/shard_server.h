// This node's share of the object directory, answering what peers send it:
// registrations, holder updates, lookups, deletes (answered once every holder
// dropped its copy) and subscriptions. Loop thread only.
#pragma once

#include "directory/directory_client.h"
#include "directory/directory_shard.h"
#include "net/event_loop.h"
#include "net/message_router.h"
#include "net/peer_links.h"
#include "wire/messages.h"

namespace hoplite {

class ShardServer {
 public:
  // `directory` sends the DropCopy requests of deletes.
  ShardServer(EventLoop& loop, PeerLinks& peers, DirectoryClient& directory, int worldSize);

  // Register, HolderUpdate, Lookup, Delete, Subscribe.
  void registerHandlers(MessageRouter& router);
  // A peer this node will not talk to again: its copies leave the lists.
  void forgetHolder(int rank) { shard_.forgetHolder(rank); }
  uint64_t waitingLookups() const { return shard_.waitingLookups(); }
  // Some ids' home rank rejoined: what this shard held for them goes (see DirectoryShard::handOver).
  void handOver();

 private:
  // kMoved: an id this node's directory share does not hold (any more, or yet).
  Status notHostedHere(const std::string& id) const;
  void handleRegister(Connection& conn, const wire::Register& msg);
  void handleHolderUpdate(Connection& conn, const wire::HolderUpdate& msg);
  void handleLookup(Connection& conn, const wire::Lookup& msg);
  void handleDelete(Connection& conn, const wire::Delete& msg);
  void handleSubscribe(Connection& conn, const wire::Subscribe& msg);
  // Asks `holder` to drop its copy of `id`; `done` runs once it did (or is gone).
  void dropCopyAt(int holder, const std::string& id, bool retract, RequestTracker::StatusCallback done);

  PeerLinks& peers_;
  DirectoryClient& directory_;
  const int worldSize_;
  DirectoryShard shard_;
};

}  // namespace hoplite
