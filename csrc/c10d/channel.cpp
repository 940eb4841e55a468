#include "c10d/channel.h"

namespace hoplite::c10d {

namespace {
using Block = std::pair<std::unique_ptr<uint8_t[]>, size_t>;  // memory, size
constexpr size_t kPoolBlocks = 4;
constexpr size_t kPoolBytes = 2ull << 30;
constexpr std::chrono::seconds kCancelGrace{5};
}  // namespace

// Blocks come back when the last message of their collective lets go of them,
// which may be on the node's loop thread: hence the lock.
class Channel::ScratchPool {
 public:
  Block take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->second >= bytes && (best == blocks_.end() || it->second < best->second)) best = it;
    }
    if (best == blocks_.end()) return {std::unique_ptr<uint8_t[]>(new uint8_t[std::max<size_t>(bytes, 1)]), bytes};
    Block b = std::move(*best);
    cached_ -= b.second;
    blocks_.erase(best);
    return b;
  }
  void give(Block b) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (blocks_.size() == kPoolBlocks || cached_ + b.second > kPoolBytes) return;  // freed
    cached_ += b.second;
    blocks_.push_back(std::move(b));
  }

 private:
  std::mutex mutex_;
  std::vector<Block> blocks_;
  size_t cached_ = 0;
};

struct Channel::Memory {
  std::shared_ptr<const void> owner;
  std::shared_ptr<ScratchPool> pool;
  std::vector<Block> scratch;
  ~Memory() {
    for (auto& b : scratch) pool->give(std::move(b));
  }
};

Channel::Channel(std::shared_ptr<Node> node, uint64_t context, int rank, std::vector<int> globalRanks)
    : node_(std::move(node)),
      context_(context),
      rank_(rank),
      globalRanks_(std::make_shared<const std::vector<int>>(std::move(globalRanks))),
      pool_(std::make_shared<ScratchPool>()) {}

int groupRankOf(const std::vector<int>& globalRanks, int global) {
  for (size_t i = 0; i < globalRanks.size(); ++i) {
    if (globalRanks[i] == global) return static_cast<int>(i);
  }
  return -1;
}

void Channel::begin(const std::string& name, const std::string& kind, uint64_t tagBase, double timeoutSeconds,
                    std::shared_ptr<const void> owner) {
  name_ = name;
  kind_ = kind;
  tagBase_ = tagBase;
  timeoutSeconds_ = timeoutSeconds;
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeoutSeconds));
  memory_ = std::make_shared<Memory>();
  memory_->owner = std::move(owner);
  memory_->pool = pool_;
}

uint8_t* Channel::scratch(size_t bytes) {
  memory_->scratch.push_back(pool_->take(bytes));
  return memory_->scratch.back().first.get();
}

void Channel::end() {
  for (auto& op : receives_) cancel(op, Status(Code::kInternal, name_ + " was abandoned after a failure"));
  receives_.clear();
  memory_.reset();
}

void Channel::cancel(const Pending& op, const Status& why) {
  std::unique_lock<std::mutex> lock(op->mutex);
  if (op->done) return;
  node_->cancelReceive(op->handle, why);
  // Done once the loop thread has run the cancel, which stops every write to
  // the receive's memory (a loop turn; bounded in case the loop is stuck).
  op->cv.wait_for(lock, kCancelGrace, [&] { return op->done; });
}

Channel::Pending Channel::start(int peer, uint64_t subTag, bool isSend) {
  if (peer < 0 || peer >= size() || peer == rank_) {
    throw CommError(Code::kInvalidArgument, name_ + ": no peer " + std::to_string(peer) + " in a group of " +
                                                std::to_string(size()));
  }
  auto op = std::make_shared<Op>();
  op->isSend = isSend;
  op->peer = peer;
  op->subTag = subTag;
  return op;
}

namespace {
Node::MessageCallback completer(const Channel::Pending& op) {
  return [op](const Status& status, int) {
    {
      std::lock_guard<std::mutex> lock(op->mutex);
      op->done = true;
      op->status = status;
    }
    op->cv.notify_all();
  };
}
}  // namespace

Channel::Pending Channel::send(int peer, uint64_t subTag, const void* data, size_t bytes) {
  auto op = start(peer, subTag, true);
  node_->sendMessage(globalRank(peer), context_, tagBase_ | subTag, kind_, static_cast<const uint8_t*>(data), bytes,
                     memory_, completer(op));
  return op;
}

Channel::Pending Channel::recv(int peer, uint64_t subTag, void* data, size_t bytes) {
  auto op = start(peer, subTag, false);
  op->handle = node_->recvMessage(globalRank(peer), context_, tagBase_ | subTag, kind_, static_cast<uint8_t*>(data), bytes,
                                  memory_, completer(op));
  receives_.push_back(op);
  return op;
}

std::string Channel::where(const Op& op) const {
  std::string peer = "rank " + std::to_string(op.peer);
  if (globalRank(op.peer) != op.peer) peer += " (global rank " + std::to_string(globalRank(op.peer)) + ")";
  return name_ + " on rank " + std::to_string(rank_) + ": " + (op.isSend ? "sending to " : "receiving from ") + peer;
}

void Channel::wait(const Pending& op) {
  std::unique_lock<std::mutex> lock(op->mutex);
  if (!op->cv.wait_until(lock, deadline_, [&] { return op->done; })) {
    lock.unlock();
    Status why(Code::kTimeout, where(*op) + " timed out after " + printableSeconds(timeoutSeconds_));
    if (!op->isSend) cancel(op, why);
    throw CommError(why.code, why.message);
  }
  if (!op->status.ok()) throw CommError(op->status.code, where(*op) + " failed: " + op->status.message);
}

void Channel::waitAll(std::vector<Pending>& ops) {
  for (auto& op : ops) wait(op);
  ops.clear();
}

}  // namespace hoplite::c10d
