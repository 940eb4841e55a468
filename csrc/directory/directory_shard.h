// This node's share of the object directory (ids hash to shards). Per object:
// metadata, the nodes holding a copy (partial or complete) and, for small
// objects, the bytes themselves so a get is one round trip; and who subscribed
// to its locations. Loop thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/object_meta.h"
#include "common/status.h"
#include "directory/recent_ids.h"
#include "net/event_loop.h"
#include "wire/messages.h"

namespace hoplite {

struct Holder {
  bool complete = false;
  int serving = 0;      // receivers this holder was assigned and has not been released from
  bool origin = false;  // registered the object (its source, unlike receivers still pulling)
  int source = -1;      // the sender it was assigned while partial, for cycle checks
  bool sourceNamed = false;  // that sender was asked for and not yet listed (kept while unlisted)
};

struct DirectoryEntry {
  ObjectMeta meta;
  std::map<int, Holder> holders;  // by rank
  bool hasInline = false;
  std::string inlineData;
  bool recomputable = false;  // see wire::Register
  uint64_t token = 0;         // its registration's (wire::Register::token), once one named it
  int standbyHolder = -1;     // the holder the standby was told of (ShardServer::tellStandby)
  // Made by holders listing again copies they had before the share moved
  // here, not by a put (see adoptGone).
  bool relisted = false;
};

class DirectoryShard {
 public:
  // Called once: with the entry and the sender assigned to the asker (-1 for
  // inline objects or when no copy is left), or with an error (kDeleted, kTimeout).
  using LookupCallback = std::function<void(const Status&, const DirectoryEntry*, int sender)>;

  // Sends a subscriber (`rank`) an object's locations.
  using Publish = std::function<void(int rank, const wire::Locations&)>;

  DirectoryShard(EventLoop& loop, Publish publish) : loop_(loop), publish_(std::move(publish)) {}
  ~DirectoryShard();

