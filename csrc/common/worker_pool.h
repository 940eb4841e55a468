// A few threads for work off the event loop (memory copies; with one thread, a
// serial queue: tasks run in submission order).
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace hoplite {

class WorkerPool {
 public:
  // `name` (at most 15 characters) names the threads for top and perf; `nice`
  // > 0 lowers their scheduling priority (Linux per-thread nice).
  WorkerPool(const char* name, int threads, int nice = 0);
  ~WorkerPool();
  // After stop() the task runs on the caller's thread instead of never.
  void submit(std::function<void()> task);
  // Finishes queued tasks, then joins the threads. Called from one of them (a
  // task that dropped the pool's last owner), that thread finishes alone.
  void stop();

 private:
  struct State;  // shared with the threads, so it may outlive the pool
  std::shared_ptr<State> state_;
  std::vector<std::thread> threads_;
};

}  // namespace hoplite
