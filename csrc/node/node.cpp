// Node lifecycle, what happens when peers fail, which part gets which frame,
// stats and shutdown.
#include "node/node.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <random>
#include <set>
#include <stdexcept>

#include "common/logging.h"
#include "common/timeouts.h"
#include "net/transport_registry.h"

namespace hoplite {
namespace {

constexpr uint64_t kMaxDataFrame = 64ull << 20;
// A put's copy thread yields to the loop and copy workers when the cores are
// busy (weight ~110 against 1024 at nice 0), yet is never starved outright.
constexpr int kPutCopyNice = 10;
// How long shutdown waits for peers to take what was sent and end their side
// of each connection (normally a round trip).
constexpr double kShutdownLingerSeconds = 2;
// After a long stall, time to read what peers sent meanwhile (their closes
// included) before redialing them.
constexpr double kResumeDelaySeconds = 0.2;
// How long a shutting-down node waits for its peers to acknowledge that it
// leaves (at most the connect and heartbeat timeouts: a peer silent that long
// counts as failed anyway): one round trip, or a dial and one.
constexpr double kLeaveSeconds = 2;
// How long after a process heard that its share moved it takes the share
// back (if settled then: Peers::settled), in heartbeat timeouts. Moved again
// within kShareReturnCalm such waits of a return (a flapping link, repeated
// stalls), it waits twice as long the next time, up to kShareReturnMaxWait
// times the first wait, so that the share does not keep moving back and forth.
constexpr double kShareReturnHeartbeats = 2;
constexpr double kShareReturnCalm = 4;
constexpr double kShareReturnMaxWait = 16;

// Control frames carry inline objects (up to the threshold) and their
// metadata; data frames at most the largest chunk.
wire::FrameLimits frameLimits(const NodeConfig& config) {
  return {std::max<uint64_t>(config.inlineThresholdBytes, 1u << 20) + (64u << 10), kMaxDataFrame};
}

uint64_t randomIncarnation() {
  uint64_t incarnation = 0;
  while (incarnation == 0) incarnation = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  return incarnation;
}

}  // namespace

Node::Node(NodeConfig config)
    : config_(std::move(config)),
      limits_(frameLimits(config_)),
      router_(limits_.maxControl),
      incarnation_(randomIncarnation()) {
  if (config_.worldSize < 1 || config_.rank < 0 || config_.rank >= config_.worldSize) {
    throw std::invalid_argument("rank " + std::to_string(config_.rank) + " out of range for world size " +
                                std::to_string(config_.worldSize));
  }
  if (config_.chunkBytes > kMaxDataFrame) {
    throw std::invalid_argument("chunk size must be at most " + std::to_string(kMaxDataFrame) + " bytes");
  }
  if (!(config_.heartbeatIntervalSeconds > 0) || !(config_.heartbeatTimeoutSeconds > config_.heartbeatIntervalSeconds)) {
    throw std::invalid_argument("heartbeat interval must be positive and shorter than the heartbeat timeout");
  }
  setLogRank(config_.rank);
  TransportOptions options{limits_, config_.socketBufferBytes, config_.tcpCongestion, config_.secret,
                           config_.clusterId};
  peers_ = std::make_unique<Peers>(
      loop_, makeTransport(config_.transport, loop_, options), router_, static_cast<PeerEvents&>(*this),
      PeersConfig{.rank = config_.rank,
                  .worldSize = config_.worldSize,
                  .host = config_.host,
                  .port = config_.port,
                  .clusterId = config_.clusterId,
                  .secret = config_.secret,
                  .connectTimeoutSeconds = config_.connectTimeoutSeconds,
                  .heartbeatIntervalSeconds = config_.heartbeatIntervalSeconds,
                  .heartbeatTimeoutSeconds = config_.heartbeatTimeoutSeconds,
                  .incarnation = incarnation_,
                  .sameHost = config_.sameHost});
  pool_ = std::make_shared<BufferPool>(config_.poolCacheBytes);
  store_ = std::make_unique<ObjectStore>(pool_, config_.capacityBytes, [this](const std::string& id) {
    evictions_++;
    loop_.post([this, id] { directory_->updateHolder(id, wire::HolderState::kRemoved); });
  });
  directory_ = std::make_unique<DirectoryClient>(
      loop_, *peers_, *store_, DirectoryClientConfig{config_.rank, config_.worldSize, config_.inlineThresholdBytes, incarnation_},
      [this] {
        // What this node hosted for ids that now go elsewhere (its own share,
        // when news comes that the others moved it while it was stalled) is
        // handed over, and lookups waiting here are sent after it. (A leave
        // hands its share over itself, saying which objects it takes along.)
        if (!stopped_) shardServer_->handOver();
        shardServer_->adoptStandby();
        subscriptions_->rehome();
        shardServer_->syncStandby(/*ownShareMoved=*/directory_->hasMoved(config_.rank));
        if (directory_->hasMoved(config_.rank)) scheduleShareReturn();
      });
  workers_ = std::make_unique<WorkerPool>("hoplite-copy", config_.copyThreads);
  putCopies_ = std::make_unique<WorkerPool>("hoplite-putcopy", 1, kPutCopyNice);
  server_ = std::make_unique<TransferServer>(
      loop_, *peers_, *store_, TransferServerConfig{config_.rank, peers_->sameHostEnabled(), config_.chunkBytes});
  client_ = std::make_unique<TransferClient>(
      loop_, *peers_, *directory_, *store_, *pool_, *workers_, *server_,
      TransferClientConfig{config_.rank, config_.worldSize, config_.chunkBytes, config_.connectTimeoutSeconds},
      [this](Completion c) { pushCompletion(std::move(c)); });
  subscriptions_ = std::make_unique<LocationSubscriptions>(
      loop_, config_.rank, [this](const std::string& id) { return directory_->shardOf(id); },
      [this](int rank, const wire::Subscribe& msg) { peers_->send(rank, msg); });
  mailbox_ = std::make_unique<Mailbox>(
      loop_, *peers_, *pool_,
      MailboxConfig{config_.rank, config_.worldSize, config_.mailboxBytes, config_.capacityBytes, config_.chunkBytes});
  shardServer_ = std::make_unique<ShardServer>(loop_, *peers_, *directory_, config_.worldSize,
                                               config_.heartbeatTimeoutSeconds);
  ReduceServices& services = *this;
  linkEstimator_ = std::make_unique<LinkEstimator>(loop_, services, config_.rank, config_.worldSize);
  coordinator_ = std::make_unique<ReduceCoordinator>(
      loop_, services,
      CoordinatorConfig{config_.rank, config_.worldSize, incarnation_, limits_.maxControl,
                        config_.heartbeatTimeoutSeconds},
      *linkEstimator_);
  reduceTasks_ = std::make_unique<ReduceTaskRunner>(loop_, services, config_.rank, *store_, *pool_, *workers_);
  // A buffer cached a whole interval unused is given back at the next trim: a
  // process holds what its workload uses lately, not the cache's bound. Before
  // malloc_trim, which then returns the pages of the small ones (malloc's).
  const auto idleFor = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(config_.heapTrimIntervalSeconds));
  heapTrimmer_ = std::make_unique<HeapTrimmer>(config_.heapTrimIntervalSeconds,
                                               [pool = pool_, idleFor] { pool->releaseIdle(idleFor); });
  registerHandlers();
  peers_->start();
  loop_.start();
}

