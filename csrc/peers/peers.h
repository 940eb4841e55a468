// The node's connections to its peers: dialing them (with retries while a
// peer starts up), the authenticated handshake, heartbeats, and failure. It
// is the observer of every connection: it checks that a frame may be
// accepted, passes messages to the router and data frames to the node, and
// tells the node when a peer fails. Loop thread only, except where noted.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/hmac.h"
#include "common/status.h"
#include "net/event_loop.h"
#include "net/local_connection.h"
#include "net/message_router.h"
#include "net/peer_links.h"
#include "net/same_host/memory_reader.h"
#include "net/transport.h"
#include "wire/messages.h"

namespace hoplite {

struct PeersConfig {
  int rank = 0;
  int worldSize = 1;
  std::string host;  // where this node listens
  int port = 0;      // 0: any free port
  std::string clusterId;
  std::string secret;
  double connectTimeoutSeconds = 30;
  double heartbeatIntervalSeconds = 1;
  double heartbeatTimeoutSeconds = 10;
  uint64_t incarnation = 0;  // of this process, told in every hello
  bool sameHost = true;      // offer and take up same-host reads (net/same_host/)
};

// What the node does when peers come and go, and with data frames.
class PeerEvents {
 public:
  virtual ~PeerEvents() = default;
  // A peer failed, in two steps. First, if it is `gone` (died or left, not
  // merely refused us), while its connection and queued writes still stand:
  // what it hosted moves on, so that requests failed next are retried there.
  virtual void onPeerGone(int rank) = 0;
  // Then, once this node let go of its connection and the writes queued for it,
  // what waited on it fails.
  virtual void onPeerFailed(int rank, const Status& failure) = 0;
  // The connection to a peer that is not known to have failed broke (it
  // closed it while this process was stalled, or this process is cut off):
  // what waited for an answer on it fails; the peer stays a member and the
  // next write dials it again. `stalled`: the break came from this process's
  // stall, so the peer most likely answers that dial.
  virtual void onLinkLost(int rank, const Status& why, bool stalled) = 0;
  // This process resumed after a stall longer than the heartbeat timeout: its
  // peers may have declared it failed meanwhile.
  virtual void onResumed() = 0;
  // A connection a peer opened to this node closed (`rank` -1: before its
  // handshake). `left`: it was the peer's latest, so the peer left or died.
  virtual void onAcceptedClosed(Connection& conn, int rank, bool left, const Status& why) = 0;
  // Whether `rank` is known to be gone for good: a refused connect to it is
  // final instead of retried.
  virtual bool departed(int rank) const = 0;
  // The handshake: what this node's hello ack tells a peer, and what a peer's
  // told this node (before the writes queued for it go out).
  virtual void fillHelloAck(wire::HelloAck* ack) = 0;
  virtual void onPeerReady(int rank, const wire::HelloAck& ack) = 0;
  // A new process of `rank` proved who it is (it rejoined, after it failed).
  virtual void onPeerRejoined(int rank) = 0;
  // This node heard which process `rank` runs for the first time (its hello
  // or hello ack): what it heard of that rank before may be of an earlier one.
  virtual void onPeerKnown(int rank) = 0;
  // A quiet peer is asked for an answer, so that its silence shows.
  virtual void ping(int rank) = 0;
  // Data frames on authenticated connections (see ConnectionObserver).
  virtual uint8_t* dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                                   std::shared_ptr<const void>* keepalive) = 0;
  virtual void onDataReceived(Connection& conn, uint64_t request, uint64_t end) = 0;
};

class Peers : public PeerLinks, public ConnectionObserver {
 public:
  struct Counters {
    std::atomic<uint64_t> handshakesRefused{0};  // peers that could not prove they know the secret
    std::atomic<uint64_t> cutOffs{0};            // times this process took itself for cut off (cutOff_)
    std::atomic<uint64_t> rejoins{0};            // new processes of a rank taken up (replaceProcess)
  };

  // Registers its handshake messages with `router`, which gets every other
  // message once a connection is authenticated.
  Peers(EventLoop& loop, std::unique_ptr<Transport> transport, MessageRouter& router, PeerEvents& events,
        PeersConfig config);
  ~Peers() override;

