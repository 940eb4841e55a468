#include "c10d/channel.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "common/object_meta.h"

namespace hoplite::c10d {

namespace {
constexpr std::chrono::seconds kCancelGrace{5};

// "rank p" (group) or "rank g" (node) as errors name member p of `ranks`.
std::string nameOf(const std::vector<int>& ranks, int groupRank, bool nodeRanks) {
  const int node = ranks.at(groupRank);
  if (nodeRanks || node == groupRank) return "rank " + std::to_string(node);
  return "rank " + std::to_string(groupRank) + " (global rank " + std::to_string(node) + ")";
}
// Aborts: a fixed size (a receive takes one message of its own size): the
// failure's code, the collective's generation (8 bytes, little-endian), then
// its text, zero-padded. The sub-tag is above every one an algorithm uses
// (they stay under 2^40, the sequence shift of the backend).
constexpr size_t kAbortBytes = 512;
constexpr size_t kAbortText = 9;  // where the text starts
constexpr uint64_t kAbortSubTag = (1ull << 40) - 1;
const std::string kAbortKind = "abort";
// An abort's send waits at least this long for a member that has not asked
// for it yet (when the sender's eager window to it is full).
constexpr double kAbortSendSeconds = 5.0;
// A collective watches for aborts once one of its waits lasts this long:
// posting and cancelling the receive in every collective made a 1 KB
// allreduce among 4 on loopback 13% slower (benchmarks/README.md), and an
// abort that waited that long in the mailbox is taken at once.
constexpr std::chrono::milliseconds kWatchAfter{5};
}  // namespace

struct Channel::Memory {
  std::shared_ptr<const void> owner;
  std::vector<std::shared_ptr<const void>> held;  // scratch buffers too: back to their pool when freed
};

Channel::Channel(std::shared_ptr<TaggedMessenger> messenger, Allocator allocate, uint64_t context, int rank,
                 std::vector<int> globalRanks)
    : messenger_(std::move(messenger)),
      allocate_(std::move(allocate)),
      context_(context),
      rank_(rank),
      globalRanks_(std::make_shared<const std::vector<int>>(std::move(globalRanks))) {}

int groupRankOf(const std::vector<int>& globalRanks, int global) {
  for (size_t i = 0; i < globalRanks.size(); ++i) {
    if (globalRanks[i] == global) return static_cast<int>(i);
  }
  return -1;
}

void Channel::begin(const std::string& name, const std::string& kind, uint64_t tagBase, double timeoutSeconds,
                    std::shared_ptr<const void> owner, uint64_t generation) {
  name_ = name;
  kind_ = kind;
  tagBase_ = tagBase;
  timeoutSeconds_ = timeoutSeconds;
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeoutSeconds));
  memory_ = std::make_shared<Memory>();
  memory_->owner = std::move(owner);
  outcome_ = std::make_shared<Outcome>();
  generation_ = generation;
}

void Channel::watchForAborts() {
  auto buffer = std::make_shared<std::array<char, kAbortBytes>>();
  memory_->held.push_back(buffer);
  std::weak_ptr<Outcome> weak = outcome_;
  const std::string where = name_ + " on " + memberName(rank_);
  abortWatch_ = messenger_->receive(
      -1, context_, tagBase_ | kAbortSubTag, kAbortKind, reinterpret_cast<uint8_t*>(buffer->data()), kAbortBytes,
      memory_, [weak, buffer, where, ranks = globalRanks_, nodeRanks = nameNodeRanks_,
                generation = generation_](const Status& status, int source) {
        auto outcome = weak.lock();
        if (!outcome || !status.ok()) return;  // the collective ended first (its cancel), or is gone
        uint64_t theirs = 0;
        for (size_t i = 0; i < 8; ++i) theirs |= uint64_t{static_cast<uint8_t>((*buffer)[1 + i])} << (8 * i);
        if (theirs != generation) return;  // an earlier collective's, with the same tags
        const auto code = static_cast<Code>(static_cast<uint8_t>((*buffer)[0]));
        const std::string reason(buffer->data() + kAbortText,
                                 strnlen(buffer->data() + kAbortText, kAbortBytes - kAbortText));
        const int member = groupRankOf(*ranks, source);
        const std::string who = member < 0 ? "rank " + std::to_string(source) : nameOf(*ranks, member, nodeRanks);
        {
          std::lock_guard<std::mutex> lock(outcome->mutex);
          if (!outcome->failure.ok()) return;
          outcome->failure = Status(code == Code::kOk ? Code::kInternal : code, who + " gave up: " + reason);
          outcome->failedOp = where;
          outcome->aborted = true;
        }
        outcome->cv.notify_all();
      });
}

