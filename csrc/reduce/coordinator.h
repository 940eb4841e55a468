// Streaming reduce, the coordinator's side: the caller's node locates the
// inputs, puts each into the next tree position as it becomes ready, and
// sends a task to the node holding it (task_runner.h). The coordinator
// follows every task until the result is complete, so that it can redo
// positions when a participant dies (coordinator_recovery.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "net/event_loop.h"
#include "reduce/link_estimator.h"
#include "reduce/reduce_services.h"
#include "reduce/reduce_state.h"
#include "reduce/reduce_types.h"

namespace hoplite {

struct CoordinatorConfig {
  int rank = 0;
  int worldSize = 1;
  uint64_t incarnation = 0;   // part of partial results' ids (unique across restarts)
  uint64_t maxControl = 0;    // largest control frame: a task must fit
  double heartbeatTimeoutSeconds = 10;  // a roll call's wait for answers
};

class ReduceCoordinator {
 public:
  ReduceCoordinator(EventLoop& loop, ReduceServices& node, CoordinatorConfig config, LinkEstimator& link);

  // Public calls (any thread): see Node::reduce and Node::reduceOutcome.
  Status reduce(const ReduceRequest& request, ReducePlan* plan);
  Status reduceOutcome(const std::string& resultId, double timeoutSeconds, ReducePlan* plan);

  // Loop thread: every reduce still coordinated here fails with `why`.
  void shutDown(const Status& why);

  struct Counters {
    std::atomic<uint64_t> coordinated{0};
    std::atomic<uint64_t> recoveries{0};  // reduces that redid positions after a participant died
  };
  const Counters& counters() const { return counters_; }

 private:
  void startReduce(uint64_t key);
  void onInput(uint64_t key, int index, const Status& status, const wire::LookupReply* reply);
  // Locates an input again (its holder died): a copy elsewhere, or one put again later.
  void relocateInput(uint64_t key, int index, int deadHolder, double delaySeconds = 0);
  // Fills vacant positions with located inputs (the first pass in arrival order).
  void launchReadyInputs(uint64_t key);
  // Fixes the tree on the first input and checks each input against it;
  // false when the reduce failed.
  bool planInput(uint64_t key, const ReduceInput& input);
  void assignInput(uint64_t key, int position, const ReduceInput& input);
  // Sends the position's task; false when that failed the reduce.
  bool sendTask(uint64_t key, int position);
  std::string partialOutputId(const ReduceCoordination& c, int position) const;
  void armInputTimer(uint64_t key);
  std::string unreachedShard(const std::string& id);
  void onTaskRegistered(uint64_t key, int position, int generation, const Status& status);
  // What a task that has not started yet waits for (its stall note), kept for the timeout's message.
  void onStallNote(uint64_t key, int position, int generation, const Status& status);
  void onTaskEnd(uint64_t key, int position, int generation, const Status& status);
  void onTaskFailed(uint64_t key, int position, const Status& status);
  void maybeReturn(uint64_t key);
  // What a reduce still waits for, for a timeout's message.
  std::string describeProgress(const ReduceCoordination& c) const;
  void endReduce(uint64_t key, const Status& outcome);  // complete (ok) or failed
  void remember(ReduceCoordination& c, const Status& outcome);
  // Recovery: after a task failed because a participant died, ask every
  // participant whether it is alive, then redo the positions that depended on
  // the dead (coordinator_recovery.cpp).
  void startRollCall(uint64_t key, const Status& why);
  void recover(uint64_t key, const std::set<int>& dead);

  EventLoop& loop_;
  ReduceServices& node_;
  const CoordinatorConfig config_;
  LinkEstimator& link_;

  // Loop-thread state.
  uint64_t nextReduce_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<ReduceCoordination>> reduces_;
  // How recent reduces coordinated here ended, for reduceOutcome (bounded).
  std::unordered_map<std::string, std::pair<Status, ReducePlan>> history_;
  std::deque<std::string> historyOrder_;
  Counters counters_;
};

}  // namespace hoplite
