// Requests this node sent that wait for an answer (a StatusReply or a
// LookupReply), each answered exactly once: by its reply, by its peer's
// failure, or at shutdown. Loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "wire/messages.h"

namespace hoplite {

class RequestTracker {
 public:
  using StatusCallback = std::function<void(const Status&)>;
  // `reply` is null when the request ended without one (a StatusReply, a failure).
  using LookupCallback = std::function<void(const Status&, const wire::LookupReply* reply)>;

  // Each returns the attempt it starts: a request asked again (under the
  // same number) is a new attempt, which `waiting` tells from the old one.
  uint64_t expectStatus(uint64_t request, int rank, StatusCallback done) {
    pending_[request] = Pending{rank, std::move(done), nullptr, ++attempts_};
    return attempts_;
  }
  uint64_t expectLookup(uint64_t request, int rank, LookupCallback done) {
    pending_[request] = Pending{rank, nullptr, std::move(done), ++attempts_};
    return attempts_;
  }
  // Whether `attempt` of `request` still waits for its answer.
  bool waiting(uint64_t request, uint64_t attempt) const {
    auto it = pending_.find(request);
    return it != pending_.end() && it->second.attempt == attempt;
  }
  // The rank whose answer `request` waits for; -1 if it waits for none.
  int rankOf(uint64_t request) const {
    auto it = pending_.find(request);
    return it == pending_.end() ? -1 : it->second.rank;
  }
  // Runs the request's callback (once) and forgets it; false if it waits for
  // nothing (answered already, or its asker gave up).
  bool answer(uint64_t request, const Status& status, const wire::LookupReply* reply = nullptr) {
    auto it = pending_.find(request);
    if (it == pending_.end()) return false;
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (p.onStatus) p.onStatus(status);
    if (p.onLookup) p.onLookup(status, reply);
    return true;
  }
  // Its asker no longer cares: no callback runs.
  void forget(uint64_t request) { pending_.erase(request); }
  // Gives a waiting status request another callback; false if none waits.
  bool replaceCallback(uint64_t request, StatusCallback done) {
    auto it = pending_.find(request);
    if (it == pending_.end() || !it->second.onStatus) return false;
    it->second.onStatus = std::move(done);
    return true;
  }
  // Answers every request to `rank` (-1: to anyone) with `why`.
  void failRank(int rank, const Status& why) {
    std::vector<uint64_t> failed;
    for (const auto& [request, p] : pending_) {
      if (rank < 0 || p.rank == rank) failed.push_back(request);
    }
    // A callback may answer or add others: each is looked up again.
    for (uint64_t request : failed) answer(request, why);
  }

 private:
  struct Pending {
    int rank;
    StatusCallback onStatus;  // exactly one of the two is set
    LookupCallback onLookup;
    uint64_t attempt;
  };
  std::unordered_map<uint64_t, Pending> pending_;
  uint64_t attempts_ = 0;
};

}  // namespace hoplite
