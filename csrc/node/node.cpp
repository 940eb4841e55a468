// Node lifecycle, peer connections and message dispatch.
#include "node/node.h"

#include <chrono>
#include <future>
#include <random>
#include <stdexcept>

#include "common/hash.h"
#include "common/logging.h"
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

// Control frames carry inline objects (up to the threshold) and their
// metadata; data frames at most the largest chunk.
wire::FrameLimits frameLimits(const NodeConfig& config) {
  return {std::max<uint64_t>(config.inlineThresholdBytes, 1u << 20) + (64u << 10), kMaxDataFrame};
}

}  // namespace

Node::Node(NodeConfig config)
    : config_(std::move(config)),
      limits_(frameLimits(config_)),
      router_(limits_.maxControl),
      hostIdentity_(config_.sameHost ? same_host::hostIdentity() : "") {
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
  const std::string probe = randomBytes(memoryProbe_.size());
  std::copy(probe.begin(), probe.end(), memoryProbe_.begin());
  while (incarnation_ == 0) incarnation_ = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  TransportOptions options{limits_, config_.socketBufferBytes, config_.tcpCongestion};
  transport_ = makeTransport(config_.transport, loop_, options);
  pool_ = std::make_shared<BufferPool>(config_.poolCacheBytes);
  store_ = std::make_unique<ObjectStore>(pool_, config_.capacityBytes, [this](const std::string& id) {
    counters_.evictions++;
    loop_.post([this, id] {
      send(shardOf(id), wire::HolderUpdate{id, config_.rank, wire::HolderState::kRemoved, -1});
    });
  });
  server_ = std::make_unique<TransferServer>(
      loop_, static_cast<PeerLinks&>(*this), *store_,
      TransferServerConfig{config_.rank, !hostIdentity_.empty(), config_.chunkBytes});
  subscriptions_ = std::make_unique<LocationSubscriptions>(
      loop_, config_.rank, [this](const std::string& id) { return shardOf(id); },
      [this](int rank, const wire::Subscribe& msg) { send(rank, msg); });
  mailbox_ = std::make_unique<Mailbox>(
      loop_, static_cast<PeerLinks&>(*this),
      MailboxConfig{config_.rank, config_.worldSize, config_.mailboxBytes, config_.capacityBytes, config_.chunkBytes});
  directory_ = std::make_unique<DirectoryShard>(loop_, [this](int rank, const wire::Locations& msg) { send(rank, msg); });
  workers_ = std::make_unique<WorkerPool>("hoplite-copy", config_.copyThreads);
  putCopies_ = std::make_unique<WorkerPool>("hoplite-putcopy", 1, kPutCopyNice);
  ReduceServices& services = *this;
  linkEstimator_ = std::make_unique<LinkEstimator>(loop_, services, config_.rank, config_.worldSize);
  coordinator_ = std::make_unique<ReduceCoordinator>(
      loop_, services,
      CoordinatorConfig{config_.rank, config_.worldSize, incarnation_, limits_.maxControl,
                        config_.heartbeatTimeoutSeconds},
      *linkEstimator_);
  reduceTasks_ = std::make_unique<ReduceTaskRunner>(loop_, services, config_.rank, *store_, *pool_, *workers_);
  registerHandlers();
  self_ = std::make_shared<LocalConnection>(loop_, this, config_.rank);
  listener_ = transport_->listen(config_.host, config_.port, this, [this](std::shared_ptr<Connection> conn) {
    // A connection that does not complete the handshake in time is dropped, so
    // silent strangers cannot pile up descriptors.
    std::weak_ptr<Connection> weak = conn;
    loop_.addTimer(config_.connectTimeoutSeconds, [weak] {
      auto c = weak.lock();
      if (c && c->isOpen() && c->peerRank() < 0) c->close(Status(Code::kProtocol, "no hello in time"));
    });
    incoming_[conn->id()] = std::move(conn);
  });
  loop_.start();
  loop_.post([this] { checkHeartbeats(); });
}

