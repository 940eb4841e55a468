// The handshake (see wire::Hello): the dialing node says who it is, the
// server answers with a challenge that proves it knows the cluster secret,
// the client proves it too, and the server's hello ack ends it. Only then
// does either side accept anything else. The ack also offers same-host reads
// (net/same_host/), which the client takes up if it can read the server's memory.
#include <unistd.h>

#include "common/logging.h"
#include "common/timeouts.h"
#include "peers/peers.h"

namespace hoplite {
namespace {
std::string bytesOf(const Digest& d) { return std::string(d.begin(), d.end()); }
// The hello's claim of where the client listens, as the proofs cover it.
std::string listenClaim(const std::string& host, uint32_t port, uint64_t incarnation) {
  return host + ':' + std::to_string(port) + '/' + std::to_string(incarnation);
}
}  // namespace

void Peers::sendHello(Peer& peer) {
  peer.helloNonce = randomBytes(wire::kNonceSize);
  peer.verified = false;
  wire::Hello hello;
  hello.rank = config_.rank;
  hello.cluster = config_.clusterId;
  hello.nonce = peer.helloNonce;
  hello.host = config_.host;
  hello.port = static_cast<uint32_t>(port());
  hello.incarnation = config_.incarnation;
  peer.helloListen = listenClaim(hello.host, hello.port, hello.incarnation);  // what our proof will cover
  peer.conn->sendControl(wire::MsgType::kHello, wire::encode(hello));
}

Digest Peers::handshakeProof(const char* role, const std::string& clientNonce, const std::string& serverNonce,
                             int clientRank, int serverRank, const std::string& clientListen) const {
  return clusterProof(config_.secret, role, config_.clusterId, clientNonce, serverNonce,
                      std::to_string(clientRank) + ':' + std::to_string(serverRank) + '\0' + clientListen);
}

std::string Peers::listenClaimOf(const Handshake& hs) {
  return listenClaim(hs.host, static_cast<uint32_t>(hs.port), hs.incarnation);
}

void Peers::handleHello(Connection& conn, const wire::Hello& msg) {
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
  wire::Challenge challenge{hs.serverNonce, bytesOf(handshakeProof("server", hs.clientNonce, hs.serverNonce, hs.rank,
                                                                   config_.rank, listenClaimOf(hs)))};
  handshakes_[conn.id()] = std::move(hs);
  conn.sendControl(wire::MsgType::kChallenge, wire::encode(challenge));
}

void Peers::handleChallenge(Connection& conn, const wire::Challenge& msg) {
  auto it = peers_.find(conn.peerRank());
  if (it == peers_.end() || it->second.conn.get() != &conn || it->second.verified || it->second.helloNonce.empty()) {
    conn.close(Status(Code::kProtocol, "unexpected challenge"));
    return;
  }
  Peer& peer = it->second;
  if (!equalDigests(handshakeProof("server", peer.helloNonce, msg.nonce, config_.rank, conn.peerRank(), peer.helloListen),
                    msg.proof)) {
    counters_.handshakesRefused++;
    HLOG(kWarn, "%s does not know the cluster secret: refusing it", peerName(conn.peerRank()).c_str());
    conn.close(Status(Code::kProtocol,
                      "it failed authentication (a different HOPLITE_SECRET, or our hello was altered on the way?)"));
    return;
  }
  peer.verified = true;
  conn.markTrusted();  // data frames from it are accepted from now on
  wire::Auth auth{bytesOf(
      handshakeProof("client", peer.helloNonce, msg.nonce, config_.rank, conn.peerRank(), peer.helloListen))};
  peer.helloNonce.clear();
  peer.helloListen.clear();
  conn.sendControl(wire::MsgType::kAuth, wire::encode(auth));
}

void Peers::handleAuth(Connection& conn, const wire::Auth& msg) {
  Handshake hs = std::move(handshakes_[conn.id()]);
  handshakes_.erase(conn.id());
  if (!equalDigests(handshakeProof("client", hs.clientNonce, hs.serverNonce, hs.rank, config_.rank, listenClaimOf(hs)),
                    msg.proof)) {
    counters_.handshakesRefused++;
    HLOG(kWarn,
         "refused connection from %s claiming rank %d: it does not know the cluster secret (HOPLITE_SECRET), or its "
         "hello was altered on the way",
         conn.describe().c_str(), hs.rank);
    conn.close(Status(Code::kProtocol, "authentication failed"));
    return;
  }
  conn.setPeerRank(hs.rank);
  conn.markTrusted();
  adoptPeer(hs.rank, hs, conn.id());
  wire::HelloAck ack{config_.rank, {}, config_.incarnation};
  ack.members = reachedMembers();
  events_.fillHelloAck(&ack);
  offerSameHost(&ack);
  conn.sendControl(wire::MsgType::kHelloAck, wire::encode(ack));
}

// A peer proved who it is: its address is where it listens now. A new process
// (another incarnation, or a new address), or a peer we had given up on, is a
// restarted process (a rank that rejoins): what we knew of the old one is
// dropped, and we reach the new one from now on. A peer given up on that
// comes back as the same process (it was stalled or cut off) keeps what still
// works, our connection to it included: failing that would make it give up
// on us in turn, and the two would evict each other for good.
void Peers::adoptPeer(int rank, const Handshake& hello, uint64_t connectionId) {
  const std::string& host = hello.host;
  const int port = hello.port;
  Peer& peer = peers_[rank];
  const bool moved = peer.port != 0 && (peer.host != host || peer.port != port);
  const bool reborn = peer.incarnation != 0 && hello.incarnation != 0 && peer.incarnation != hello.incarnation;
  const bool cameBack = !moved && peer.lost && hello.incarnation != 0 && peer.incarnation == hello.incarnation;
  peer.incoming = connectionId;
  if (!moved && !reborn && !peer.lost) {
    peer.host = host;
    peer.port = port;
    const bool first = peer.incarnation == 0 && hello.incarnation != 0;
    if (hello.incarnation != 0) peer.incarnation = hello.incarnation;
    if (first) events_.onPeerKnown(rank);
    dialIfAwaited(rank);
    return;
  }
  if (cameBack) {
    HLOG(kInfo, "%s is back (it was stalled or cut off)", peerName(rank).c_str());
    peer.lost = false;
    events_.onPeerRejoined(rank);  // (its shard stays moved until it takes it back: the same process)
    return;
  }
  HLOG(kInfo, "rank %d rejoined from %s:%d", rank, host.c_str(), port);
  replaceProcess(rank, host, port, hello.incarnation, connectionId);
}

void Peers::replaceProcess(int rank, const std::string& host, int port, uint64_t incarnation, uint64_t incoming) {
  // What was on its way to the old process fails (and is asked again where that retries).
  // (Not `gone`: its shard is where it was, or returns below.)
  counters_.rejoins++;
  const Peer& old = peers_[rank];
  if (old.conn || !old.queued.empty()) {
    failPeer(rank, Status(Code::kPeerFailed, peerName(rank) + " restarted"), /*gone=*/false);
  }
  Peer fresh;
  fresh.host = host;
  fresh.port = port;
  fresh.incoming = incoming;
  fresh.incarnation = incarnation;
  peers_[rank] = std::move(fresh);  // (failPeer's callbacks may have rehashed peers_)
  events_.onPeerRejoined(rank);
}

std::vector<wire::MemberAddress> Peers::reachedMembers() const {
  std::vector<wire::MemberAddress> members;
  for (const auto& [rank, peer] : peers_) {
    // Only processes this node hears from now: a stale view would send the
    // asker back to a dead one.
    if (!peer.lost && peer.port != 0 && peer.incarnation != 0 && talksTo(rank)) {
      members.push_back(wire::MemberAddress{rank, peer.incarnation, peer.host, static_cast<uint32_t>(peer.port)});
    }
  }
  return members;
}

// A rank that rejoined while this node was stalled or cut off introduced
// itself to it in vain, and this node still knows only the process it gave
// up on. A member that reaches the new process says where it listens (as its
// authenticated hello told it); this node reaches that one from now on.
void Peers::learnMembers(int from, const std::vector<wire::MemberAddress>& members) {
  const bool away = justStalled(steadySeconds());
  for (const wire::MemberAddress& m : members) {
    if (m.rank == config_.rank || m.rank == from || m.rank < 0 || m.rank >= config_.worldSize || m.incarnation == 0) {
      continue;
    }
    auto it = peers_.find(m.rank);
    if (it == peers_.end() || it->second.incarnation == m.incarnation) continue;
    // Only about a process this node gave up on, or does not hear from
    // since it was away itself: else the member's news may be the older.
    const Peer& known = it->second;
    if (!(known.lost || (away && !talksTo(m.rank)))) continue;
    // Never heard from, where this node reaches it: the same process, not yet
    // met (replacing it would fail what is on its way to it).
    if (known.incarnation == 0 && known.host == m.host && known.port == static_cast<int>(m.port)) continue;
    HLOG(kInfo, "rank %d rejoined from %s:%u while this process could not hear it (%s knows it)", m.rank,
         m.host.c_str(), m.port, peerName(from).c_str());
    replaceProcess(m.rank, m.host, static_cast<int>(m.port), m.incarnation, /*incoming=*/0);
  }
}

void Peers::handleHelloAck(Connection& conn, const wire::HelloAck& ack) {
  auto it = peers_.find(conn.peerRank());
  if (it == peers_.end() || it->second.conn.get() != &conn || ack.rank != conn.peerRank() || !it->second.verified) {
    conn.close(Status(Code::kProtocol, "unexpected hello ack"));
    return;
  }
  Peer& peer = it->second;
  peer.ready = true;
  peer.refusalIsFinal = false;
  peer.probing = false;
  peer.lastHeard = steadySeconds();
  // Whom we reached: a process we knew under another incarnation (at the
  // same address) was restarted meanwhile.
  const bool restarted = peer.incarnation != 0 && ack.incarnation != peer.incarnation;
  // One given up on that answers as the same process was stalled or cut off (see adoptPeer).
  const bool cameBack = peer.lost && peer.incarnation != 0 && ack.incarnation == peer.incarnation;
  const bool first = peer.incarnation == 0 && ack.incarnation != 0;
  peer.incarnation = ack.incarnation;
  if (restarted) peer.leaving = false;  // (the process that left is not this one)
  if (restarted || cameBack) {
    peer.lost = false;
    // The connection it opened before (or its old process did) says nothing
    // about it now: its late close must not count as it leaving.
    peer.incoming = 0;
    events_.onPeerRejoined(conn.peerRank());
  }
  if (first) events_.onPeerKnown(conn.peerRank());  // (before the ack's news of moves, read against it)
  peer.memory = acceptSameHost(conn.peerRank(), ack);  // before the queued pulls go out
  events_.onPeerReady(conn.peerRank(), ack);
  auto queued = std::move(peer.queued);
  peer.queued.clear();
  // A failed send closes the connection and fails the peer's requests.
  auto c = peer.conn;
  for (auto& write : queued) {
    if (!c || !c->isOpen()) break;
    write(*c);
  }
  learnMembers(conn.peerRank(), ack.members);
  leaveCutOffIfMostReached();
}

void Peers::handleProbe(Connection& conn, const wire::Probe& msg) {
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, Status()}));
}

