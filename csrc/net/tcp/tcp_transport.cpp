#include "net/tcp/tcp_transport.h"

#include "net/transport_registry.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "net/sockets.h"
#include "net/tcp/tcp_connection.h"

namespace hoplite {
namespace {

class TcpListener : public Listener {
 public:
  TcpListener(EventLoop& loop, const std::string& host, int port, ConnectionObserver* observer,
              AcceptCallback onAccept, TransportOptions options)
      : host_(host), acceptor_(loop, host, port, [&loop, observer, onAccept, options](int fd, const std::string& peer) {
          configureSocket(fd, options);
          auto conn = std::make_shared<TcpConnection>(loop, fd, false, peer, observer, options);
          conn->open();
          onAccept(conn);
        }) {}

  std::string host() const override { return host_; }
  int port() const override { return acceptor_.port(); }
  // Called on the loop thread.
  void close() override { acceptor_.close(); }

 private:
  std::string host_;
  SocketAcceptor acceptor_;
};

bool setCongestion(int fd, const std::string& name) {
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0;
}

std::string procLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

[[maybe_unused]] const bool kRegistered = registerTransport("tcp", [](EventLoop& loop, const TransportOptions& options) {
  return std::make_unique<TcpTransport>(loop, options);
});

}  // namespace

TcpTransport::TcpTransport(EventLoop& loop, TransportOptions options) : loop_(loop), options_(std::move(options)) {
  if (options_.congestion.empty()) return;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  const bool ok = setCongestion(fd, options_.congestion);
  const int err = errno;
  ::close(fd);
  if (!ok) {
    throw std::invalid_argument("tcp_congestion '" + options_.congestion + "': " + std::strerror(err) +
                                " (this kernel has: " + procLine("/proc/sys/net/ipv4/tcp_available_congestion_control") +
                                "; without CAP_NET_ADMIN only: " +
                                procLine("/proc/sys/net/ipv4/tcp_allowed_congestion_control") + ")");
  }
}

void configureSocket(int fd, const TransportOptions& options) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Checked when the transport was made.
  if (!options.congestion.empty()) setCongestion(fd, options.congestion);
  if (options.socketBufferBytes > 0) {
    int size = options.socketBufferBytes;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }
}

std::unique_ptr<Listener> TcpTransport::listen(const std::string& host, int port, ConnectionObserver* observer,
                                               AcceptCallback onAccept) {
  return std::make_unique<TcpListener>(loop_, host, port, observer, std::move(onAccept), options_);
}

std::shared_ptr<Connection> TcpTransport::connect(const std::string& host, int port, ConnectionObserver* observer) {
  sockaddr_in addr = makeAddress(host, port);
  int err = 0;
  const int fd = connectingSocket(addr, [this](int s) { configureSocket(s, options_); }, &err);
  auto conn = std::make_shared<TcpConnection>(loop_, fd, true, addressString(addr), observer, options_);
  conn->open();
  if (err != 0) {
    // Report the failure from the loop, after the caller has stored the connection.
    Status why(Code::kPeerFailed, "connect to " + addressString(addr) + ": " + std::strerror(err));
    loop_.post([conn, why] { conn->close(why); });
  }
  return conn;
}

}  // namespace hoplite
