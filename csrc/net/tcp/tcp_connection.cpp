#include "net/tcp/tcp_connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "net/sockets.h"

namespace hoplite {
namespace {

std::atomic<uint64_t> gNextConnectionId{1};
constexpr size_t kReadBudget = 16u << 20;  // bytes per readiness event, for fairness
constexpr int kMaxIov = 64;
// While a large payload arrives, wake only once this much of it is queued:
// on a shaped link bytes trickle in a few packets at a time, and reading each
// trickle cost a wakeup and three syscalls per few KB (measured: ~7.5 KB per
// recv in an 8-node broadcast at 1 Gbit/s).
constexpr size_t kPayloadLowWater = 256u << 10;
constexpr size_t kMinLowWaterPayload = 64u << 10;  // smaller payloads are read as they come
// Frames and payload ends smaller than this are read through the read-ahead
// buffer; larger wants are received in place.
constexpr size_t kReadAhead = 16u << 10;

Status errnoStatus(const char* what, int err) {
  return Status(Code::kPeerFailed, std::string(what) + ": " + std::strerror(err));
}

}  // namespace

TcpConnection::TcpConnection(EventLoop& loop, int fd, bool connecting, std::string peerAddress,
                             ConnectionObserver* observer, const TransportOptions& options)
    : Connection(gNextConnectionId++),
      loop_(loop),
      fd_(fd),
      connecting_(connecting),
      peerAddress_(std::move(peerAddress)),
      observer_(observer),
      options_(options),
      trusted_(false),  // either side: only once the other has proved it knows the secret
      ahead_(new uint8_t[kReadAhead]) {}

TcpConnection::~TcpConnection() {
  if (fd_ < 0) return;
  // Dropped without close() (its owner let go of it while it was open), maybe
  // by a handler of the batch that also holds this connection's events.
  if (loop_.onLoopThread()) loop_.forget(this);
  ::close(fd_);
}

void TcpConnection::open() {
  wantWrite_ = connecting_;
  if (!loop_.addFd(fd_, EPOLLIN | EPOLLRDHUP | (connecting_ ? EPOLLOUT : 0), this)) {
    // Report it from the loop, after the owner has stored this connection.
    auto self = shared_from_this();
    loop_.post([self] { self->close(Status(Code::kInternal, "cannot watch socket")); });
  }
}

std::string TcpConnection::describe() const {
  std::string who = peerRank() >= 0 ? "rank " + std::to_string(peerRank()) + " at " : "";
  return who + peerAddress_;
}

void TcpConnection::sendControl(wire::MsgType type, std::string payload) {
  if (closed_ || ending_) return;
  Outgoing out;
  wire::encodeHeader(out.head, type, payload.size());
  out.headSize = wire::kHeaderSize;
  out.owned = std::move(payload);
  // Control frames overtake queued data frames (at frame boundaries: after the
  // frame on the wire and after earlier control frames), so a request or an
  // answer never waits behind megabytes of someone else's transfer.
  auto at = outq_.begin();
  if (at != outq_.end() && at->sent > 0) ++at;
  while (at != outq_.end() && at->data == nullptr) ++at;
  outq_.insert(at, std::move(out));
  if (!connecting_) flushSoon();
}

void TcpConnection::sendData(uint64_t flow, uint64_t request, uint64_t offset, const uint8_t* data, size_t size,
                             std::shared_ptr<const void> keepalive) {
  if (closed_ || ending_) return;
  Outgoing out;
  wire::encodeHeader(out.head, wire::MsgType::kData, wire::kDataSubheaderSize + size);
  wire::encodeDataSubheader(out.head + wire::kHeaderSize, request, offset);
  out.headSize = wire::kHeaderSize + wire::kDataSubheaderSize;
  out.data = data;
  out.dataSize = size;
  out.keepalive = std::move(keepalive);
  out.flow = flow;
  auto at = dataSlot(out);
  outq_.insert(at, std::move(out));
  if (!connecting_) flushSoon();
}

std::deque<TcpConnection::Outgoing>::iterator TcpConnection::dataSlot(Outgoing& frame) {
  auto isData = [](const Outgoing& o) { return o.data != nullptr; };
  auto first = std::find_if(outq_.begin(), outq_.end(), isData);
  // The tag of the frame being sent (or next), else of the last one sent.
  const uint64_t now = first != outq_.end() ? first->start : sentStart_;
  // Control frames sit before every data frame not started, so the frames
  // from the first unstarted one on are data frames sorted by tag.
  auto unstarted = std::find_if(first, outq_.end(), [](const Outgoing& o) { return o.data != nullptr && o.sent == 0; });
  frame.start = flowTags_.next(frame.flow, frame.dataSize, now);
  return std::upper_bound(unstarted, outq_.end(), frame.start,
                          [](uint64_t start, const Outgoing& o) { return start < o.start; });
}

void TcpConnection::close(const Status& why) {
  if (closed_) return;
  closed_ = true;
  loop_.removeFd(fd_);
  // Closing with unread bytes makes the kernel reset the connection and drop
  // what it has not yet transmitted (e.g. a rank's last message before it shuts
  // down): read what is there first, so the peer gets the bytes, then the FIN.
  // Bounded: a peer still sending must not hold the loop here.
  char sink[64 << 10];
  for (int i = 0; i < 64 && ::recv(fd_, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  ::close(fd_);
  fd_ = -1;
  outq_.clear();
  // Keep this object alive until the loop finishes the current batch of events,
  // which may still name it.
  auto self = shared_from_this();
  loop_.post([self] {});
  observer_->onClosed(*this, why);
}

void TcpConnection::closeGracefully(const Status& why) {
  if (closed_ || ending_) return;
  if (!connecting_) flush();  // what was queued before (its write may be pending: flushSoon) goes first
  if (closed_) return;
  if (connecting_ || ::shutdown(fd_, SHUT_WR) != 0) {
    close(why);
    return;
  }
  ending_ = true;
  endWhy_ = why;
  outq_.clear();  // their senders were not told they were sent, and are failed
  wantWrite_ = false;
  loop_.modifyFd(fd_, EPOLLIN | EPOLLRDHUP, this);
  if (lowWater_ > 1) setLowWater(1);  // the end of stream may follow a partial frame
  dropInput();
}

void TcpConnection::dropInput() {
  char sink[64 << 10];
  for (size_t budget = kReadBudget; budget > 0;) {  // a peer still sending must not hold the loop
    const ssize_t got = ::recv(fd_, sink, sizeof sink, MSG_DONTWAIT);
    if (got > 0) {
      budget -= std::min(budget, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(endWhy_);  // the peer's end, or its reset: nothing more will come
    return;
  }
}

void TcpConnection::handleEvents(uint32_t events) {
  if (closed_) return;
  auto self = shared_from_this();
  if (ending_) {
    dropInput();
    return;
  }
  if (connecting_) {
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) finishConnect();
    return;
  }
  if (events & EPOLLIN) readSome();
  if (closed_) return;
  if (events & EPOLLOUT) flush();
  if (closed_) return;
  if ((events & (EPOLLERR | EPOLLHUP)) && !(events & EPOLLIN)) {
    close(Status(Code::kPeerFailed, "connection to " + describe() + " failed"));
  }
}

void TcpConnection::finishConnect() {
  const int err = connectResult(fd_);
  if (err != 0) {
    close(errnoStatus(("connect to " + describe()).c_str(), err));
    return;
  }
  connecting_ = false;
  flush();
}

void TcpConnection::updateInterest() {
  bool want = !outq_.empty();
  if (want == wantWrite_) return;
  wantWrite_ = want;
  loop_.modifyFd(fd_, EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0), this);
}

void TcpConnection::flushSoon() {
  if (flushQueued_) return;
  flushQueued_ = true;
  loop_.runSoon([self = shared_from_this()] {
    self->flushQueued_ = false;
    if (!self->closed_ && !self->ending_ && !self->connecting_) self->flush();
  });
}

void TcpConnection::flush() {
  while (!outq_.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = outq_.begin(); it != outq_.end() && n + 2 <= kMaxIov; ++it) {
      size_t skip = it->sent;
      if (skip < it->headSize) {
        iov[n++] = {it->head + skip, it->headSize - skip};
        skip = 0;
      } else {
        skip -= it->headSize;
      }
      const uint8_t* body = it->data ? it->data : reinterpret_cast<const uint8_t*>(it->owned.data());
      size_t bodySize = it->data ? it->dataSize : it->owned.size();
      if (bodySize > skip) iov[n++] = {const_cast<uint8_t*>(body) + skip, bodySize - skip};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t wrote = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);  // a dead peer is an error, not SIGPIPE
    if (wrote < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      close(errnoStatus(("send to " + describe()).c_str(), errno));
      return;
    }
    size_t left = static_cast<size_t>(wrote);
    while (left > 0) {
      Outgoing& front = outq_.front();
      size_t rest = front.total() - front.sent;
      if (left >= rest) {
        left -= rest;
        if (front.data != nullptr) sentStart_ = front.start;
        outq_.pop_front();
      } else {
        front.sent += left;
        left = 0;
      }
    }
  }
  updateInterest();
}

void TcpConnection::onHeader() {
  const wire::FrameLimits limits = trusted_ ? options_.limits : wire::kHandshakeLimits;
  Status s = wire::decodeHeader(header_, limits, &frame_);
  if (!s.ok()) {
    close(Status(Code::kProtocol, s.message + " from " + describe()));
    return;
  }
  headerGot_ = 0;
  if (static_cast<wire::MsgType>(frame_.type) == wire::MsgType::kData) {
    if (!trusted_) {
      close(Status(Code::kProtocol, "data frame before the handshake from " + describe()));
      return;
    }
    readState_ = ReadState::kDataSubheader;
    subGot_ = 0;
  } else {
    readState_ = ReadState::kControl;
    control_.resize(frame_.length);
    controlGot_ = 0;
  }
}

void TcpConnection::setLowWater(size_t bytes) {
  int value = static_cast<int>(bytes);
  // Best effort: without it, reads are merely smaller.
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &value, sizeof(value)) == 0) lowWater_ = bytes;
}

