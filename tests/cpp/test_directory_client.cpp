// Who hears that a directory shard moved: every member this node believes
// alive, a rank whose own share moved included as long as this node still
// hears from it (a process taken for failed that came back keeps its share
// moved); not ranks that failed or leave; the gone rank itself when this
// node saw it go, or still hears from it (it may live on, taken for failed).
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "check.h"
#include "on_loop.h"
#include "directory/directory_client.h"

using namespace hoplite;

namespace {

// Takes the frames written to it: the news of moves it carries.
class NewsConnection : public Connection {
 public:
  NewsConnection() : Connection(1) {}
  std::vector<int> movedRanks, returnedRanks;
  void sendControl(wire::MsgType type, std::string payload) override {
    wire::Reader r(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
    if (type == wire::MsgType::kShardMoved) movedRanks.push_back(wire::ShardMoved::decode(r).share.rank);
    if (type == wire::MsgType::kShardReturned) returnedRanks.push_back(wire::ShardReturned::decode(r).share.rank);
  }
  void sendData(uint64_t, uint64_t, uint64_t, const uint8_t*, size_t, std::shared_ptr<const void>) override {}
  void close(const Status&) override {}
  bool isOpen() const override { return true; }
  std::string describe() const override { return "fake"; }
};

// Records to whom the client sends what, instead of sending. (With an
// empty store, the only messages a move sends are the news of it.)
class FakePeers : public PeerLinks {
 public:
  std::set<int> failed, leaving, talking;
  std::map<int, uint64_t> incarnations;
  std::set<int> told;                      // ranks sent news of a move
  std::set<std::pair<int, int>> toldOf;    // (recipient, moved rank)
  std::set<std::pair<int, int>> toldOfReturn;  // (recipient, rank whose share returned)