Node::~Node() { shutdown(); }

// ---------------------------------------------------------------- peers' events

void Node::onPeerGone(int rank) {
  // First: requests failed next are retried at the new shard.
  directory_->moveShardFrom(rank, peers_->incarnationOf(rank), /*sawItGo=*/true);
  reduceTasks_->dropPartialResultsOf(rank);
}

void Node::onPeerFailed(int rank, const Status& failure) {
  // This node will not talk to it again: its copies leave this shard's lists.
  shardServer_->forgetHolder(rank);
  onLinkLost(rank, failure, /*stalled=*/false);
}

void Node::onLinkLost(int rank, const Status& why, bool stalled) {
  reduceTasks_->failOrphanedTasks();
  directory_->requests().failRank(rank, why);
  client_->failPullsFrom(rank, why, /*holderLives=*/stalled);
  mailbox_->failFrom(rank, 0, why);
}

void Node::onResumed() {
  // Peers that evicted this process forgot its copies and moved its shard.
  // Asking each peer something on a fresh connection makes it say, in its
  // hello ack, what moved; this node also lists its copies again (at their
  // shard as this node knows it then, and again if the news moves it).
  // Their reduces computed elsewhere what this node was computing for them,
  // or had been sent meanwhile (read in the events at hand).
  resuming_ = true;
  reduceTasks_->abandonRemoteTasks();
  loop_.runSoon([this] { resuming_ = false; });
  loop_.addTimer(kResumeDelaySeconds, [this] {
    if (shuttingDown_) return;
    peers_->redialAll();
    for (int rank = 0; rank < config_.worldSize; ++rank) {
      if (rank != config_.rank) ping(rank);
    }
    directory_->reRegisterCopies([](const std::string&) { return true; });
  });
}

