// How a TcpConnection reads: a stream of control and data frames of every size
// (empty, a few bytes, across the read-ahead size, hundreds of KB), arriving
// in pieces cut at random bytes, comes out as the same frames in order, each
// payload in its destination with its progress reported, abandoned and
// unwanted payloads dropped without losing the frames after them.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

struct Sent {
  bool data;
  uint64_t request;  // data frames
  std::string bytes;  // the control payload or the data payload
};

// Records what the connection delivers. Requests divisible by 7 have no
// destination (dropped); request 5 is abandoned after its first progress.
struct Recorder : ConnectionObserver {
  TcpConnection* conn = nullptr;
  std::vector<Sent> got;
  std::map<uint64_t, std::vector<uint8_t>> buffers;
  std::map<uint64_t, uint64_t> progress;
  int disorders = 0;

  void onFrame(Connection&, wire::MsgType, const uint8_t* payload, size_t size) override {
    got.push_back({false, 0, std::string(reinterpret_cast<const char*>(payload), size)});
  }
  uint8_t* dataDestination(Connection&, uint64_t request, uint64_t offset, uint64_t size,
                           std::shared_ptr<const void>*) override {
    got.push_back({true, request, std::string()});
    progress[request] = offset;
    if (request % 7 == 0) return nullptr;
    auto& buffer = buffers[request];
    buffer.assign(size, 0);
    return buffer.data();
  }
  void onDataReceived(Connection&, uint64_t request, uint64_t upTo) override {
    disorders += upTo <= progress[request];
    progress[request] = upTo;
    if (request == 5) conn->abandonData(5);
  }
  void onClosed(Connection&, const Status&) override {}
};

// As level-triggered epoll would: the connection hears of input only while the
// socket has some, so bytes it read ahead and left unparsed would stay there.
void readWhileReadable(int fd, TcpConnection& conn) {
  for (int turns = 0; turns < 100; ++turns) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) != 1) return;
    conn.handleEvents(EPOLLIN);
  }
  CHECK(!"the connection leaves input in the socket");
}

std::string frameBytes(const Sent& frame) {
  std::string out(wire::kHeaderSize + (frame.data ? wire::kDataSubheaderSize : 0), '\0');
  auto* head = reinterpret_cast<uint8_t*>(out.data());
  if (frame.data) {
    wire::encodeHeader(head, wire::MsgType::kData, wire::kDataSubheaderSize + frame.bytes.size());
    wire::encodeDataSubheader(head + wire::kHeaderSize, frame.request, 0);
  } else {
    wire::encodeHeader(head, wire::MsgType::kCancel, frame.bytes.size());
  }
  return out + frame.bytes;
}

void randomFramesInRandomPieces(unsigned seed) {
  EventLoop loop;  // not started: the test drives the connection itself
  Recorder recorder;
  int fds[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
  auto conn = std::make_shared<TcpConnection>(loop, fds[0], false, "test", &recorder,
                                              TransportOptions{wire::FrameLimits{1 << 20, 1 << 20}, 0});
  recorder.conn = conn.get();
  conn->open();
  conn->markTrusted();

  std::mt19937 rng(seed);
  const size_t sizes[] = {0, 1, 7, 100, (16 << 10) - 40, 16 << 10, (16 << 10) + 3, 50000, 300000};
  std::vector<Sent> sent;
  std::string stream;
  std::vector<size_t> ends;  // where each frame ends in the stream
  for (uint64_t i = 0; i < 400; ++i) {
    Sent frame{rng() % 2 == 0, i, std::string(sizes[rng() % std::size(sizes)], '\0')};
    for (char& c : frame.bytes) c = static_cast<char>(rng());
    stream += frameBytes(frame);
    ends.push_back(stream.size());
    sent.push_back(std::move(frame));
  }
  // Written in pieces of up to 40 KB cut at random bytes, each read before the next is written;
  // every frame written whole is delivered before more is written.
  int stalls = 0;
  for (size_t at = 0; at < stream.size();) {
    size_t piece = std::min<size_t>(stream.size() - at, 1 + rng() % 40000);
    // Half the pieces end with a frame: an empty frame must not wait for more.
    if (rng() % 2 == 0) piece = std::min(piece, *std::upper_bound(ends.begin(), ends.end(), at) - at);
    const ssize_t wrote = ::send(fds[1], stream.data() + at, piece, 0);
    if (wrote > 0) at += static_cast<size_t>(wrote);
    readWhileReadable(fds[0], *conn);
    const size_t whole = std::upper_bound(ends.begin(), ends.end(), at) - ends.begin();
    stalls += recorder.got.size() < whole;
  }
  CHECK(stalls == 0);

  CHECK(recorder.got.size() == sent.size());
  CHECK(recorder.disorders == 0);
  for (size_t i = 0; i < sent.size() && i < recorder.got.size(); ++i) {
    const Sent& s = sent[i];
    const Sent& g = recorder.got[i];
    CHECK(g.data == s.data);
    if (!s.data) {
      CHECK(g.bytes == s.bytes);
      continue;
    }
    CHECK(g.request == s.request);
    if (s.request % 7 == 0 || s.request == 5 || s.bytes.empty()) continue;  // dropped
    const auto& buffer = recorder.buffers[s.request];
    CHECK(std::string(buffer.begin(), buffer.end()) == s.bytes);
    CHECK(recorder.progress[s.request] == s.bytes.size());
  }
  conn->close(Status());
  ::close(fds[1]);
}

}  // namespace

int main() {
  for (unsigned seed = 1; seed <= 3; ++seed) randomFramesInRandomPieces(seed);
  return finish("test_tcp_read");
}
