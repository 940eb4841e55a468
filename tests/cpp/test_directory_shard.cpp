// What a directory shard remembers across moves: registration tokens keep a
// cleanup of one computation of a reduce's result from removing a later
// one's entry; remembered deletes travel with a hand-over and through the
// standby list; an id put again after its delete is forgotten by the standby,
// and a holder listing a copy again overrides a standby's delete; a standby
// knows where puts' copies are, so objects lost with their holder fail gets;
// a delete asked again at the next host after its answer was lost succeeds,
// as does one of an object lost with its holder;
// what a standby adopted survives a second failover; a new standby host
// gets all that a shard knows for it, and a standby's stale records go;
// watches leave with their ids; a handed-over delete stands over copies
// listed again after a move, not over a put.
#include <memory>
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
  old.subscribe("kept", 3, 1);
  old.subscribe("stays", 3, 2);
  std::vector<wire::GoneId> handed = old.handOver([](const std::string& id) { return id != "stays"; });
  CHECK(old.sizes().watches == 1);  // "kept"'s subscriber subscribes at its new host
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
  standby.adoptStandby([](const std::string& id) { return id != "elsewhere"; },
                       [](int) { return DirectoryShard::Fate::kAlive; }, 0);
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

void testDeleteAskedAgain(EventLoop& loop) {
  constexpr uint64_t kDelete = 41, kOther = 42;
  DirectoryShard host(loop, [](int, const wire::Locations&) {});
  DirectoryShard standby(loop, [](int, const wire::Locations&) {});
  DirectoryShard successor(loop, [](int, const wire::Locations&) {});
  std::vector<int> holders;
  // At the same host: the same delete succeeds again; any other is told the id was deleted.
  CHECK(host.registerObject(registration("x", 1, 0)).ok());
  CHECK(host.remove("x", /*retract=*/false, &holders, /*ifToken=*/0, kDelete).ok());
  CHECK(holders == std::vector<int>{1});
  holders.clear();
  CHECK(host.remove("x", false, &holders, 0, kDelete).ok());
  CHECK(holders.empty());
  CHECK(host.remove("x", false, &holders, 0, kOther).code == Code::kDeleted);
  CHECK(host.remove("x", false, &holders, 0, /*deleteToken=*/0).code == Code::kDeleted);
  // Through the standby list, after the host died with the answer.
  standby.keepStandby(wire::GoneId{"x", /*deleted=*/true, -1, false, kDelete});
  standby.adoptStandby([](const std::string&) { return true; }, [](int) { return DirectoryShard::Fate::kAlive; }, 0);
  CHECK(standby.remove("x", false, &holders, 0, kDelete).ok());
  CHECK(standby.remove("x", false, &holders, 0, kOther).code == Code::kDeleted);
  // Through a hand-over, after the id's home rank rejoined.
  for (const auto& gone : host.handOver([](const std::string&) { return true; })) successor.adoptGone(gone);
  CHECK(successor.remove("x", false, &holders, 0, kDelete).ok());
  CHECK(successor.remove("x", false, &holders, 0, kOther).code == Code::kDeleted);
  CHECK(holders.empty());
  // Put again since: a new object, which the old delete does not name.
  CHECK(successor.registerObject(registration("x", 2, 0)).ok());
  CHECK(successor.remove("x", false, &holders, 0, kOther).ok());
  CHECK(successor.remove("x", false, &holders, 0, kDelete).code == Code::kDeleted);
  // Deleted at a standby that took over before the put's holder (rank 3)
  // listed its copy there: that holder is told to drop it, and its listing,
  // should it come after all, is refused.
  holders.clear();
  standby.keepStandby(wire::GoneId{"y", /*deleted=*/false, /*lastHolder=*/3, false});
  standby.adoptStandby([](const std::string&) { return true; }, [](int) { return DirectoryShard::Fate::kAlive; }, 0);
  CHECK(standby.remove("y", false, &holders, 0, kDelete).ok());
  CHECK(holders == std::vector<int>{3});
  CHECK(standby.isDeleted("y"));
  CHECK(standby.registerObject(registration("y", 3, 0, /*reannounce=*/true)).code == Code::kDeleted);
  // A retract, or a cleanup under a reduce's token (which the standby does
  // not know), of an expected id only stops expecting it: nothing is deleted.
  for (uint64_t ifToken : {0, 5}) {
    holders.clear();
    const std::string id = ifToken ? "cleaned" : "retracted";
    standby.keepStandby(wire::GoneId{id, false, 3, false});
    standby.adoptStandby([](const std::string&) { return true; }, [](int) { return DirectoryShard::Fate::kAlive; }, 0);
    CHECK(standby.remove(id, /*retract=*/ifToken == 0, &holders, ifToken, kDelete).code == Code::kNotFound);
    CHECK(holders.empty() && !standby.isDeleted(id));
    CHECK(standby.registerObject(registration(id, 3, 0, /*reannounce=*/true)).ok());
  }
  // The same delete asked again at a standby: holders that missed its drop
  // cannot list their copies again.
  standby.keepStandby(wire::GoneId{"z", /*deleted=*/true, -1, false, kDelete});
  standby.adoptStandby([](const std::string&) { return true; }, [](int) { return DirectoryShard::Fate::kAlive; }, 0);
  CHECK(standby.remove("z", false, &holders, 0, kDelete).ok());
  CHECK(standby.registerObject(registration("z", 3, 0, /*reannounce=*/true)).code == Code::kDeleted);
  // Lost with its only holder: deleted all the same, so the holder, only
  // taken for failed, cannot list its copy again. A retract or a reduce's
  // cleanup leaves it lost.
  holders.clear();
  CHECK(host.registerObject(registration("lost", 4, 0)).ok());
  host.forgetHolder(4);
  CHECK(host.isLost("lost"));
  CHECK(host.remove("lost", /*retract=*/true, &holders, 0, 0).code == Code::kNotFound);
  CHECK(host.remove("lost", false, &holders, /*ifToken=*/5, 0).code == Code::kNotFound);
  CHECK(host.isLost("lost"));
  CHECK(host.remove("lost", false, &holders, 0, kDelete).ok());
  CHECK(holders.empty() && host.isDeleted("lost") && !host.isLost("lost"));
  CHECK(host.remove("lost", false, &holders, 0, kDelete).ok());  // asked again
  CHECK(host.registerObject(registration("lost", 4, 0, /*reannounce=*/true)).code == Code::kDeleted);
}

