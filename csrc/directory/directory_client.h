// This node as a client of the directory and of its peers: where each id's
// entry lives (and where it moves when its shard's rank is gone), requests
// to shards and peers that wait for an answer, each answered exactly once,
// and lookups. Loop thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "directory/directory_access.h"
#include "net/event_loop.h"
#include "net/peer_links.h"
#include "net/request_tracker.h"
#include "store/object_store.h"
#include "wire/messages.h"

namespace hoplite {

struct DirectoryClientConfig {
  int rank = 0;
  int worldSize = 1;
  uint64_t inlineThresholdBytes = 0;  // copies re-registered with their bytes up to this size
  uint64_t incarnation = 0;           // of this process
};

class DirectoryClient : public DirectoryAccess {
 public:
  using StatusCallback = RequestTracker::StatusCallback;

  // `onShardsChanged` runs once a shard moved or returned (what follows shards moves too).
  DirectoryClient(EventLoop& loop, PeerLinks& peers, ObjectStore& store, DirectoryClientConfig config,
                  std::function<void()> onShardsChanged);

  // The rank hosting an id's directory entry: its hash's rank (its home), or,
  // while that rank's process is gone, the next rank after it that is not.
  int shardOf(const std::string& id) const override;
  int homeShardOf(const std::string& id) const override;
  bool hosts(const std::string& id) const { return shardOf(id) == config_.rank; }
  int rank() const { return config_.rank; }
  // Who hosts the share of the directory that `homeRank` had.
  int shardHost(int homeRank) const;
  // Who would host this node's shares if its process died (-1: nobody).
  int standbyHost() const;
  bool hasMoved(int homeRank) const { return moved_.count(homeRank) > 0; }
  // Whether `rank` is a member to tell of moves: not failed nor leaving, and
  // either its share has not moved or this node still hears from it.
  bool isLiveMember(int rank) const;
  // The shards that moved, and the processes whose death moved them.
  std::vector<wire::ShareState> movedShards() const;
  // The latest return of each rank's share (ShardReturned) this node heard
  // of, for ranks whose process is still the one that took it back.
  std::vector<wire::ShareState> returnedShards() const;
  // `rank`'s process `incarnation` (0: unknown) is gone: its share of the
  // directory moves on, the other members hear of it, and this node registers
  // there its copies of the objects that were listed on it. News of another
  // process than the one this node knows of that rank changes nothing. One
  // share always stays (a member could claim every rank failed).
  // `sawItGo`: this node's own failure detection gave up on it (this is not
  // news from another member): the rank is told too, as it may live on,
  // taken for failed while its heartbeats were lost; then it hears of its
  // move at once instead of when it next dials a member (a dead one's
  // connect is refused).
  void moveShardFrom(int rank, uint64_t incarnation, bool sawItGo = false);
  // A member's news that a share moved (ShardMoved, or a hello ack's list):
  // moveShardFrom, unless the share returned since or the news is of another
  // process of that rank. Returns false for such stale news.
  bool hearShardMoved(const wire::ShareState& news);
  // A member's news that a process back from a stall or a cut-off took its
  // share back (ShardReturned, or a hello ack's list), newer than any this
  // node heard: the share returns to it, the other members hear of it, and
  // this node registers there its copies of the objects whose entries live
  // there (that process handed its share over when it heard that it moved).
  // A rank this node has given up on since, or that leaves, has its share
  // moved on again at once.
  void hearShardReturned(const wire::ShareState& news);
  // This process, taken for failed while it was stalled or cut off, takes its
  // share back and tells the members. False: its share has not moved, or it leaves.
  bool takeShareBack();
  // A new process of `rank` joined (PeerLinks::incarnationOf tells it): a
  // share that moved away from its rank returns to it, and this node
  // registers there its copies of the objects that are listed there now
  // (also when it had not moved: the new process starts with an empty share).
  void shardReturned(int rank);
  // Whether the move this node took `rank`'s share for was of another process
  // than the one it now knows runs there: news a process heard before it
  // heard from that rank, of a process that has left or died since (its
  // successor's share is its own).
  bool movedFromAnotherProcess(int rank) const;
  // This process (`incarnation`) leaves: its share of the directory moves on
  // here as it does at the peers that hear of it (moveShardFrom). Returns the
  // ranks that host what this node hosted (none if its share is the last).
  std::set<int> leave(uint64_t incarnation);
  // Registers this node's copies of the objects `picked` at their shard (again).
  void reRegisterCopies(const std::function<bool(const std::string& id)>& picked);
  // Shares of the directory that have moved (any thread, for stats).
  uint64_t shardsMoved() const { return movedCount_.load(); }