size_t TcpConnection::lowWaterFor(size_t payloadLeft) const {
  if (payloadLeft < kMinLowWaterPayload) return 1;
  size_t bytes = std::min(payloadLeft, kPayloadLowWater);
  // A fixed receive buffer must hold it with room to spare, or the sender
  // could stall on a closed window while we wait for more.
  if (options_.socketBufferBytes > 0) bytes = std::min(bytes, static_cast<size_t>(options_.socketBufferBytes) / 4);
  return std::max<size_t>(bytes, 1);
}

void TcpConnection::abandonData(uint64_t request) {
  if (readState_ != ReadState::kDataPayload || dataRequest_ != request) return;
  dataDest_ = nullptr;  // readSome reads the rest into discard_
  dataKeep_.reset();
}

void TcpConnection::readSome() {
  readFrames();
  if (closed_ || ending_) return;
  // Only now, as it goes back to epoll: a payload that is all there already is
  // read without the two setsockopt calls. Never above what is left of the
  // frame; raised once per frame, lowered only when what is left falls below it.
  const bool inPayload = readState_ == ReadState::kDataPayload;
  const size_t lowWater = inPayload ? lowWaterFor(dataSize_ - dataGot_) : 1;
  if (lowWater < lowWater_ || (lowWater > lowWater_ && !lowWaterRaised_)) {
    setLowWater(lowWater);
    lowWaterRaised_ = inPayload;
  }
}

