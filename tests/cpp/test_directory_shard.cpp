// What a directory shard remembers across moves: registration tokens keep a
// cleanup of one computation of a reduce's result from removing a later
// one's entry; remembered deletes travel with a hand-over and through the
// standby list; an id put again after its delete is forgotten by the standby,
// and a holder listing a copy again overrides a standby's delete.
#include <string>
#include <vector>

#include "check.h"
#include "directory/directory_shard.h"

using namespace hoplite;

namespace {

ObjectMeta meta() {
  ObjectMeta m;
  m.dtype = "float32";
  m.itemsize = 4;
  m.shape = {1 << 20};
  m.nbytes = 4u << 20;
  m.device = "cpu";
  return m;
}

wire::Register registration(const std::string& id, int holder, uint64_t token, bool reannounce = false) {
  wire::Register reg;
  reg.id = id;
  reg.meta = meta();
  reg.holder = holder;
  reg.recomputable = token != 0;
  reg.reannounce = reannounce;
  reg.token = token;
  return reg;
}

void testTokens(EventLoop& loop) {
  DirectoryShard shard(loop, [](int, const wire::Locations&) {});
  std::vector<int> holders;
  // A cleanup under another token leaves the entry; its own token removes it.
  CHECK(shard.registerObject(registration("result", 1, 5)).ok());
  CHECK(shard.remove("result", /*retract=*/true, &holders, /*ifToken=*/7).code == Code::kAlreadyExists);
  CHECK(holders.empty());
  CHECK(shard.remove("result", /*retract=*/true, &holders, /*ifToken=*/5).ok());
  CHECK(holders == std::vector<int>{1});
  // Registered under no token (a reader's copy listed first after a move): any cleanup removes it.
  holders.clear();
  CHECK(shard.registerObject(registration("result", 2, 0, /*reannounce=*/true)).ok());
  CHECK(shard.remove("result", /*retract=*/true, &holders, /*ifToken=*/7).ok());
  CHECK(holders == std::vector<int>{2});
  // The origin re-registering after a move names the entry's token.
  holders.clear();
  CHECK(shard.registerObject(registration("result", 2, 0, /*reannounce=*/true)).ok());
  CHECK(shard.registerObject(registration("result", 1, 9, /*reannounce=*/true)).ok());
  CHECK(shard.remove("result", /*retract=*/false, &holders, /*ifToken=*/7).code == Code::kAlreadyExists);
  CHECK(shard.remove("result", /*retract=*/false, &holders, /*ifToken=*/0).ok());
  CHECK(shard.isDeleted("result"));
}

void testHandOver(EventLoop& loop) {
  DirectoryShard old(loop, [](int, const wire::Locations&) {});
  DirectoryShard successor(loop, [](int, const wire::Locations&) {});
  std::vector<int> holders;
  CHECK(old.registerObject(registration("gone", 1, 0)).ok());
  CHECK(old.remove("gone", /*retract=*/false, &holders).ok());
  CHECK(old.registerObject(registration("kept", 1, 0)).ok());
  CHECK(old.registerObject(registration("stays", 1, 0)).ok());
  std::vector<wire::GoneId> handed = old.handOver([](const std::string& id) { return id != "stays"; });
  CHECK(handed.size() == 1 && handed[0].id == "gone" && handed[0].deleted);
  CHECK(!old.isDeleted("gone"));  // not this shard's any more
  for (const auto& g : handed) successor.adoptGone(g);
  CHECK(successor.isDeleted("gone"));
  CHECK(successor.remove("gone", false, &holders).code == Code::kDeleted);
  CHECK(old.remove("stays", false, &holders).ok());
  // A leaving shard (rank 4) also hands over the objects only it holds, as lost with it.
  CHECK(old.registerObject(registration("only-mine", 4, 0)).ok());
  CHECK(old.registerObject(registration("shared", 4, 0)).ok());
  CHECK(old.registerObject(registration("shared", 2, 0, /*reannounce=*/true)).ok());
  handed = old.handOver([](const std::string&) { return true; }, /*leaving=*/4);
  CHECK(handed.size() == 2);  // with "stays", deleted above
  for (const auto& g : handed) {
    CHECK(g.id == "stays" ? g.deleted && !g.lastHolderLeft
                          : g.id == "only-mine" && !g.deleted && g.lastHolder == 4 && g.lastHolderLeft);
  }
}

void testStandby(EventLoop& loop) {
  DirectoryShard standby(loop, [](int, const wire::Locations&) {});
  standby.keepStandby(wire::GoneId{"deleted", true, -1, false});
  standby.keepStandby(wire::GoneId{"put-again", true, -1, false});
  standby.keepStandby(wire::GoneId{"put-again", false, -1, false});
  standby.keepStandby(wire::GoneId{"elsewhere", true, -1, false});
  // Before its host dies, the standby list answers nothing.
  CHECK(!standby.isDeleted("deleted"));
  standby.adoptStandby([](const std::string& id) { return id != "elsewhere"; });
  CHECK(standby.isDeleted("deleted"));
  CHECK(!standby.isDeleted("put-again"));
  CHECK(!standby.isDeleted("elsewhere"));
  // The id put again is taken. So is a copy of a standby-deleted id listed
  // again (the standby may have missed its put; a holder's copy is evidence).
  CHECK(standby.registerObject(registration("put-again", 2, 0, /*reannounce=*/true)).ok());
  CHECK(standby.registerObject(registration("deleted", 2, 0, /*reannounce=*/true)).ok());
  // A delete the shard made itself still refuses a copy listed again.
  std::vector<int> holders;
  CHECK(standby.remove("deleted", /*retract=*/false, &holders).ok());
  CHECK(standby.registerObject(registration("deleted", 3, 0, /*reannounce=*/true)).code == Code::kDeleted);
}

}  // namespace

int main() {
  EventLoop loop;  // not started: nothing here waits
  testTokens(loop);
  testHandOver(loop);
  testStandby(loop);
  return finish("test_directory_shard");
}
