// A receive given up while its message's last bytes are still landing: it
// reports the reason once, and no byte is written to its memory after. Over
// UCX, abandoning a rendezvous that does not land in time closes the
// connection, whose failure forgets the message before the cancel is through.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "messenger/mailbox.h"
#include "on_loop.h"

using namespace hoplite;

namespace {

// A connection from rank 1 that records what it is asked to do; with
// `closesOnAbandon`, abandoning data closes it as a UCX one does when a
// rendezvous does not finish in time.
class FakeConnection : public Connection {
 public:
  FakeConnection(Mailbox*& mailbox, bool closesOnAbandon)
      : Connection(7), mailbox_(mailbox), closesOnAbandon_(closesOnAbandon) {
    setPeerRank(1);
  }
  std::vector<uint64_t> abandoned;
  void sendControl(wire::MsgType, std::string) override {}
  void sendData(uint64_t, uint64_t, uint64_t, const uint8_t*, size_t, std::shared_ptr<const void>) override {}
  void abandonData(uint64_t request) override {
    abandoned.push_back(request);
    if (closesOnAbandon_) close(Status(Code::kPeerFailed, "the rendezvous did not finish in time"));
  }
  void close(const Status& why) override {
    if (!open_) return;
    open_ = false;
    mailbox_->failFrom(peerRank(), id(), why);  // what the node does for a closed connection
  }
  bool isOpen() const override { return open_; }
  std::string describe() const override { return "fake connection from rank 1"; }

 private:
  Mailbox*& mailbox_;
  bool closesOnAbandon_;
  bool open_ = true;
};

class Links : public PeerLinks {
 public:
  explicit Links(std::shared_ptr<Connection> conn) : conn_(std::move(conn)) {}
  void whenConnected(int, std::function<void(Connection&)> write) override { write(*conn_); }
  std::shared_ptr<Connection> sharedConnection(Connection&) override { return conn_; }
  bool hasFailed(int) override { return false; }
  bool isLeaving(int) const override { return false; }
  bool talksTo(int) const override { return true; }
  bool isReady(int) const override { return true; }
  uint64_t latestIncoming(int) override { return conn_->id(); }
  uint64_t incarnationOf(int) const override { return 1; }
  std::string peerName(int rank) const override { return "rank " + std::to_string(rank); }

 private:
  std::shared_ptr<Connection> conn_;
};

void testACancelledReceiveWhoseBytesAreLanding(EventLoop& loop, bool closesOnAbandon) {
  Mailbox* mailbox = nullptr;
  auto conn = std::make_shared<FakeConnection>(mailbox, closesOnAbandon);
  Links links(conn);
  BufferPool pool(0);
  Mailbox box(loop, links, pool, MailboxConfig{0, 2});
  mailbox = &box;

  constexpr uint64_t kSize = 1 << 20;
  const uint64_t request = wire::kMessageRequestBit | 5;
  std::vector<uint8_t> dest(kSize, 0);
  std::vector<Status> reports;
  const uint64_t handle = box.receive(1, 3, 4, "test", dest.data(), kSize, nullptr,
                                      [&](const Status& s, int) { reports.push_back(s); });
  uint8_t* landing = nullptr;
  onLoop(loop, [&] {
    box.onMessage(*conn, wire::Message{request, 3, 4, kSize, "test", false});
    std::shared_ptr<const void> keepalive;
    // Deferred (an eager one would arm a credit timer): the receive asked for
    // it. The one data frame has started (its destination is handed out) and not landed.
    landing = box.dataDestination(*conn, request, 0, kSize, &keepalive);
  });
  CHECK(landing == dest.data());
  box.cancelReceive(handle, Status(Code::kTimeout, "given up"));
  onLoop(loop, [] {});  // (after the cancel, posted first)
  CHECK(conn->abandoned == std::vector<uint64_t>{request});
  CHECK(reports.size() == 1 && reports[0].code == Code::kTimeout && reports[0].message == "given up");
  // Its last bytes land late: nothing more is reported.
  onLoop(loop, [&] { box.onDataReceived(*conn, request, kSize); });
  CHECK(reports.size() == 1);
  CHECK(conn->isOpen() == !closesOnAbandon);
}

}  // namespace

int main() {
  EventLoop loop;
  loop.start();
  testACancelledReceiveWhoseBytesAreLanding(loop, /*closesOnAbandon=*/false);
  testACancelledReceiveWhoseBytesAreLanding(loop, /*closesOnAbandon=*/true);
  loop.stop();
  return finish("test_mailbox");
}
