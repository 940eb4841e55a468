// Where ids' directory entries live, and the requests this node makes.
#include "directory/directory_client.h"

#include <algorithm>
#include <set>
#include <unordered_set>
#include <utility>

#include "common/hash.h"
#include "common/logging.h"
#include "common/timeouts.h"

namespace hoplite {

DirectoryClient::DirectoryClient(EventLoop& loop, PeerLinks& peers, ObjectStore& store, DirectoryClientConfig config,
                                 std::function<void()> onShardsChanged)
    : loop_(loop), peers_(peers), store_(store), config_(config), onShardsChanged_(std::move(onShardsChanged)) {}

namespace {
// Between a lookup's kMoved answer and asking again: time for the news of a
// moved or returned shard to reach the asker or the shard.
constexpr double kRedirectDelaySeconds = 0.05;
// How long registers and deletes are asked again while members disagree on
// where an id's entry lives (news of a move or return travels in one hop).
constexpr double kShardRedirectSeconds = 10;
}  // namespace

Status DirectoryClient::closedError() const {
  return Status(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " is shut down");
}

int DirectoryClient::shardOf(const std::string& id) const { return shardHost(homeShardOf(id)); }

int DirectoryClient::homeShardOf(const std::string& id) const {
  return static_cast<int>(fnv1a(id) % static_cast<uint64_t>(config_.worldSize));
}

int DirectoryClient::shardHost(int rank) const {
  while (moved_.count(rank)) rank = (rank + 1) % config_.worldSize;  // one always stays (moveShardFrom)
  return rank;
}

int DirectoryClient::standbyHost() const {
  for (int step = 1; step < config_.worldSize; ++step) {
    const int rank = (config_.rank + step) % config_.worldSize;
    if (!moved_.count(rank)) return rank;
  }
  return -1;
}

std::vector<wire::ShareState> DirectoryClient::movedShards() const {
  std::vector<wire::ShareState> out;
  for (const auto& [rank, share] : moved_) out.push_back(wire::ShareState{rank, share.incarnation, share.epoch});
  return out;
}

std::vector<wire::ShareState> DirectoryClient::returnedShards() const {
  std::vector<wire::ShareState> out;
  for (const auto& [rank, share] : returned_) {
    if (share.epoch == epochOf(rank)) out.push_back(wire::ShareState{rank, share.incarnation, share.epoch});
  }
  return out;
}

uint64_t DirectoryClient::epochOf(int rank) const {
  auto it = returned_.find(rank);
  if (it == returned_.end()) return 0;
  const uint64_t process = rank == config_.rank ? config_.incarnation : peers_.incarnationOf(rank);
  // (A process this node never heard from: the one the news named.)
  return process == 0 || it->second.incarnation == process ? it->second.epoch : 0;
}

template <typename News>
void DirectoryClient::tellMembers(const News& news) {
  for (int r = 0; r < config_.worldSize; ++r) {
    if (r != config_.rank && r != news.share.rank && isLiveMember(r)) peers_.send(r, news);
  }
}

void DirectoryClient::moveShardFrom(int rank, uint64_t incarnation, bool sawItGo) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  // One shard always stays (a member could claim every rank failed).
  if (rank < 0 || rank >= config_.worldSize || moved_.count(rank) || moved_.size() + 1 >= static_cast<size_t>(config_.worldSize) || closing_) {
    return;
  }
  const uint64_t known = peers_.incarnationOf(rank);
  if (incarnation != 0 && known != 0 && incarnation != known) return;  // an earlier process: its shard returned since
  if (incarnation == 0) incarnation = known;
  std::unordered_set<std::string> listedThere;
  for (const auto& obj : store_.snapshot()) {
    if (shardOf(obj->id()) == rank) listedThere.insert(obj->id());
  }
  const wire::ShardMoved news{{rank, incarnation, epochOf(rank)}};
  moved_[rank] = ShareRecord{incarnation, news.share.epoch};
  movedCount_ = moved_.size();
  onShardsChanged_();
  HLOG(kInfo, "%s is gone (failed or left): its directory shard moves on; re-registering %zu local copies",
       peers_.peerName(rank).c_str(), listedThere.size());
  // Everyone must agree where ids go: tell the others (who pass it on once).
  tellMembers(news);
  if (sawItGo) {
    // Once the failure is through (it drops what is queued for the rank),
    // so that this dials it anew.
    loop_.runSoon([this, news] {
      auto moved = moved_.find(news.share.rank);
      if (closing_ || moved == moved_.end() || moved->second.incarnation != news.share.incarnation ||
          moved->second.epoch != news.share.epoch || !peers_.hasFailed(news.share.rank) ||
          peers_.isLeaving(news.share.rank)) {
        return;
      }
      peers_.send(news.share.rank, news);
    });
  } else if (rank != config_.rank && !peers_.hasFailed(rank) && !peers_.isLeaving(rank) && peers_.talksTo(rank)) {
    // News from another member, of a rank this node still hears from: it may
    // live on, cut off from the one that saw it go (loss), and must learn of
    // its move to take the share back. Told only over a link that is up.
    peers_.send(rank, news);
  }
  reRegisterCopies([&](const std::string& id) { return listedThere.count(id) > 0; });
}

