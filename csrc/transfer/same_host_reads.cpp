// Same-host pulls (net/same_host/): a holder on this host announces where the
// bytes of each piece are (DataAt) instead of sending them, and the receiver
// copies them out of the holder's memory, on the loop or a copy thread. The
// holder keeps that memory until the receiver cancels the pull, which it does
// only once no read of it is in flight, so a read never sees memory the holder
// reused, whatever happened to the object meanwhile.
#include <utility>

#include "common/logging.h"
#include "transfer/client.h"

namespace hoplite {
namespace {
// Reads up to this size run on the loop; larger ones on a worker.
constexpr uint64_t kLoopReadBytes = 256u << 10;
// Bytes one loop turn reads before it lets other events in.
constexpr uint64_t kLoopReadBudget = 1u << 20;
}  // namespace

void TransferClient::handleDataAt(Connection& conn, const wire::DataAt& msg) {
  auto it = pulls_.find(msg.request);
  if (it == pulls_.end()) {
    // Ended meanwhile (or served late from a parked pull): the memory is not wanted.
    conn.sendControl(wire::MsgType::kCancel, wire::encode(wire::Cancel{msg.request}));
    return;
  }
  PullOp& pull = it->second;
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

TransferClient::SameHostRange TransferClient::takeRead(std::deque<SameHostRange>& queue, uint64_t most) {
  SameHostRange range = queue.front();
  queue.pop_front();
  while (!queue.empty() && range.length < most && queue.front().address == range.address + range.length) {
    range.length += queue.front().length;
    queue.pop_front();
  }
  if (range.length > most) {  // the rest is read next
    queue.push_front(SameHostRange{range.offset + most, range.length - most, range.address + most});
    range.length = most;
  }
  return range;
}

void TransferClient::readNextRange(uint64_t request) {
  uint64_t budget = kLoopReadBudget;
  for (;;) {
    auto it = pulls_.find(request);
    if (it == pulls_.end()) return;
    PullOp& pull = it->second;
    if (pull.state != PullState::kActive || pull.toRead.empty()) return;
    const SameHostRange range = takeRead(pull.toRead, chunkFor(pull.object->size()));
    const uint64_t end = range.offset + range.length;
    if (range.length > kLoopReadBytes) {
      pull.state = PullState::kReading;
      copies_.submit([this, request, end, range, memory = pull.holderMemory, obj = pull.object] {
        Status s = memory->read(range.address, obj->data() + range.offset, range.length);
        loop_.post([this, request, end, s] {
          if (onRangeRead(request, end, s)) readNextRange(request);
        });
      });
      return;
    }
    if (range.length > budget) {  // the loop has other work too: go on in a later turn
      pull.toRead.push_front(range);
      loop_.post([this, request] { readNextRange(request); });
      return;
    }
    budget -= range.length;
    if (!onRangeRead(request, end, pull.holderMemory->read(range.address, pull.object->data() + range.offset,
                                                           range.length))) {
      return;
    }
  }
}

bool TransferClient::onRangeRead(uint64_t request, uint64_t end, const Status& status) {
  auto it = pulls_.find(request);
  if (it == pulls_.end()) return false;
  PullOp& pull = it->second;
  const PullState meanwhile = std::exchange(pull.state, PullState::kActive);
  if (meanwhile == PullState::kReadDropped) {
    const int rank = pull.rank;
    pulls_.erase(it);
    releaseHolder(request, rank);
    return false;
  }
  if (meanwhile == PullState::kReadFailed || !status.ok()) {
    const Status why = meanwhile == PullState::kReadFailed ? pull.failure
                                    : Status(Code::kPeerFailed, "pull of object " + printableId(pull.object->id()) +
                                                                    " from " + peers_.peerName(pull.rank) + ": " +
                                                                    status.message);
    failPull(request, why, meanwhile == PullState::kReadFailed && pull.failureSparesHolder);
    return false;
  }
  auto obj = pull.object;
  counters_.bytesReceivedSameHost += end - obj->watermark();
  advancePull(pull, end);
  if (end == obj->size()) {
    finishPull(request);
    return false;
  }
  return true;
}

}  // namespace hoplite