Node::~Node() { shutdown(); }

int Node::port() const { return listener_ ? listener_->port() : 0; }

double Node::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Node::shardOf(const std::string& id) const {
  return shardHost(static_cast<int>(fnv1a(id) % static_cast<uint64_t>(config_.worldSize)));
}

int Node::shardHost(int rank) const {
  while (deadShards_.count(rank)) rank = (rank + 1) % config_.worldSize;  // one always stays (moveShardFrom)
  return rank;
}

void Node::moveShardFrom(int rank) {
  // One shard always stays (a member could claim every rank failed).
  if (rank < 0 || rank >= config_.worldSize || deadShards_.count(rank) || deadShards_.size() + 1 >= static_cast<size_t>(config_.worldSize) || shuttingDown_) {
    return;
  }
  std::vector<std::shared_ptr<LocalObject>> moved;
  for (auto& obj : store_->snapshot()) {
    if (!obj->failed() && shardOf(obj->id()) == rank) moved.push_back(std::move(obj));
  }
  deadShards_.insert(rank);
  subscriptions_->shardFailed(rank);
  HLOG(kInfo, "%s is gone (failed or left): its directory shard moves on; re-registering %zu local copies",
       peerName(rank).c_str(), moved.size());
  // Everyone must agree where ids go: tell the others (who pass it on once).
  for (int r = 0; r < config_.worldSize; ++r) {
    if (r != config_.rank && r != rank && !deadShards_.count(r) && !peers_[r].lost) send(r, wire::ShardMoved{rank});
  }
  for (const auto& obj : moved) {
    wire::Register reg;
    reg.request = newRequest();
    reg.id = obj->id();
    reg.meta = obj->meta();
    reg.holder = config_.rank;
    reg.complete = obj->complete();
    reg.recomputable = obj->recomputable;
    reg.reannounce = true;
    reg.primary = obj->primary();
    if (reg.complete && obj->size() <= config_.inlineThresholdBytes) {
      reg.hasInline = true;
      reg.inlineData.assign(reinterpret_cast<const char*>(obj->data()), obj->size());
    }
    std::string id = reg.id;
    requestShard(id, wire::MsgType::kRegister, wire::encode(reg), reg.request, [this, id](const Status& s) {
      if (!s.ok()) HLOG(kDebug, "re-registering %s: %s", printableId(id).c_str(), s.message.c_str());
    });
  }
}

std::string Node::peerName(int rank) const {
  auto it = peers_.find(rank);
  if (rank == config_.rank) return "rank " + std::to_string(rank) + " (self)";
  if (it == peers_.end()) return "rank " + std::to_string(rank);
  return "rank " + std::to_string(rank) + " at " + it->second.host + ":" + std::to_string(it->second.port);
}

void Node::addPeer(int rank, const std::string& host, int port) {
  loop_.post([this, rank, host, port] {
    Peer& peer = peers_[rank];
    if (peer.host == host && peer.port == port) return;
    peer.host = host;
    peer.port = port;
    if (peer.conn) peer.conn->close(Status(Code::kPeerFailed, "peer address changed"));
  });
}

// ---------------------------------------------------------------- connections

void Node::sendTo(int rank, wire::MsgType type, std::string payload) {
  whenConnected(rank, [type, payload = std::move(payload)](Connection& c) mutable { c.sendControl(type, std::move(payload)); });
}

void Node::whenConnected(int rank, std::function<void(Connection&)> write) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (shuttingDown_) return;
  if (rank == config_.rank) {
    write(*self_);
    return;
  }
  Peer& peer = peers_[rank];
  if (peer.ready && peer.conn && peer.conn->isOpen()) {
    write(*peer.conn);
    return;
  }
  peer.queued.push_back(std::move(write));
  if (!peer.conn) {
    // Retry refused connects only while a peer may still be starting up (not
    // one known to have failed: a restarted one is listening by the time we learn of it).
    peer.connectDeadline = peer.lost || deadShards_.count(rank) ? 0 : now() + config_.connectTimeoutSeconds;
    peer.backoff = 0.05;
    connectPeer(rank);
  }
}

