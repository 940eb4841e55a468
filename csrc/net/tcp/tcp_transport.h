// TCP transport: IPv4 listener and outgoing connects, all on the node's event loop.
#pragma once

#include <memory>
#include <string>

#include "net/event_loop.h"
#include "net/transport.h"

namespace hoplite {

class TcpTransport : public Transport {
 public:
  TcpTransport(EventLoop& loop, TransportOptions options) : loop_(loop), options_(options) {}

  // Binds and listens at once (on the caller's thread) so the address is known;
  // accepting runs on the loop. Throws std::runtime_error if the bind fails.
  std::unique_ptr<Listener> listen(const std::string& host, int port, ConnectionObserver* observer,
                                   AcceptCallback onAccept) override;
  // Must be called on the loop thread.
  std::shared_ptr<Connection> connect(const std::string& host, int port, ConnectionObserver* observer) override;

 private:
  EventLoop& loop_;
  TransportOptions options_;
};

// Socket options every connection gets: non-blocking, TCP_NODELAY, buffer sizes.
void configureSocket(int fd, const TransportOptions& options);

}  // namespace hoplite
