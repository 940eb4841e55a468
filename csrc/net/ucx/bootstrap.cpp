#include "net/ucx/bootstrap.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hoplite {
namespace {

constexpr uint32_t kMagic = 0x58435548;  // "HUCX" little-endian
constexpr uint8_t kVersion = 1;
constexpr size_t kHead = 4 + 1 + 8 + 4;
constexpr uint32_t kMaxAddress = 16u << 10;  // UCP worker addresses are hundreds of bytes

template <typename T>
void append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T read(const std::string& in, size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(value));
  return value;
}

// An empty address says the sender could not make its endpoint to us.
std::string encode(const BootstrapHello& hello) {
  std::string out;
  append(out, kMagic);
  append(out, kVersion);
  append(out, hello.connectionId);
  append(out, static_cast<uint32_t>(hello.workerAddress.size()));
  return out + hello.workerAddress;
}

// Whether `in` holds a whole hello; a malformed one is an error.
Status decode(const std::string& in, bool* complete, BootstrapHello* hello) {
  *complete = false;
  if (in.size() < kHead) return {};
  if (read<uint32_t>(in, 0) != kMagic || read<uint8_t>(in, 4) != kVersion) {
    return Status(Code::kProtocol, "not a hoplite UCX hello");
  }
  const uint32_t length = read<uint32_t>(in, 13);
  if (length > kMaxAddress) return Status(Code::kProtocol, "UCX hello with a bad address length");
  if (in.size() < kHead + length) return {};
  if (in.size() > kHead + length) return Status(Code::kProtocol, "bytes after the UCX hello");
  hello->connectionId = read<uint64_t>(in, 5);
  hello->workerAddress = in.substr(kHead, length);
  *complete = true;
  return {};
}

}  // namespace

BootstrapExchange::BootstrapExchange(EventLoop& loop, int fd, std::string describe, double timeoutSeconds, Done done)
    : loop_(loop), fd_(fd), describe_(std::move(describe)), timeoutSeconds_(timeoutSeconds), done_(std::move(done)) {}

BootstrapExchange::~BootstrapExchange() {
  if (fd_ >= 0) ::close(fd_);
}

void BootstrapExchange::dial(EventLoop& loop, int fd, std::string describe, BootstrapHello hello,
                             double timeoutSeconds, Done done) {
  std::shared_ptr<BootstrapExchange> exchange(
      new BootstrapExchange(loop, fd, std::move(describe), timeoutSeconds, std::move(done)));
  exchange->out_ = encode(hello);
  exchange->start(true);
}

void BootstrapExchange::respond(EventLoop& loop, int fd, std::string describe, Reply reply, double timeoutSeconds,
                                Done done) {
  std::shared_ptr<BootstrapExchange> exchange(
      new BootstrapExchange(loop, fd, std::move(describe), timeoutSeconds, std::move(done)));
  exchange->reply_ = std::move(reply);
  exchange->start(false);
}

void BootstrapExchange::start(bool connecting) {
  connecting_ = connecting;
  // The loop's handler table holds a plain pointer: this object keeps itself
  // alive (the timer's and the handler's references) until finish().
  auto self = shared_from_this();
  timer_ = loop_.addTimer(timeoutSeconds_, [self] {
    self->timer_ = 0;
    self->finish(Status(Code::kPeerFailed, "no UCX hello from " + self->describe_ + " in time"));
  });
  // Writable: the dialer's connect is done and its hello can go.
  if (!loop_.addFd(fd_, EPOLLIN | EPOLLRDHUP | (out_.empty() ? 0 : EPOLLOUT), this)) {
    loop_.post([self] { self->finish(Status(Code::kInternal, "cannot watch the UCX hello's socket")); });
  }
}

void BootstrapExchange::handleEvents(uint32_t events) {
  auto self = shared_from_this();
  if (connecting_) {
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      finish(Status(Code::kPeerFailed, "connect to " + describe_ + ": " + std::strerror(err)));
      return;
    }
    connecting_ = false;
  }
  if (!out_.empty()) writeSome();
  if (fd_ >= 0 && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) readSome();
}

void BootstrapExchange::writeSome() {
  while (!out_.empty()) {
    const ssize_t wrote = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (wrote < 0) {
      finish(Status(Code::kPeerFailed, "send the UCX hello to " + describe_ + ": " + std::strerror(errno)));
      return;
    }
    out_.erase(0, static_cast<size_t>(wrote));
  }
  if (out_.empty() && gotHello_) {
    finish({});  // the responder: its reply is out
    return;
  }
  loop_.modifyFd(fd_, EPOLLIN | EPOLLRDHUP | (out_.empty() ? 0 : EPOLLOUT), this);
}

void BootstrapExchange::readSome() {
  char buf[4096];
  while (fd_ >= 0 && !gotHello_) {
    const ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got <= 0) {
      finish(Status(Code::kPeerFailed, "UCX hello from " + describe_ + ": connection closed"));
      return;
    }
    in_.append(buf, static_cast<size_t>(got));
    bool complete = false;
    Status s = decode(in_, &complete, &peer_);
    if (!s.ok()) {
      finish(Status(s.code, s.message + " from " + describe_));
      return;
    }
    if (!complete) continue;
    gotHello_ = true;
    if (!reply_) {
      finish({});  // the dialer: its hello went first
      return;
    }
    out_ = encode(reply_(peer_));
    writeSome();
  }
}

void BootstrapExchange::finish(const Status& why) {
  if (!done_) return;
  auto self = shared_from_this();
  if (timer_ != 0) loop_.cancelTimer(timer_);
  timer_ = 0;
  if (fd_ >= 0) {
    loop_.removeFd(fd_);
    ::close(fd_);
    fd_ = -1;
  }
  Done done = std::move(done_);
  done_ = nullptr;
  done(why, std::move(peer_));
}

}  // namespace hoplite
