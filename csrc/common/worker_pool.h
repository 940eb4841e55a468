// A few threads for memory copies, so the event loop never stalls on a memcpy.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hoplite {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  void submit(std::function<void()> task);
  // Finishes queued tasks, then joins the threads.
  void stop();

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace hoplite
