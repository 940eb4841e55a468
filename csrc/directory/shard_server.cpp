// This node's share of the directory, serving its peers' requests.
#include "directory/shard_server.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "common/hash.h"
#include "common/logging.h"
#include "common/step_trace.h"
#include "common/timeouts.h"

namespace hoplite {
namespace {
// A delete that has waited this long for holders to drop their copies names them in the log.
constexpr double kSlowDropSeconds = 5.0;
}  // namespace

ShardServer::ShardServer(EventLoop& loop, PeerLinks& peers, DirectoryClient& directory, int worldSize,
                         double graceSeconds)
    : loop_(loop),
      peers_(peers),
      directory_(directory),
      worldSize_(worldSize),
      graceSeconds_(graceSeconds),
      shard_(loop, [this](int rank, const wire::Locations& msg) { peers_.send(rank, msg); }),
      standbyTold_(directory.standbyHost()) {}

void ShardServer::registerHandlers(MessageRouter& router) {
  router.on<wire::Register>(Route::kOnEither, [this](Connection& c, const wire::Register& m) { handleRegister(c, m); });
  router.on<wire::HolderUpdate>(Route::kOnEither,
                                [this](Connection& c, const wire::HolderUpdate& m) { handleHolderUpdate(c, m); });
  router.on<wire::ResultFailed>(Route::kOnEither,
                                [this](Connection&, const wire::ResultFailed& m) { handleResultFailed(m); });
  router.on<wire::Lookup>(Route::kOnEither, [this](Connection& c, const wire::Lookup& m) { handleLookup(c, m); });
  router.on<wire::Delete>(Route::kOnEither, [this](Connection& c, const wire::Delete& m) { handleDelete(c, m); });
  router.on<wire::Subscribe>(Route::kOnEither, [this](Connection& c, const wire::Subscribe& m) { handleSubscribe(c, m); });
  router.on<wire::ShardHandOver>(Route::kOnEither, [this](Connection&, const wire::ShardHandOver& m) { handleHandOver(m); });
}

void ShardServer::dropCopyAt(int holder, const std::string& id, bool retract, RequestTracker::StatusCallback done) {
  uint64_t drop = directory_.newRequest();
  directory_.requestStatus(holder, wire::MsgType::kDropCopy, wire::encode(wire::DropCopy{drop, id, retract}), drop,
                           std::move(done));
}

Status ShardServer::notHostedHere(const std::string& id) const {
  // The asker and this node disagree on where the id's entry lives, for as
  // long as one of them has not heard that a shard moved or returned: it asks
  // again shortly (DirectoryClient::requestShard and sendLookup).
  return Status(Code::kMoved,
                "rank " + std::to_string(directory_.rank()) + " does not host the directory entry of " + printableId(id));
}

void ShardServer::handleRegister(Connection& conn, const wire::Register& msg) {
  const bool hosted = directory_.hosts(msg.id);
  const bool wasDeleted = hosted && shard_.isDeleted(msg.id);
  Status s = hosted ? shard_.registerObject(msg) : notHostedHere(msg.id);
  if (s.ok() && shard_.takeStandbyHolder(msg.id, msg.holder, msg.primary)) {
    tellStandby(msg.id, /*deleted=*/false, msg.holder);  // where a copy is (put again, maybe)
  } else if (s.ok() && wasDeleted) {
    tellStandby(msg.id, /*deleted=*/false);  // put again
  } else if (s.code == Code::kDeleted && msg.reannounce) {
    // A copy of a deleted object (its holder missed the delete's drop, which
    // went to a host that died): it goes too.
    dropCopyAt(msg.holder, msg.id, /*retract=*/false, [](const Status&) {});
  }
  conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, s}));
}

void ShardServer::handleHolderUpdate(Connection& conn, const wire::HolderUpdate& msg) {
  // Not hosted here: its sender lists its copies again where the entry went
  // once it hears of the move (unknown here is no sign of a delete).
  if (!directory_.hosts(msg.id)) return;
  bool known = shard_.updateHolder(msg);
  if (!known && msg.state != wire::HolderState::kRemoved && msg.holder == conn.peerRank()) {
    // A copy finished after its object was deleted: it must not outlive the delete.
    if (shard_.isLost(msg.id)) {
      // Rare, and suspect: a copy that outlived the holders taken for failed
      // (the soak saw an object lost while its owner lived on).
      HLOG(kInfo, "the copy of %s on %s is %s, but the object was taken for lost here: dropping that copy",
           printableId(msg.id).c_str(), peers_.peerName(msg.holder).c_str(),
           msg.state == wire::HolderState::kComplete ? "complete" : "partial");
    }
    dropCopyAt(msg.holder, msg.id, /*retract=*/false, [](const Status&) {});
  }
}