bool DirectoryClient::hearShardMoved(const wire::ShareState& news) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (news.rank < 0 || news.rank >= config_.worldSize) return false;
  const uint64_t known = news.rank == config_.rank ? config_.incarnation : peers_.incarnationOf(news.rank);
  const bool sameProcess = news.incarnation == 0 || known == 0 || news.incarnation == known;
  if (!sameProcess || news.epoch < epochOf(news.rank)) return false;  // before a rejoin, or a return
  if (news.epoch > epochOf(news.rank)) {
    // The sender heard of a return this node missed, and of a move after it.
    returned_[news.rank] = ShareRecord{known != 0 ? known : news.incarnation, news.epoch};
  }
  auto moved = moved_.find(news.rank);
  if (moved != moved_.end()) {
    moved->second.epoch = std::max(moved->second.epoch, news.epoch);
  } else {
    moveShardFrom(news.rank, news.incarnation);
  }
  return true;
}

void DirectoryClient::hearShardReturned(const wire::ShareState& news) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (closing_ || news.rank < 0 || news.rank >= config_.worldSize || news.rank == config_.rank) return;
  auto moved = moved_.find(news.rank);
  // A process this node never heard from: the one whose share it moved.
  const uint64_t known = peers_.incarnationOf(news.rank);
  const uint64_t process = known != 0 ? known : moved != moved_.end() ? moved->second.incarnation : 0;
  if (news.incarnation == 0 || (process != 0 && news.incarnation != process) || news.epoch <= epochOf(news.rank)) {
    return;
  }
  returned_[news.rank] = ShareRecord{news.incarnation, news.epoch};
  if (moved != moved_.end() && moved->second.epoch < news.epoch) {
    moved_.erase(moved);
    movedCount_ = moved_.size();
    onShardsChanged_();
    HLOG(kInfo, "%s is back and takes its directory shard back", peers_.peerName(news.rank).c_str());
  }
  tellMembers(wire::ShardReturned{news});
  if (peers_.hasFailed(news.rank) || peers_.isLeaving(news.rank)) {
    // This node gave up on it since (or it leaves): its share moves on again, as of this return.
    moveShardFrom(news.rank, news.incarnation, /*sawItGo=*/!peers_.isLeaving(news.rank));
    return;
  }
  // Its process handed its share over when it heard that it moved (moved
  // here or not): what this node holds is listed there again (unless this
  // process leaves: its copies go with it).
  if (!left_) reRegisterCopies([&](const std::string& id) { return shardOf(id) == news.rank; });
}

bool DirectoryClient::takeShareBack() {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto moved = moved_.find(config_.rank);
  if (closing_ || left_ || moved == moved_.end()) return false;
  const wire::ShardReturned news{{config_.rank, config_.incarnation, epochOf(config_.rank) + 1}};
  returned_[config_.rank] = ShareRecord{config_.incarnation, news.share.epoch};
  moved_.erase(moved);
  movedCount_ = moved_.size();
  onShardsChanged_();
  HLOG(kInfo, "this process takes its directory shard back (the others moved it while it was stalled or cut off)");
  tellMembers(news);
  // Its own copies were listed at the interim host, which drops them now, as every member does.
  reRegisterCopies([&](const std::string& id) { return shardOf(id) == config_.rank; });
  return true;
}

