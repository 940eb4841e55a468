#include "net/sockets.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/logging.h"

namespace hoplite {

sockaddr_in makeAddress(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    throw std::runtime_error("not an IPv4 address: '" + host + "'");
  }
  return addr;
}

std::string addressString(const sockaddr_in& addr) {
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(ntohs(addr.sin_port));
}

int listeningSocket(const std::string& host, int port, int* boundPort) {
  sockaddr_in addr = makeAddress(host, port);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1024) != 0) {
    int err = errno;
    ::close(fd);
    throw std::runtime_error("listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *boundPort = ntohs(addr.sin_port);
  return fd;
}

int connectingSocket(const sockaddr_in& addr, const std::function<void(int)>& configure, int* error) {
  *error = 0;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  if (configure) configure(fd);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    *error = errno;
  }
  return fd;
}

int connectResult(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  return err;
}

SocketAcceptor::SocketAcceptor(EventLoop& loop, const std::string& host, int port, OnSocket onSocket)
    : loop_(loop), onSocket_(std::move(onSocket)) {
  fd_ = listeningSocket(host, port, &port_);
  loop_.addFd(fd_, EPOLLIN, this);
}

SocketAcceptor::~SocketAcceptor() { close(); }

void SocketAcceptor::close() {
  if (fd_ < 0) return;
  if (pause_ != 0) loop_.cancelTimer(pause_);
  pause_ = 0;
  loop_.removeFd(fd_);
  ::close(fd_);
  fd_ = -1;
}

void SocketAcceptor::handleEvents(uint32_t) {
  while (fd_ >= 0) {
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      onSocket_(fd, addressString(peer));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      HLOG(kWarn, "accept: %s; pausing for 100 ms", std::strerror(errno));
      loop_.removeFd(fd_);
      pause_ = loop_.addTimer(0.1, [this] {
        pause_ = 0;
        if (fd_ >= 0) loop_.addFd(fd_, EPOLLIN, this);
      });
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      HLOG(kWarn, "accept: %s", std::strerror(errno));
    }
    return;
  }
}

}  // namespace hoplite
