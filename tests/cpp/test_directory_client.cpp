// Who hears that a directory shard moved: every member this node believes
// alive, a rank whose own share moved included as long as this node still
// hears from it (a process taken for failed that came back keeps its share
// moved); not ranks that failed or leave; the gone rank itself only when this
// node saw it go (it may live on, taken for failed).
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "check.h"
#include "directory/directory_client.h"

using namespace hoplite;

namespace {

// Records to whom the client sends, instead of sending. (With an empty
// store, the only messages a move sends are the news of it.)
class FakePeers : public PeerLinks {
 public:
  std::set<int> failed, leaving, talking;
  std::map<int, uint64_t> incarnations;
  std::set<int> told;

  void whenConnected(int rank, std::function<void(Connection&)>) override { told.insert(rank); }
  std::shared_ptr<Connection> sharedConnection(Connection&) override { return nullptr; }
  bool hasFailed(int rank) override { return failed.count(rank) > 0; }
  bool isLeaving(int rank) const override { return leaving.count(rank) > 0; }
  bool talksTo(int rank) const override { return talking.count(rank) > 0; }
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
  CHECK((peers.told == std::set<int>{1, 2, 4}));
  CHECK(client.isLiveMember(2) && !client.isLiveMember(5) && !client.isLiveMember(6) && !client.isLiveMember(7));
  CHECK(client.isLiveMember(4));
  // Seen to go by this node itself: the rank is told too (it may live on).
  peers.told.clear();
  peers.failed.insert(1);
  client.moveShardFrom(1, 0, /*sawItGo=*/true);
  CHECK((peers.told == std::set<int>{1, 2, 3, 4}));  // (3's share moved, and it talks to this node)
  // A rank that leaves is not.
  peers.told.clear();
  client.moveShardFrom(7, 0, /*sawItGo=*/true);
  CHECK((peers.told == std::set<int>{2, 3, 4}));
}

}  // namespace

int main() {
  EventLoop loop;  // not started: nothing here waits
  testMovesReachEveryLiveMember(loop);
  return finish("test_directory_client");
}