std::set<int> DirectoryClient::leave(uint64_t incarnation) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  left_ = true;
  std::set<int> hosted;
  for (int home = 0; home < config_.worldSize; ++home) {
    if (shardHost(home) == config_.rank) hosted.insert(home);
  }
  // One share always stays (as in moveShardFrom): the last one cannot leave.
  if (moved_.count(config_.rank) || moved_.size() + 1 >= static_cast<size_t>(config_.worldSize)) return {};
  moved_[config_.rank] = ShareRecord{incarnation, epochOf(config_.rank)};
  movedCount_ = moved_.size();
  std::set<int> successors;
  for (int home : hosted) successors.insert(shardHost(home));
  return successors;
}

void DirectoryClient::shardReturned(int rank) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (closing_) return;
  auto it = moved_.find(rank);
  if (it != moved_.end()) {
    if (it->second.incarnation == peers_.incarnationOf(rank)) return;  // the same process, back after a stall
    moved_.erase(it);
    movedCount_ = moved_.size();
    onShardsChanged_();
    HLOG(kInfo, "%s rejoined: its directory shard returns to it", peers_.peerName(rank).c_str());
  }
  // Moved or not (it may have come back before this node saw it die), its
  // new process's share starts empty.
  reRegisterCopies([&](const std::string& id) { return shardOf(id) == rank; });
}

bool DirectoryClient::movedFromAnotherProcess(int rank) const {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = moved_.find(rank);
  const uint64_t known = peers_.incarnationOf(rank);
  return rank != config_.rank && it != moved_.end() && it->second.incarnation != 0 && known != 0 &&
         it->second.incarnation != known;
}

void DirectoryClient::reRegisterCopies(const std::function<bool(const std::string& id)>& picked) {
  for (const auto& obj : store_.snapshot()) {
    if (obj->failed() || !picked(obj->id())) continue;
    wire::Register reg;
    reg.id = obj->id();
    reg.meta = obj->meta();
    reg.holder = config_.rank;
    reg.complete = obj->complete();
    reg.recomputable = obj->recomputable;
    reg.reannounce = true;
    reg.primary = obj->primary();
    reg.putPending = obj->registering;
    reg.token = obj->registrationToken;
    if (reg.complete && obj->size() <= config_.inlineThresholdBytes) {
      reg.hasInline = true;
      reg.inlineData.assign(reinterpret_cast<const char*>(obj->data()), obj->size());
    }
    requestRegister(std::move(reg), [id = obj->id()](const Status& s) {
      if (!s.ok()) HLOG(kDebug, "re-registering %s: %s", printableId(id).c_str(), s.message.c_str());
    });
  }
}

void DirectoryClient::requestStatus(int rank, wire::MsgType type, std::string payload, uint64_t request,
                                    StatusCallback cb, double delay) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  if (closing_) {
    cb(closedError());
    return;
  }
  const uint64_t attempt = requests_.expectStatus(request, rank, std::move(cb));
  sendWhenDue(rank, type, std::move(payload), request, attempt, delay);
}

void DirectoryClient::sendWhenDue(int rank, wire::MsgType type, std::string payload, uint64_t request,
                                  uint64_t attempt, double delay) {
  if (delay <= 0) {
    peers_.sendTo(rank, type, std::move(payload));
    return;
  }
  // Answered meanwhile (a failure, shutdown, its asker gave up), or asked
  // again elsewhere: this attempt sends nothing.
  loop_.addTimer(delay, [this, rank, type, payload = std::move(payload), request, attempt]() mutable {
    if (!closing_ && requests_.waiting(request, attempt)) peers_.sendTo(rank, type, std::move(payload));
  });
}

Status DirectoryClient::disagreement(const std::string& id, const Status& moved) {
  return Status(Code::kTimeout, "the members did not agree in time on which rank hosts the directory entry of " +
                                    printableId(id) + " (" + moved.message + ")");
}

void DirectoryClient::requestShard(const std::string& id, wire::MsgType type, std::string payload, uint64_t request,
                                   StatusCallback cb, double deadline, double delay) {
  const int shard = shardOf(id);
  const uint64_t process = peers_.incarnationOf(shard);
  requestStatus(shard, type, payload, request,
                [this, id, type, payload, request, shard, process, deadline, cb = std::move(cb)](const Status& s) {
                  auto again = [this, id, type, payload, request, cb, deadline](double delay) {
                    requestShard(id, type, payload, request, cb, deadline, delay);
                  };
                  if (!retryShardRequest(s, id, shard, process, deadline, std::move(again), cb)) cb(s);
                },
                delay);
}