  // Listens, and starts the heartbeats (before the loop starts).
  void start();
  int port() const;  // any thread, once started
  void addPeer(int rank, const std::string& host, int port);
  // A connect to `rank` that is being refused is final from now on.
  void stopRetrying(int rank);
  // `rank`'s process said it leaves: when its connections close, what waits
  // for it fails saying so, and a refused connect to it is final.
  void markLeaving(int rank);
  bool isReady(int rank) const override;
  // Neither cut off from most peers nor stalled within the last heartbeat timeout.
  bool settled() const;
  bool hasConnection(int rank) const;  // dialed, or being dialed
  bool sameHostEnabled() const { return !hostIdentity_.empty(); }
  // This process's host as same_host::hostIdentity() tells it; empty when same-host reads are off.
  const std::string& hostIdentity() const { return hostIdentity_; }
  // The memory of a ready peer on this host that this node can read; null otherwise.
  std::shared_ptr<same_host::PeerMemory> memoryOf(int rank) const;
  // Peers that could not prove they know the secret, in the handshake or
  // before it in the transport (any thread).
  uint64_t handshakesRefused() const { return counters_.handshakesRefused + transport_->peersRefused(); }
  uint64_t cutOffs() const { return counters_.cutOffs; }
  uint64_t rejoins() const { return counters_.rejoins; }

  // Shutdown: every connection ends gracefully (what was sent still arrives);
  // then, from the caller's thread, waits up to `lingerSeconds` for peers to
  // end their side and closes what is left.
  void closeAll(const Status& why);
  void awaitEnded(double lingerSeconds);

  // PeerLinks.
  void whenConnected(int rank, std::function<void(Connection&)> write) override;
  std::shared_ptr<Connection> sharedConnection(Connection& conn) override;
  bool hasFailed(int rank) override;
  bool isLeaving(int rank) const override;
  bool talksTo(int rank) const override;
  uint64_t latestIncoming(int rank) override;
  uint64_t incarnationOf(int rank) const override;
  // After a stall: closes every connection this node dialed, so that the next
  // write to each peer dials it again (and hears what moved meanwhile).
  void redialAll();
  std::string peerName(int rank) const override;