void Channel::sendAborts(const Status& why) {
  auto payload = std::make_shared<std::array<uint8_t, kAbortBytes>>();
  payload->fill(0);
  (*payload)[0] = static_cast<uint8_t>(why.code);
  for (size_t i = 0; i < 8; ++i) (*payload)[1 + i] = static_cast<uint8_t>(generation_ >> (8 * i));
  std::memcpy(payload->data() + kAbortText, why.message.data(),
              std::min(why.message.size(), kAbortBytes - kAbortText - 1));
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_) continue;
    messenger_->send(globalRank(peer), context_, tagBase_ | kAbortSubTag, kAbortKind, payload->data(), kAbortBytes,
                     payload, [](const Status&, int) {}, std::max(timeoutSeconds_, kAbortSendSeconds));
  }
}

uint8_t* Channel::scratch(size_t bytes) {
  std::shared_ptr<Buffer> buffer = allocate_(bytes);
  uint8_t* data = buffer->data();
  memory_->held.push_back(std::move(buffer));
  return data;
}

void Channel::hold(std::shared_ptr<const void> memory) { memory_->held.push_back(std::move(memory)); }

void Channel::end(const Status& why) {
  const bool failed = !why.ok();
  if (failed && outcome_ && size() > 1) {
    bool aborted;
    {
      std::lock_guard<std::mutex> lock(outcome_->mutex);
      aborted = outcome_->aborted;
    }
    if (!aborted) sendAborts(why);  // else an abort already went to every member
  }
  if (abortWatch_ != 0) {
    messenger_->cancelReceive(abortWatch_, Status(Code::kInternal, name_ + " ended"));
    abortWatch_ = 0;
  }
  if (failed && outcome_) {
    const Status abandoned(Code::kInternal, name_ + " was abandoned after a failure");
    {
      std::lock_guard<std::mutex> lock(outcome_->mutex);
      for (auto& op : sends_) {
        if (!op->done) messenger_->cancelSend(op->handle, abandoned);  // its peer will not ask for it now
      }
    }
    for (auto& op : receives_) requestCancel(op, abandoned);
    const auto until = std::chrono::steady_clock::now() + kCancelGrace;
    for (auto& op : receives_) awaitCancel(op, until);
  }
  receives_.clear();
  sends_.clear();
  memory_.reset();
  outcome_.reset();
}

void Channel::requestCancel(const Pending& op, const Status& why) {
  std::lock_guard<std::mutex> lock(op->outcome->mutex);
  if (!op->done) messenger_->cancelReceive(op->handle, why);
}

void Channel::awaitCancel(const Pending& op, std::chrono::steady_clock::time_point until) {
  // Done once the loop thread has run the cancel, which stops every write to
  // the receive's memory (a loop turn; bounded in case the loop is stuck).
  std::unique_lock<std::mutex> lock(op->outcome->mutex);
  op->outcome->awaited = op.get();
  op->outcome->cv.wait_until(lock, until, [&] { return op->done; });
  op->outcome->awaited = nullptr;
}

double Channel::secondsLeft() const {
  const double left = std::chrono::duration<double>(deadline_ - std::chrono::steady_clock::now()).count();
  return std::max(left, 1e-3);
}

std::string Channel::memberName(int groupRank) const { return nameOf(*globalRanks_, groupRank, nameNodeRanks_); }