bool DirectoryClient::retryShardRequest(const Status& s, const std::string& id, int shard, uint64_t process,
                                        double deadline, std::function<void(double delay)> again,
                                        std::function<void(const Status&)> fail) {
  if (closing_) return false;
  if (s.code == Code::kPeerFailed) {
    loop_.runSoon([this, s, id, shard, process, deadline, again = std::move(again), fail = std::move(fail)] {
      if (closing_ || steadySeconds() >= deadline || !shardMovedOrRestarted(id, shard, process)) return fail(s);
      again(0);
    });
    return true;
  }
  if (s.code != Code::kMoved) return false;
  if (steadySeconds() + kRedirectDelaySeconds >= deadline) {
    fail(disagreement(id, s));
  } else {
    again(kRedirectDelaySeconds);
  }
  return true;
}

uint64_t DirectoryClient::requestLookup(const std::string& id, double timeoutSeconds, bool locate, int failedHolder,
                             LookupCallback cb, int preferred) {
  const uint64_t request = newRequest();
  if (closing_) {
    cb(closedError(), nullptr);
    return request;
  }
  sendLookup(
      wire::Lookup{request, id, static_cast<uint64_t>(timeoutSeconds * 1000) + 1, locate, failedHolder, preferred},
      std::move(cb), steadySeconds() + timeoutSeconds);
  return request;
}

void DirectoryClient::sendLookup(const wire::Lookup& msg, LookupCallback cb, double deadline, double delay) {
  // Asked again under the same request number, so the caller can still cancel it.
  const int shard = shardOf(msg.id);
  const uint64_t process = peers_.incarnationOf(shard);
  const uint64_t attempt = requests_.expectLookup(
      msg.request, shard, [this, msg, shard, process, cb, deadline](const Status& s, const wire::LookupReply* r) {
        wire::Lookup next = msg;
        const double left = deadline - steadySeconds();
        next.timeoutMs = static_cast<uint64_t>(std::max(0.0, left - kRedirectDelaySeconds) * 1000) + 1;
        auto again = [this, next, cb, deadline](double delay) { sendLookup(next, cb, deadline, delay); };
        auto fail = [cb](const Status& why) { cb(why, nullptr); };
        if (!retryShardRequest(s, msg.id, shard, process, deadline, std::move(again), std::move(fail))) cb(s, r);
      });
  sendWhenDue(shard, wire::MsgType::kLookup, wire::encode(msg), msg.request, attempt, delay);
}

bool DirectoryClient::isLiveMember(int rank) const {
  if (peers_.hasFailed(rank) || peers_.isLeaving(rank)) return false;
  // A moved share's rank is gone, unless this node hears from it: a process
  // taken for failed that came back (a stall, a cut link) keeps its share
  // moved until it takes it back, and must still hear of every later move.
  return !moved_.count(rank) || peers_.talksTo(rank);
}

bool DirectoryClient::shardMovedOrRestarted(const std::string& id, int shard, uint64_t process) const {
  return shardOf(id) != shard || peers_.incarnationOf(shard) != process;
}

void DirectoryClient::updateHolder(const std::string& id, wire::HolderState state, int sender) {
  peers_.send(shardOf(id), wire::HolderUpdate{id, config_.rank, state, sender});
}

uint64_t DirectoryClient::requestDelete(const std::string& id, bool retract, StatusCallback cb, uint64_t ifToken) {
  const uint64_t request = newRequest();
  requestShard(id, wire::MsgType::kDelete, wire::encode(wire::Delete{request, id, retract, ifToken}), request, std::move(cb),
               steadySeconds() + kShardRedirectSeconds);
  return request;
}

void DirectoryClient::requestRegister(wire::Register reg, StatusCallback cb) {
  reg.request = newRequest();
  requestShard(reg.id, wire::MsgType::kRegister, wire::encode(reg), reg.request, std::move(cb),
               steadySeconds() + kShardRedirectSeconds);
}

void DirectoryClient::probe(int rank, std::string padding, StatusCallback cb) {
  const uint64_t request = newRequest();
  requestStatus(rank, wire::MsgType::kProbe, wire::encode(wire::Probe{request, std::move(padding)}), request,
                std::move(cb));
}

}  // namespace hoplite
