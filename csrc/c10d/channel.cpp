#include "c10d/channel.h"

namespace hoplite::c10d {

struct Channel::Memory {
  std::shared_ptr<const void> owner;
  std::vector<std::unique_ptr<uint8_t[]>> scratch;
};

Channel::Channel(std::shared_ptr<Node> node, uint64_t context, int rank, std::vector<int> globalRanks)
    : node_(std::move(node)), context_(context), rank_(rank), globalRanks_(std::move(globalRanks)) {}

void Channel::begin(const std::string& name, uint64_t tagBase, double timeoutSeconds,
                    std::shared_ptr<const void> owner) {
  name_ = name;
  tagBase_ = tagBase;
  timeoutSeconds_ = timeoutSeconds;
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeoutSeconds));
  memory_ = std::make_shared<Memory>();
  memory_->owner = std::move(owner);
}

uint8_t* Channel::scratch(size_t bytes) {
  memory_->scratch.push_back(std::unique_ptr<uint8_t[]>(new uint8_t[std::max<size_t>(bytes, 1)]));
  return memory_->scratch.back().get();
}

void Channel::end() {
  for (auto& op : receives_) {
    std::lock_guard<std::mutex> lock(op->mutex);
    if (!op->done) node_->cancelReceive(op->handle, Status(Code::kInternal, name_ + " was abandoned after a failure"));
  }
  receives_.clear();
  memory_.reset();
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
  node_->sendMessage(globalRank(peer), context_, tagBase_ | subTag, static_cast<const uint8_t*>(data), bytes,
                     memory_, completer(op));
  return op;
}

Channel::Pending Channel::recv(int peer, uint64_t subTag, void* data, size_t bytes) {
  auto op = start(peer, subTag, false);
  op->handle = node_->recvMessage(globalRank(peer), context_, tagBase_ | subTag, static_cast<uint8_t*>(data), bytes,
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
    if (!op->isSend) node_->cancelReceive(op->handle, why);
    throw CommError(why.code, why.message);
  }
  if (!op->status.ok()) throw CommError(op->status.code, where(*op) + " failed: " + op->status.message);
}

void Channel::waitAll(std::vector<Pending>& ops) {
  for (auto& op : ops) wait(op);
  ops.clear();
}

}  // namespace hoplite::c10d