void Node::onAcceptedClosed(Connection& conn, int rank, bool left, const Status& why) {
  reduceTasks_->failOrphanedTasks(&conn);
  if (left) {
    // It registered its objects over this connection: they leave this shard's
    // lists too (a peer closes its connections only when it leaves or dies).
    shardServer_->forgetHolder(rank);
    reduceTasks_->dropPartialResultsOf(rank);
  }
  if (rank >= 0 && !shuttingDown_) {
    mailbox_->failFrom(rank, conn.id(), Status(Code::kPeerFailed, "connection from " + peers_->peerName(rank) +
                                                                      " closed: " + why.message));
  }
  server_->onConnectionClosed(conn.id());
}

void Node::fillHelloAck(wire::HelloAck* ack) {
  ack->deadShards = directory_->movedShards();
  ack->returnedShards = directory_->returnedShards();
}

void Node::onPeerReady(int, const wire::HelloAck& ack) {
  for (const wire::ShareState& share : ack.returnedShards) {
    // (A return the same ack lists a later move of counts through that move.)
    const bool movedSince = std::any_of(ack.deadShards.begin(), ack.deadShards.end(), [&](const wire::ShareState& d) {
      return d.rank == share.rank && d.epoch >= share.epoch;
    });
    if (!movedSince) directory_->hearShardReturned(share);
  }
  for (const wire::ShareState& share : ack.deadShards) directory_->hearShardMoved(share);
}

void Node::onPeerRejoined(int rank) {
  directory_->shardReturned(rank);
  shardServer_->handOver();  // what this node hosted for the rejoined rank's ids goes back
  // Its copies left this node's shards when it was taken for failed (a new
  // process lists only what it has, which is no harm).
  peers_->send(rank, wire::RelistCopies{peers_->incarnationOf(rank)});
}

void Node::onPeerKnown(int rank) {
  // This process moved the share of an earlier process of that rank (news
  // heard before it knew the current one, which rejoined since): as a rejoin.
  if (directory_->movedFromAnotherProcess(rank)) {
    HLOG(kInfo, "%s is not the process whose directory shard this process took for moved", peers_->peerName(rank).c_str());
    onPeerRejoined(rank);
  }
}

uint8_t* Node::dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                               std::shared_ptr<const void>* keepalive) {
  if (Mailbox::carriesMessage(request)) return mailbox_->dataDestination(conn, request, offset, size, keepalive);
  return client_->dataDestination(conn, request, offset, size, keepalive);
}

void Node::onDataReceived(Connection& conn, uint64_t request, uint64_t end) {
  if (Mailbox::carriesMessage(request)) return mailbox_->onDataReceived(conn, request, end);
  client_->onDataReceived(conn, request, end);
}

void Node::ping(int rank) {
  directory_->probe(rank, "", [](const Status&) {});
}

// ---------------------------------------------------------------- messages

template <typename M>
void Node::handle(Route route, void (Node::*method)(Connection&, const M&)) {
  router_.on<M>(route, [this, method](Connection& conn, const M& msg) { (this->*method)(conn, msg); });
}