void Node::connectPeer(int rank) {
  Peer& peer = peers_[rank];
  if (peer.port == 0) {
    failPeer(rank, Status(Code::kPeerFailed, "no address known for rank " + std::to_string(rank)));
    return;
  }
  peer.ready = false;
  try {
    peer.conn = transport_->connect(peer.host, peer.port, this);
  } catch (const std::exception& e) {
    failPeer(rank, Status(Code::kPeerFailed, e.what()));
    return;
  }
  peer.conn->setPeerRank(rank);
  peer.helloNonce = randomBytes(wire::kNonceSize);
  peer.verified = false;
  wire::Hello hello;
  hello.rank = config_.rank;
  hello.cluster = config_.clusterId;
  hello.nonce = peer.helloNonce;
  hello.host = config_.host;
  hello.port = static_cast<uint32_t>(port());
  hello.incarnation = incarnation_;
  peer.conn->sendControl(wire::MsgType::kHello, wire::encode(hello));
  // A peer that accepts but never answers (stopped, or not a node) would
  // otherwise hold what is queued for it forever.
  std::weak_ptr<Connection> weak = peer.conn;
  loop_.addTimer(config_.connectTimeoutSeconds, [this, rank, weak] {
    auto conn = weak.lock();
    auto it = peers_.find(rank);
    if (!conn || !conn->isOpen() || it == peers_.end() || it->second.conn != conn || it->second.ready) return;
    conn->close(Status(Code::kTimeout, "no handshake with " + peerName(rank) + " within " +
                                           printableSeconds(config_.connectTimeoutSeconds)));
  });
}

void Node::failPeer(int rank, const Status& why, bool gone) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (rank < 0 || rank >= config_.worldSize) return;
  if (gone) {
    moveShardFrom(rank);  // first: requests failed below are retried at the new shard
    reduceTasks_->dropPartialResultsOf(rank);
  }
  Peer& peer = peers_[rank];
  peer.lost = true;
  // This node will not talk to it again: its copies leave this shard's lists.
  directory_->forgetHolder(rank);
  peer.conn.reset();
  peer.ready = false;
  peer.queued.clear();
  Status failure(Code::kPeerFailed, peerName(rank) + " failed: " + why.message);
  requests_.failRank(rank, failure);
  std::vector<uint64_t> pulls;
  for (const auto& [request, pull] : pulls_) {
    if (pull.rank == rank) pulls.push_back(request);
  }
  for (uint64_t request : pulls) failPull(request, failure);
  mailbox_->failFrom(rank, 0, failure);
}

std::shared_ptr<Connection> Node::sharedConnection(Connection& conn) {
  if (&conn == self_.get()) return self_;
  auto it = incoming_.find(conn.id());
  if (it != incoming_.end()) return it->second;
  for (auto& [rank, peer] : peers_) {
    if (peer.conn.get() == &conn) return peer.conn;
  }
  return nullptr;
}