  // ConnectionObserver.
  void onFrame(Connection& conn, wire::MsgType type, const uint8_t* payload, size_t size) override;
  uint8_t* dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                           std::shared_ptr<const void>* keepalive) override;
  void onDataReceived(Connection& conn, uint64_t request, uint64_t end) override;
  void onClosed(Connection& conn, const Status& why) override;

 private:
  struct Peer {
    std::string host;
    int port = 0;
    std::shared_ptr<Connection> conn;
    bool ready = false;  // handshake done
    std::vector<std::function<void(Connection&)>> queued;  // writes waiting for the handshake
    double connectDeadline = 0;
    double backoff = 0.05;
    bool lost = false;      // was reachable once and failed since: no retrying
    bool redialed = false;  // after it closed mid-handshake: dead or refusing us? (onDialedClosed)
    // Dialed because it still talks to us after we gave up on it (heardFrom):
    // a dial that fails then proves nothing about it.
    bool probing = false;
    double probedAt = -1e9;
    bool leaving = false;   // it said it shuts down (markLeaving)
    bool awaitingAddress = false;  // writes are queued for it, its address is not known yet (awaitAddress)
    bool dialFailed = false;  // its dial failed at once: failPeer runs soon (failDialSoon)
    // It answered until this process stalled: a refused redial means its
    // process is gone, not that it is still starting (until a handshake).
    bool refusalIsFinal = false;
    double lastHeard = 0;   // any frame on the connection, for heartbeats
    double acceptedAt = 0;  // when a dial's connect completed, until its handshake does (checkHeartbeats)
    std::string helloNonce;   // ours, until the peer's challenge is verified
    std::string helloListen;  // the listen address our hello claimed, as the proofs cover it
    bool verified = false;   // the peer proved it knows the secret
    uint64_t incoming = 0;   // id of the latest connection it opened to us
    uint64_t incarnation = 0;  // of its process, from its hello (0: not heard yet)
    std::shared_ptr<same_host::PeerMemory> memory;  // on this host and readable
  };
  // An accepted connection between its hello and its proof.
  struct Handshake {
    int rank = -1;
    std::string clientNonce, serverNonce;
    std::string host;  // where the client says it listens
    int port = 0;
    uint64_t incarnation = 0;
  };

  // --- connections and failure (peers.cpp) ---
  void connectPeer(int rank);
  // A dial that cannot start fails the peer in a later task, not inside the
  // write that asked for it (whenConnected): its caller may be iterating
  // what the failure changes (a shard's subscribers, a reduce's positions).
  void failDialSoon(int rank, const Status& why);
  void awaitAddress(int rank);
  // Its address became known, or the wait's deadline passed: what was queued
  // while awaiting it is dialed (connectPeer fails the peer if still unknown).
  void dialIfAwaited(int rank);
  // `gone`: it died (not merely refused us).
  void failPeer(int rank, const Status& why, bool gone = true);
  void onDialedClosed(Connection& conn, const Status& why);
  void checkHeartbeats();
  void heardFrom(Connection& conn);
  // Whether `conn` finished the handshake: only then may it carry anything but the handshake.
  bool authenticated(Connection& conn) const;
  void dispatch(Connection& conn, wire::MsgType type, wire::Reader& reader);
  void noteEnded();

  // --- the handshake (handshake.cpp): see wire::Hello ---
  void sendHello(Peer& peer);
  // Both proofs cover where the client says it listens (`clientListen`,
  // "host:port/incarnation"), so a hello whose address was altered on the way fails them.
  Digest handshakeProof(const char* role, const std::string& clientNonce, const std::string& serverNonce,
                        int clientRank, int serverRank, const std::string& clientListen) const;
  static std::string listenClaimOf(const Handshake& hs);  // what a client's hello claimed
  void handleHello(Connection& conn, const wire::Hello& msg);
  void handleChallenge(Connection& conn, const wire::Challenge& msg);
  void handleAuth(Connection& conn, const wire::Auth& msg);
  void handleHelloAck(Connection& conn, const wire::HelloAck& ack);
  void handleProbe(Connection& conn, const wire::Probe& msg);
  void adoptPeer(int rank, const Handshake& hello, uint64_t connectionId);
  // `rank` is a new process now (it rejoined): what waited on the old one
  // fails, and the new one is reached at host:port from now on.
  void replaceProcess(int rank, const std::string& host, int port, uint64_t incarnation, uint64_t incoming);
  // The peers this node has not given up on, for its hello acks.
  std::vector<wire::MemberAddress> reachedMembers() const;
  // A member's hello ack names a new process of a rank this node gave up on:
  // that rank rejoined while this node could not hear it (see handshake.cpp).
  void learnMembers(int from, const std::vector<wire::MemberAddress>& members);
  // What this node's hello ack offers for same-host reads, and whether it can
  // take up a peer's offer (null: it cannot).
  void offerSameHost(wire::HelloAck* ack) const;
  std::shared_ptr<same_host::PeerMemory> acceptSameHost(int rank, const wire::HelloAck& ack) const;

  EventLoop& loop_;
  std::unique_ptr<Transport> transport_;
  MessageRouter& router_;
  PeerEvents& events_;
  const PeersConfig config_;
  const std::string hostIdentity_;  // empty when same-host reads are off
  std::array<uint8_t, 16> memoryProbe_{};  // random; peers read it to test same-host reads
  std::unique_ptr<Listener> listener_;
  std::shared_ptr<LocalConnection> self_;
  std::unordered_map<int, Peer> peers_;
  std::unordered_map<uint64_t, std::shared_ptr<Connection>> incoming_;
  std::unordered_map<uint64_t, Handshake> handshakes_;
  double lastHeartbeatCheck_ = 0;
  double stalledUntil_ = 0;  // closes until then may be peers evicting this process (justStalled)
  // Whether this process stalled (stopped, starved) just now, so that its
  // peers may have declared it failed and closed its connections: then their
  // closes say nothing about them.
  bool justStalled(double t) const;
  // The heartbeat timer ran late: this process did not run for a while.
  bool heartbeatOverdue(double t) const;
  // Most of the peers this process talks to fell silent together: it takes
  // itself for the one cut off (a network partition), not them for failed.
  // Until it reaches most of its peers again it declares no one failed (the
  // majority moves its shard, not it theirs): what waits on a silent peer
  // fails, and the silent peers are redialed every heartbeat interval.
  bool cutOff_ = false;
  void checkCutOff(double t);
  double fadingAfterSeconds() const;  // seconds of silence after which a peer counts towards a cut-off
  // The connection to a peer not blamed for its loss is gone: what waited on
  // it, or was queued for it, fails with `why`; the next write dials again.
  void dropLink(Peer& peer, int rank, const std::string& why, bool stalled);
  void leaveCutOffIfMostReached();
  bool closing_ = false;
  // At shutdown: the connections ending gracefully, and the promise kept once
  // none of them is open.
  std::vector<std::shared_ptr<Connection>> ending_;
  std::promise<void> allEnded_;
  bool allEndedKept_ = false;
  Counters counters_;
};

}  // namespace hoplite
