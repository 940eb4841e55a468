// Pulls: the holder the directory assigned sends a copy's bytes (or, on the
// same host, says where they lie: same_host_reads.cpp); a holder that fails
// is replaced by another at the byte where it stopped.
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/step_trace.h"
#include "common/timeouts.h"
#include "transfer/client.h"

namespace hoplite {
namespace {
// Senders one pull may lose and replace before it fails.
constexpr int kMaxResumes = 3;
}  // namespace

bool TransferClient::onStatusReply(const wire::StatusReply& msg) {
  if (!pulls_.count(msg.request)) return false;
  failPull(msg.request, msg.status);
  return true;
}

void TransferClient::failPullsFrom(int rank, const Status& failure, bool holderLives) {
  std::vector<uint64_t> failed;
  for (const auto& [request, pull] : pulls_) {
    if (pull.rank == rank) failed.push_back(request);
  }
  for (uint64_t request : failed) failPull(request, failure, holderLives);
}

void TransferClient::endPullsOf(const std::shared_ptr<LocalObject>& obj) {
  std::vector<uint64_t> ended;
  for (const auto& [request, pull] : pulls_) {
    if (pull.object == obj) ended.push_back(request);
  }
  for (uint64_t request : ended) {
    auto it = pulls_.find(request);
    if (it == pulls_.end()) continue;
    if (it->second.state != PullState::kActive) {  // it ends when the read returns
      it->second.state = PullState::kReadDropped;
      continue;
    }
    const int rank = it->second.rank;
    pulls_.erase(it);
    releaseHolder(request, rank);
  }
}

void TransferClient::startPull(int holder, int senderSource, const std::shared_ptr<LocalObject>& obj, int resumes) {
  uint64_t request = directory_.newRequest();
  const uint64_t offset = obj->watermark();  // 0, or where a failed sender stopped
  pulls_[request] = PullOp{holder, obj, offset, resumes, senderSource};
  // Whether the holder's memory can be read is known once it is connected.
  peers_.whenConnected(holder, [this, request, holder, id = obj->id(), offset](Connection& conn) {
    auto it = pulls_.find(request);
    if (it == pulls_.end()) return;
    it->second.holderMemory = peers_.memoryOf(holder);
    const bool sameHost = it->second.holderMemory != nullptr;
    const uint64_t get = it->second.object->handOverTo;
    conn.sendControl(wire::MsgType::kPull, wire::encode(wire::Pull{request, id, offset, sameHost}));
    traceStep(Step::kPullSent, id, holder);
    if (!sameHost && get) stopTakeOver(get);  // over TCP: the copy stays, the get copies as bytes arrive
  });
}

uint8_t* TransferClient::dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                               std::shared_ptr<const void>* keepalive) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return nullptr;  // cancelled or failed: discard
  PullOp& pull = it->second;
  if (conn.peerRank() != pull.rank || offset != pull.expected || size > pull.object->size() - offset) {
    HLOG(kWarn, "out-of-order data for %s from %s: offset %llu, expected %llu from rank %d",
         printableId(pull.object->id()).c_str(), conn.describe().c_str(), static_cast<unsigned long long>(offset),
         static_cast<unsigned long long>(pull.expected), pull.rank);
    conn.close(Status(Code::kProtocol, "data frame out of order"));
    return nullptr;
  }
  pull.expected += size;
  *keepalive = pull.object->buffer();
  return pull.object->data() + offset;
}

void TransferClient::onDataReceived(Connection& conn, uint64_t request, uint64_t end) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return;
  auto obj = it->second.object;
  advancePull(it->second, end);
  if (end == obj->size()) finishPull(request);
}

void TransferClient::advancePull(PullOp& pull, uint64_t end) {
  auto obj = pull.object;  // the last bytes' listeners may end the pull
  if (!std::exchange(pull.firstBytesTraced, true)) traceStep(Step::kPullFirstBytes, obj->id(), pull.rank, end - obj->watermark());
  // Before the advance, whose listeners may complete a get at once.
  if (end == obj->size()) traceStep(Step::kPullDone, obj->id(), pull.rank);
  counters_.bytesReceived += end - obj->watermark();
  obj->advance(end);
}

void TransferClient::finishPull(uint64_t request) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return;  // a listener woken by the last bytes dropped the copy
  auto obj = it->second.object;
  int sender = it->second.rank;
  const bool sameHost = it->second.holderMemory != nullptr;
  pulls_.erase(it);  // first: telling the holder may close the connection, which fails its pulls
  counters_.pullsCompleted++;
  HLOG(kDebug, "pull of %s from rank %d done at %.3f s (steady clock)", printableId(obj->id()).c_str(), sender, steadySeconds());
  const uint64_t get = std::exchange(obj->handOverTo, 0);
  const bool handedOver = get && sameHost && handOver(get, obj, sender);  // the get completes first
  if (sameHost) releaseHolder(request, sender);
  if (handedOver) return;
  if (get) stopTakeOver(get);
  // This node now holds a complete copy, and its sender is free for others.
  directory_.updateHolder(obj->id(), wire::HolderState::kComplete, sender);
}