// ---------------------------------------------------------------- same-host reads

void Peers::offerSameHost(wire::HelloAck* ack) const {
  if (hostIdentity_.empty()) return;
  ack->host = hostIdentity_;
  ack->pid = static_cast<uint32_t>(::getpid());
  ack->probeAddress = reinterpret_cast<uintptr_t>(memoryProbe_.data());
  ack->probe.assign(memoryProbe_.begin(), memoryProbe_.end());
}

std::shared_ptr<same_host::PeerMemory> Peers::acceptSameHost(int rank, const wire::HelloAck& c) const {
  if (hostIdentity_.empty() || c.host != hostIdentity_ || c.pid == 0 || c.probe.size() != memoryProbe_.size()) {
    return nullptr;
  }
  // Same kernel and namespaces; whether the kernel lets us read the peer
  // (ptrace restrictions, seccomp) shows only by trying.
  auto memory = same_host::PeerMemory::open(static_cast<int>(c.pid));
  std::string seen(c.probe.size(), '\0');
  Status s = memory ? memory->read(c.probeAddress, reinterpret_cast<uint8_t*>(seen.data()), seen.size())
                    : Status(Code::kPeerFailed, "no pidfd for process " + std::to_string(c.pid));
  if (!s.ok() || seen != c.probe) {
    HLOG(kInfo, "%s runs on this host but its memory cannot be read (%s): pulls from it use TCP",
         peerName(rank).c_str(), s.ok() ? "other bytes there" : s.message.c_str());
    return nullptr;
  }
  return memory;
}

}  // namespace hoplite