void ShardServer::handleResultFailed(const wire::ResultFailed& msg) {
  // Moved meanwhile: the new host's lookups of it wait as before (the note is soft state).
  if (directory_.hosts(msg.id)) shard_.failResult(msg.id, msg.status);
}

namespace {
// Ids per ShardHandOver frame: well under the smallest control frame limit at the longest ids.
constexpr size_t kHandOverBatch = 512;
}  // namespace

void ShardServer::handOver(int leaving) {
  std::map<int, std::vector<wire::GoneId>> byHost;
  for (auto& gone : shard_.handOver([this](const std::string& id) { return !directory_.hosts(id); }, leaving)) {
    const int host = directory_.shardOf(gone.id);
    if (host != directory_.rank()) byHost[host].push_back(std::move(gone));
  }
  for (auto& [host, gone] : byHost) sendHandOver(host, /*standby=*/false, std::move(gone));
}

void ShardServer::sendHandOver(int rank, bool standby, std::vector<wire::GoneId> gone) {
  for (size_t from = 0; from < gone.size(); from += kHandOverBatch) {
    wire::ShardHandOver msg;
    msg.standby = standby;
    const size_t to = std::min(gone.size(), from + kHandOverBatch);
    msg.gone.assign(std::make_move_iterator(gone.begin() + from), std::make_move_iterator(gone.begin() + to));
    peers_.send(rank, msg);
  }
}

void ShardServer::handleHandOver(const wire::ShardHandOver& msg) {
  if (msg.standby) {
    for (const auto& gone : msg.gone) shard_.keepStandby(gone);
    return;
  }
  for (const auto& gone : msg.gone) {
    // (members disagreeing: dropped) This node's standby learns it too.
    std::vector<int> stale;
    if (!directory_.hosts(gone.id) || !shard_.adoptGone(gone, /*fromStandby=*/false, &stale)) continue;
    tellStandby(gone.id, gone.deleted, gone.lastHolder, gone.deletedBy);
    if (!stale.empty()) {
      HLOG(kInfo, "%s was deleted by the previous host of its share: the %zu copies listed here again are dropped",
           printableId(gone.id).c_str(), stale.size());
    }
    for (int holder : stale) {
      if (!peers_.hasFailed(holder)) dropCopyAt(holder, gone.id, /*retract=*/false, [](const Status&) {});
    }
  }
}

void ShardServer::forgetHolder(int rank, bool left) {
  const uint64_t entriesBefore = shard_.sizes().entries;
  for (const auto& [id, holder] : shard_.forgetHolder(rank, left)) tellStandby(id, /*deleted=*/false, holder);
  // Said once per call: a peer may be failed again without a new "is gone".
  if (const uint64_t lost = entriesBefore - shard_.sizes().entries; lost > 0) {
    HLOG(kInfo, "%s %s: %llu objects listed here had no other holder and are remembered as lost",
         peers_.peerName(rank).c_str(), left ? "left" : "is taken for failed", static_cast<unsigned long long>(lost));
  }
}

void ShardServer::adoptStandby() {
  using Fate = DirectoryShard::Fate;
  const auto adopted = shard_.adoptStandby(
      [this](const std::string& id) { return directory_.hosts(id); },
      [this](int rank) {
        if (rank == directory_.rank() || !(peers_.hasFailed(rank) || directory_.hasMoved(rank))) return Fate::kAlive;
        return peers_.isLeaving(rank) ? Fate::kLeft : Fate::kFailed;
      },
      graceSeconds_);
  // This node's own standby learns what it took over.
  for (const auto& gone : adopted) tellStandby(gone.id, gone.deleted, gone.lastHolder, gone.deletedBy);
}

void ShardServer::syncStandby(bool ownShareMoved) {
  if (ownShareMoved) shard_.dropStandby();
  const int standby = directory_.standbyHost();
  if (standby == standbyTold_) return;
  standbyTold_ = standby;
  if (standby >= 0) sendHandOver(standby, /*standby=*/true, shard_.standbyRecords());
}

void ShardServer::tellStandby(const std::string& id, bool deleted, int holder, uint64_t deletedBy) {
  if (toStandby_.empty()) loop_.runSoon([this] { flushStandby(); });
  toStandby_.push_back(wire::GoneId{id, deleted, holder, false, deletedBy});
}

uint64_t ShardServer::deleteToken(int rank, uint64_t request) const {
  // A client asks again under the same request number (DirectoryClient::requestShard);
  // its process's incarnation tells it apart from other processes' requests.
  const uint64_t incarnation = peers_.incarnationOf(rank);
  if (incarnation == 0) return 0;  // not known: no token
  return mix64(incarnation ^ mix64(request ^ (static_cast<uint64_t>(rank) << 48))) | 1;
}

