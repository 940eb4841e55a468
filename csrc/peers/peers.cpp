// Connections to peers: dialing, failure, heartbeats, and what a frame must
// pass before the router sees it. The handshake is in handshake.cpp.
#include "peers/peers.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>

#include "common/logging.h"
#include "common/timeouts.h"

namespace hoplite {
Peers::Peers(EventLoop& loop, std::unique_ptr<Transport> transport, MessageRouter& router, PeerEvents& events,
             PeersConfig config)
    : loop_(loop),
      transport_(std::move(transport)),
      router_(router),
      events_(events),
      config_(std::move(config)),
      hostIdentity_(config_.sameHost ? same_host::hostIdentity() : "") {
  const std::string probe = randomBytes(memoryProbe_.size());
  std::copy(probe.begin(), probe.end(), memoryProbe_.begin());
  router_.on<wire::Challenge>(Route::kOnDialed, [this](Connection& c, const wire::Challenge& m) { handleChallenge(c, m); });
  router_.on<wire::HelloAck>(Route::kOnDialed, [this](Connection& c, const wire::HelloAck& m) { handleHelloAck(c, m); });
  router_.on<wire::Probe>(Route::kOnEither, [this](Connection& c, const wire::Probe& m) { handleProbe(c, m); });
}

Peers::~Peers() = default;

void Peers::start() {
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
  loop_.post([this] { checkHeartbeats(); });
}

int Peers::port() const { return listener_ ? listener_->port() : 0; }

void Peers::addPeer(int rank, const std::string& host, int port) {
  loop_.post([this, rank, host, port] {
    Peer& peer = peers_[rank];
    if (peer.host == host && peer.port == port) return;
    peer.host = host;
    peer.port = port;
    if (peer.conn) {
      peer.conn->close(Status(Code::kPeerFailed, "peer address changed"));
    } else {
      dialIfAwaited(rank);
    }
  });
}

void Peers::stopRetrying(int rank) {
  auto peer = peers_.find(rank);
  if (peer != peers_.end()) peer->second.connectDeadline = 0;
}

void Peers::markLeaving(int rank) {
  auto peer = peers_.find(rank);
  if (peer == peers_.end()) return;
  peer->second.leaving = true;
  peer->second.connectDeadline = 0;
}

bool Peers::talksTo(int rank) const {
  auto peer = peers_.find(rank);
  if (peer == peers_.end()) return false;
  return (peer->second.ready && peer->second.conn && peer->second.conn->isOpen()) ||
         incoming_.count(peer->second.incoming) > 0;
}

bool Peers::isReady(int rank) const {
  auto peer = peers_.find(rank);
  return peer != peers_.end() && peer->second.ready;
}

bool Peers::hasConnection(int rank) const {
  auto peer = peers_.find(rank);
  return peer != peers_.end() && peer->second.conn != nullptr;
}

std::shared_ptr<same_host::PeerMemory> Peers::memoryOf(int rank) const {
  auto peer = peers_.find(rank);
  return peer != peers_.end() ? peer->second.memory : nullptr;
}

bool Peers::hasFailed(int rank) { return peers_[rank].lost; }

bool Peers::isLeaving(int rank) const {
  auto peer = peers_.find(rank);
  return peer != peers_.end() && peer->second.leaving;
}

uint64_t Peers::latestIncoming(int rank) { return peers_[rank].incoming; }

uint64_t Peers::incarnationOf(int rank) const {
  if (rank == config_.rank) return config_.incarnation;
  auto it = peers_.find(rank);
  return it == peers_.end() ? 0 : it->second.incarnation;
}

std::string Peers::peerName(int rank) const {
  auto it = peers_.find(rank);
  if (rank == config_.rank) return "rank " + std::to_string(rank) + " (self)";
  if (it == peers_.end()) return "rank " + std::to_string(rank);
  return "rank " + std::to_string(rank) + " at " + it->second.host + ":" + std::to_string(it->second.port);
}

// ---------------------------------------------------------------- connections

void Peers::whenConnected(int rank, std::function<void(Connection&)> write) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (closing_) return;
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
  if (!peer.conn && !peer.awaitingAddress && !peer.dialFailed) {
    // Retry refused connects only while a peer may still be starting up (not
    // one known to have failed: a restarted one is listening by the time we learn of it).
    peer.connectDeadline =
        peer.lost || peer.refusalIsFinal || events_.departed(rank) ? 0 : steadySeconds() + config_.connectTimeoutSeconds;
    peer.backoff = 0.05;
    peer.redialed = false;
    connectPeer(rank);
  }
}

