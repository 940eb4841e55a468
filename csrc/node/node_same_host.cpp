// Same-host pulls (net/same_host/): a holder on this host announces where the
// bytes of each piece are (DataAt) instead of sending them, and the receiver
// copies them out of the holder's memory on a worker. The holder keeps that
// memory until the receiver cancels the pull, so a read never sees memory the
// holder reused, whatever happened to the object meanwhile.
#include <unistd.h>

#include "common/logging.h"
#include "node/node.h"

namespace hoplite {
namespace {
// Reads up to this size run on the loop; larger ones on a worker.
constexpr uint64_t kLoopReadBytes = 256u << 10;
}  // namespace

void Node::offerSameHost(wire::Challenge* challenge) const {
  if (hostIdentity_.empty()) return;
  challenge->host = hostIdentity_;
  challenge->pid = static_cast<uint32_t>(::getpid());
  challenge->probeAddress = reinterpret_cast<uintptr_t>(memoryProbe_.data());
  challenge->probe.assign(memoryProbe_.begin(), memoryProbe_.end());
}

std::string Node::sameHostFacts(const wire::Challenge& c) const {
  return c.host + '\0' + std::to_string(c.pid) + ':' + std::to_string(c.probeAddress) + ':' + c.probe;
}

std::shared_ptr<same_host::PeerMemory> Node::acceptSameHost(int rank, const wire::Challenge& c) const {
  if (hostIdentity_.empty() || c.host != hostIdentity_ || c.pid == 0 || c.probe.size() != memoryProbe_.size()) {
    return nullptr;
  }
  // Same kernel and namespaces; whether the kernel lets us read the peer
  // (ptrace restrictions, seccomp) shows only by trying.
  auto memory = same_host::PeerMemory::open(static_cast<int>(c.pid));
  std::string seen(c.probe.size(), '\0');
  Status s = memory ? memory->read(c.probeAddress, reinterpret_cast<uint8_t*>(seen.data()), seen.size())
                    : Status(Code::kPeerFailed, "no pidfd for process " + std::to_string(c.pid));
  if (!s.ok() || seen != c.probe) {
    HLOG(kInfo, "%s runs on this host but its memory cannot be read (%s): pulls from it use TCP",
         peerName(rank).c_str(), s.ok() ? "other bytes there" : s.message.c_str());
    return nullptr;
  }
  return memory;
}

void Node::handleDataAt(Connection& conn, const wire::DataAt& msg) {
  auto it = pulls_.find(msg.request);
  if (it == pulls_.end()) return;  // ended meanwhile: its Cancel releases the memory
  PullState& pull = it->second;
  if (conn.peerRank() != pull.rank || !pull.holderMemory || msg.offset != pull.expected ||
      msg.length > pull.object->size() - msg.offset) {
    HLOG(kWarn, "out-of-order data for %s from %s", printableId(pull.object->id()).c_str(), conn.describe().c_str());
    conn.close(Status(Code::kProtocol, "same-host data announced out of order"));
    return;
  }
  pull.expected += msg.length;
  pull.toRead.push_back(SameHostRange{msg.offset, msg.length, msg.address});
  readNextRange(msg.request);
}

void Node::readNextRange(uint64_t request) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return;
  PullState& pull = it->second;
  if (pull.reading || pull.toRead.empty()) return;
  // Reads of up to a chunk, merging ranges announced back to back: few
  // hand-offs, while the watermark moves often enough for relays and copies.
  const uint64_t most = chunkFor(pull.object->size());
  SameHostRange range = pull.toRead.front();
  pull.toRead.pop_front();
  while (!pull.toRead.empty() && range.length < most) {
    const SameHostRange& next = pull.toRead.front();
    if (next.address != range.address + range.length) break;
    range.length += next.length;
    pull.toRead.pop_front();
  }
  if (range.length > most) {  // the rest is read next
    pull.toRead.push_front(SameHostRange{range.offset + most, range.length - most, range.address + most});
    range.length = most;
  }
  const uint64_t end = range.offset + range.length;
  if (range.length <= kLoopReadBytes) {
    Status s = pull.holderMemory->read(range.address, pull.object->data() + range.offset, range.length);
    onRangeRead(request, end, s);
    return;
  }
  pull.reading = true;
  workers_->submit([this, request, end, memory = pull.holderMemory, range, obj = pull.object] {
    Status s = memory->read(range.address, obj->data() + range.offset, range.length);
    loop_.post([this, request, end, s] { onRangeRead(request, end, s); });
  });
}

void Node::onRangeRead(uint64_t request, uint64_t end, const Status& status) {
  auto released = releaseAfterRead_.find(request);
  if (released != releaseAfterRead_.end()) {
    const int holder = released->second;
    releaseAfterRead_.erase(released);
    if (peers_.count(holder) && peers_[holder].conn) send(holder, wire::Cancel{request});
    return;
  }
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return;
  PullState& pull = it->second;
  pull.reading = false;
  if (!status.ok()) {
    failPull(request, Status(Code::kPeerFailed, "pull of object " + printableId(pull.object->id()) + " from " +
                                                    peerName(pull.rank) + ": " + status.message));
    return;
  }
  auto obj = pull.object;
  counters_.bytesReceived += end - obj->watermark();
  counters_.bytesReceivedSameHost += end - obj->watermark();
  obj->advance(end);
  if (end == obj->size()) return finishPull(request);
  readNextRange(request);
}

void Node::releaseHolder(uint64_t request, const PullState& pull) {
  if (pull.reading) {
    releaseAfterRead_[request] = pull.rank;
    return;
  }
  auto peer = peers_.find(pull.rank);
  if (peer != peers_.end() && peer->second.conn) send(pull.rank, wire::Cancel{request});
}

}  // namespace hoplite