// (status, answered) of a get's lookup at `shard`, answered at once or parked.
struct Answer {
  Status status;
  bool answered = false;
};

std::shared_ptr<Answer> lookUp(DirectoryShard& shard, const std::string& id) {
  auto answer = std::make_shared<Answer>();
  shard.lookup(id, /*asker=*/0, /*locate=*/false, 60, [answer](const Status& s, const DirectoryEntry*, int) {
    answer->status = s;
    answer->answered = true;
  });
  return answer;
}

void testStandbyHolders(EventLoop& loop) {
  // The host tells its standby of each put's holder, and of another holder
  // once that one is gone while copies remain.
  DirectoryShard host(loop, [](int, const wire::Locations&) {});
  CHECK(host.registerObject(registration("x", 1, 0)).ok());
  CHECK(host.takeStandbyHolder("x", 1, /*primary=*/true));
  CHECK(host.registerObject(registration("x", 2, 0, /*reannounce=*/true)).ok());
  CHECK(!host.takeStandbyHolder("x", 2, /*primary=*/false));  // the put's holder is told of already
  CHECK(host.registerObject(registration("result", 1, /*token=*/3)).ok());
  CHECK(!host.takeStandbyHolder("result", 1, /*primary=*/true));  // recomputed if lost: never told
  auto moved = host.forgetHolder(1);
  CHECK(moved.size() == 1 && moved[0].first == "x" && moved[0].second == 2);

  DirectoryShard standby(loop, [](int, const wire::Locations&) {});
  standby.keepStandby(wire::GoneId{"holder-dead", false, 5, false});
  standby.keepStandby(wire::GoneId{"holder-alive", false, 6, false});
  standby.keepStandby(wire::GoneId{"listed", false, 5, false});
  standby.keepStandby(wire::GoneId{"retracted", false, 5, false});
  standby.keepStandby(wire::GoneId{"retracted", false, -1, false});
  CHECK(standby.registerObject(registration("listed", 7, 0, /*reannounce=*/true)).ok());
  using Fate = DirectoryShard::Fate;
  int goneRank = 5;
  auto fateOf = [&goneRank](int rank) { return rank == goneRank ? Fate::kFailed : Fate::kAlive; };
  standby.adoptStandby([](const std::string&) { return true; }, fateOf, 0);
  // Lost with rank 5, which is gone: failed at once.
  auto dead = lookUp(standby, "holder-dead");
  CHECK(dead->answered && dead->status.code == Code::kPeerFailed);
  CHECK(dead->status.message.find("its last holder, rank 5, failed") != std::string::npos);
  // Listed by another holder before the adoption: found; forgotten when retracted: waits.
  CHECK(lookUp(standby, "listed")->answered && lookUp(standby, "listed")->status.ok());
  CHECK(!lookUp(standby, "retracted")->answered);
  // Rank 6 is alive: a get waits for it to list its copy, and fails once it goes first.
  auto alive = lookUp(standby, "holder-alive");
  CHECK(!alive->answered);
  standby.forgetHolder(6, /*left=*/true);
  CHECK(alive->answered && alive->status.code == Code::kPeerFailed);
  CHECK(alive->status.message.find("rank 6, left") != std::string::npos);
  // A holder this node never talked to: its shard's move says it is gone
  // (the next adoption checks what is still expected).
  standby.keepStandby(wire::GoneId{"holder-unheard", false, 9, false});
  standby.adoptStandby([](const std::string&) { return true; }, fateOf, 0);
  auto unheard = lookUp(standby, "holder-unheard");
  CHECK(!unheard->answered);
  goneRank = 9;
  standby.adoptStandby([](const std::string&) { return true; }, fateOf, 0);
  CHECK(unheard->answered && unheard->status.code == Code::kPeerFailed);
  // With a grace period, a gone holder's objects are not lost at once (it may
  // only have stalled, and list them again).
  standby.keepStandby(wire::GoneId{"holder-stalled", false, 9, false});
  standby.adoptStandby([](const std::string&) { return true; }, fateOf, 10);
  CHECK(!lookUp(standby, "holder-stalled")->answered);
  CHECK(standby.registerObject(registration("holder-stalled", 9, 0, /*reannounce=*/true)).ok());
  CHECK(lookUp(standby, "holder-stalled")->status.ok());
  // A copy listed again wins over the memory of the loss.
  CHECK(standby.registerObject(registration("holder-dead", 8, 0, /*reannounce=*/true)).ok());
  CHECK(lookUp(standby, "holder-dead")->status.ok());
}