void Node::onClosed(Connection& conn, const Status& why) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (shuttingDown_) noteEnded();
  handshakes_.erase(conn.id());
  if (incoming_.erase(conn.id())) {
    // A sender that went away sends nothing more (a peer never redials after
    // its connection failed): who waits for it, now or later, fails.
    // Only the connection it opened last speaks for it: an older one closing
    // late (its previous process's) says nothing about a rank that rejoined.
    const int from = conn.peerRank();
    if (from >= 0 && !shuttingDown_ && peers_[from].incoming == conn.id()) {
      peers_[from].lost = true;
      // It registered its objects over this connection: they leave this shard's
      // lists too (a peer closes its connections only when it leaves or dies).
      directory_->forgetHolder(from);
      reduceTasks_->dropPartialResultsOf(from);
    }
    if (from >= 0 && !shuttingDown_) {
      mailbox_->failFrom(from, conn.id(), Status(Code::kPeerFailed, "connection from " + peerName(from) + " closed: " + why.message));
    }
    server_->onConnectionClosed(conn.id());
    return;
  }
  int rank = conn.peerRank();
  auto it = peers_.find(rank);
  if (it == peers_.end() || it->second.conn.get() != &conn) return;  // a replaced connection
  Peer& peer = it->second;
  // Retry only connects that never completed: the peer may not be listening
  // yet (fresh namespaces take a moment). One that accepted and then closed
  // (e.g. died before its hello ack) has failed.
  bool neverConnected = !peer.ready && !conn.wasEstablished();
  if (!shuttingDown_ && neverConnected && now() < peer.connectDeadline) {
    HLOG(kDebug, "connect to %s failed (%s); retrying", peerName(rank).c_str(), why.message.c_str());
    peer.conn.reset();
    double delay = peer.backoff;
    peer.backoff = std::min(peer.backoff * 2, 1.0);
    loop_.addTimer(delay, [this, rank] {
      if (!shuttingDown_ && !peers_[rank].conn) connectPeer(rank);
    });
    return;
  }
  // One that accepted and then closed during the handshake is alive but
  // refused us (most likely another secret): its directory shard stays.
  failPeer(rank, why, /*gone=*/peer.ready || !conn.wasEstablished());
}

Digest Node::handshakeProof(const char* role, const std::string& clientNonce, const std::string& serverNonce,
                            int clientRank, int serverRank) const {
  return hmacSha256(config_.secret, std::string(role) + '\0' + config_.clusterId + '\0' + clientNonce + serverNonce +
                                        std::to_string(clientRank) + ':' + std::to_string(serverRank));
}

namespace {
std::string bytesOf(const Digest& d) { return std::string(d.begin(), d.end()); }
}  // namespace

void Node::handleHello(Connection& conn, const wire::Hello& msg) {
  if (msg.protocol != wire::kVersion) {
    conn.close(Status(Code::kProtocol, "peer speaks protocol " + std::to_string(msg.protocol)));
    return;
  }
  if (msg.cluster != config_.clusterId) {
    HLOG(kWarn, "refused connection from %s: it belongs to another cluster", conn.describe().c_str());
    conn.close(Status(Code::kProtocol, "cluster id mismatch"));
    return;
  }
  if (msg.rank < 0 || msg.rank >= config_.worldSize) {
    conn.close(Status(Code::kProtocol, "peer rank out of range"));
    return;
  }
  Handshake hs{msg.rank, msg.nonce, randomBytes(wire::kNonceSize), msg.host, static_cast<int>(msg.port),
               msg.incarnation};
  wire::Challenge challenge{hs.serverNonce,
                            bytesOf(handshakeProof("server", hs.clientNonce, hs.serverNonce, hs.rank, config_.rank))};
  handshakes_[conn.id()] = std::move(hs);
  conn.sendControl(wire::MsgType::kChallenge, wire::encode(challenge));
}

void Node::handleAuth(Connection& conn, const wire::Auth& msg) {
  Handshake hs = std::move(handshakes_[conn.id()]);
  handshakes_.erase(conn.id());
  if (!equalDigests(handshakeProof("client", hs.clientNonce, hs.serverNonce, hs.rank, config_.rank), msg.proof)) {
    counters_.handshakesRefused++;
    HLOG(kWarn, "refused connection from %s claiming rank %d: it does not know the cluster secret (HOPLITE_SECRET)",
         conn.describe().c_str(), hs.rank);
    conn.close(Status(Code::kProtocol, "authentication failed"));
    return;
  }
  conn.setPeerRank(hs.rank);
  conn.markTrusted();
  adoptPeer(hs.rank, hs, conn.id());
  wire::HelloAck ack{config_.rank, {}};
  ack.deadShards.assign(deadShards_.begin(), deadShards_.end());
  offerSameHost(&ack);
  conn.sendControl(wire::MsgType::kHelloAck, wire::encode(ack));
}

