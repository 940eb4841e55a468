#include "net/ucx/bootstrap.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "net/sockets.h"
#include "wire/messages.h"

namespace hoplite {
namespace {

constexpr uint32_t kMagic = 0x58435548;  // "HUCX" little-endian
constexpr uint8_t kVersion = 3;
constexpr size_t kHead = 4 + 1 + 1 + 4;  // magic, version, kind, body length
constexpr size_t kHelloFixed = 8 + wire::kProofSize;  // connection id, proof; the address follows
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

}  // namespace

BootstrapExchange::BootstrapExchange(EventLoop& loop, int fd, std::string describe, BootstrapKey key, bool dialer,
                                     double timeoutSeconds, Done done)
    : loop_(loop),
      fd_(fd),
      describe_(std::move(describe)),
      key_(std::move(key)),
      dialer_(dialer),
      timeoutSeconds_(timeoutSeconds),
      done_(std::move(done)),
      connecting_(dialer),
      expected_(Kind::kNonce),
      myNonce_(randomBytes(wire::kNonceSize)) {}

BootstrapExchange::~BootstrapExchange() {
  if (fd_ >= 0) ::close(fd_);
}

void BootstrapExchange::dial(EventLoop& loop, int fd, std::string describe, BootstrapKey key, BootstrapHello hello,
                             double timeoutSeconds, std::function<void()> connected, Done done) {
  std::shared_ptr<BootstrapExchange> exchange(
      new BootstrapExchange(loop, fd, std::move(describe), std::move(key), true, timeoutSeconds, std::move(done)));
  exchange->mine_ = std::move(hello);
  exchange->connected_ = std::move(connected);
  exchange->queue(Kind::kNonce, exchange->myNonce_);
  exchange->start();
}

void BootstrapExchange::respond(EventLoop& loop, int fd, std::string describe, BootstrapKey key, Reply reply,
                                double timeoutSeconds, Done done) {
  std::shared_ptr<BootstrapExchange> exchange(
      new BootstrapExchange(loop, fd, std::move(describe), std::move(key), false, timeoutSeconds, std::move(done)));
  exchange->reply_ = std::move(reply);
  exchange->start();
}

void BootstrapExchange::start() {
  // The loop's handler table holds a plain pointer: this object keeps itself
  // alive (the timer's and the handler's references) until finish().
  auto self = shared_from_this();
  timer_ = loop_.addTimer(timeoutSeconds_, [self] {
    self->timer_ = 0;
    if (self->finishWhenSent_) {  // the peer does not read our last message: what it said stands
      self->finish(self->finishStatus_, self->finishRefused_);
    } else {
      self->finish(Status(Code::kTimeout, "no UCX hello from " + self->describe_ + " in time"));
    }
  });
  // Writable: the dialer's connect is done and its nonce can go.
  if (!loop_.addFd(fd_, EPOLLIN | EPOLLRDHUP | (out_.empty() ? 0 : EPOLLOUT), this)) {
    loop_.post([self] { self->finish(Status(Code::kInternal, "cannot watch the UCX hello's socket")); });
  }
}

void BootstrapExchange::queue(Kind kind, const std::string& body) {
  append(out_, kMagic);
  append(out_, kVersion);
  append(out_, static_cast<uint8_t>(kind));
  append(out_, static_cast<uint32_t>(body.size()));
  out_ += body;
}

void BootstrapExchange::queueHello(const BootstrapHello& hello) {
  std::string body;
  append(body, hello.connectionId);
  const Digest digest = helloProof(dialer_, hello);
  body.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  queue(Kind::kHello, body + hello.workerAddress);
}

Digest BootstrapExchange::proof(const char* role, const std::string& tail) const {
  const std::string& dialerNonce = dialer_ ? myNonce_ : peerNonce_;
  const std::string& responderNonce = dialer_ ? peerNonce_ : myNonce_;
  return clusterProof(key_.secret, role, key_.clusterId, dialerNonce, responderNonce, tail);
}

Digest BootstrapExchange::helloProof(bool ofDialer, const BootstrapHello& hello) const {
  std::string tail;
  append(tail, hello.connectionId);
  return proof(ofDialer ? "ucx-dialer" : "ucx-responder", tail + hello.workerAddress);
}

void BootstrapExchange::handleEvents(uint32_t events) {
  auto self = shared_from_this();
  if (connecting_) {
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
    const int err = connectResult(fd_);
    if (err != 0) {
      finish(Status(Code::kPeerFailed, "connect to " + describe_ + ": " + std::strerror(err)));
      return;
    }
    connecting_ = false;
    if (connected_) connected_();
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
      if (finishWhenSent_) {  // what the last message said stands (a refusal is counted all the same)
        finish(finishStatus_, finishRefused_);
      } else {
        finish(Status(Code::kPeerFailed, "send the UCX hello to " + describe_ + ": " + std::strerror(errno)));
      }
      return;
    }
    out_.erase(0, static_cast<size_t>(wrote));
  }
  if (out_.empty() && finishWhenSent_) {
    finish(finishStatus_, finishRefused_);  // the responder: its hello (or refusal) is out
    return;
  }
  loop_.modifyFd(fd_, EPOLLIN | EPOLLRDHUP | (out_.empty() ? 0 : EPOLLOUT), this);
}

