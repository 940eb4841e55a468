// IPv4 addresses and the non-blocking TCP sockets the transports start from.
#pragma once

#include <netinet/in.h>

#include <functional>
#include <string>

#include "net/event_loop.h"

namespace hoplite {

// Throws std::runtime_error if `host` is not a dotted IPv4 address.
sockaddr_in makeAddress(const std::string& host, int port);
// "a.b.c.d:port"
std::string addressString(const sockaddr_in& addr);

// A non-blocking socket bound and listening at host:port (0: any port), whose
// bound port goes to *boundPort. Throws std::runtime_error naming the address.
int listeningSocket(const std::string& host, int port, int* boundPort);
// A non-blocking socket connecting to `addr` (done when it is writable),
// given to `configure` first (options that must precede the connect). A
// connect that failed at once leaves *error set (0 otherwise). Throws
// std::runtime_error if no socket can be made.
int connectingSocket(const sockaddr_in& addr, const std::function<void(int)>& configure, int* error);
// How a non-blocking connect on `fd` ended, once it is writable: 0 or an errno.
int connectResult(int fd);

// A listening socket on a loop: accepts every pending connection and hands
// each socket (non-blocking) and its peer's address on. Out of descriptors, it
// stops listening for 100 ms instead of spinning.
class SocketAcceptor : public EventHandler {
 public:
  using OnSocket = std::function<void(int fd, const std::string& peer)>;
  // Listens at once (so the port is known); throws std::runtime_error if it cannot.
  SocketAcceptor(EventLoop& loop, const std::string& host, int port, OnSocket onSocket);
  ~SocketAcceptor() override;
  SocketAcceptor(const SocketAcceptor&) = delete;
  SocketAcceptor& operator=(const SocketAcceptor&) = delete;

  int port() const { return port_; }
  void close();  // on the loop thread, or once it has stopped
  void handleEvents(uint32_t events) override;

 private:
  EventLoop& loop_;
  int fd_ = -1;
  int port_ = 0;
  OnSocket onSocket_;
  EventLoop::TimerId pause_ = 0;
};

}  // namespace hoplite