void Node::registerHandlers() {
  // Peers and the directory.
  handle(Route::kOnEither, &Node::handleShardMoved);
  handle(Route::kOnEither, &Node::handleShardReturned);
  handle(Route::kOnEither, &Node::handleRelistCopies);
  handle(Route::kOnEither, &Node::handleLeave);
  shardServer_->registerHandlers(router_);
  router_.on<wire::Locations>(Route::kOnEither, [this](Connection& c, const wire::Locations& m) {
    subscriptions_->onLocations(c, m);
  });
  // Answers to this node's requests.
  handle(Route::kOnEither, &Node::onStatusReply);
  handle(Route::kOnEither, &Node::onLookupReply);
  // Transfers: served, and pulled.
  handle(Route::kOnEither, &Node::handleDropCopy);
  server_->registerHandlers(router_);
  client_->registerHandlers(router_);
  reduceTasks_->registerHandlers(router_);
  mailbox_->registerHandlers(router_);
}

void Node::handleShardMoved(Connection&, const wire::ShardMoved& msg) {
  // Another member saw it go: a connect to it that is being refused now is
  // final, not a peer still starting up (requests queued for it fail at the
  // next refusal and move on to the new shard, instead of waiting out the
  // connect timeout).
  if (directory_->hearShardMoved(msg.share) && msg.share.rank != config_.rank) peers_->stopRetrying(msg.share.rank);
}

void Node::handleShardReturned(Connection&, const wire::ShardReturned& msg) { directory_->hearShardReturned(msg.share); }

void Node::handleRelistCopies(Connection& conn, const wire::RelistCopies& msg) {
  const int rank = conn.peerRank();
  // (Not once this node leaves: its copies go with it.)
  if (rank < 0 || rank == config_.rank || msg.incarnation != incarnation_ || stopped() || shuttingDown_) return;
  directory_->reRegisterCopies([&](const std::string& id) { return directory_->shardOf(id) == rank; });
}

void Node::scheduleShareReturn() {
  if (shareReturnScheduled_) return;
  const double first = kShareReturnHeartbeats * config_.heartbeatTimeoutSeconds;
  const bool soonAfterReturn = steadySeconds() - shareReturnedAt_ < kShareReturnCalm * shareReturnWait_;
  shareReturnWait_ = soonAfterReturn ? std::min(2 * shareReturnWait_, kShareReturnMaxWait * first) : first;
  armShareReturn();
}

void Node::armShareReturn() {
  shareReturnScheduled_ = true;
  loop_.addTimer(shareReturnWait_, [this] {
    shareReturnScheduled_ = false;
    if (shuttingDown_ || stopped_ || !directory_->hasMoved(config_.rank)) return;
    if (!peers_->settled()) return armShareReturn();
    if (directory_->takeShareBack()) shareReturnedAt_ = steadySeconds();
  });
}

void Node::handleLeave(Connection& conn, const wire::Leave& msg) {
  const int rank = conn.peerRank();
  // (A leave of an earlier process of that rank changes nothing.)
  if (rank >= 0 && rank != config_.rank && msg.incarnation == peers_->incarnationOf(rank) && !shuttingDown_) {
    HLOG(kInfo, "%s leaves the cluster", peers_->peerName(rank).c_str());
    peers_->markLeaving(rank);
    directory_->moveShardFrom(rank, msg.incarnation);
    shardServer_->forgetHolder(rank, /*left=*/true);
    reduceTasks_->dropPartialResultsOf(rank);
  }
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, Status()}));
}