  // A new object (kAlreadyExists if the id is taken), or, with `reannounce`,
  // one more holder of an object that may already be known here.
  Status registerObject(const wire::Register& msg);
  // Returns false if the object is unknown here (e.g. deleted meanwhile).
  bool updateHolder(const wire::HolderUpdate& msg);
  // The reduce into `id` failed (wire::ResultFailed): the lookups waiting for
  // it fail with `why`, and so do later ones until `id` is registered. An id
  // registered or lost stays so; a deleted one stays deleted, saying why.
  void failResult(const std::string& id, const Status& why);
  // Answers at once if the object exists or was deleted, else when it is
  // registered or after `timeoutSeconds`. For an object that is not inline,
  // the answer assigns `asker` a sender and lists the asker as a partial holder.
  // With `locate`, the answer only names a holder (complete ones first, then
  // the origin) and changes nothing.
  // `failedHolder` (>= 0): the asker's sender (or, with `locate`, the holder it
  // was told of) died; it is skipped for this answer (the shard's own failure
  // detection forgets it for good). A locate that finds no other holder waits
  // as if the object did not exist (it may be put again, e.g. by a rejoined rank).
  // `preferred` (>= 0): the sender the asker asks for (a neighbour in a ring),
  // assigned even before it is listed, since its node parks pulls until its
  // own copy exists; unless its supply runs through the asker.
  void lookup(const std::string& id, int asker, bool locate, double timeoutSeconds, LookupCallback reply,
              int failedHolder = -1, int preferred = -1);
  // Whom `holder` still receives the entry's object from (-1: its copy is
  // complete, not fed by a pull, or it is not listed).
  static int sourceOf(const DirectoryEntry& entry, int holder);
  // `rank`'s subscription `request`: it is sent the object's locations now and
  // after every change (whether the object exists yet or not) until it
  // unsubscribes or is forgotten.
  void subscribe(const std::string& id, int rank, uint64_t request);
  void unsubscribe(const std::string& id, int rank, uint64_t request);
  // A node is gone (failed or shut down): it holds no copies and subscribes to
  // nothing any more, and whoever it was pulling from is free again. Objects it
  // held the last copy of are lost: gets of them fail, a reduce's locate waits
  // for them, and they may be put again.
  // `left`: it shut down (errors say so). Returns the objects whose holder
  // the standby was told of was `rank` and that other holders still have:
  // (id, the holder to tell it of now).
  std::vector<std::pair<std::string, int>> forgetHolder(int rank, bool left = false);
  // After `holder` registered the object: whether the standby should be told
  // of it as the object's holder (the put's holder, or the first one listed).
  bool takeStandbyHolder(const std::string& id, int holder, bool primary);
  // Forgets the object and returns who held copies (for a put expected from
  // its holder, see adoptStandby: that holder, unless `retract` or `ifToken`
  // is given). A deleted id is remembered
  // (gets of it fail at once); a retracted one is not (gets of it wait for it
  // to be registered again). `ifToken` (nonzero): only if the entry was
  // registered under that token or under none; else nothing changes (a
  // cleanup of an earlier computation of a reduce's result) and it says so.
  // `deleteToken` (nonzero) names this delete: asked again (its answer was
  // lost with a host taken for failed), it finds the id deleted under that
  // token, here or by the host whose share this is now, and succeeds; from
  // then on, holders listing a copy again are refused (as after a delete
  // made here), since the delete is known to have happened. An id
  // remembered as lost is deleted too: listed again later (its holder was
  // only taken for failed), it is refused.
  Status remove(const std::string& id, bool retract, std::vector<int>* holders, uint64_t ifToken = 0,
                uint64_t deleteToken = 0);
  // The ids that `leaves` picks are hosted elsewhere now (their home rank
  // rejoined, or this process leaves): their entries are dropped (their
  // holders register them there), the lookups parked for them are answered
  // kMoved, to be asked there, and what is remembered of those gone is
  // returned, for their new host (adoptGone). `leaving` (this node's rank,
  // when it leaves): objects it alone holds are returned as lost with it.
  std::vector<wire::GoneId> handOver(const std::function<bool(const std::string& id)>& leaves, int leaving = -1);
  // What the previous host remembered of an id that is gone, unless it was
  // registered here since: gets of it fail at once, also those parked now.
  // A delete made there also stands over an entry made here only by copies
  // listed again after the move (`relisted`): the entry goes, and its
  // holders are added to `staleHolders`, to drop their copies (without
  // `staleHolders`, such an entry is kept). (`fromStandby`: see
  // adoptStandby.) Returns whether it was adopted.
  bool adoptGone(const wire::GoneId& gone, bool fromStandby = false, std::vector<int>* staleHolders = nullptr);
  // Whether the id is remembered as deleted.
  bool isDeleted(const std::string& id) const;
  // Remembered as lost: its last holder was taken for failed or left.
  bool isLost(const std::string& id) const;
  // Standby: what this node must know of the shares it takes over should
  // their host die. `gone.deleted`: the id was deleted; else, with
  // `gone.lastHolder` >= 0, it was put and that rank holds the put's copy;
  // else forget it (retracted). Bounded: the oldest are forgotten first.
  void keepStandby(const wire::GoneId& gone);
  // What a standby must know of this shard's ids (keepStandby's records):
  // where each put's copy is, and which ids were deleted.
  std::vector<wire::GoneId> standbyRecords() const;
  // Forgets what was kept as a standby.
  void dropStandby();
  enum class Fate { kAlive, kFailed, kLeft };
  // The standby ids this node hosts now (`hosted`, after their host died):
  // deleted ones are remembered as deleted here, unless a holder lists a copy
  // again (the standby may have missed that the id was put again). Put ones
  // that no holder listed here yet are expected from the holder the standby
  // was told of: if it is gone (`fateOf`; checked again at every later call)
  // and has not listed its copy `graceSeconds` later, or if this node loses
  // it (forgetHolder), they are remembered as lost with it, so that gets fail
  // instead of waiting for a put. Returns what was adopted, for this node's
  // own standby: a second failover must not forget it.
  std::vector<wire::GoneId> adoptStandby(const std::function<bool(const std::string& id)>& hosted,
                                         const std::function<Fate(int rank)>& fateOf, double graceSeconds);
  // Lookups parked here until their object is registered (any thread, for stats).
  uint64_t waitingLookups() const { return waiting_.load(); }
  // What this shard holds now, for stats (loop thread).
  struct Sizes {
    uint64_t entries = 0;
    uint64_t inlineBytes = 0;  // objects' bytes kept in their entries
    uint64_t gone = 0;         // ids remembered as deleted or lost
    uint64_t standby = 0;      // records kept as a standby
    uint64_t watches = 0;      // ids with subscribers
  };
  Sizes sizes() const;

