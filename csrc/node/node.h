// The runtime every participating process embeds: local object store, directory
// shard, transport endpoint and background copies. Public methods may be called
// from any thread; everything else runs on the node's single event loop thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/object_meta.h"
#include "common/status.h"
#include "common/timeouts.h"
#include "common/worker_pool.h"
#include "coll/device_reducer.h"
#include "directory/directory_client.h"
#include "directory/shard_server.h"
#include "directory/subscriptions.h"
#include "messenger/mailbox.h"
#include "net/event_loop.h"
#include "net/loop_call.h"
#include "net/message_router.h"
#include "net/transport.h"
#include "reduce/coordinator.h"
#include "reduce/link_estimator.h"
#include "reduce/reduce_services.h"
#include "reduce/reduce_types.h"
#include "reduce/task_runner.h"
#include "peers/peers.h"
#include "store/buffer_pool.h"
#include "store/device_memory.h"
#include "store/heap_trimmer.h"
#include "store/object_store.h"
#include "transfer/client.h"
#include "transfer/server.h"
#include "wire/messages.h"

namespace hoplite {

struct NodeConfig {
  int rank = 0;
  int worldSize = 1;
  std::string host = "127.0.0.1";  // address to bind and advertise
  int port = 0;                    // 0: any free port
  std::string transport = "tcp";   // by name (net/transport_registry.h)
  std::string clusterId;           // peers with another id are refused
  std::string secret;              // shared by the cluster; peers that cannot prove they know it are refused
  uint64_t chunkBytes = 0;         // 0: chosen per object from its size
  uint64_t capacityBytes = 1ull << 34;
  uint64_t inlineThresholdBytes = 64 * 1024;
  uint64_t poolCacheBytes = 1ull << 32;
  double connectTimeoutSeconds = 30;
  // A peer this node talks to that has sent nothing for an interval is pinged;
  // one that stays silent for the timeout (hung, stopped, cut off) has failed.
  double heartbeatIntervalSeconds = 1;
  double heartbeatTimeoutSeconds = 10;
  int copyThreads = 2;
  int socketBufferBytes = 0;
  // TCP congestion control of this node's connections (e.g. "cubic"); empty: the system's default.
  std::string tcpCongestion;
  // Bytes of tagged messages this node sends to one peer ahead of their
  // receives; messages beyond (and any over 4 MiB) wait for their receive.
  uint64_t mailboxBytes = 64ull << 20;
  // Pull objects from peers on this host by reading their memory
  // (net/same_host/) where the kernel allows it; false: always over TCP.
  bool sameHost = true;
  // Every this many seconds, the pool's buffers unused for as long are unmapped
  // and malloc_trim(0) is called (store/heap_trimmer.h); 0: never.
  double heapTrimIntervalSeconds = 30;
};

// Composes the parts (peers, the directory client and this node's shard,
// the transfer client and server, the mailbox, subscriptions, the reduce)
// and implements what they need of it: PeerEvents and ReduceServices.
class Node : private PeerEvents, private ReduceServices {
 public:
  explicit Node(NodeConfig config);
  ~Node() override;

  const std::string& host() const { return config_.host; }
  int port() const { return peers_->port(); }
  // Processes with the same non-empty identity read each other's memory (net/same_host/).
  const std::string& hostIdentity() const { return peers_->hostIdentity(); }
  int rank() const { return config_.rank; }

