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
  // `graceSeconds`: how long a rank thought gone has to list its copies again
  // at a shard that took over, before gets of them fail (adoptStandby).
  ShardServer(EventLoop& loop, PeerLinks& peers, DirectoryClient& directory, int worldSize, double graceSeconds);

  // Register, HolderUpdate, Lookup, Delete, Subscribe, ShardHandOver.
  void registerHandlers(MessageRouter& router);
  // A peer this node will not talk to again: its copies leave the lists (and
  // the standby hears where the copies it knew of there are still held).
  void forgetHolder(int rank, bool left = false);
  uint64_t waitingLookups() const { return shard_.waitingLookups(); }
  DirectoryShard::Sizes sizes() const { return shard_.sizes(); }  // loop thread
  // Some ids are hosted elsewhere now (their home rank rejoined, or this
  // process leaves: `leaving` is its rank): what this shard held for them
  // goes, and what it remembers of those gone is sent to their new hosts
  // (DirectoryShard::handOver).
  void handOver(int leaving = -1);
  // Shares moved to this node: what its standby kept for them (deletes, and
  // where puts' copies were) counts here now.
  void adoptStandby();
  // After shares moved or returned: a new standby host hears all that this
  // shard knows for it (it missed what went to the one before); and while
  // this node's own share is moved, it is nobody's standby, so what it kept
  // as one goes (else, back home, it would adopt records gone stale).
  void syncStandby(bool ownShareMoved);

 private:
  // kMoved: an id this node's directory share does not hold (any more, or yet).
  Status notHostedHere(const std::string& id) const;
  void handleRegister(Connection& conn, const wire::Register& msg);
  void handleHolderUpdate(Connection& conn, const wire::HolderUpdate& msg);
  void handleResultFailed(const wire::ResultFailed& msg);
  void handleLookup(Connection& conn, const wire::Lookup& msg);
  void handleDelete(Connection& conn, const wire::Delete& msg);
  void handleSubscribe(Connection& conn, const wire::Subscribe& msg);
  void handleHandOver(const wire::ShardHandOver& msg);
  // Tells the rank that takes this node's shares over, should it die, that
  // `id` was deleted (by the delete `deletedBy`), or put with its copy at
  // `holder` (-1: forget it); batched per pass of the loop.
  void tellStandby(const std::string& id, bool deleted, int holder = -1, uint64_t deletedBy = 0);
  // Names the delete `request` of `rank`'s process, the same at any host (DirectoryShard::remove).
  uint64_t deleteToken(int rank, uint64_t request) const;
  void flushStandby();
  // `gone` to `rank` in ShardHandOver frames of a bounded size.
  void sendHandOver(int rank, bool standby, std::vector<wire::GoneId> gone);
  // Asks `holder` to drop its copy of `id`; `done` runs once it did (or is gone).
  void dropCopyAt(int holder, const std::string& id, bool retract, RequestTracker::StatusCallback done);

  EventLoop& loop_;
  PeerLinks& peers_;
  DirectoryClient& directory_;
  const int worldSize_;
  const double graceSeconds_;
  DirectoryShard shard_;
  int standbyTold_;                      // the standby host that knows all this shard does (syncStandby)
  std::vector<wire::GoneId> toStandby_;  // not sent yet (tellStandby)
};

}  // namespace hoplite
