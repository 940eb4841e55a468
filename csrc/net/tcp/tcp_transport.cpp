#include "net/tcp/tcp_transport.h"

#include "net/transport_registry.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "common/logging.h"
#include "net/sockets.h"
#include "net/tcp/tcp_connection.h"

namespace hoplite {
namespace {

class TcpListener : public Listener, public EventHandler {
 public:
  TcpListener(EventLoop& loop, int fd, std::string host, int port, ConnectionObserver* observer,
              AcceptCallback onAccept, TransportOptions options)
      : loop_(loop),
        fd_(fd),
        host_(std::move(host)),
        port_(port),
        observer_(observer),
        onAccept_(std::move(onAccept)),
        options_(options) {}
  ~TcpListener() override {
    if (fd_ >= 0) ::close(fd_);
  }

  std::string host() const override { return host_; }
  int port() const override { return port_; }
  // Called on the loop thread.
  void close() override {
    if (fd_ < 0) return;
    loop_.removeFd(fd_);
    ::close(fd_);
    fd_ = -1;
  }

  void handleEvents(uint32_t) override {
    while (fd_ >= 0) {
      sockaddr_in peer{};
      socklen_t len = sizeof(peer);
      int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: stop listening for a moment instead of spinning.
          HLOG(kWarn, "accept: %s; pausing for 100 ms", std::strerror(errno));
          loop_.removeFd(fd_);
          loop_.addTimer(0.1, [this] {
            if (fd_ >= 0) loop_.addFd(fd_, EPOLLIN, this);
          });
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
          HLOG(kWarn, "accept: %s", std::strerror(errno));
        }
        return;
      }
      configureSocket(fd, options_);
      auto conn = std::make_shared<TcpConnection>(loop_, fd, false, addressString(peer), observer_, options_);
      conn->open();
      onAccept_(conn);
    }
  }

 private:
  EventLoop& loop_;
  int fd_;
  std::string host_;
  int port_;
  ConnectionObserver* observer_;
  AcceptCallback onAccept_;
  TransportOptions options_;
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
  int boundPort = 0;
  const int fd = listeningSocket(host, port, &boundPort);
  auto listener = std::make_unique<TcpListener>(loop_, fd, host, boundPort, observer, std::move(onAccept), options_);
  loop_.addFd(fd, EPOLLIN, listener.get());
  return listener;
}

std::shared_ptr<Connection> TcpTransport::connect(const std::string& host, int port, ConnectionObserver* observer) {
  sockaddr_in addr = makeAddress(host, port);
  bool connecting = false;
  int err = 0;
  const int fd = connectingSocket(addr, [this](int s) { configureSocket(s, options_); }, &connecting, &err);
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