  void addPeer(int rank, const std::string& host, int port) { peers_->addPeer(rank, host, port); }
  // Introduces this node to every peer and waits (up to the timeout) for their
  // answers: a restarted rank rejoining the cluster. They learn its new address
  // from the handshake, it learns from them where directory shards moved.
  Status announce(double timeoutSeconds);
  // Registers the object and returns. Small and mid-sized objects are copied
  // in the call (`*copied` is set: `src` may be released at once); larger
  // ones in the background (a kPutCopied completion with `token` says when
  // `src` may be released). With `borrowed` memory (holding the bytes),
  // nothing is copied: the store keeps the caller's memory until the object
  // is deleted. With a `device` source, `src` is unused and the bytes are
  // read from it.
  Status put(const std::string& id, const ObjectMeta& meta, const uint8_t* src, uint64_t token,
             double timeoutSeconds, bool* copied, std::shared_ptr<Buffer> borrowed = nullptr,
             std::shared_ptr<DeviceSource> device = nullptr);
  // Memory from the node's pool (reused where it can be),
  // e.g. for a result that gets write into. Throws std::bad_alloc.
  std::shared_ptr<Buffer> allocate(size_t bytes) { return pool_->allocate(bytes); }
  // Device copies page-lock store buffers through `locker` (CUDA builds).
  void setHostMemoryLocker(std::shared_ptr<HostMemoryLocker> locker) { pool_->setLocker(std::move(locker)); }
  // Reduce steps over objects put from a device run on it through `reducer`
  // (CUDA builds); set before the node takes part in a reduce.
  void setDeviceReducer(std::shared_ptr<DeviceReducer> reducer) { reduceTasks_->setDeviceReducer(std::move(reducer)); }
  // Starts a get; the outcome arrives as a kGet completion with `token`, except
  // when a complete local copy exists: then it is served at once into *now and
  // true is returned. copy=false hands out the store's own buffer (read-only by
  // contract); a `target` receives the copy instead of a buffer from the pool.
  // `source` (>= 0): the rank to pull from if it holds a copy or gets one
  // within a few seconds (e.g. a neighbour in a ring); the directory's choice
  // otherwise, and after any failure.
  bool get(const std::string& id, double timeoutSeconds, bool copy, uint64_t token, Completion* now,
           const GetTarget* target = nullptr, int source = -1);
  // Deletes every object of `ids` and every copy of them; the requests go out
  // at once. The outcome is the first failure in the order of `ids`, if any.
  Status remove(const std::vector<std::string>& ids, double timeoutSeconds);
  // Starts a streaming reduce (reduce/coordinator.h) and returns once its inputs are
  // chosen and every tree position has registered its output: the result
  // object then exists and fills as the reduce streams. This node coordinates
  // it until the result is complete: if a participant dies, the positions that
  // depended on it are redone (with other inputs where its input is lost).
  Status reduce(const ReduceRequest& request, ReducePlan* plan) { return coordinator_->reduce(request, plan); }
  // Waits until a reduce this node coordinates (or recently did) into
  // `resultId` has completed its result, and gives the plan it ended with.
  Status reduceOutcome(const std::string& resultId, double timeoutSeconds, ReducePlan* plan) {
    return coordinator_->reduceOutcome(resultId, timeoutSeconds, plan);
  }
  // Subscriptions to where objects are (directory/subscriptions.h).
  LocationSubscriptions& subscriptions() { return *subscriptions_; }
  // Tagged messages between ranks (messenger/tagged_messenger.h).
  TaggedMessenger& messenger() { return *mailbox_; }
  // Waits up to `timeoutSeconds` for completions; false once shut down and drained.
  bool waitCompletions(std::vector<Completion>* out, double timeoutSeconds);
  // Offers each completion to `handler` first, on the thread that completes
  // it (the loop, mostly): what it takes (returns true for) is not queued for
  // waitCompletions. It must be quick and must not call into the node. Set
  // before the first operation.
  void setDirectCompletion(std::function<bool(Completion&)> handler) { directCompletion_ = std::move(handler); }
  std::map<std::string, uint64_t> stats();
  // What this node's share of the directory holds (from the loop thread).
  DirectoryShard::Sizes shardSizes();
  void shutdown();


 private:
  // --- what happens to peers and messages (node.cpp) ---
  PeerLinks& peers() override { return *peers_; }
  DirectoryClient& directory() override { return *directory_; }
  // PeerEvents.
  void onPeerGone(int rank) override;
  void onPeerFailed(int rank, const Status& failure) override;
  void onLinkLost(int rank, const Status& why, bool stalled) override;
  void onResumed() override;
  void onAcceptedClosed(Connection& conn, int rank, bool left, const Status& why) override;
  bool departed(int rank) const override { return directory_->hasMoved(rank); }
  void onPeerRejoined(int rank) override;
  void onPeerKnown(int rank) override;
  void fillHelloAck(wire::HelloAck* ack) override;
  void onPeerReady(int rank, const wire::HelloAck& ack) override;
  void ping(int rank) override;
  uint8_t* dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                           std::shared_ptr<const void>* keepalive) override;
  void onDataReceived(Connection& conn, uint64_t request, uint64_t end) override;
  // Who handles which message: every part's handlers, once, at construction.
  void registerHandlers();
  template <typename M>
  void handle(Route route, void (Node::*method)(Connection&, const M&));
  void handleShardMoved(Connection& conn, const wire::ShardMoved& msg);
  void handleShardReturned(Connection& conn, const wire::ShardReturned& msg);
  void handleRelistCopies(Connection& conn, const wire::RelistCopies& msg);
  // This process's share moved (it was taken for failed while stalled or cut
  // off): it takes it back after a wait (kShareReturnHeartbeats heartbeat
  // timeouts, longer if it moved again soon after its last return), once
  // settled, so that shares do not pile up on the ranks never taken for failed.
  void scheduleShareReturn();
  // Waits shareReturnWait_, then takes the share back if settled, else waits again.
  void armShareReturn();
  // A peer's process leaves (shuts down): see wire::Leave.
  void handleLeave(Connection& conn, const wire::Leave& msg);
  // Shutdown's first step: the peers hear that this process leaves, and the
  // new hosts of its share of the directory get what it remembers of gone
  // ids. `done` runs once, when all answered or after the leave timeout.
  void leaveCluster(std::function<void()> done);
  void onStatusReply(Connection& conn, const wire::StatusReply& msg);
  void onLookupReply(Connection& conn, const wire::LookupReply& msg);
  double now() const override { return steadySeconds(); }