// What a standby adopts goes on to its own standby, so that a second
// failover still knows it: deleted ids, with their delete's token, and where
// a put's copy is. An id put again before the adoption is not passed on.
void testSecondFailover(EventLoop& loop) {
  constexpr uint64_t kDelete = 0x51, kOther = 0x53;
  auto everything = [](const std::string&) { return true; };
  auto alive = [](int) { return DirectoryShard::Fate::kAlive; };
  DirectoryShard first(loop, [](int, const wire::Locations&) {});
  first.keepStandby(wire::GoneId{"deleted", /*deleted=*/true, -1, false, kDelete});
  first.keepStandby(wire::GoneId{"held", /*deleted=*/false, /*lastHolder=*/4, false});
  first.keepStandby(wire::GoneId{"put-again", /*deleted=*/true, -1, false, kDelete});
  CHECK(first.registerObject(registration("put-again", 2, 0, /*reannounce=*/true)).ok());
  const auto adopted = first.adoptStandby(everything, alive, 0);
  CHECK(adopted.size() == 2);

  DirectoryShard second(loop, [](int, const wire::Locations&) {});
  for (const auto& gone : adopted) second.keepStandby(gone);
  second.adoptStandby(everything, alive, 0);
  std::vector<int> holders;
  CHECK(second.remove("deleted", false, &holders, 0, kDelete).ok());
  CHECK(second.remove("deleted", false, &holders, 0, kOther).code == Code::kDeleted);
  CHECK(!lookUp(second, "held")->answered);  // rank 4 lives: waits for its listing
  CHECK(second.registerObject(registration("held", 4, 0, /*reannounce=*/true)).ok());
  CHECK(lookUp(second, "held")->status.ok());
  CHECK(!second.isDeleted("put-again"));
  // A hand-over's gone id is adopted (and so passed on) only if not put again since.
  CHECK(!first.adoptGone(wire::GoneId{"put-again", true, -1, false, kOther}));
  CHECK(first.adoptGone(wire::GoneId{"handed", true, -1, false, kOther}));
}

