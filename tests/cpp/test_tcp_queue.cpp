// The order in which a TcpConnection puts queued frames on the wire: data
// frames of different flows alternate (one flow's backlog delays another by at
// most a frame), frames of one flow keep their order, and control frames
// overtake data frames that have not started.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "net/tcp/tcp_connection.h"

using namespace hoplite;

namespace {

struct NullObserver : ConnectionObserver {
  void onFrame(Connection&, wire::MsgType, const uint8_t*, size_t) override {}
  uint8_t* dataDestination(Connection&, uint64_t, uint64_t, uint64_t, std::shared_ptr<const void>*) override {
    return nullptr;
  }
  void onDataReceived(Connection&, uint64_t, uint64_t) override {}
  void onClosed(Connection&, const Status&) override {}
};

struct Frame {
  uint8_t type;
  uint64_t request, offset;
};

uint64_t readU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Reads what the connection writes until `count` frames have arrived, letting
// it flush whenever the socket drains.
std::vector<Frame> receiveFrames(TcpConnection& conn, int peer, size_t count) {
  std::string bytes;
  std::vector<Frame> frames;
  size_t at = 0;
  while (frames.size() < count) {
    char buf[1 << 16];
    ssize_t got = ::recv(peer, buf, sizeof buf, MSG_DONTWAIT);
    if (got > 0) bytes.append(buf, static_cast<size_t>(got));
    if (got < 0 && errno != EAGAIN) break;
    if (got <= 0) conn.handleEvents(EPOLLOUT);
    while (bytes.size() - at >= wire::kHeaderSize) {
      const auto* head = reinterpret_cast<const uint8_t*>(bytes.data() + at);
      wire::FrameHeader h;
      if (!wire::decodeHeader(head, wire::FrameLimits{1 << 20, 1 << 20}, &h).ok()) return frames;
      if (bytes.size() - at < wire::kHeaderSize + h.length) break;
      Frame f{h.type, 0, 0};
      if (h.type == static_cast<uint8_t>(wire::MsgType::kData)) {
        f.request = readU64(head + wire::kHeaderSize);
        f.offset = readU64(head + wire::kHeaderSize + 8);
      }
      frames.push_back(f);
      at += wire::kHeaderSize + h.length;
    }
  }
  return frames;
}

std::shared_ptr<TcpConnection> connectionWithSmallBuffer(EventLoop& loop, NullObserver& observer, int fds[2]) {
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
  int small = 4096;  // so that frames queue instead of being written at once
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  auto conn = std::make_shared<TcpConnection>(loop, fds[0], false, "test", &observer,
                                              TransportOptions{wire::FrameLimits{1 << 20, 1 << 20}, 0});
  conn->open();
  conn->markTrusted();
  return conn;
}

// Random frames of four flows, control frames and partial drains: every
// flow's data arrives in order, whatever was queued when.
void randomFlowsKeepTheirOrder() {
  EventLoop loop;
  NullObserver observer;
  int fds[2];
  auto conn = connectionWithSmallBuffer(loop, observer, fds);
  std::mt19937 rng(1);
  std::vector<uint8_t> data(1 << 17, 3);
  std::map<uint64_t, uint64_t> queuedTo, arrivedTo;
  std::string bytes;
  size_t at = 0, frames = 0, disorders = 0, sent = 0;
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 3 < 2 && sent < 5000) {
      const uint64_t flow = rng() % 4;
      const size_t size = 1 + rng() % 70000;
      conn->sendData(flow, flow, queuedTo[flow], data.data(), size, nullptr);
      queuedTo[flow] += size;
      ++sent;
      if (rng() % 5 == 0) conn->sendControl(wire::MsgType::kCancel, std::string(8, '\0'));
      continue;
    }
    char buf[1 << 15];
    ssize_t got = ::recv(fds[1], buf, rng() % sizeof buf + 1, MSG_DONTWAIT);
    if (got > 0) bytes.append(buf, static_cast<size_t>(got));
    conn->handleEvents(EPOLLOUT);
    while (bytes.size() - at >= wire::kHeaderSize) {
      const auto* head = reinterpret_cast<const uint8_t*>(bytes.data() + at);
      wire::FrameHeader h;
      if (!wire::decodeHeader(head, wire::FrameLimits{1 << 20, 1 << 20}, &h).ok()) {
        CHECK(!"a frame began inside another");
        return;
      }
      if (bytes.size() - at < wire::kHeaderSize + h.length) break;
      if (h.type == static_cast<uint8_t>(wire::MsgType::kData)) {
        const uint64_t request = readU64(head + wire::kHeaderSize), offset = readU64(head + wire::kHeaderSize + 8);
        disorders += offset != arrivedTo[request];
        arrivedTo[request] = offset + h.length - wire::kDataSubheaderSize;
        ++frames;
      }
      at += wire::kHeaderSize + h.length;
    }
  }
  CHECK(frames > 1000);
  CHECK(disorders == 0);
  conn->close(Status());
  ::close(fds[1]);
}

}  // namespace

