// How two UCX workers meet: over a short-lived TCP connection to the node's
// listening address, each sends a hello with its UCP worker address and the id
// under which it knows this connection; then each makes an endpoint to the
// other's worker address. (UCX's own connection manager, ucp_listener and
// client-server endpoints, crashed on its async thread when peers left at the
// same moment, with UCX 1.13 and 1.22.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "net/event_loop.h"

namespace hoplite {

struct BootstrapHello {
  uint64_t connectionId = 0;  // the sender's id of this connection: the receiver puts it in every message
  std::string workerAddress;  // ucp_worker_get_address's bytes
};

// One side of the exchange on a connected (or connecting) non-blocking socket:
// sends `hello`, reads the peer's, and calls `done` exactly once, with the
// peer's hello or why it failed (the peer closed, a malformed hello, or
// `timeoutSeconds` passed). The socket is closed before `done` is called.
class BootstrapExchange : public EventHandler, public std::enable_shared_from_this<BootstrapExchange> {
 public:
  using Done = std::function<void(const Status&, BootstrapHello)>;
  using Reply = std::function<BootstrapHello(const BootstrapHello& peer)>;
  // Both keep the exchange alive themselves until `done` is called.
  // `dial`: the connecting side, whose hello goes first.
  static void dial(EventLoop& loop, int fd, std::string describe, BootstrapHello hello, double timeoutSeconds,
                   Done done);
  // `respond`: the accepting side, which reads the peer's hello first and
  // asks `reply` for its own (made once it knows the peer).
  static void respond(EventLoop& loop, int fd, std::string describe, Reply reply, double timeoutSeconds, Done done);
  ~BootstrapExchange() override;

  void handleEvents(uint32_t events) override;

 private:
  BootstrapExchange(EventLoop& loop, int fd, std::string describe, double timeoutSeconds, Done done);
  void start(bool connecting);
  void writeSome();
  void readSome();
  void finish(const Status& why);

  EventLoop& loop_;
  int fd_;
  std::string describe_;
  double timeoutSeconds_;
  Done done_;
  Reply reply_;
  bool connecting_ = false;
  std::string out_;     // still to send
  std::string in_;      // received so far
  bool gotHello_ = false;
  BootstrapHello peer_;
  EventLoop::TimerId timer_ = 0;
};

}  // namespace hoplite