void TransferClient::failPull(uint64_t request, const Status& why, bool holderLives) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return;
  switch (it->second.state) {
    case PullState::kActive:
      break;
    case PullState::kReading:  // it ends when the read returns: nothing may resume under it
      it->second.state = PullState::kReadFailed;
      it->second.failure = why;
      it->second.failureSparesHolder = holderLives;
      return;
    case PullState::kReadFailed:
      it->second.failureSparesHolder = it->second.failureSparesHolder && holderLives;  // it died since
      return;
    case PullState::kReadDropped:
      return;
  }
  auto obj = it->second.object;
  int rank = it->second.rank;
  int resumes = it->second.resumes;
  const int senderSource = it->second.senderSource;
  const bool sameHost = it->second.holderMemory != nullptr;
  pulls_.erase(it);  // first: telling the holder may close the connection, which fails its pulls
  if (sameHost) releaseHolder(request, rank);
  // A holder that handed its copy to a get is no failure: not counted.
  const bool moved = why.code == Code::kMoved;
  const bool resumable = (moved || (why.code == Code::kPeerFailed && resumes < kMaxResumes)) && !closing_ &&
                         store_.find(obj->id()) == obj;
  if (resumable && holderLives && !moved && !peers_.hasFailed(rank)) {
    // Its bytes are still there: asking the shard would only skip it.
    counters_.pullResumes++;
    HLOG(kInfo, "resuming %s from %s at byte %llu over a new connection (%s)", printableId(obj->id()).c_str(),
         peers_.peerName(rank).c_str(), static_cast<unsigned long long>(obj->watermark()), why.message.c_str());
    startPull(rank, senderSource, obj, resumes + 1);
    return;
  }
  if (resumable) {
    resumePull(obj, rank, moved ? resumes : resumes + 1, why);
    return;
  }
  dropFailedCopy(obj, rank, why);
}

// The sender died mid-transfer, or had handed its copy to a get (kMoved): ask
// the shard for another holder (it skips that one and never picks one fed
// through this node) and continue from the bytes already here, so only what
// was in flight moves again.
void TransferClient::resumePull(std::shared_ptr<LocalObject> obj, int deadRank, int resumes, Status why) {
  resuming_[obj.get()] = deadRank;
  directory_.requestLookup(obj->id(), config_.resumeTimeoutSeconds, /*locate=*/false, deadRank,
                [this, obj, deadRank, resumes, why](const Status& s, const wire::LookupReply* reply) {
                  resuming_.erase(obj.get());
                  if (store_.find(obj->id()) != obj) return;  // dropped meanwhile
                  if (!s.ok() || reply == nullptr || reply->sender < 0 || reply->sender == config_.rank ||
                      reply->sender >= config_.worldSize) {
                    if (why.code != Code::kMoved) return dropFailedCopy(obj, -1, why);
                    // Nothing failed: what the directory said is the news (deleted, no copy left).
                    const Status none(Code::kNotFound, "no node holds a copy of object " + printableId(obj->id()));
                    return dropFailedCopy(obj, -1, s.ok() ? none : s);
                  }
                  if (why.code == Code::kMoved) {
                    HLOG(kDebug, "pull of %s goes to %s instead: %s", printableId(obj->id()).c_str(),
                         peers_.peerName(reply->sender).c_str(), why.message.c_str());
                  } else {
                    counters_.pullResumes++;
                    HLOG(kInfo, "resuming %s from %s at byte %llu after %s failed", printableId(obj->id()).c_str(),
                         peers_.peerName(reply->sender).c_str(), static_cast<unsigned long long>(obj->watermark()),
                         peers_.peerName(deadRank).c_str());
                  }
                  startPull(reply->sender, reply->senderSource, obj, resumes);
                });
}

void TransferClient::releaseHolder(uint64_t request, int rank) {
  if (peers_.hasConnection(rank)) peers_.send(rank, wire::Cancel{request});
}

void TransferClient::dropFailedCopy(const std::shared_ptr<LocalObject>& obj, int rank, const Status& why) {
  if (store_.find(obj->id()) == obj) store_.remove(obj->id());
  directory_.updateHolder(obj->id(), wire::HolderState::kRemoved, rank);
  std::string where = why.code == Code::kPeerFailed || rank < 0
                          ? why.message
                          : "transfer from " + peers_.peerName(rank) + " failed: " + why.message;
  // No copy left to resume from, but its reduce recomputes it: its readers wait.
  const bool recomputed = obj->recomputable && why.code == Code::kPeerFailed;
  obj->fail(Status(recomputed ? Code::kRetry : why.code, where));
}

}  // namespace hoplite