ssize_t TcpConnection::take(uint8_t* dst, size_t want, size_t* budget, bool* drained) {
  if (aheadBegin_ < aheadEnd_) {
    const size_t n = std::min(want, aheadEnd_ - aheadBegin_);
    if (dst != nullptr) std::memcpy(dst, ahead_.get() + aheadBegin_, n);
    aheadBegin_ += n;
    return static_cast<ssize_t>(n);
  }
  // Large wants go straight to their destination: read-ahead saves syscalls
  // between small frames, it must not copy payloads.
  const bool direct = want >= kReadAhead;
  uint8_t* into = ahead_.get();
  size_t size = kReadAhead;
  if (direct && dst != nullptr) {
    into = dst;
    size = want;
  } else if (direct) {
    discard_.resize(std::min<size_t>(want, 1u << 20));
    into = discard_.data();
    size = discard_.size();
  }
  ssize_t got;
  do {
    got = ::recv(fd_, into, size, 0);
  } while (got < 0 && errno == EINTR);
  if (got == 0) {
    close(Status(Code::kPeerFailed, "connection closed by " + describe()));
    return -1;
  }
  if (got < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      *drained = true;
      return 0;
    }
    close(errnoStatus(("receive from " + describe()).c_str(), errno));
    return -1;
  }
  *budget -= std::min(*budget, static_cast<size_t>(got));
  *drained = static_cast<size_t>(got) < size;
  if (direct) return got;
  aheadBegin_ = 0;
  aheadEnd_ = static_cast<size_t>(got);
  return take(dst, want, budget, drained);
}