void Peers::connectPeer(int rank) {
  Peer& peer = peers_[rank];
  if (peer.port == 0) {
    awaitAddress(rank);
    return;
  }
  peer.ready = false;
  peer.acceptedAt = 0;
  try {
    peer.conn = transport_->connect(peer.host, peer.port, this);
  } catch (const std::exception& e) {
    failDialSoon(rank, Status(Code::kPeerFailed, e.what()));
    return;
  }
  peer.conn->setPeerRank(rank);
  sendHello(peer);
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

void Peers::failDialSoon(int rank, const Status& why) {
  peers_[rank].dialFailed = true;
  loop_.runSoon([this, rank, why] {
    if (std::exchange(peers_[rank].dialFailed, false)) failPeer(rank, why);
  });
}

void Peers::awaitAddress(int rank) {
  // A peer's address comes from the rendezvous (addPeer) or from its hello,
  // and a peer may write to this node before either reached it (it finished
  // the rendezvous first): what is queued for it waits, up to the connect
  // deadline, instead of failing a peer that is merely not heard of yet.
  Peer& peer = peers_[rank];
  if (steadySeconds() >= peer.connectDeadline) {
    failDialSoon(rank, Status(Code::kPeerFailed, "no address known for rank " + std::to_string(rank) + " within " +
                                                     printableSeconds(config_.connectTimeoutSeconds)));
    return;
  }
  peer.awaitingAddress = true;
  loop_.addTimer(peer.connectDeadline - steadySeconds(), [this, rank] {
    if (!closing_) dialIfAwaited(rank);
  });
}

void Peers::dialIfAwaited(int rank) {
  Peer& peer = peers_[rank];
  if (!peer.awaitingAddress) return;
  peer.awaitingAddress = false;
  connectPeer(rank);
}

void Peers::failPeer(int rank, const Status& why, bool gone) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (rank < 0 || rank >= config_.worldSize) return;
  Peer& peer = peers_[rank];
  // A dial made because it still talked to us (heardFrom): failing, it proves nothing.
  if (peer.probing) gone = false;
  peer.probing = false;
  if (gone) events_.onPeerGone(rank);
  peer.lost = true;
  peer.awaitingAddress = false;
  peer.dialFailed = false;
  peer.conn.reset();
  peer.ready = false;
  peer.queued.clear();
  events_.onPeerFailed(rank, Status(Code::kPeerFailed, peer.leaving ? peerName(rank) + " left (it shut down)"
                                                                     : peerName(rank) + " failed: " + why.message));
}

std::shared_ptr<Connection> Peers::sharedConnection(Connection& conn) {
  if (&conn == self_.get()) return self_;
  auto it = incoming_.find(conn.id());
  if (it != incoming_.end()) return it->second;
  for (auto& [rank, peer] : peers_) {
    if (peer.conn.get() == &conn) return peer.conn;
  }
  return nullptr;
}

void Peers::onClosed(Connection& conn, const Status& why) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (closing_) noteEnded();
  handshakes_.erase(conn.id());
  if (!incoming_.erase(conn.id())) return onDialedClosed(conn, why);
  // A sender that went away sends nothing more (a peer never redials after
  // its connection failed): who waits for it, now or later, fails.
  // Only the connection it opened last speaks for it: an older one closing
  // late (its previous process's) says nothing about a rank that rejoined.
  const int from = conn.peerRank();
  const bool left =
      from >= 0 && !closing_ && !cutOff_ && peers_[from].incoming == conn.id() && !justStalled(steadySeconds());
  if (left) peers_[from].lost = true;
  events_.onAcceptedClosed(conn, from, left, why);
}

