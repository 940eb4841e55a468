// The tree positions of streaming reduces that this node computes: each
// streams `input op children` chunk by chunk into its own output object,
// which its parent fetches like any object while it is being written; the
// root's output is the result. Tasks arrive as ReduceTask messages from their
// coordinator (coordinator.h, possibly on this node). Loop thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <unordered_map>

#include "coll/device_reducer.h"
#include "common/worker_pool.h"
#include "net/event_loop.h"
#include "net/message_router.h"
#include "reduce/reduce_services.h"
#include "reduce/reduce_state.h"
#include "store/buffer_pool.h"
#include "store/object_store.h"

namespace hoplite {

class ReduceTaskRunner {
 public:
  ReduceTaskRunner(EventLoop& loop, ReduceServices& node, int rank, ObjectStore& store, BufferPool& pool,
                   WorkerPool& workers);

  // Reduce steps over objects put from a device run on it through `reducer`
  // (CUDA builds); set before the node takes part in a reduce.
  void setDeviceReducer(std::shared_ptr<DeviceReducer> reducer) { deviceReducer_ = std::move(reducer); }
  void registerHandlers(MessageRouter& router);
  // Its coordinator died: the partial results it had this node compute go.
  void dropPartialResultsOf(int coordinator);
  // Tasks whose coordinator's connection closed (`closed`, or any that is
  // gone) fail: the coordinator computes their positions again.
  void failOrphanedTasks(const Connection* closed = nullptr);
  // This node resumed from a stall or a cut-off, which its peers most likely
  // took for its death: the tasks of other nodes' reduces fail (those
  // coordinators computed them elsewhere, and a stale root would publish a
  // result they moved on from), as do those that were waiting to be read.
  void abandonRemoteTasks();
  // Every task fails with `why`.
  void shutDown(const Status& why);

  struct Counters {
    std::atomic<uint64_t> tasks{0}, bytes{0};
    std::atomic<uint64_t> abandoned{0};  // of tasks, given up after a stall or a cut-off (abandonRemoteTasks)
    std::atomic<uint64_t> bytesOnDevice{0};  // of bytes, computed by the DeviceReducer
  };
  const Counters& counters() const { return counters_; }

 private:
  void handleTask(Connection& conn, const wire::ReduceTask& msg);
  void handleAbort(Connection& conn, const wire::ReduceAbort& msg);
  void startTask(uint64_t task, std::shared_ptr<LocalObject> input);
  void startTaskInputs(uint64_t task);
  void answerTask(ReduceTaskState& task, const Status& status);
  void reportTaskEnd(const ReduceTaskState& task, const Status& status);
  // Tells the coordinator what the task, not registered yet, waits for.
  void sendStallNote(const ReduceTaskState& task);
  void watchTaskObject(uint64_t task, const std::shared_ptr<LocalObject>& obj);
  void progressTask(uint64_t task);
  // The task's output is valid up to `to`: traced, then its readers woken.
  void advanceOutput(ReduceTaskState& task, uint64_t to);
  void finishTask(uint64_t task);
  void failTask(uint64_t task, const Status& why);
  // Fails every task `doomed` picks, each with `why` of it; returns how many.
  size_t failTasksWhere(const std::function<bool(const ReduceTaskState&)>& doomed,
                        const std::function<Status(const ReduceTaskState&)>& why);
  void closeRoot(const std::shared_ptr<ReduceTaskState>& task);
  // Its coordinator's process is alive as far as this node knows.
  bool coordinatorLives(const ReduceTaskState& task);
  static bool orphaned(const ReduceTaskState& task, const Connection* closed = nullptr);

  EventLoop& loop_;
  ReduceServices& node_;
  const int rank_;
  ObjectStore& store_;
  BufferPool& pool_;
  WorkerPool& workers_;
  std::shared_ptr<DeviceReducer> deviceReducer_;
  uint64_t nextTask_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<ReduceTaskState>> tasks_;
  std::mt19937_64 tokens_{std::random_device{}()};  // registration tokens (ReduceTaskState::token)
  Counters counters_;
};

}  // namespace hoplite
