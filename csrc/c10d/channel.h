// A process group's view of the node's tagged messages (TaggedMessenger), the small transport
// the collective algorithms are written against (as Gloo's are against its
// pairs): group ranks, one tag space per collective, and every wait bounded by
// the collective's deadline. Used by one thread at a time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/status.h"
#include "messenger/tagged_messenger.h"
#include "store/buffer_pool.h"

namespace hoplite::c10d {

// A collective failed: a peer died, sent the wrong size, or the deadline passed.
class CommError : public std::runtime_error {
 public:
  CommError(Code code, const std::string& what) : std::runtime_error(what), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

// The group rank of node rank `global` among `globalRanks`, or -1 outside the group.
int groupRankOf(const std::vector<int>& globalRanks, int global);

class Channel {
 public:
  struct Op;  // one send or receive in flight
  struct Outcome;  // of one collective: its first failure
  using Pending = std::shared_ptr<Op>;
  // Memory for scratch: the node's BufferPool, whose freed buffers are reused.
  using Allocator = std::function<std::shared_ptr<Buffer>(size_t bytes)>;

  // `globalRanks[i]` is the node rank of group rank i.
  Channel(std::shared_ptr<TaggedMessenger> messenger, Allocator allocate, uint64_t context, int rank,
          std::vector<int> globalRanks);

  // Errors name members by node rank ("rank 3") instead of group rank ("rank
  // 2 (global rank 3)"): for callers whose users name members so.
  void nameNodeRanks() { nameNodeRanks_ = true; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(globalRanks_->size()); }
  int globalRank(int groupRank) const { return globalRanks_->at(groupRank); }
  // Node rank of each group rank, shareable with callbacks that may outlive the channel.
  std::shared_ptr<const std::vector<int>> globalRanks() const { return globalRanks_; }
  TaggedMessenger& messenger() { return *messenger_; }
  uint64_t context() const { return context_; }

  // Starts a collective: its name for errors, its kind (which the peers'
  // messages must match: see TaggedMessenger), its tags, its deadline, and
  // `owner`, which keeps the memory it touches alive until the node has
  // finished with every message. `generation` tells it apart from earlier
  // collectives whose tags were the same (the backend's sequence numbers
  // wrap): an abort of one of those is not taken for its own.
  void begin(const std::string& name, const std::string& kind, uint64_t tagBase, double timeoutSeconds,
             std::shared_ptr<const void> owner, uint64_t generation = 0);
  // Uninitialised scratch memory that lives as long as the collective's
  // messages. From the allocator's pool, so reused across collectives: fresh
  // pages cost a fault each, which on a chain reduce of 256 MB was a large
  // share of the CPU time.
  uint8_t* scratch(size_t bytes);
  // Keeps `memory` (e.g. a tensor the collective made) alive as long as the
  // collective's messages: a failure can end the collective while they still
  // read or write it.
  void hold(std::shared_ptr<const void> memory);
  // Ends the collective. After a failure (`why`, not OK), what it left
  // unfinished is cancelled: its receives (returns once their memory is no
  // longer written) and its deferred sends that no receive asked for yet; and
  // unless the failure was another member's abort, every other member is sent
  // one, which fails the collective there at once instead of at its deadline
  // (a member that waits on a neighbour that gave up would otherwise wait for
  // its whole timeout).
  void end(const Status& why);

  Pending send(int peer, uint64_t subTag, const void* data, size_t bytes);
  Pending recv(int peer, uint64_t subTag, void* data, size_t bytes);
  // Waits for `op`; throws CommError (naming the collective and peer) when it
  // or any other op of the collective failed (the peers stop waiting for each
  // other at the first failure), or at the deadline, cancelling the receive.
  void wait(const Pending& op);
  void waitAll(std::vector<Pending>& ops);

 private:
  struct Memory;
  Pending start(int peer, uint64_t subTag, bool isSend);
  // Posts the receive of other members' aborts (any source, the last
  // sub-tag), from the collective's thread.
  void watchForAborts();
  void sendAborts(const Status& why);
  // Asks the messenger to cancel a receive that has not completed; awaitCancel
  // returns once its memory is no longer written (or at `until`).
  void requestCancel(const Pending& op, const Status& why);
  void awaitCancel(const Pending& op, std::chrono::steady_clock::time_point until);
  double secondsLeft() const;

  std::shared_ptr<TaggedMessenger> messenger_;
  Allocator allocate_;
  uint64_t context_;
  int rank_;
  std::shared_ptr<const std::vector<int>> globalRanks_;

  // The collective in progress.
  std::string name_;
  std::string kind_;
  uint64_t tagBase_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  double timeoutSeconds_ = 0;
  std::shared_ptr<Memory> memory_;
  std::shared_ptr<Outcome> outcome_;
  std::vector<Pending> receives_;  // of this collective, to cancel what a failure leaves
  std::vector<Pending> sends_;
  uint64_t generation_ = 0;
  uint64_t abortWatch_ = 0;  // the messenger's handle of the abort receive (0: none)
  bool nameNodeRanks_ = false;
  // "rank p" (group) or "rank g" (node) as errors name a member.
  std::string memberName(int groupRank) const;
};

// What the ops of one collective share; its mutex guards their state too.
struct Channel::Outcome {
  std::mutex mutex;
  std::condition_variable cv;
  Status failure;  // the first op's that failed
  std::string failedOp;  // which one, for the error
  bool aborted = false;  // the failure is another member's abort
  // The op the collective's thread waits for (null: none): the others'
  // completions do not wake it, only this one's or a failure.
  const Op* awaited = nullptr;
};

struct Channel::Op {
  bool isSend = false;
  int peer = 0;
  uint64_t subTag = 0;
  uint64_t handle = 0;  // the messenger's, for cancelling
  std::string where;    // "<collective> on rank r: sending to rank p"
  std::shared_ptr<Outcome> outcome;
  bool done = false;
  Status status;
};

}  // namespace hoplite::c10d