Channel::Pending Channel::start(int peer, uint64_t subTag, bool isSend) {
  if (subTag >= kAbortSubTag) throw CommError(Code::kInternal, name_ + ": sub-tag " + std::to_string(subTag) + " is reserved");
  if (peer < 0 || peer >= size() || peer == rank_) {
    throw CommError(Code::kInvalidArgument, name_ + ": no peer " + std::to_string(peer) + " in a group of " +
                                                std::to_string(size()));
  }
  auto op = std::make_shared<Op>();
  op->isSend = isSend;
  op->peer = peer;
  op->subTag = subTag;
  op->outcome = outcome_;
  op->where = name_ + " on " + memberName(rank_) + ": " + (isSend ? "sending to " : "receiving from ") + memberName(peer);
  return op;
}

namespace {
// `timeoutSeconds`: the collective's. A send's own deadline (what was left of
// it when the send started) reports in those terms, as the waits do.
TaggedMessenger::Callback completer(const Channel::Pending& op, double timeoutSeconds) {
  return [op, timeoutSeconds](const Status& reported, int) {
    const Status status = reported.code == Code::kTimeout
                              ? Status(Code::kTimeout, "timed out after " + printableSeconds(timeoutSeconds))
                              : reported;
    Channel::Outcome& outcome = *op->outcome;
    bool wake;
    {
      std::lock_guard<std::mutex> lock(outcome.mutex);
      op->done = true;
      op->status = status;
      if (!status.ok() && outcome.failure.ok()) {
        outcome.failure = status;
        outcome.failedOp = op->where;
      }
      wake = outcome.awaited == op.get() || !status.ok();
    }
    if (wake) outcome.cv.notify_all();
  };
}
}  // namespace

Channel::Pending Channel::send(int peer, uint64_t subTag, const void* data, size_t bytes) {
  auto op = start(peer, subTag, true);
  // With the collective's deadline, so that the node withdraws a deferred send
  // whose receiver never asks for it.
  op->handle = messenger_->send(globalRank(peer), context_, tagBase_ | subTag, kind_, static_cast<const uint8_t*>(data),
                                bytes, memory_, completer(op, timeoutSeconds_), secondsLeft());
  sends_.push_back(op);
  return op;
}

Channel::Pending Channel::recv(int peer, uint64_t subTag, void* data, size_t bytes) {
  auto op = start(peer, subTag, false);
  op->handle = messenger_->receive(globalRank(peer), context_, tagBase_ | subTag, kind_, static_cast<uint8_t*>(data),
                                   bytes, memory_, completer(op, timeoutSeconds_));
  receives_.push_back(op);
  return op;
}

void Channel::wait(const Pending& op) {
  Outcome& outcome = *op->outcome;
  std::unique_lock<std::mutex> lock(outcome.mutex);
  outcome.awaited = op.get();
  auto over = [&] { return op->done || !outcome.failure.ok(); };
  bool ended = outcome.cv.wait_until(lock, std::min(deadline_, std::chrono::steady_clock::now() + kWatchAfter), over);
  if (!ended && abortWatch_ == 0 && size() > 1) {
    lock.unlock();
    watchForAborts();  // an abort that came meanwhile is taken at once
    lock.lock();
  }
  if (!ended) ended = outcome.cv.wait_until(lock, deadline_, over);
  outcome.awaited = nullptr;
  if (!ended) {
    lock.unlock();
    Status why(Code::kTimeout, op->where + " timed out after " + printableSeconds(timeoutSeconds_));
    if (!op->isSend) {
      requestCancel(op, why);
      awaitCancel(op, std::chrono::steady_clock::now() + kCancelGrace);
    }
    lock.lock();
    if (!op->done || op->status.message == why.message) throw CommError(why.code, why.message);
    // Else it ended on its own (completed, or failed) before the cancel reached it.
  }
  if (op->done && !op->status.ok()) throw CommError(op->status.code, op->where + " failed: " + op->status.message);
  // Another op failed, or another member gave up: this one would wait for a
  // peer that has given up, or is gone. After an abort, the op waited for is
  // named too: the member that gave up may only have waited for this one.
  if (!op->done && outcome.aborted) throw CommError(outcome.failure.code, op->where + " stopped: " + outcome.failure.message);
  if (!op->done) throw CommError(outcome.failure.code, outcome.failedOp + " failed: " + outcome.failure.message);
}

void Channel::waitAll(std::vector<Pending>& ops) {
  for (auto& op : ops) wait(op);
  ops.clear();
}

}  // namespace hoplite::c10d