  uint64_t newRequest() override { return nextRequest_++; }
  RequestTracker& requests() { return requests_; }
  // Sends a request to `rank` (after `delay` seconds); `cb` runs once, with
  // its StatusReply or a failure.
  void requestStatus(int rank, wire::MsgType type, std::string payload, uint64_t request, StatusCallback cb,
                     double delay = 0);
  uint64_t requestLookup(const std::string& id, double timeoutSeconds, bool locate, int failedHolder,
                         LookupCallback cb, int preferred = -1) override;
  void updateHolder(const std::string& id, wire::HolderState state, int sender = -1) override;
  // Deletes `id` everywhere (`retract`: it is being recomputed; `ifToken`:
  // only its registration under that token, see wire::IdRequest); `cb` runs
  // once: with the shard's answer, which comes after every holder dropped its
  // copy, or with a failure. Returns the request's number (RequestTracker).
  uint64_t requestDelete(const std::string& id, bool retract, StatusCallback cb, uint64_t ifToken = 0);
  // Registers `reg` (its request id is given here) at its id's shard.
  void requestRegister(wire::Register reg, StatusCallback cb);
  // Tells `id`'s shard that the reduce into it failed for good (one way).
  void reportResultFailed(const std::string& id, const Status& why) {
    peers_.send(shardOf(id), wire::ResultFailed{id, why});
  }
  // Fire and forget.
  void deleteEverywhere(const std::string& id, uint64_t ifToken = 0) {
    requestDelete(id, /*retract=*/false, [](const Status&) {}, ifToken);
  }
  // Asks `rank` for an answer, carrying `padding`; `cb` runs once.
  void probe(int rank, std::string padding, StatusCallback cb);

  // Shutdown: nothing new is sent or retried from now on; failAll then
  // answers what still waits.
  void close() { closing_ = true; }
  void failAll(const Status& why) { requests_.failRank(-1, why); }

 private:
  // A request to the id's directory shard, sent again to its successor if
  // that shard fails before answering, and again shortly (until `deadline`)
  // if the shard answers that it does not host the id (kMoved).
  void requestShard(const std::string& id, wire::MsgType type, std::string payload, uint64_t request,
                    StatusCallback cb, double deadline, double delay = 0);
  // The same for a lookup, whose own timeout is the deadline.
  void sendLookup(const wire::Lookup& msg, LookupCallback cb, double deadline, double delay = 0);
  // Whether the shard's answer `s` (from process `process` of rank `shard`)
  // calls for asking again: its shard failed and the entry now lives elsewhere
  // (asked once the event that failed it is handled), or it said the entry
  // moved (asked after kRedirectDelaySeconds). Then `again(delay)` asks again,
  // or `fail` gets what ends the request (the deadline passed), and true is
  // returned; false: `s` is the answer.
  bool retryShardRequest(const Status& s, const std::string& id, int shard, uint64_t process, double deadline,
                         std::function<void(double delay)> again, std::function<void(const Status&)> fail);
  // Whether the id's entry now lives elsewhere than on process `process` of
  // rank `shard`, where it was asked: its shard moved, or that rank restarted.
  bool shardMovedOrRestarted(const std::string& id, int shard, uint64_t process) const;
  // Sends `payload` to `rank` after `delay` seconds if `attempt` of `request` still waits then.
  void sendWhenDue(int rank, wire::MsgType type, std::string payload, uint64_t request, uint64_t attempt,
                   double delay);
  // A kMoved answer at the deadline: the members disagreed on where the id's entry lives all along.
  static Status disagreement(const std::string& id, const Status& moved);
  Status closedError() const;

  EventLoop& loop_;
  PeerLinks& peers_;
  ObjectStore& store_;
  const DirectoryClientConfig config_;
  const std::function<void()> onShardsChanged_;
  // A process of a rank, and how many times it took its share back then.
  struct ShareRecord {
    uint64_t incarnation = 0;
    uint64_t epoch = 0;
  };
  // How many times `rank`'s current process took its share back, as far as this node heard.
  uint64_t epochOf(int rank) const;
  // Tells the live members, other than this node and the share's rank.
  template <typename News>
  void tellMembers(const News& news);
  std::map<int, ShareRecord> moved_;     // ranks whose share moved on: the process that died, and as of which return
  std::map<int, ShareRecord> returned_;  // the latest return of each rank's share heard of
  bool left_ = false;                    // this process leaves (leave)
  std::atomic<uint64_t> movedCount_{0};  // moved_.size()
  uint64_t nextRequest_ = 1;
  RequestTracker requests_;
  bool closing_ = false;
};

}  // namespace hoplite