void Peers::onDialedClosed(Connection& conn, const Status& why) {
  int rank = conn.peerRank();
  auto it = peers_.find(rank);
  if (it == peers_.end() || it->second.conn.get() != &conn) return;  // a replaced connection
  Peer& peer = it->second;
  if (!closing_ && peer.ready && justStalled(steadySeconds())) {
    // It most likely declared this process failed while it was stalled: it
    // is not to blame and its shard stays (it tells us what it moved when we
    // dial it again).
    HLOG(kWarn, "the connection to %s closed while this process was stalled (%s): redialing it when needed",
         peerName(rank).c_str(), why.message.c_str());
    return dropLink(peer, rank, "the connection to " + peerName(rank) +
                                    " closed while this process was stalled past the heartbeat timeout (" +
                                    why.message + ")",
                    /*stalled=*/!peer.leaving);
  }
  // Cut off, a silent peer is not blamed; one whose host refuses the connect
  // (reachable, and nothing listens) is gone all the same.
  const bool refused = !conn.wasEstablished() && why.code != Code::kTimeout;
  if (!closing_ && cutOff_ && !refused) {
    return dropLink(peer, rank, "cannot reach " + peerName(rank) +
                                    ": this process is cut off from most of its peers (a network partition?) and "
                                    "fails what waits on them (" + why.message + ")",
                    /*stalled=*/false);
  }
  // Retry only connects that never completed: the peer may not be listening
  // yet (fresh namespaces take a moment). One that accepted and then closed
  // (e.g. died before its hello ack) has failed.
  bool neverConnected = !peer.ready && !conn.wasEstablished();
  if (!closing_ && neverConnected && steadySeconds() < peer.connectDeadline) {
    HLOG(kDebug, "connect to %s failed (%s); retrying", peerName(rank).c_str(), why.message.c_str());
    peer.conn.reset();
    double delay = peer.backoff;
    peer.backoff = std::min(peer.backoff * 2, 1.0);
    loop_.addTimer(delay, [this, rank] {
      if (!closing_ && !peers_[rank].conn) connectPeer(rank);
    });
    return;
  }
  // One that accepted and then closed the handshake itself either died
  // meanwhile or refuses us (another cluster). One redial tells which: a
  // dead process's port refuses the connect (its shard moves on, and what
  // waited for it is asked again there); a live one closes again, and its
  // shard stays. Closes of our own making (a bad proof, no answer) are final.
  const bool closedByPeer = why.code == Code::kPeerFailed;
  if (!closing_ && !peer.ready && conn.wasEstablished() && closedByPeer && !peer.redialed) {
    HLOG(kDebug, "%s closed during the handshake (%s); redialing once", peerName(rank).c_str(), why.message.c_str());
    peer.redialed = true;
    peer.conn.reset();
    peer.connectDeadline = 0;  // a refused connect is final
    connectPeer(rank);
    return;
  }
  failPeer(rank, why, /*gone=*/peer.ready || !conn.wasEstablished());
}

// ---------------------------------------------------------------- heartbeats

void Peers::heardFrom(Connection& conn) {
  auto it = peers_.find(conn.peerRank());
  if (it == peers_.end()) return;
  Peer& peer = it->second;
  if (peer.conn.get() == &conn) {
    peer.lastHeard = steadySeconds();
    return;
  }
  // A peer this node gave up on by itself (its handshake timed out while it
  // was stopped for a moment) still talks over a connection it opened:
  // dialing it takes it back if it is the same process (handleHelloAck). At
  // most once a heartbeat interval.
  const double now = steadySeconds();
  if (peer.lost && !peer.conn && !peer.leaving && !peer.awaitingAddress && incoming_.count(conn.id()) && !closing_ &&
      now - peer.probedAt >= config_.heartbeatIntervalSeconds) {
    peer.probedAt = now;
    const int rank = it->first;
    loop_.runSoon([this, rank] {
      auto again = peers_.find(rank);
      if (closing_ || again == peers_.end() || !again->second.lost || again->second.conn || again->second.leaving) return;
      HLOG(kInfo, "%s, given up on, still talks to this process: dialing it", peerName(rank).c_str());
      again->second.probing = true;
      connectPeer(rank);
    });
  }
}

void Peers::redialAll() {
  std::vector<std::shared_ptr<Connection>> dialed;
  for (const auto& [rank, peer] : peers_) {
    if (peer.conn) dialed.push_back(peer.conn);
  }
  // Closed in the stall's window: not blamed on the peers (onDialedClosed).
  for (const auto& c : dialed) c->close(Status(Code::kPeerFailed, "redialing after this process stalled"));
}