void testStandbyRecords(EventLoop& loop) {
  constexpr uint64_t kDelete = 0x61;
  auto everything = [](const std::string&) { return true; };
  auto alive = [](int) { return DirectoryShard::Fate::kAlive; };
  DirectoryShard host(loop, [](int, const wire::Locations&) {});
  CHECK(host.registerObject(registration("put", 3, 0)).ok());
  CHECK(host.takeStandbyHolder("put", 3, /*primary=*/true));
  CHECK(host.registerObject(registration("deleted", 2, 0)).ok());
  std::vector<int> holders;
  CHECK(host.remove("deleted", false, &holders, 0, kDelete).ok());
  const auto records = host.standbyRecords();
  CHECK(records.size() == 2);
  // A standby that was told only of an older put (at rank 5) of the deleted id.
  DirectoryShard standby(loop, [](int, const wire::Locations&) {});
  standby.keepStandby(wire::GoneId{"deleted", false, 5, false});
  for (const auto& r : records) standby.keepStandby(r);
  standby.adoptStandby(everything, alive, 0);
  CHECK(standby.isDeleted("deleted"));
  CHECK(standby.remove("deleted", false, &holders, 0, kDelete).ok());  // the same delete, asked again
  CHECK(!lookUp(standby, "put")->answered);  // expected from rank 3 (alive)
  // Records dropped (this node's own share moved): nothing is adopted.
  DirectoryShard away(loop, [](int, const wire::Locations&) {});
  away.keepStandby(wire::GoneId{"stale", false, 5, false});
  away.dropStandby();
  CHECK(away.adoptStandby(everything, alive, 0).empty());
}

void testRelistedCopiesGiveWayToAHandedOverDelete(EventLoop& loop) {
  // A host deleted these ids while cut off; meanwhile their holders, which
  // had taken it for failed, listed their copies at this interim host.
  constexpr uint64_t kDelete = 0x71;
  std::vector<wire::Locations> told;
  DirectoryShard interim(loop, [&](int, const wire::Locations& m) { told.push_back(m); });
  auto deleted = [&](const std::string& id) { return wire::GoneId{id, /*deleted=*/true, -1, false, kDelete}; };
  CHECK(interim.registerObject(registration("stale", 2, 0, /*reannounce=*/true)).ok());
  CHECK(interim.registerObject(registration("stale", 3, 0, /*reannounce=*/true)).ok());
  interim.subscribe("stale", 5, 1);
  std::vector<int> stale;
  CHECK(interim.adoptGone(deleted("stale"), false, &stale));
  CHECK((stale == std::vector<int>{2, 3}));
  CHECK(interim.isDeleted("stale"));
  CHECK(lookUp(interim, "stale")->status.code == Code::kDeleted);
  CHECK(!told.empty() && told.back().state == wire::LocationState::kDeleted);
  // Kept: an entry a put registered here; one listed again and then
  // registered by its put (re-sent after the move); one listed while its
  // put waits for its answer; and any, when the caller drops no copies.
  std::vector<wire::Register> kept{registration("put", 2, 0), registration("re-sent", 2, 0, true),
                                   registration("pending", 2, 0, true), registration("no-drops", 2, 0, true)};
  kept[2].putPending = true;
  for (const auto& reg : kept) CHECK(interim.registerObject(reg).ok());
  CHECK(interim.registerObject(registration("re-sent", 2, 0)).ok());
  for (const auto& reg : kept) {
    stale.clear();
    CHECK(!interim.adoptGone(deleted(reg.id), false, reg.id == "no-drops" ? nullptr : &stale));
    CHECK(stale.empty() && lookUp(interim, reg.id)->status.ok());
  }
  // A put waiting for its answer lists its copy of an id deleted before: a new object.
  CHECK(interim.registerObject(registration("stale", 4, 0, /*reannounce=*/true)).code == Code::kDeleted);
  wire::Register pending = registration("stale", 4, 0, /*reannounce=*/true);
  pending.putPending = true;
  CHECK(interim.registerObject(pending).ok());
  CHECK(!interim.isDeleted("stale"));
}

}  // namespace

int main() {
  EventLoop loop;  // not started: nothing here waits
  testTokens(loop);
  testHandOver(loop);
  testStandby(loop);
  testStandbyHolders(loop);
  testDeleteAskedAgain(loop);
  testSecondFailover(loop);
  testStandbyRecords(loop);
  testRelistedCopiesGiveWayToAHandedOverDelete(loop);
  return finish("test_directory_shard");
}
