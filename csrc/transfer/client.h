// What a node fetches from others: gets (a lookup at the directory, then a
// local copy: this node's own, an inline one, or one pulled from the holder
// the directory assigns) and the pulls that fill those copies, over the
// holder's connection or, on the same host, by reading its memory
// (same_host_reads.cpp). A pull whose holder fails resumes from another
// holder at the byte where it stopped. Loop thread only, except get().
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "common/worker_pool.h"
#include "directory/directory_access.h"
#include "net/event_loop.h"
#include "net/message_router.h"
#include "peers/peers.h"
#include "store/buffer_pool.h"
#include "store/device_memory.h"
#include "store/object_store.h"
#include "transfer/server.h"
#include "wire/messages.h"

namespace hoplite {

// Where a get's copy goes instead of a buffer from the pool: the caller's own
// memory (get(out=...)), which must match the object's dtype and byte size, or
// a device (which checks the object itself).
struct GetTarget {
  std::shared_ptr<Buffer> buffer;
  std::string dtype;
  std::shared_ptr<DeviceTarget> device;
};

// Delivered to the caller through Node::waitCompletions().
struct Completion {
  enum class Kind : uint8_t { kGet = 0, kPutCopied = 1 };
  uint64_t token = 0;
  Kind kind = Kind::kGet;
  Status status;
  std::shared_ptr<Buffer> buffer;  // a get's bytes
  ObjectMeta meta;
};

struct TransferClientConfig {
  int rank = 0;
  int worldSize = 1;
  uint64_t chunkBytes = 0;           // 0: chosen per object from its size
  double resumeTimeoutSeconds = 30;  // a resumed pull's lookup
};

class TransferClient {
 public:
  // A local copy of an object (complete or still arriving), and the rank it is pulled from (-1: none).
  using FetchCallback = std::function<void(const Status&, std::shared_ptr<LocalObject>, int sender)>;
  using CompletionSink = std::function<void(Completion)>;

  TransferClient(EventLoop& loop, Peers& peers, DirectoryAccess& directory, ObjectStore& store, BufferPool& pool,
                 WorkerPool& copies, TransferServer& server, TransferClientConfig config, CompletionSink complete);

  // DataAt (same-host pieces).
  void registerHandlers(MessageRouter& router);

  // Any thread. Starts a get; see Node::get.
  bool get(const std::string& id, double timeoutSeconds, bool copy, uint64_t token, Completion* now,
           const GetTarget* target, int source);
  // Obtains a local copy of an object: this node's own (complete or still
  // arriving), a copy pulled from the sender the directory assigns (`sender`,
  // else -1), or a standalone one for an inline object. Runs `done` once.
  // `preferred`: the sender to ask the directory for (see DirectoryShard::lookup).
  // `forGet`: a get's fetch, traced as get.located when the directory answers
  // (before the pull it starts).
  void fetch(const std::string& id, double timeoutSeconds, FetchCallback done, int preferred = -1,
             bool forGet = false);

  // Data frames of pulls (see ConnectionObserver).
  uint8_t* dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                           std::shared_ptr<const void>* keepalive);
  void onDataReceived(Connection& conn, uint64_t request, uint64_t end);
  // A holder refused or ended a pull; false if `msg` answers no pull.
  bool onStatusReply(const wire::StatusReply& msg);
  // The pulls from a failed peer fail (and resume elsewhere where they can).
  // `holderLives`: only the link broke (this process stalled and redials):
  // its pulls go on from the same holder over a new connection.
  void failPullsFrom(int rank, const Status& failure, bool holderLives = false);
  // This node's copy `object` left the store: its pulls end.
  void endPullsOf(const std::shared_ptr<LocalObject>& object);
  // Every get ends with `why`; nothing new starts.
  void shutDown(const Status& why);

  struct Counters {
    std::atomic<uint64_t> bytesReceived{0}, pullsCompleted{0};
    std::atomic<uint64_t> bytesReceivedSameHost{0};  // of bytesReceived, read from a peer's memory
    std::atomic<uint64_t> inlineGets{0}, localGets{0}, remoteGets{0};
    std::atomic<uint64_t> copiesHandedOver{0};  // remote gets that took their pulled copy (handOver)
    std::atomic<uint64_t> pullResumes{0};  // transfers continued from another holder after a failure
  };
  const Counters& counters() const { return counters_; }