void Node::leaveCluster(std::function<void()> done) {
  // Told: the peers this node talks to, and the new hosts of its share (the
  // others hear of the move from them, as after a failure).
  std::set<int> told = directory_->leave(incarnation_);
  for (int rank = 0; rank < config_.worldSize; ++rank) {
    if (peers_->talksTo(rank)) told.insert(rank);
  }
  for (auto it = told.begin(); it != told.end();) {
    const int rank = *it;
    it = rank == config_.rank || !directory_->isLiveMember(rank) ? told.erase(it) : std::next(it);
  }
  struct Leaving {
    size_t waiting;
    bool finished = false;
    std::function<void()> done;
  };
  auto leaving = std::make_shared<Leaving>(Leaving{told.size() + 1, false, std::move(done)});
  auto finish = [leaving] {
    if (leaving->finished) return;
    leaving->finished = true;
    leaving->done();
  };
  auto answered = [leaving, finish](const Status&) {
    if (--leaving->waiting == 0) finish();
  };
  loop_.addTimer(std::min({kLeaveSeconds, config_.connectTimeoutSeconds, config_.heartbeatTimeoutSeconds}), finish);
  for (int rank : told) {
    const uint64_t request = directory_->newRequest();
    directory_->requestStatus(rank, wire::MsgType::kLeave, wire::encode(wire::Leave{request, incarnation_}), request,
                              answered);
  }
  // After the leaves, on the same connections: parked lookups are answered
  // kMoved (asked again at the new host), and what this shard remembers of
  // gone ids goes there, with the objects only this node holds (lost now).
  shardServer_->handOver(config_.rank);
  answered(Status());
}

void Node::onStatusReply(Connection&, const wire::StatusReply& msg) {
  if (client_->onStatusReply(msg)) return;  // a holder refused or ended a pull
  directory_->requests().answer(msg.request, msg.status);  // (false: answered already, or its asker gave up)
}

void Node::onLookupReply(Connection&, const wire::LookupReply& msg) {
  directory_->requests().answer(msg.request, msg.status, &msg);
}

// ---------------------------------------------------------------- completions, stats, shutdown

void Node::pushCompletion(Completion c) {
  if (directCompletion_ && directCompletion_(c)) return;
  {
    std::lock_guard<std::mutex> lock(completionMutex_);
    completions_.push_back(std::move(c));
  }
  completionCv_.notify_all();
}

bool Node::waitCompletions(std::vector<Completion>* out, double timeoutSeconds) {
  std::unique_lock<std::mutex> lock(completionMutex_);
  completionCv_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds),
                         [this] { return closed_ || !completions_.empty(); });
  while (!completions_.empty()) {
    out->push_back(std::move(completions_.front()));
    completions_.pop_front();
  }
  return !(closed_ && out->empty());
}

Status Node::announce(double timeoutSeconds) {
  if (stopped()) return Status(Code::kShutdown, "node is shut down");
  auto done = startOnLoop(loop_, [this, timeoutSeconds](std::function<void(Status)> done) {
    // Peers that are dead too, or slow, need not hold the rejoining rank up.
    std::set<int> others;
    for (int r = 0; r < config_.worldSize; ++r) {
      if (r != config_.rank) others.insert(r);
    }
    probeRanks(others, timeoutSeconds, [done = std::move(done)](std::set<int>) { done(Status()); });
  });
  return awaitStatus(done, timeoutSeconds + kLoopAnswerGraceSeconds, "introducing this node to its peers");
}

DirectoryShard::Sizes Node::shardSizes() {
  if (loop_.onLoopThread()) return shardServer_->sizes();
  auto sizes = std::make_shared<DirectoryShard::Sizes>();
  auto read = startOnLoop(loop_, [this, sizes](std::function<void(Status)> done) {
    *sizes = shardServer_->sizes();
    done(Status());
  });
  // (Stopped, or a loop too busy to answer within the wait: zeros.)
  if (read.wait_for(std::chrono::seconds(1)) != std::future_status::ready || !read.get().ok()) return {};
  return *sizes;
}