 private:
  struct Waiter {
    uint64_t token;
    int asker;
    bool locate;
    int preferred;
    LookupCallback reply;
    EventLoop::TimerId timer;
  };
  // Why an id is gone (deleted, or lost with its last holder), remembered so
  // that a get of it fails at once instead of waiting. Bounded (gone_);
  // forgotten once put again.
  struct Gone;
  using Entries = std::unordered_map<std::string, DirectoryEntry>;
  // An entry with no copy left (see lost()): forgets it, and remembers it as
  // lost (last holder, or -1) unless its reduce computes it again.
  Entries::iterator dropLost(Entries::iterator entry, int lastHolder, bool left = false);
  // No longer expects the id from a holder (listed, deleted or retracted).
  void forgetExpected(const std::string& id);
  // An expected id (adoptStandby) whose holder is gone: lost with it, unless
  // listed, deleted or expected from another holder since.
  void loseExpected(const wire::GoneId& gone);
  // Answers the lookups waiting for `id` with `why`; a reduce's locates wait
  // on when `keepLocates`.
  void failWaiters(const std::string& id, const Status& why, bool keepLocates);
  // Whether the entry has no copy left anywhere (inline bytes count as one).
  static bool lost(const DirectoryEntry& entry) { return entry.holders.empty() && !entry.hasInline; }
  // Receiver-driven broadcast: picks who serves `asker` (`preferred` if it
  // may) and marks it busy.
  static int assignSender(DirectoryEntry& entry, int asker, int skip = -1, int preferred = -1);
  // Whether `holder`'s supply chain (source, its source, ...) runs through `asker`.
  static bool feedsFrom(const DirectoryEntry& entry, int holder, int asker);
  static int anyHolder(const DirectoryEntry& entry, int skip = -1);
  // The entry's holder `rank`, listed now if it was not: then already busy
  // with the receivers that asked for it by name before.
  static Holder& listHolder(DirectoryEntry& entry, int rank);
  static int answerFor(DirectoryEntry& entry, int asker, bool locate, int preferred) {
    return locate ? anyHolder(entry) : assignSender(entry, asker, -1, preferred);
  }
  wire::Locations locationsOf(const std::string& id) const;
  // Tells the object's subscribers where it is, if that changed since they were last told.
  void tellSubscribers(const std::string& id);

  EventLoop& loop_;
  Publish publish_;
  Entries entries_;
  struct Watch {
    std::vector<std::pair<int, uint64_t>> subscribers;  // (rank, request)
    std::string told;  // the locations they were last sent, encoded with request 0
  };
  std::unordered_map<std::string, Watch> watches_;
  std::unordered_map<std::string, std::vector<Waiter>> waiters_;
  std::atomic<uint64_t> waiting_{0};  // entries of waiters_
  uint64_t nextWaiter_ = 1;
  struct Gone {
    Code code;  // kDeleted, or kPeerFailed for a lost object
    int rank = -1;      // a lost object's last holder, or -1
    bool left = false;  // that holder shut down (else it failed)
    bool fromStandby = false;  // a delete the dead host's standby kept: a holder listing a copy again wins
    uint64_t deletedBy = 0;    // the delete's token (remove)
    bool failedReduce = false;  // a result whose reduce failed (`code`, `why`): not lost, never computed
    std::string why;            // that failure; for a deleted result, its reduce's failure, if told
  };
  static Status goneStatus(const std::string& id, const Gone& gone);
  // What a shard remembers of gone ids, and keeps as a standby: bounded so
  // that a long run's memory levels off, not at what a shard sees in hours.
  static constexpr size_t kMaxRememberedGone = 1u << 15;
  static constexpr size_t kMaxStandby = 1u << 15;
  RecentIds<Gone> gone_{kMaxRememberedGone};
  struct StandbyRecord {
    bool deleted;  // else put, its copy at `holder`
    int holder;
    uint64_t deletedBy;
  };
  RecentIds<StandbyRecord> standby_{kMaxStandby};  // keepStandby
  // Adopted ids whose put's holder has not listed its copy here yet → that holder (adoptStandby).
  std::unordered_map<std::string, int> expected_;
  std::unordered_map<std::string, EventLoop::TimerId> graceTimers_;  // expected ids whose holder is gone
};

}  // namespace hoplite