  void whenConnected(int rank, std::function<void(Connection&)> write) override {
    NewsConnection conn;
    write(conn);
    told.insert(rank);
    for (int moved : conn.movedRanks) toldOf.emplace(rank, moved);
    for (int returned : conn.returnedRanks) toldOfReturn.emplace(rank, returned);
  }
  std::shared_ptr<Connection> sharedConnection(Connection&) override { return nullptr; }
  bool hasFailed(int rank) override { return failed.count(rank) > 0; }
  bool isLeaving(int rank) const override { return leaving.count(rank) > 0; }
  bool talksTo(int rank) const override { return talking.count(rank) > 0; }
  bool isReady(int rank) const override { return talking.count(rank) > 0; }
  uint64_t latestIncoming(int) override { return 0; }
  uint64_t incarnationOf(int rank) const override {
    auto it = incarnations.find(rank);
    return it == incarnations.end() ? 0 : it->second;
  }
  std::string peerName(int rank) const override { return "rank " + std::to_string(rank); }
};

void testMovesReachEveryLiveMember(EventLoop& loop) {
  FakePeers peers;
  for (int r = 0; r < 8; ++r) peers.incarnations[r] = 100 + r;
  ObjectStore store(std::make_shared<BufferPool>(0), 1 << 20, [](const std::string&) {});
  DirectoryClient client(loop, peers, store, DirectoryClientConfig{0, 8, 0}, [] {});
  // Rank 2 was taken for failed and came back as the same process (its share
  // stays moved); rank 5's share moved and this node does not hear from it.
  client.moveShardFrom(2, 0);
  client.moveShardFrom(5, 0);
  peers.talking = {1, 2, 3, 4, 6, 7};
  peers.failed = {6};
  peers.leaving = {7};
  peers.told.clear();
  client.moveShardFrom(3, 0);
  CHECK(client.hasMoved(3));
  CHECK((peers.told == std::set<int>{1, 2, 3, 4}));  // rank 3 too: this node still hears from it
  CHECK(client.isLiveMember(2) && !client.isLiveMember(5) && !client.isLiveMember(6) && !client.isLiveMember(7));
  CHECK(client.isLiveMember(4));
}

void testTheRankSeenToGoIsToldOnceItsFailureIsThrough(EventLoop& loop) {
  FakePeers peers;
  for (int r = 0; r < 8; ++r) peers.incarnations[r] = 100 + r;
  peers.talking = {2, 3, 4, 5, 6, 7};
  ObjectStore store(std::make_shared<BufferPool>(0), 1 << 20, [](const std::string&) {});
  DirectoryClient client(loop, peers, store, DirectoryClientConfig{0, 8, 0}, [] {});
  // The failure moves the share first, and drops what was queued for the
  // rank after: the rank is told only once that is through (it may live on).
  onLoop(loop, [&] {
    client.moveShardFrom(1, 0, /*sawItGo=*/true);
    CHECK((peers.told == std::set<int>{2, 3, 4, 5, 6, 7}));
    peers.failed.insert(1);
  });
  CHECK((peers.told == std::set<int>{1, 2, 3, 4, 5, 6, 7}));
  CHECK(peers.toldOf.count({1, 1}) == 1);
  // News from another member: the rank is not dialed...
  peers.told.clear();
  peers.talking.erase(2);
  onLoop(loop, [&] {
    client.moveShardFrom(2, 0);
    peers.failed.insert(2);
  });
  CHECK((peers.told == std::set<int>{3, 4, 5, 6, 7}));
  // ...but told over a link that is up: it may live on, cut off from the one that saw it go.
  peers.told.clear();
  peers.toldOf.clear();
  onLoop(loop, [&] { client.moveShardFrom(3, 0); });
  CHECK(peers.toldOf.count({3, 3}) == 1 && (peers.told == std::set<int>{3, 4, 5, 6, 7}));
  // Nor one that leaves, nor one back (taken back, or rejoined) before the news went out.
  peers.told.clear();
  peers.leaving.insert(7);
  peers.toldOf.clear();
  onLoop(loop, [&] {
    client.moveShardFrom(7, 0, /*sawItGo=*/true);
    client.moveShardFrom(6, 0, /*sawItGo=*/true);
    peers.failed.insert(7);
  });
  CHECK(peers.toldOf.count({7, 7}) == 0 && peers.toldOf.count({6, 6}) == 0);
  CHECK(peers.toldOf.count({6, 7}) == 1 && peers.toldOf.count({5, 6}) == 1);
}

// A process back from a stall takes its share back (epoch + 1): news of a
// move made before that return is stale, news of one after it is not, and
// each return is passed on once.
void testAReturnOutdatesTheMovesBeforeIt(EventLoop& loop) {
  FakePeers peers;
  for (int r = 0; r < 8; ++r) peers.incarnations[r] = 100 + r;
  peers.talking = {1, 2, 3, 4, 5, 6, 7};
  ObjectStore store(std::make_shared<BufferPool>(0), 1 << 20, [](const std::string&) {});
  DirectoryClient client(loop, peers, store, DirectoryClientConfig{0, 8, 0, 100}, [] {});
  client.moveShardFrom(3, 0);
  CHECK(client.hasMoved(3) && client.shardHost(3) == 4);
  peers.told.clear();
  client.hearShardReturned({3, 103, 1});
  CHECK(!client.hasMoved(3) && client.shardHost(3) == 3);
  CHECK((peers.told == std::set<int>{1, 2, 4, 5, 6, 7}));  // passed on, not to rank 3 itself
  peers.told.clear();
  client.hearShardReturned({3, 103, 1});  // passed back by another member: nothing more
  CHECK(peers.told.empty());
  // The move before the return, passed on late: stale.
  CHECK(!client.hearShardMoved({3, 103, 0}) && !client.hasMoved(3));
  // A return of another process of that rank is not this one's.
  client.moveShardFrom(5, 0);
  client.hearShardReturned({5, 999, 1});
  CHECK(client.hasMoved(5));
  // A move after the return counts, and the return before it, late, does not undo it.
  CHECK(client.hearShardMoved({3, 103, 1}) && client.hasMoved(3));
  client.hearShardReturned({3, 103, 1});
  CHECK(client.hasMoved(3));
  // A move after a return this node missed (epoch 2), then that return late: still moved.
  CHECK(client.hearShardMoved({3, 103, 2}) && client.hasMoved(3));
  client.hearShardReturned({3, 103, 2});
  CHECK(client.hasMoved(3));
  client.hearShardReturned({3, 103, 3});
  CHECK(!client.hasMoved(3));
  // What hello acks tell: the latest return of each rank's current process.
  auto returned = client.returnedShards();
  CHECK(returned.size() == 1 && returned[0].rank == 3 && returned[0].incarnation == 103 && returned[0].epoch == 3);
  // This node's own share: taken back only once moved, with the next epoch, told to every live member.
  CHECK(!client.takeShareBack());
  CHECK(client.hearShardMoved({0, 100, 0}) && client.hasMoved(0));
  peers.toldOfReturn.clear();
  CHECK(client.takeShareBack() && !client.hasMoved(0));
  CHECK((peers.toldOfReturn == std::set<std::pair<int, int>>{{1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0}, {6, 0}, {7, 0}}));
  CHECK(!client.hearShardMoved({0, 100, 0}) && !client.hasMoved(0));  // the old move, late
  // A member that never heard from rank 6 itself: news names its process.
  peers.incarnations.erase(6);
  CHECK(client.hearShardMoved({6, 106, 0}) && client.hasMoved(6));
  client.hearShardReturned({6, 999, 1});  // not the process whose share moved
  CHECK(client.hasMoved(6));
  client.hearShardReturned({6, 106, 1});
  CHECK(!client.hasMoved(6));
  CHECK(!client.hearShardMoved({6, 106, 0}) && !client.hasMoved(6));  // the move before the return, late
  // News of a process that has left since, heard before this node heard from
  // rank 1's current one (a process that just started): told apart once it does.
  peers.incarnations.erase(1);
  CHECK(client.hearShardMoved({1, 101, 0}) && client.hasMoved(1) && !client.movedFromAnotherProcess(1));
  peers.incarnations[1] = 201;
  CHECK(client.movedFromAnotherProcess(1));
  client.shardReturned(1);  // (what the node does then, as for a rejoin)
  CHECK(!client.hasMoved(1) && client.shardHost(1) == 1 && !client.movedFromAnotherProcess(1));
  client.moveShardFrom(1, 0);  // the current process's own move
  CHECK(client.hasMoved(1) && !client.movedFromAnotherProcess(1));
  client.shardReturned(1);  // (the same process: stays moved)
  CHECK(client.hasMoved(1));
  // A return of a rank this node has given up on since: its share moves on again, as of that return.
  client.moveShardFrom(4, 0);
  peers.failed.insert(4);
  client.hearShardReturned({4, 104, 1});
  CHECK(client.hasMoved(4));
  CHECK(!client.hearShardMoved({4, 104, 0}) && client.hearShardMoved({4, 104, 1}));
  // A process that leaves does not take its share back.
  CHECK(client.hearShardMoved({0, 100, 1}) && client.hasMoved(0));
  client.leave(100);
  CHECK(!client.takeShareBack() && client.hasMoved(0));
}

}  // namespace

int main() {
  EventLoop idle;  // not started: nothing here waits
  testMovesReachEveryLiveMember(idle);
  testAReturnOutdatesTheMovesBeforeIt(idle);
  EventLoop loop;
  loop.start();
  testTheRankSeenToGoIsToldOnceItsFailureIsThrough(loop);
  loop.stop();
  return finish("test_directory_client");
}