// A peer proved who it is: its address is where it listens now. A new process
// (another incarnation, or a new address), or a peer we had given up on, is a
// restarted process (a rank that rejoins): what we knew of the old one is
// dropped, and we reach the new one from now on.
void Node::adoptPeer(int rank, const Handshake& hello, uint64_t connectionId) {
  const std::string& host = hello.host;
  const int port = hello.port;
  Peer& peer = peers_[rank];
  const bool moved = peer.port != 0 && (peer.host != host || peer.port != port);
  const bool reborn = peer.incarnation != 0 && hello.incarnation != 0 && peer.incarnation != hello.incarnation;
  peer.incoming = connectionId;
  if (!moved && !reborn && !peer.lost) {
    peer.host = host;
    peer.port = port;
    if (hello.incarnation != 0) peer.incarnation = hello.incarnation;
    return;
  }
  // What was on its way to the old process fails (and is asked again where that retries).
  if (peer.conn || !peer.queued.empty()) failPeer(rank, Status(Code::kPeerFailed, peerName(rank) + " restarted"));
  HLOG(kInfo, "rank %d rejoined from %s:%d", rank, host.c_str(), port);
  Peer fresh;
  fresh.host = host;
  fresh.port = port;
  fresh.incoming = connectionId;
  fresh.incarnation = hello.incarnation;
  peers_[rank] = std::move(fresh);
}

bool Node::authenticated(Connection& conn) const {
  if (&conn == self_.get()) return true;
  if (incoming_.count(conn.id())) return conn.peerRank() >= 0;  // set once the client's proof checked out
  auto it = peers_.find(conn.peerRank());
  return it != peers_.end() && it->second.conn.get() == &conn && it->second.ready;
}

void Node::handleChallenge(Connection& conn, const wire::Challenge& msg) {
  auto it = peers_.find(conn.peerRank());
  if (it == peers_.end() || it->second.conn.get() != &conn || it->second.verified || it->second.helloNonce.empty()) {
    conn.close(Status(Code::kProtocol, "unexpected challenge"));
    return;
  }
  Peer& peer = it->second;
  if (!equalDigests(handshakeProof("server", peer.helloNonce, msg.nonce, config_.rank, conn.peerRank()), msg.proof)) {
    counters_.handshakesRefused++;
    HLOG(kWarn, "%s does not know the cluster secret: refusing it", peerName(conn.peerRank()).c_str());
    conn.close(Status(Code::kProtocol, "it failed authentication (a different HOPLITE_SECRET?)"));
    return;
  }
  peer.verified = true;
  conn.markTrusted();  // data frames from it are accepted from now on
  wire::Auth auth{bytesOf(handshakeProof("client", peer.helloNonce, msg.nonce, config_.rank, conn.peerRank()))};
  peer.helloNonce.clear();
  conn.sendControl(wire::MsgType::kAuth, wire::encode(auth));
}

void Node::heardFrom(Connection& conn) {
  auto it = peers_.find(conn.peerRank());
  if (it != peers_.end() && it->second.conn.get() == &conn) it->second.lastHeard = now();
}