bool Peers::heartbeatOverdue(double t) const {
  return lastHeartbeatCheck_ > 0 && t - lastHeartbeatCheck_ > 2 * config_.heartbeatIntervalSeconds + 1;
}

bool Peers::justStalled(double t) const { return heartbeatOverdue(t) || t < stalledUntil_; }

bool Peers::settled() const { return !cutOff_ && !justStalled(steadySeconds()); }

void Peers::checkHeartbeats() {
  if (closing_) return;
  const double t = steadySeconds();
  // After this process itself stalled (stopped, starved), answers may be
  // waiting unread: start counting again instead of failing everyone.
  const bool late = heartbeatOverdue(t);
  const double stalledFor = t - lastHeartbeatCheck_;
  lastHeartbeatCheck_ = t;
  if (late) {
    for (auto& [rank, peer] : peers_) peer.lastHeard = t;
    stalledUntil_ = t + config_.heartbeatTimeoutSeconds;  // their closes may still be on their way
    HLOG(kWarn, "this process stalled for %s", printableSeconds(stalledFor).c_str());
    // Peers may have evicted it already (they count silence from their last
    // frame, up to an interval before this stall began): assume they did.
    events_.onResumed();
  }
  checkCutOff(t);
  std::vector<int> silent, quiet;
  std::vector<std::pair<int, std::shared_ptr<Connection>>> mute;
  for (auto& [rank, peer] : peers_) {
    if (!peer.ready && peer.conn && peer.conn->isOpen() && peer.conn->wasEstablished()) {
      // Accepted and silent since (a stopped process's kernel still accepts):
      // as dead as a peer silent on a connection in use. (A connect timeout
      // shorter than the heartbeat timeout gives up on it first, alone.)
      // Counted from when this process last ran settled.
      if (late || peer.acceptedAt == 0 || justStalled(t)) peer.acceptedAt = t;
      if (t - std::max(peer.acceptedAt, peer.lastHeard) > config_.heartbeatTimeoutSeconds) {
        mute.emplace_back(rank, peer.conn);
      }
      continue;
    }
    if (!peer.ready || !peer.conn || !peer.conn->isOpen()) {
      // Cut off: the silent peers are redialed, to find out when the link is back.
      if (cutOff_ && !peer.conn && !peer.awaitingAddress && !peer.leaving) quiet.push_back(rank);
      continue;
    }
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
    Status why(Code::kPeerFailed, "it answered nothing for " + printableSeconds(config_.heartbeatTimeoutSeconds) +
                                      " (HOPLITE_HEARTBEAT_TIMEOUT)");
    conn->close(why);  // fails everything waiting on it
  }
  for (const auto& [rank, conn] : mute) {
    auto it = peers_.find(rank);
    if (it == peers_.end() || it->second.conn != conn || it->second.ready) continue;
    Status why(Code::kPeerFailed, "it accepted the connection but answered nothing for " +
                                      printableSeconds(config_.heartbeatTimeoutSeconds) + " (HOPLITE_HEARTBEAT_TIMEOUT)");
    // Cut off, it is blamed on no one (onDialedClosed); else failPeer lets go
    // of the connection first, so onDialedClosed ignores its close.
    if (!cutOff_) failPeer(rank, why);
    conn->close(why);
  }
  for (int rank : quiet) events_.ping(rank);
  loop_.addTimer(config_.heartbeatIntervalSeconds, [this] { checkHeartbeats(); });
}

double Peers::fadingAfterSeconds() const {
  // Peers fall silent within a heartbeat interval of each other when this
  // process's link goes: those half-way to the timeout count too. An idle,
  // healthy peer is pinged only once quiet for an interval, so it may be
  // quiet for two intervals and a round trip: never less than that.
  return std::min(config_.heartbeatTimeoutSeconds,
                  std::max(config_.heartbeatTimeoutSeconds / 2, 2 * config_.heartbeatIntervalSeconds + 0.5));
}