void TcpConnection::readFrames() {
  size_t budget = kReadBudget;
  bool drained = false;  // the last recv left the socket empty
  while (!closed_ && !ending_) {
    uint8_t* dst = nullptr;
    size_t want = 0;
    switch (readState_) {
      case ReadState::kHeader:
        dst = header_ + headerGot_;
        want = wire::kHeaderSize - headerGot_;
        break;
      case ReadState::kControl:
        dst = control_.data() + controlGot_;
        want = control_.size() - controlGot_;
        break;
      case ReadState::kDataSubheader:
        dst = sub_ + subGot_;
        want = wire::kDataSubheaderSize - subGot_;
        break;
      case ReadState::kDataPayload:
        dst = dataDest_ != nullptr ? dataDest_ + dataGot_ : nullptr;  // nullptr: abandoned, dropped
        want = dataSize_ - dataGot_;
        break;
    }
    if (want > 0) {
      // Back to epoll only with nothing read ahead (epoll knows only the
      // socket), and only where bytes are needed (an empty frame just
      // completed is delivered first): when the socket was empty at the last
      // recv (no recv just to hear EAGAIN) or this turn's budget is spent
      // (level-triggered: the loop comes back).
      if (aheadBegin_ == aheadEnd_ && (drained || budget == 0)) return;
      const ssize_t got = take(dst, want, &budget, &drained);
      if (got <= 0) return;  // closed, or nothing there
      switch (readState_) {
        case ReadState::kHeader: headerGot_ += got; break;
        case ReadState::kControl: controlGot_ += got; break;
        case ReadState::kDataSubheader: subGot_ += got; break;
        case ReadState::kDataPayload:
          dataGot_ += got;
          if (dataDest_ != nullptr) observer_->onDataReceived(*this, dataRequest_, dataOffset_ + dataGot_);
          break;
      }
    }
    // Advance the state machine on completed pieces.
    switch (readState_) {
      case ReadState::kHeader:
        if (headerGot_ == wire::kHeaderSize) onHeader();
        break;
      case ReadState::kControl:
        if (controlGot_ == control_.size()) {
          readState_ = ReadState::kHeader;
          std::vector<uint8_t> payload;
          payload.swap(control_);
          observer_->onFrame(*this, static_cast<wire::MsgType>(frame_.type), payload.data(), payload.size());
        }
        break;
      case ReadState::kDataSubheader:
        if (subGot_ == wire::kDataSubheaderSize) {
          wire::decodeDataSubheader(sub_, &dataRequest_, &dataOffset_);
          dataSize_ = frame_.length - wire::kDataSubheaderSize;
          dataGot_ = 0;
          dataDest_ = observer_->dataDestination(*this, dataRequest_, dataOffset_, dataSize_, &dataKeep_);
          readState_ = ReadState::kDataPayload;
          lowWaterRaised_ = false;
          if (dataSize_ == 0) readState_ = ReadState::kHeader;
        }
        break;
      case ReadState::kDataPayload:
        if (dataGot_ == dataSize_) {
          readState_ = ReadState::kHeader;
          dataDest_ = nullptr;
          dataKeep_.reset();
        }
        break;
    }
  }
}

}  // namespace hoplite