void Node::checkHeartbeats() {
  if (shuttingDown_) return;
  const double t = now();
  // After this process itself stalled (stopped, starved), answers may be
  // waiting unread: start counting again instead of failing everyone.
  const bool late = lastHeartbeatCheck_ > 0 && t - lastHeartbeatCheck_ > 2 * config_.heartbeatIntervalSeconds + 1;
  lastHeartbeatCheck_ = t;
  if (late) {
    for (auto& [rank, peer] : peers_) peer.lastHeard = t;
  }
  std::vector<int> silent, quiet;
  for (const auto& [rank, peer] : peers_) {
    if (!peer.ready || !peer.conn || !peer.conn->isOpen()) continue;
    if (t - peer.lastHeard > config_.heartbeatTimeoutSeconds) {
      silent.push_back(rank);
    } else if (t - peer.lastHeard >= config_.heartbeatIntervalSeconds) {
      quiet.push_back(rank);
    }
  }
  // Acting may send to other peers (and so add entries): not while iterating.
  for (int rank : silent) {
    auto it = peers_.find(rank);
    if (it == peers_.end() || !it->second.conn) continue;
    auto conn = it->second.conn;
    conn->close(Status(Code::kPeerFailed, "it answered nothing for " + printableSeconds(config_.heartbeatTimeoutSeconds) +
                                              " (HOPLITE_HEARTBEAT_TIMEOUT)"));  // fails everything waiting on it
  }
  for (int rank : quiet) {
    uint64_t request = newRequest();
    requestStatus(rank, wire::MsgType::kProbe, wire::encode(wire::Probe{request, ""}), request, [](const Status&) {});
  }
  loop_.addTimer(config_.heartbeatIntervalSeconds, [this] { checkHeartbeats(); });
}

void Node::onFrame(Connection& conn, wire::MsgType type, const uint8_t* payload, size_t size) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  heardFrom(conn);
  wire::Reader reader(payload, size);
  try {
    dispatch(conn, type, reader);
  } catch (const wire::DecodeError& e) {
    HLOG(kWarn, "malformed message from %s: %s", conn.describe().c_str(), e.what());
    conn.close(Status(Code::kProtocol, std::string("malformed message: ") + e.what()));
  }
}

void Node::dispatch(Connection& conn, wire::MsgType type, wire::Reader& reader) {
  bool isIncoming = incoming_.count(conn.id()) > 0;
  if (isIncoming && conn.peerRank() < 0) {
    // Nothing but the handshake, in order, before it completes.
    const bool challenged = handshakes_.count(conn.id()) > 0;
    if (type == wire::MsgType::kHello && !challenged) {
      handleHello(conn, wire::Hello::decode(reader));
    } else if (type == wire::MsgType::kAuth && challenged) {
      handleAuth(conn, wire::Auth::decode(reader));
    } else {
      conn.close(Status(Code::kProtocol, "message out of handshake order"));
    }
    return;
  }
  if (!isIncoming && !authenticated(conn) && type != wire::MsgType::kChallenge && type != wire::MsgType::kHelloAck) {
    // A server that has not proved it knows the secret gets no say.
    conn.close(Status(Code::kProtocol, "message before the server authenticated"));
    return;
  }
  if (!router_.route(conn, isIncoming, type, reader)) {
    conn.close(Status(Code::kProtocol, "unexpected message type " + std::to_string(static_cast<int>(type)) +
                                           (isIncoming ? " on a connection the peer dialed" : " on a dialed connection")));
  }
}

template <typename M>
void Node::handle(Route route, void (Node::*method)(Connection&, const M&)) {
  router_.on<M>(route, [this, method](Connection& conn, const M& msg) { (this->*method)(conn, msg); });
}

void Node::registerHandlers() {
  // Peers and the directory.
  handle(Route::kOnDialed, &Node::handleChallenge);
  handle(Route::kOnDialed, &Node::handleHelloAck);
  handle(Route::kOnEither, &Node::handleShardMoved);
  handle(Route::kOnEither, &Node::handleProbe);
  handle(Route::kOnEither, &Node::handleRegister);
  handle(Route::kOnEither, &Node::handleHolderUpdate);
  handle(Route::kOnEither, &Node::handleLookup);
  handle(Route::kOnEither, &Node::handleDelete);
  handle(Route::kOnEither, &Node::handleSubscribe);
  router_.on<wire::Locations>(Route::kOnEither, [this](Connection& c, const wire::Locations& m) {
    subscriptions_->onLocations(c, m);
  });
  // Answers to this node's requests.
  handle(Route::kOnEither, &Node::onStatusReply);
  handle(Route::kOnEither, &Node::onLookupReply);
  // Transfers: served, and pulled.
  handle(Route::kOnEither, &Node::handleDropCopy);
  handle(Route::kOnEither, &Node::handleDataAt);
  server_->registerHandlers(router_);
  reduceTasks_->registerHandlers(router_);
  mailbox_->registerHandlers(router_);
}

