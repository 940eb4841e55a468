// How two UCX workers meet: over a short-lived TCP connection to the node's
// listening address, four messages, two each way:
//   dialer → responder   a nonce
//   responder → dialer   a nonce, and a proof over both
//   dialer → responder   its hello: its id of the connection, its UCP worker address, a proof
//   responder → dialer   its hello, the same (or, for a wrong proof, a refusal)
// A proof is an HMAC under the cluster's secret over both nonces (and the
// hello), so neither side tells its worker address to, or makes an endpoint
// to the address of, a peer that has not proved it knows the secret, and a
// proof cannot be replayed on another exchange. Then each side makes an endpoint to
// the other's address, and the node's own handshake follows over UCX.
// (UCX's own connection manager, ucp_listener and client-server endpoints,
// crashed on its async thread when peers left at the same moment, with UCX
// 1.13 and 1.22.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/hmac.h"
#include "common/status.h"
#include "net/event_loop.h"

namespace hoplite {

struct BootstrapHello {
  uint64_t connectionId = 0;  // the sender's id of this connection: the receiver puts it in every message
  std::string workerAddress;  // ucp_worker_get_address's bytes; empty: the sender cannot reach the receiver
};

// What both sides must share for the exchange to succeed.
struct BootstrapKey {
  std::string secret;     // the cluster's (HOPLITE_SECRET)
  std::string clusterId;  // a proof for one cluster is not one for another
};

// One side of the exchange on a connected (or connecting) non-blocking socket.
// Calls `done` exactly once, with the peer's hello, or with why it failed (the
// peer closed, a malformed message, a wrong proof either way, or
// `timeoutSeconds` passed); `refused` is true exactly when the secrets
// differed: this side found the peer's proof wrong, or (the dialer) the peer
// refused its hello. The socket is closed before `done` is called.
class BootstrapExchange : public EventHandler, public std::enable_shared_from_this<BootstrapExchange> {
 public:
  using Done = std::function<void(const Status&, BootstrapHello peer, bool refused)>;
  using Reply = std::function<BootstrapHello(const BootstrapHello& peer)>;
  // Both keep the exchange alive themselves until `done` is called.
  // `dial`: the connecting side, whose nonce goes first; `connected` is
  // called once its TCP connect completes (the peer's host accepted it).
  static void dial(EventLoop& loop, int fd, std::string describe, BootstrapKey key, BootstrapHello hello,
                   double timeoutSeconds, std::function<void()> connected, Done done);
  // `respond`: the accepting side, which asks `reply` for its hello once the
  // peer's hello proved it knows the secret; `done` follows once that is sent.
  static void respond(EventLoop& loop, int fd, std::string describe, BootstrapKey key, Reply reply,
                      double timeoutSeconds, Done done);
  ~BootstrapExchange() override;

  void handleEvents(uint32_t events) override;

 private:
  enum class Kind : uint8_t { kNonce = 1, kHello = 2, kRefused = 3 };

  BootstrapExchange(EventLoop& loop, int fd, std::string describe, BootstrapKey key, bool dialer,
                    double timeoutSeconds, Done done);
  void start();
  void queue(Kind kind, const std::string& body);
  void queueHello(const BootstrapHello& hello);
  // The HMAC under the secret of `role`, both nonces and `tail`.
  Digest proof(const char* role, const std::string& tail) const;
  // The proof that the dialer's (or the responder's) hello comes from a member.
  Digest helloProof(bool ofDialer, const BootstrapHello& hello) const;
  void writeSome();
  void readSome();
  // One whole message from the peer; false once the exchange has finished.
  bool onMessage(Kind kind, const std::string& body);
  void finishWhenSent(const Status& why, bool refused);
  void finish(const Status& why, bool refused = false);

  EventLoop& loop_;
  int fd_;
  std::string describe_;
  BootstrapKey key_;
  bool dialer_;
  double timeoutSeconds_;
  Done done_;
  Reply reply_;
  std::function<void()> connected_;
  BootstrapHello mine_;       // the dialer's, sent once the responder's nonce is in
  bool connecting_ = false;   // the dialer until its connect completes
  Kind expected_;             // the peer's next message
  std::string myNonce_, peerNonce_;
  std::string out_;           // still to send
  std::string in_;            // received, not yet a whole message
  bool finishWhenSent_ = false;  // the responder's last message is queued: then done_ with these
  Status finishStatus_;
  bool finishRefused_ = false;
  BootstrapHello peer_;
  EventLoop::TimerId timer_ = 0;
};

}  // namespace hoplite