struct Send {
  uint64_t flow;  // also the request
  int frames;
  size_t bytes;  // each
};

// Queues `sends` in order (and a control frame after them, if asked) while the
// socket is full, then checks the order of what arrives: (request, index of
// the frame within its flow), request 0 for the control frame.
void checkOrder(const std::vector<Send>& sends, bool control, const std::vector<std::pair<uint64_t, uint64_t>>& expected) {
  EventLoop loop;  // not started: the test drives the connection itself
  NullObserver observer;
  int fds[2];
  auto conn = connectionWithSmallBuffer(loop, observer, fds);
  std::vector<uint8_t> data(1 << 20, 7);
  std::map<uint64_t, size_t> size;
  bool first = true;
  for (const Send& s : sends) {
    size[s.flow] = s.bytes;
    for (int i = 0; i < s.frames; ++i) {
      conn->sendData(s.flow, s.flow, i * s.bytes, data.data(), s.bytes, nullptr);
      // Writes are flushed once the loop's handlers are done: here the first
      // frame starts on the wire before the rest are queued.
      if (first) conn->handleEvents(EPOLLOUT);
      first = false;
    }
  }
  if (control) conn->sendControl(wire::MsgType::kCancel, std::string(8, '\0'));
  std::vector<Frame> got = receiveFrames(*conn, fds[1], expected.size());
  CHECK(got.size() == expected.size());
  for (size_t i = 0; i < got.size() && i < expected.size(); ++i) {
    const bool isControl = got[i].type != static_cast<uint8_t>(wire::MsgType::kData);
    const bool ok = isControl ? expected[i].first == 0
                              : got[i].request == expected[i].first &&
                                    got[i].offset == expected[i].second * size[expected[i].first];
    CHECK(ok);
    if (!ok) std::fprintf(stderr, "frame %zu: request %llu offset %llu\n", i,
                          static_cast<unsigned long long>(got[i].request), static_cast<unsigned long long>(got[i].offset));
  }
  conn->close(Status());
  ::close(fds[1]);
}

int main() {
  randomFlowsKeepTheirOrder();
  // The first data frame has started when the rest are queued; frames of equal
  // size alternate, and the control frame goes right after the started one.
  checkOrder({{11, 6, 64 << 10}, {22, 3, 64 << 10}}, true,
             {{11, 0}, {0, 0}, {22, 0}, {11, 1}, {22, 1}, {11, 2}, {22, 2}, {11, 3}, {11, 4}, {11, 5}});
  // Shares are in bytes: four 16 KiB frames of flow 22 per 64 KiB frame of flow 11.
  checkOrder({{11, 4, 64 << 10}, {22, 8, 16 << 10}}, false,
             {{11, 0}, {22, 0}, {22, 1}, {22, 2}, {22, 3}, {11, 1}, {22, 4}, {22, 5}, {22, 6}, {22, 7}, {11, 2}, {11, 3}});
  return finish("test_tcp_queue");
}