void Node::handleHelloAck(Connection& conn, const wire::HelloAck& ack) {
  auto it = peers_.find(conn.peerRank());
  if (it == peers_.end() || it->second.conn.get() != &conn || ack.rank != conn.peerRank() || !it->second.verified) {
    conn.close(Status(Code::kProtocol, "unexpected hello ack"));
    return;
  }
  Peer& peer = it->second;
  peer.ready = true;
  peer.lastHeard = now();
  peer.memory = acceptSameHost(conn.peerRank(), ack);  // before the queued pulls go out
  for (int32_t rank : ack.deadShards) {
    if (rank >= 0 && rank < config_.worldSize) moveShardFrom(rank);
  }
  auto queued = std::move(peer.queued);
  peer.queued.clear();
  // A failed send closes the connection and fails the peer's requests.
  auto c = peer.conn;
  for (auto& write : queued) {
    if (!c->isOpen()) break;
    write(*c);
  }
}

void Node::handleShardMoved(Connection&, const wire::ShardMoved& msg) {
  if (msg.rank < 0 || msg.rank >= config_.worldSize) return;
  // Another member saw it go: a connect to it that is being refused now is
  // final, not a peer still starting up (requests queued for it fail at the
  // next refusal and move on to the new shard, instead of waiting out the
  // connect timeout).
  auto peer = peers_.find(msg.rank);
  if (peer != peers_.end()) peer->second.connectDeadline = 0;
  moveShardFrom(msg.rank);
}

void Node::handleProbe(Connection& conn, const wire::Probe& msg) {
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, Status()}));
}

void Node::handleHolderUpdate(Connection& conn, const wire::HolderUpdate& msg) {
  bool known = directory_->updateHolder(msg);
  if (!known && msg.state != wire::HolderState::kRemoved && msg.holder == conn.peerRank()) {
    // A copy finished after its object was deleted: it must not outlive the delete.
    uint64_t drop = newRequest();
    requestStatus(msg.holder, wire::MsgType::kDropCopy, wire::encode(wire::DropCopy{drop, msg.id}), drop,
                  [](const Status&) {});
  }
}

void Node::onStatusReply(Connection&, const wire::StatusReply& msg) {
  if (pulls_.count(msg.request)) {
    failPull(msg.request, msg.status);
    return;
  }
  requests_.answer(msg.request, msg.status);  // (false: answered already, or its asker gave up)
}

void Node::onLookupReply(Connection&, const wire::LookupReply& msg) {
  requests_.answer(msg.request, msg.status, &msg);
}

// ---------------------------------------------------------------- completions, stats, shutdown

void Node::pushCompletion(Completion c) {
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
  return awaitStatus(done, timeoutSeconds + 5, "introducing this node to its peers");
}