void Peers::checkCutOff(double t) {
  if (cutOff_) return leaveCutOffIfMostReached();  // (also when the live peers shrank meanwhile)
  const double fadingAfter = fadingAfterSeconds();
  int talking = 0, silent = 0;
  std::vector<std::shared_ptr<Connection>> fading;
  for (const auto& [rank, peer] : peers_) {
    if (!peer.ready || !peer.conn || !peer.conn->isOpen()) continue;
    ++talking;
    const double quietFor = t - peer.lastHeard;
    silent += quietFor > config_.heartbeatTimeoutSeconds;
    if (quietFor > fadingAfter) fading.push_back(peer.conn);
  }
  // One silent peer is that peer's trouble; most of them at once, this process's.
  const int count = static_cast<int>(fading.size());
  if (silent == 0 || count < 2 || 2 * count <= talking) return;
  cutOff_ = true;
  counters_.cutOffs++;
  HLOG(kWarn,
       "%d of the %d peers this process talks to answered nothing for over %s: taking this process for cut off from "
       "the cluster (a network partition?). It declares none of them failed, fails what waits on them, and redials "
       "them until it reaches most of its peers again",
       count, talking, printableSeconds(fadingAfter).c_str());
  for (const auto& c : fading) c->close(Status(Code::kPeerFailed, "it answered nothing (HOPLITE_HEARTBEAT_TIMEOUT)"));
}

void Peers::dropLink(Peer& peer, int rank, const std::string& why, bool stalled) {
  peer.conn.reset();
  peer.ready = false;
  peer.queued.clear();  // (what they carried is failed next)
  peer.refusalIsFinal = stalled;
  events_.onLinkLost(rank, Status(Code::kPeerFailed, why), stalled);
}

void Peers::leaveCutOffIfMostReached() {
  if (!cutOff_) return;
  // Of the peers not known to be gone (failed before the cut, or moved on).
  int reached = 0, members = 0;
  for (const auto& [rank, peer] : peers_) {
    if (rank == config_.rank || peer.lost || events_.departed(rank)) continue;
    ++members;
    reached += peer.ready && peer.conn && peer.conn->isOpen();
  }
  if (2 * reached <= members) return;
  cutOff_ = false;
  HLOG(kWarn, "this process reaches %d of its %d live peers again: no longer cut off", reached, members);
  // The others most likely declared it failed meanwhile: it recovers as after a stall.
  stalledUntil_ = steadySeconds() + config_.heartbeatTimeoutSeconds;
  events_.onResumed();
}

// ---------------------------------------------------------------- frames

void Peers::onFrame(Connection& conn, wire::MsgType type, const uint8_t* payload, size_t size) {
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

bool Peers::authenticated(Connection& conn) const {
  if (&conn == self_.get()) return true;
  if (incoming_.count(conn.id())) return conn.peerRank() >= 0;  // set once the client's proof checked out
  auto it = peers_.find(conn.peerRank());
  return it != peers_.end() && it->second.conn.get() == &conn && it->second.ready;
}

void Peers::dispatch(Connection& conn, wire::MsgType type, wire::Reader& reader) {
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

uint8_t* Peers::dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                                std::shared_ptr<const void>* keepalive) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  heardFrom(conn);
  if (!authenticated(conn)) {
    conn.close(Status(Code::kProtocol, "data before the handshake completed"));
    return nullptr;
  }
  return events_.dataDestination(conn, request, offset, size, keepalive);
}

void Peers::onDataReceived(Connection& conn, uint64_t request, uint64_t end) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  // A ping's answer queues behind the data frame being read: on a slow link
  // (a delay, a congestion control still sized for the old round trip) one
  // frame takes longer than the heartbeat timeout, and its bytes are the
  // only sign of life meanwhile.
  heardFrom(conn);
  events_.onDataReceived(conn, request, end);
}

// ---------------------------------------------------------------- shutdown

void Peers::closeAll(const Status& why) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  closing_ = true;
  listener_->close();
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
}

void Peers::noteEnded() {
  if (allEndedKept_) return;
  for (const auto& conn : ending_) {
    if (conn->isOpen()) return;
  }
  allEndedKept_ = true;
  allEnded_.set_value();
}

void Peers::awaitEnded(double lingerSeconds) {
  // Bounded: a hung peer that never ends its side does not hold shutdown.
  if (allEnded_.get_future().wait_for(std::chrono::duration<double>(lingerSeconds)) != std::future_status::ready) {
    std::promise<void> forced;
    const bool posted = loop_.post([this, &forced] {
      for (auto& conn : ending_) conn->close(Status(Code::kShutdown, "node shut down before its peer ended the connection"));
      forced.set_value();
    });
    if (posted) forced.get_future().wait();
  }
  ending_.clear();
}

}  // namespace hoplite
