// Serving pulls (see server.h).
#include "transfer/server.h"

#include <algorithm>

#include "common/chunking.h"
#include "common/step_trace.h"
#include "common/object_meta.h"

namespace hoplite {
namespace {
// A relay sends what arrived in frames of at least min(chunk, this) (or the rest).
constexpr uint64_t kMinRelayFrame = 256u << 10;
// A pull that reached this node before its copy exists waits this long for it.
constexpr double kParkSeconds = 5.0;
// Ids of copies handed to local gets that the server remembers.
constexpr size_t kHandedOverRemembered = 1024;
}  // namespace

TransferServer::TransferServer(EventLoop& loop, PeerLinks& peers, ObjectStore& store, TransferServerConfig config)
    : loop_(loop), peers_(peers), store_(store), config_(config) {}

void TransferServer::registerHandlers(MessageRouter& router) {
  router.on<wire::Pull>(Route::kOnEither, [this](Connection& c, const wire::Pull& m) { handlePull(c, m); });
  router.on<wire::Cancel>(Route::kOnEither, [this](Connection& c, const wire::Cancel& m) { handleCancel(c, m); });
}

void TransferServer::noteHandedOver(const std::string& id) {
  if (!handedOver_.insert(id).second) return;
  handedOverOrder_.push_back(id);
  if (handedOverOrder_.size() > kHandedOverRemembered) {
    handedOver_.erase(handedOverOrder_.front());
    handedOverOrder_.pop_front();
  }
}

void TransferServer::onConnectionClosed(uint64_t connectionId) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  std::vector<StreamKey> ended;
  for (const auto& [key, stream] : streams_) {
    if (key.first == connectionId) ended.push_back(key);
  }
  for (const auto& key : ended) end(key);
  lent_.erase(lent_.lower_bound({connectionId, 0}), lent_.upper_bound({connectionId, UINT64_MAX}));
  counters_.lent = lent_.size();
}


void TransferServer::handleCancel(Connection& conn, const wire::Cancel& msg) {
  end({conn.id(), msg.request});
  lent_.erase({conn.id(), msg.request});
  counters_.lent = lent_.size();
}

void TransferServer::handlePull(Connection& conn, const wire::Pull& msg) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  traceStep(Step::kServePull, msg.id, conn.peerRank());
  auto shared = peers_.sharedConnection(conn);
  if (auto obj = store_.find(msg.id)) {
    start(shared, msg, obj);
    return;
  }
  if (handedOver_.count(msg.id)) {  // gone, not yet arrived: the reader asks the directory again
    const Status moved(Code::kMoved, peers_.peerName(config_.rank) + " handed its copy of object " + printableId(msg.id) +
                                         " to a get");
    conn.sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, moved}));
    return;
  }
  auto& parked = parked_[msg.id];
  if (parked.size() >= 1024) {  // bounded: a peer cannot park requests without limit
    start(shared, msg, nullptr);
    return;
  }
  std::string id = msg.id;
  uint64_t request = msg.request;
  auto timer = loop_.addTimer(kParkSeconds, [this, id, request] {
    auto it = parked_.find(id);
    if (it == parked_.end()) return;
    auto& list = it->second;
    for (auto p = list.begin(); p != list.end(); ++p) {
      if (p->msg.request != request) continue;
      ParkedPull pull = std::move(*p);
      list.erase(p);
      if (list.empty()) parked_.erase(it);
      if (auto c = pull.conn.lock()) start(c, pull.msg, store_.find(pull.msg.id));
      return;
    }
  });
  parked.push_back(ParkedPull{shared, msg, timer});
}

void TransferServer::serveParkedPulls(const std::shared_ptr<LocalObject>& obj) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = parked_.find(obj->id());
  if (it == parked_.end()) return;
  auto list = std::move(it->second);
  parked_.erase(it);
  for (auto& pull : list) {
    loop_.cancelTimer(pull.timer);
    if (auto c = pull.conn.lock()) start(c, pull.msg, obj);
  }
}

void TransferServer::start(const std::shared_ptr<Connection>& conn, const wire::Pull& msg,
                        const std::shared_ptr<LocalObject>& obj) {
  if (!conn || !conn->isOpen()) return;
  if (!obj || obj->failed() || msg.offset > obj->size()) {
    Status s = !obj || obj->failed()
                   ? Status(Code::kNotFound, "rank " + std::to_string(config_.rank) + " holds no copy of object " +
                                                 printableId(msg.id))
                   : Status(Code::kInvalidArgument, "pull offset beyond the end of object " + printableId(msg.id));
    conn->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{msg.request, s}));
    return;
  }
  StreamKey key{conn->id(), msg.request};
  end(key);  // a repeated request replaces the earlier stream
  Stream& stream = streams_[key];
  stream.conn = conn;
  stream.request = msg.request;
  stream.object = obj;
  stream.next = msg.offset;
  stream.sameHost = msg.sameHost && config_.sameHost;  // offered only then
  if (stream.sameHost) {
    lent_[key] = obj->buffer();
    counters_.lent = lent_.size();
  }
  stream.listener = obj->addListener([this, key] { pump(key); });
  counters_.pullsServed++;
  if (!obj->complete()) counters_.relaysServed++;
  pump(key);
}

void TransferServer::pump(const StreamKey& key) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = streams_.find(key);
  if (it == streams_.end()) return;
  Stream& stream = it->second;
  auto conn = stream.conn.lock();
  if (!conn || !conn->isOpen()) {
    end(key);
    return;
  }
  const auto& obj = stream.object;
  if (obj->failed()) {
    conn->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{stream.request, obj->error()}));
    end(key);
    return;
  }
  // Sending may close the connection, whose onClosed ends this stream: work on
  // copies and look the stream up again afterwards.
  const auto object = obj;
  const uint64_t request = stream.request;
  const uint64_t chunk = chunkSize(object->size(), config_.chunkBytes);
  const uint64_t ready = object->watermark();
  uint64_t next = stream.next;
  // A copy still arriving advances a few KB at a time: relay it in frames of
  // at least kMinRelayFrame (or the rest), not one small frame per advance.
  if (ready < object->size() && ready - next < std::min(chunk, kMinRelayFrame)) return;
  const bool sameHost = stream.sameHost;
  while (next < ready && conn->isOpen()) {
    // A same-host reader cuts what is ready into reads of its own.
    uint64_t n = sameHost ? ready - next : std::min(chunk, ready - next);
    if (sameHost) {
      conn->sendControl(wire::MsgType::kDataAt,
                        wire::encode(wire::DataAt{request, next, n, reinterpret_cast<uintptr_t>(object->data() + next)}));
      counters_.bytesSentSameHost += n;
    } else {
      conn->sendData(request, request, next, object->data() + next, n, object->buffer());
    }
    counters_.bytesSent += n;
    next += n;
  }
  it = streams_.find(key);
  if (it == streams_.end()) return;
  it->second.next = next;
  if (next == object->size() || !conn->isOpen()) end(key);
}

void TransferServer::end(const StreamKey& key) {
  auto it = streams_.find(key);
  if (it == streams_.end()) return;
  it->second.object->removeListener(it->second.listener);
  streams_.erase(it);
}

}  // namespace hoplite
