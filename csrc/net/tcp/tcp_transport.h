// TCP transport: IPv4 listener and outgoing connects, all on the node's event loop.
#pragma once

#include <memory>
#include <string>

#include "net/event_loop.h"
#include "net/transport.h"

namespace hoplite {

class TcpTransport : public Transport {
 public:
  // Throws std::invalid_argument if options.congestion is set but this kernel
  // does not offer it to this process.
  TcpTransport(EventLoop& loop, TransportOptions options);

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

// Socket options every connection gets: TCP_NODELAY, buffer sizes, congestion control.
void configureSocket(int fd, const TransportOptions& options);

}  // namespace hoplite