 private:
  // --- gets (client.cpp) ---
  // A get's life. kLookingUp -> kTakingOver | kFollowing; kTakingOver ->
  // kFollowing (another reader came, or the pull is over TCP); kFollowing <->
  // kCopying (a worker copies a piece); kCopying -> kEnding (it ended while a
  // worker writes into the caller's target: delivered once that write is
  // over); a copy lost on the way (evicted: kLookingUp again; recomputed:
  // kWaitingRetry -> kLookingUp). Every state ends with finishGet.
  enum class GetState : uint8_t { kLookingUp, kWaitingRetry, kTakingOver, kFollowing, kCopying, kEnding };
  struct GetOp {
    GetState state = GetState::kLookingUp;
    std::string id;
    bool copy = true;
    double timeoutSeconds = 0;
    EventLoop::TimerId timer = 0;
    ObjectMeta meta;                      // once known
    std::shared_ptr<LocalObject> object;  // once a local copy exists
    uint64_t listener = 0;
    std::string stage;                    // before a local copy exists, for timeout messages; empty: at the directory
    // copy=true: the caller's own buffer, filled behind the object's watermark.
    std::shared_ptr<Buffer> result;
    GetTarget target;  // where `result` must be, when the caller chose it
    Status ending;     // kEnding: how the get ended
    uint64_t copied = 0;
    int lookups = 0;  // a holder may have evicted its copy since the lookup: ask again
    int source = -1;  // the sender the caller prefers, until the first lookup asks for it
    int retries = 0;  // times the object was being recomputed (kRetry) and looked up again
  };
  void startGet(uint64_t token);
  // The get's timeout, naming what it waited for; `directorySaid`: the
  // lookup's own timeout message, when that ended the get.
  Status timedOut(const GetOp& op, const std::string& directorySaid = "") const;
  // The pull that fills `object` now, as a timeout names it ("" if none).
  std::string describePullOf(const LocalObject& object) const;
  void onFetchLookup(const std::string& id, const Status& status, const wire::LookupReply* reply,
                     const FetchCallback& done, bool forGet);
  // `sender`: the holder the fetch started a pull from for this get (-1: none).
  void waitForLocal(uint64_t token, std::shared_ptr<LocalObject> object, int sender);
  // Runs whenever the local copy advances.
  void progressGet(uint64_t token);
  // kTakingOver: a get whose copy is pulled from a holder on this host
  // hopes to take the copy's buffer when the pull ends (handOver) instead of
  // copying it. Whether nothing but the store and that get uses
  // the copy: no other listener and no other owner of its memory.
  static bool onlyItsGetUses(const LocalObject& object);
  // The get gives up taking its copy's buffer and copies it like any other.
  void stopTakeOver(uint64_t token);
  // Something else starts using a local copy: no get may take it.
  void keepCopy(LocalObject& object);
  // A same-host pull for a get ended: the get takes the copy's buffer as its
  // result and the copy leaves the store and the directory (the holder read
  // is as close to every reader on this host, and one copy less is made).
  // False (nothing done) when something else uses the copy.
  bool handOver(uint64_t token, const std::shared_ptr<LocalObject>& object, int sender);
  // A buffer of the pool for the get's own copy; false (the get failed) if none.
  bool allocateResult(uint64_t token);
  // Copies bytes [from, from + n) of a local copy to a get's device target (copy threads).
  Status writeToDevice(DeviceTarget& device, const LocalObject& object, uint64_t from, uint64_t n);
  // (`status` by value: it may be the op's own `ending`, which this erases.)
  void finishGet(uint64_t token, Status status, std::shared_ptr<Buffer> result = nullptr);

  // --- pulls (pulls.cpp) ---
  struct SameHostRange {
    uint64_t offset, length, address;
  };
  // A pull's life: kActive -> (same host) kReading while a copy thread reads
  // a range -> kActive. What happens to a pull while a read is in flight
  // waits for the read to return (a resume must not race it): kReadFailed
  // (then it fails), kReadDropped (its copy was dropped: it just ends).
  enum class PullState : uint8_t { kActive, kReading, kReadFailed, kReadDropped };
  struct PullOp {
    int rank;
    std::shared_ptr<LocalObject> object;
    uint64_t expected = 0;  // next offset the holder will send
    int resumes = 0;        // senders lost so far
    int senderSource = -1;  // whom the holder itself received it from when assigned (LookupReply)
    PullState state = PullState::kActive;
    Status failure;  // kReadFailed: why
    bool failureSparesHolder = false;  // kReadFailed: the holder lives (failPull)
    bool firstBytesTraced = false;
    // Same-host pulls: read from the holder's memory, one range at a time,
    // in the order the holder announced them, on the loop or a copy thread.
    std::shared_ptr<same_host::PeerMemory> holderMemory;
    std::deque<SameHostRange> toRead;
  };
  // `senderSource`: whom `holder` itself still receives the object from (LookupReply).
  void startPull(int holder, int senderSource, const std::shared_ptr<LocalObject>& object, int resumes = 0);
  // The pull's bytes up to `end` arrived: counted, traced, and its copy advanced.
  void advancePull(PullOp& pull, uint64_t end);
  void resumePull(std::shared_ptr<LocalObject> object, int deadRank, int resumes, Status why);
  void dropFailedCopy(const std::shared_ptr<LocalObject>& object, int rank, const Status& why);
  void finishPull(uint64_t request);
  // The pull's holder failed, or only the link to it (`holderLives`): it
  // resumes from another holder, or the same one, or its copy fails.
  void failPull(uint64_t request, const Status& why, bool holderLives = false);
  // A pull that ended (no read of it in flight) tells its holder to stop, and
  // a same-host one that the memory it lent may be reused.
  void releaseHolder(uint64_t request, int rank);

  // --- same-host reads (same_host_reads.cpp) ---
  void handleDataAt(Connection& conn, const wire::DataAt& msg);
  void readNextRange(uint64_t request);
  // The next read: up to `most` bytes, merging ranges announced back to back
  // (few hand-offs, while the watermark moves often enough for relays and copies).
  static SameHostRange takeRead(std::deque<SameHostRange>& queue, uint64_t most);
  // Applies a finished read; true when the pull goes on.
  bool onRangeRead(uint64_t request, uint64_t end, const Status& status);

  uint64_t chunkFor(uint64_t size) const;

  EventLoop& loop_;
  Peers& peers_;
  DirectoryAccess& directory_;
  ObjectStore& store_;
  BufferPool& pool_;
  WorkerPool& copies_;
  TransferServer& server_;
  const TransferClientConfig config_;
  const CompletionSink complete_;
  bool closing_ = false;
  std::unordered_map<uint64_t, GetOp> gets_;    // by the caller's token
  std::unordered_map<uint64_t, PullOp> pulls_;    // by request id
  // Copies whose pull lost its sender, while the directory names another: the rank lost.
  std::unordered_map<const LocalObject*, int> resuming_;
  Counters counters_;
};

}  // namespace hoplite