std::map<std::string, uint64_t> Node::stats() {
  const Mailbox::Counters& messages = mailbox_->counters();
  const DirectoryShard::Sizes shard = shardSizes();
  return {
      {"bytes_sent", server_->counters().bytesSent.load() + messages.bytesSent.load()},
      {"bytes_received", client_->counters().bytesReceived.load() + messages.bytesReceived.load()},
      {"bytes_sent_same_host", server_->counters().bytesSentSameHost.load()},
      {"bytes_received_same_host", client_->counters().bytesReceivedSameHost.load()},
      {"pulls_lent", server_->counters().lent.load()},
      {"pulls_served", server_->counters().pullsServed.load()},
      {"pulls_completed", client_->counters().pullsCompleted.load()},
      {"relays_served", server_->counters().relaysServed.load()},
      {"reduces_coordinated", coordinator_->counters().coordinated.load()},
      {"reduce_tasks", reduceTasks_->counters().tasks.load()},
      {"reduce_tasks_abandoned", reduceTasks_->counters().abandoned.load()},
      {"reduce_recoveries", coordinator_->counters().recoveries.load()},
      {"reduce_bytes", reduceTasks_->counters().bytes.load()},
      {"reduce_bytes_on_device", reduceTasks_->counters().bytesOnDevice.load()},
      {"link_probes", linkEstimator_->probesSent()},
      {"pull_resumes", client_->counters().pullResumes.load()},
      {"messages_sent", messages.sent.load()},
      {"messages_received", messages.received.load()},
      {"messages_unexpected", messages.unexpected.load()},
      {"messages_deferred", messages.deferred.load()},
      {"messages_withdrawn", messages.withdrawn.load()},
      {"messages_discarded", messages.discarded.load()},
      {"mailbox_bytes", messages.waitingBytes.load()},
      {"messages_deferred_bytes", messages.deferredBytes.load()},
      {"handshakes_refused", peers_->handshakesRefused()},
      {"cut_offs", peers_->cutOffs()},
      {"rejoins", peers_->rejoins()},
      {"inline_gets", client_->counters().inlineGets.load()},
      {"local_gets", client_->counters().localGets.load()},
      {"remote_gets", client_->counters().remoteGets.load()},
      {"copies_handed_over", client_->counters().copiesHandedOver.load()},
      {"evictions", evictions_.load()},
      {"subscriptions", subscriptions_->count()},
      {"store_used_bytes", store_->usedBytes()},
      {"store_capacity_bytes", store_->capacityBytes()},
      {"store_objects", store_->count()},
      {"lookups_waiting", shardServer_->waitingLookups()},
      {"directory_entries", shard.entries},
      {"directory_inline_bytes", shard.inlineBytes},
      {"directory_gone", shard.gone},
      {"directory_standby", shard.standby},
      {"directory_watches", shard.watches},
      {"shards_moved", directory_->shardsMoved()},
      {"pool_cached_bytes", pool_->cachedBytes()},
      {"pool_mapped_bytes", pool_->mappedBytes()},
      {"pool_held_bytes", pool_->heldBytes()},
      {"heap_trims", heapTrimmer_->trims()},
      {"heap_trim_us", heapTrimmer_->trimMicros()},
  };
}

void Node::shutdown() {
  if (stopped_.exchange(true)) return;
  subscriptions_->stop();  // waiters return now
  // A leave, not a failure: the peers move this node's share of the
  // directory and drop its copies without failing over.
  auto left = std::make_shared<std::promise<void>>();
  if (loop_.post([this, left] { leaveCluster([left] { left->set_value(); }); })) {
    left->get_future().wait_for(std::chrono::duration<double>(kLeaveSeconds + 1));
  }
  std::promise<void> done;
  const bool loopRunning = loop_.post([this, &done] {
    // Set however the task ends: a step that throws must not leave shutdown
    // waiting forever.
    struct SetOnExit {
      std::promise<void>& promise;
      ~SetOnExit() { promise.set_value(); }
    } setOnExit{done};
    shuttingDown_ = true;
    directory_->close();
    Status why(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " shut down");
    client_->shutDown(why);
    peers_->closeAll(why);
    directory_->failAll(why);
    coordinator_->shutDown(why);
    reduceTasks_->shutDown(why);
    mailbox_->shutDown(why);
  });
  if (loopRunning) done.get_future().wait();
  peers_->awaitEnded(kShutdownLingerSeconds);
  loop_.stop();
  workers_->stop();
  putCopies_->stop();
  heapTrimmer_->stop();  // the Node may outlive its shutdown (a c10d backend holds it)
  {
    std::lock_guard<std::mutex> lock(completionMutex_);
    closed_ = true;
  }
  completionCv_.notify_all();
}

}  // namespace hoplite