std::map<std::string, uint64_t> Node::stats() {
  const Mailbox::Counters& messages = mailbox_->counters();
  return {
      {"bytes_sent", server_->counters().bytesSent.load() + messages.bytesSent.load()},
      {"bytes_received", counters_.bytesReceived.load() + messages.bytesReceived.load()},
      {"bytes_sent_same_host", server_->counters().bytesSentSameHost.load()},
      {"bytes_received_same_host", counters_.bytesReceivedSameHost.load()},
      {"pulls_lent", server_->counters().lent.load()},
      {"pulls_served", server_->counters().pullsServed.load()},
      {"pulls_completed", counters_.pullsCompleted.load()},
      {"relays_served", server_->counters().relaysServed.load()},
      {"reduces_coordinated", coordinator_->counters().coordinated.load()},
      {"reduce_tasks", reduceTasks_->counters().tasks.load()},
      {"reduce_recoveries", coordinator_->counters().recoveries.load()},
      {"reduce_bytes", reduceTasks_->counters().bytes.load()},
      {"reduce_bytes_on_device", reduceTasks_->counters().bytesOnDevice.load()},
      {"link_probes", linkEstimator_->probesSent()},
      {"pull_resumes", counters_.pullResumes.load()},
      {"messages_sent", messages.sent.load()},
      {"messages_received", messages.received.load()},
      {"messages_unexpected", messages.unexpected.load()},
      {"messages_deferred", messages.deferred.load()},
      {"messages_withdrawn", messages.withdrawn.load()},
      {"mailbox_bytes", messages.waitingBytes.load()},
      {"handshakes_refused", counters_.handshakesRefused.load()},
      {"inline_gets", counters_.inlineGets.load()},
      {"local_gets", counters_.localGets.load()},
      {"remote_gets", counters_.remoteGets.load()},
      {"copies_handed_over", counters_.copiesHandedOver.load()},
      {"evictions", counters_.evictions.load()},
      {"subscriptions", subscriptions_->count()},
      {"store_used_bytes", store_->usedBytes()},
      {"store_capacity_bytes", store_->capacityBytes()},
      {"store_objects", store_->count()},
      {"lookups_waiting", directory_->waitingLookups()},
      {"pool_cached_bytes", pool_->cachedBytes()},
      {"pool_mapped_bytes", pool_->mappedBytes()},
  };
}

void Node::noteEnded() {
  if (allEndedKept_) return;
  for (const auto& conn : ending_) {
    if (conn->isOpen()) return;
  }
  allEndedKept_ = true;
  allEnded_.set_value();
}

void Node::shutdown() {
  if (stopped_.exchange(true)) return;
  subscriptions_->stop();  // waiters return now
  std::promise<void> done;
  const bool loopRunning = loop_.post([this, &done] {
    // Set however the task ends: a step that throws must not leave shutdown
    // waiting forever.
    struct SetOnExit {
      std::promise<void>& promise;
      ~SetOnExit() { promise.set_value(); }
    } setOnExit{done};
    shuttingDown_ = true;
    Status why(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " shut down");
    listener_->close();
    std::vector<uint64_t> gets;
    for (const auto& entry : gets_) gets.push_back(entry.first);
    for (uint64_t token : gets) finishGet(token, why);
    // What this node sent before it shut down still reaches its peers (e.g.
    // the last pieces of a collective that completed here): see closeGracefully.
    for (auto& [rank, peer] : peers_) {
      if (peer.conn) ending_.push_back(peer.conn);
      peer.queued.clear();  // also of peers waiting to redial: their sends fail now
    }
    for (auto& [id, conn] : incoming_) ending_.push_back(conn);
    for (auto& conn : std::vector(ending_)) conn->closeGracefully(why);
    noteEnded();
    self_->close(why);
    requests_.failRank(-1, why);
    coordinator_->shutDown(why);
    reduceTasks_->shutDown(why);
    mailbox_->shutDown(why);
  });
  if (loopRunning) done.get_future().wait();
  // Bounded: a hung peer that never ends its side does not hold shutdown.
  if (allEnded_.get_future().wait_for(std::chrono::duration<double>(kShutdownLingerSeconds)) !=
      std::future_status::ready) {
    std::promise<void> forced;
    const bool posted = loop_.post([this, &forced] {
      for (auto& conn : ending_) conn->close(Status(Code::kShutdown, "node shut down before its peer ended the connection"));
      forced.set_value();
    });
    if (posted) forced.get_future().wait();
  }
  ending_.clear();
  loop_.stop();
  workers_->stop();
  putCopies_->stop();
  {
    std::lock_guard<std::mutex> lock(completionMutex_);
    closed_ = true;
  }
  completionCv_.notify_all();
}

}  // namespace hoplite