  // --- puts (node_objects.cpp) ---
  // Copies a put's bytes into its store copy, in chunks, from `src` or `device`.
  void copyIn(std::shared_ptr<LocalObject> object, const uint8_t* src, std::shared_ptr<DeviceSource> device,
              uint64_t token);
  // Copies bytes [from, from + n) of a put's source into its store copy.
  Status fillFrom(LocalObject& object, const uint8_t* src, DeviceSource* device, uint64_t from, uint64_t n);
  uint64_t chunkFor(uint64_t size) const override;
  void pushCompletion(Completion c);

  // --- the rest of ReduceServices ---
  void probeRanks(const std::set<int>& ranks, double timeoutSeconds,
                  std::function<void(std::set<int> silent)> done) override;  // node_probe.cpp
  bool shuttingDown() const override { return shuttingDown_; }
  bool resuming() const override { return resuming_; }
  void fetch(const std::string& id, double timeoutSeconds, FetchCallback done, int preferred = -1) override {
    client_->fetch(id, timeoutSeconds, std::move(done), preferred);
  }

  // --- its copies (node_objects.cpp) ---
  // Loop thread: asks the shard to delete `id` everywhere; `done` gets the outcome.
  // Returns the directory request it made (RequestTracker).
  uint64_t deleteOne(const std::string& id, std::function<void(const Status&)> done);
  // The timeout of a delete whose `requests` still wait: it names their shards.
  Status deleteTimedOut(const std::string& what, double timeoutSeconds, const std::vector<uint64_t>& requests);
  void handleDropCopy(Connection& conn, const wire::DropCopy& msg);
  void serveParkedPulls(const std::shared_ptr<LocalObject>& obj) override { server_->serveParkedPulls(obj); }
  void dropLocalCopy(const std::string& id, const Status& why) override;

  NodeConfig config_;
  wire::FrameLimits limits_;
  MessageRouter router_;
  EventLoop loop_;
  // Random per process: told in every hello, and part of this node's
  // partial-result ids (unique across restarts).
  const uint64_t incarnation_;
  std::unique_ptr<Peers> peers_;
  std::shared_ptr<BufferPool> pool_;
  std::unique_ptr<ObjectStore> store_;
  std::unique_ptr<WorkerPool> workers_;
  // Copies of puts into the store, at a lower priority than the transfers
  // they feed (a put's copy on every rank at once otherwise starves them).
  std::unique_ptr<WorkerPool> putCopies_;
  // The parts, declared after what they refer to (destroyed before it).
  std::unique_ptr<DirectoryClient> directory_;  // where ids' entries live; requests to them
  std::unique_ptr<ShardServer> shardServer_;     // this node's share of the directory
  std::unique_ptr<Mailbox> mailbox_;
  std::unique_ptr<TransferServer> server_;  // pulls from this node's copies
  std::unique_ptr<TransferClient> client_;  // gets, and the pulls that feed them
  std::unique_ptr<LocationSubscriptions> subscriptions_;
  // The streaming reduce (reduce/): the reduces this node coordinates, the
  // tree positions it computes, and the link estimate that sizes the trees.
  std::unique_ptr<LinkEstimator> linkEstimator_;
  std::unique_ptr<ReduceCoordinator> coordinator_;
  std::unique_ptr<ReduceTaskRunner> reduceTasks_;

  // Gives malloc's freed pages back every interval; depends on nothing above.
  std::unique_ptr<HeapTrimmer> heapTrimmer_;

  // Loop-thread state.
  bool shuttingDown_ = false;
  bool resuming_ = false;  // loop thread (ReduceServices::resuming)
  bool shareReturnScheduled_ = false;
  double shareReturnWait_ = 0;                    // the last wait before taking the share back
  double shareReturnedAt_ = -1e300;               // when this process last took its share back

  std::function<bool(Completion&)> directCompletion_;
  std::mutex completionMutex_;
  std::condition_variable completionCv_;
  std::deque<Completion> completions_;
  bool closed_ = false;

  std::atomic<bool> stopped_{false};
  bool stopped() const override { return stopped_.load(); }

  std::atomic<uint64_t> evictions_{0};
};

}  // namespace hoplite