void ShardServer::flushStandby() {
  std::vector<wire::GoneId> gone = std::move(toStandby_);
  toStandby_.clear();
  const int standby = directory_.standbyHost();
  if (standby >= 0) sendHandOver(standby, /*standby=*/true, std::move(gone));
}

void ShardServer::handleLookup(Connection& conn, const wire::Lookup& msg) {
  if (!directory_.hosts(msg.id)) {
    wire::LookupReply reply;
    reply.request = msg.request;
    reply.status = notHostedHere(msg.id);
    conn.sendControl(wire::MsgType::kLookupReply, wire::encode(reply));
    return;
  }
  traceStep(Step::kShardLookup, msg.id, conn.peerRank());
  std::weak_ptr<Connection> weak = peers_.sharedConnection(conn);
  uint64_t request = msg.request;
  // The asker's timeout, within bounds: a peer must not park requests forever.
  double timeout = std::min(static_cast<double>(msg.timeoutMs) / 1000.0, kMaxTimeoutSeconds);
  // A source this node knows to be gone would only fail the pull and send the asker back.
  const bool usable = msg.preferred >= 0 && msg.preferred < worldSize_ && directory_.isLiveMember(msg.preferred);
  const int preferred = usable ? msg.preferred : -1;
  shard_.lookup(
      msg.id, conn.peerRank(), msg.locate, timeout,
      [weak, request, id = msg.id](const Status& s, const DirectoryEntry* entry, int sender) {
        auto c = weak.lock();
        if (!c) return;  // the asker went away
        traceStep(Step::kShardAnswer, id, c->peerRank());
        wire::LookupReply reply;
        reply.request = request;
        reply.status = s;
        if (entry != nullptr) {
          reply.meta = entry->meta;
          reply.hasInline = entry->hasInline;
          reply.inlineData = entry->inlineData;
          reply.sender = sender;
          reply.senderSource = DirectoryShard::sourceOf(*entry, sender);
          reply.recomputable = entry->recomputable;
        }
        c->sendControl(wire::MsgType::kLookupReply, wire::encode(reply));
      },
      msg.failedHolder, preferred);
}

void ShardServer::handleDelete(Connection& conn, const wire::Delete& msg) {
  if (!directory_.hosts(msg.id)) {
    conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, notHostedHere(msg.id)}));
    return;
  }
  std::vector<int> holders;
  const uint64_t token = msg.retract ? 0 : deleteToken(conn.peerRank(), msg.request);
  Status s = shard_.remove(msg.id, msg.retract, &holders, msg.ifToken, token);
  if (s.ok()) tellStandby(msg.id, /*deleted=*/!msg.retract, /*holder=*/-1, token);  // (retracted: forgotten)
  if (msg.retract && s.code == Code::kNotFound) s = Status();  // nothing to take back
  uint64_t request = msg.request;
  // A holder known to have failed holds nothing any more (the one a standby
  // expected may have): not waited for.
  std::erase_if(holders, [this](int holder) { return peers_.hasFailed(holder); });
  if (!s.ok() || holders.empty()) {
    conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{request, s}));
    return;
  }
  // Answer once every holder dropped its copy (or is gone), so no later get
  // anywhere can still see the object. The slow-drop warning's timer goes with
  // the answer: one armed for every delete would keep its closures alive for
  // kSlowDropSeconds, scattered small blocks that fragment malloc's heap.
  auto waiting = std::make_shared<std::set<int>>(holders.begin(), holders.end());
  auto warning = std::make_shared<EventLoop::TimerId>(0);
  std::weak_ptr<Connection> weak = peers_.sharedConnection(conn);
  for (int holder : holders) {
    dropCopyAt(holder, msg.id, msg.retract, [this, weak, request, waiting, warning, holder](const Status&) {
      waiting->erase(holder);  // (each drop is answered once: by its holder, or by its failure)
      if (!waiting->empty()) return;
      loop_.cancelTimer(*warning);
      if (auto c = weak.lock()) {
        c->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{request, Status()}));
      }
    });
  }
  if (waiting->empty()) return;
  *warning = loop_.addTimer(kSlowDropSeconds, [this, waiting, id = msg.id] {
    std::string names;
    for (int holder : *waiting) names += (names.empty() ? "" : ", ") + peers_.peerName(holder);
    HLOG(kWarn, "the delete of %s has waited %s for holders to drop their copies: %s", printableId(id).c_str(),
         printableSeconds(kSlowDropSeconds).c_str(), names.c_str());
  });
}

void ShardServer::handleSubscribe(Connection& conn, const wire::Subscribe& msg) {
  if (msg.cancel) {
    shard_.unsubscribe(msg.id, conn.peerRank(), msg.request);
  } else {
    shard_.subscribe(msg.id, conn.peerRank(), msg.request);
  }
}

}  // namespace hoplite