void BootstrapExchange::readSome() {
  char buf[4096];
  while (fd_ >= 0 && !finishWhenSent_) {
    const ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got <= 0) {
      finish(Status(Code::kPeerFailed, "UCX hello from " + describe_ + ": connection closed"));
      return;
    }
    in_.append(buf, static_cast<size_t>(got));
    while (in_.size() >= kHead) {
      if (read<uint32_t>(in_, 0) != kMagic || read<uint8_t>(in_, 4) != kVersion) {
        finish(Status(Code::kProtocol, "not a hoplite UCX hello from " + describe_));
        return;
      }
      const auto kind = static_cast<Kind>(read<uint8_t>(in_, 5));
      const uint32_t length = read<uint32_t>(in_, 6);
      if (length > kHelloFixed + kMaxAddress) {
        finish(Status(Code::kProtocol, "UCX hello with a bad length from " + describe_));
        return;
      }
      if (in_.size() < kHead + length) break;
      std::string body = in_.substr(kHead, length);
      in_.erase(0, kHead + length);
      if (!onMessage(kind, body)) return;
    }
  }
}

bool BootstrapExchange::onMessage(Kind kind, const std::string& body) {
  if (dialer_ && kind == Kind::kRefused && expected_ == Kind::kHello) {
    finish(Status(Code::kProtocol, describe_ + " refused this node's UCX hello: authentication failed (a different "
                                               "HOPLITE_SECRET?)"),
           true);
    return false;
  }
  // The responder's nonce carries its proof over both nonces.
  const size_t nonceSize = wire::kNonceSize + (dialer_ ? wire::kProofSize : 0);
  const bool wellFormed =
      kind == expected_ && (kind == Kind::kNonce ? body.size() == nonceSize : body.size() >= kHelloFixed);
  if (!wellFormed || (kind == Kind::kHello && !in_.empty())) {
    finish(Status(Code::kProtocol, "malformed or unexpected UCX hello from " + describe_));
    return false;
  }
  if (kind == Kind::kNonce) {
    peerNonce_ = body.substr(0, wire::kNonceSize);
    expected_ = Kind::kHello;
    if (dialer_) {  // the responder proves itself before the dialer tells its address
      if (!equalDigests(proof("ucx-responder-nonce", ""), body.substr(wire::kNonceSize))) {
        finish(Status(Code::kProtocol, "the node at " + describe_ +
                                           " failed authentication (a different HOPLITE_SECRET?)"),
               true);
        return false;
      }
      queueHello(mine_);
    } else {
      const Digest digest = proof("ucx-responder-nonce", "");
      queue(Kind::kNonce, myNonce_ + std::string(reinterpret_cast<const char*>(digest.data()), digest.size()));
    }
    writeSome();
    return fd_ >= 0;
  }
  peer_.connectionId = read<uint64_t>(body, 0);
  peer_.workerAddress = body.substr(kHelloFixed);
  if (!equalDigests(helloProof(!dialer_, peer_), body.substr(8, wire::kProofSize))) {
    Status why(Code::kProtocol, "UCX hello from " + describe_ + " failed authentication (a different HOPLITE_SECRET?)");
    if (dialer_) {
      finish(why, true);
    } else {  // told, so that the dialer can say why rather than "closed"
      queue(Kind::kRefused, "");
      finishWhenSent(why, true);
    }
    return false;
  }
  if (dialer_) {
    finish({});  // its hello went before the responder's
  } else {
    queueHello(reply_(peer_));
    finishWhenSent({}, false);
  }
  return false;
}

void BootstrapExchange::finishWhenSent(const Status& why, bool refused) {
  finishWhenSent_ = true;
  finishStatus_ = why;
  finishRefused_ = refused;
  writeSome();
}

void BootstrapExchange::finish(const Status& why, bool refused) {
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
  done(why, std::move(peer_), refused);
}

}  // namespace hoplite
