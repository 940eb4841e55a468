// One epoll loop thread per node. All connection and node state is touched only
// from this thread; other threads hand it work with post(). Idle means blocked in
// epoll_wait: no polling, no periodic wake-ups unless a timer is armed.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace hoplite {

// Loop-owned state checks its thread in debug builds (HOPLITE_DEBUG_BUILD=1):
// a call from another thread aborts naming the place.
[[noreturn]] void abortOffLoop(const char* file, int line, const char* function);
#ifdef HOPLITE_DEBUG
#define HOPLITE_ASSERT_ON_LOOP(loop) \
  ((loop).onLoopThread() ? (void)0 : ::hoplite::abortOffLoop(__FILE__, __LINE__, __func__))
#else
#define HOPLITE_ASSERT_ON_LOOP(loop) ((void)0)
#endif

class EventHandler {
 public:
  virtual ~EventHandler() = default;
  virtual void handleEvents(uint32_t events) = 0;
};

class EventLoop {
 public:
  using Clock = std::chrono::steady_clock;
  using TimerId = uint64_t;

  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void start();
  // Whether the caller runs on the loop thread (for HOPLITE_ASSERT_ON_LOOP).
  bool onLoopThread() const { return std::this_thread::get_id() == loopThread_.load(); }
  // Runs what was already posted, then stops the thread and joins it.
  void stop();
  // False once stop() began: the task will never run.
  bool post(std::function<void()> fn);
  // Loop thread only: runs `fn` once the events and tasks at hand are handled,
  // before the loop waits again (e.g. one write for what several handlers queued).
  void runSoon(std::function<void()> fn);

  TimerId addTimer(double seconds, std::function<void()> fn);
  void cancelTimer(TimerId id);

  bool addFd(int fd, uint32_t events, EventHandler* handler);
  void modifyFd(int fd, uint32_t events, EventHandler* handler);
  void removeFd(int fd);
  // Loop thread only: the events of the batch at hand not yet handled for
  // `handler` are dropped. A handler destroyed while the loop handles a batch
  // calls it, so that no later event of that batch reaches it.
  void forget(const EventHandler* handler);

 private:
  void run();
  void wake();
  void runPosted();
  void runSoonTasks();
  static void guarded(const std::function<void()>& fn);
  int runDueTimers();  // returns ms until the next timer, or -1

  int epollFd_ = -1;
  int wakeFd_ = -1;
  epoll_event* batch_ = nullptr;  // the events being handled (loop thread only)
  int batchNext_ = 0, batchEnd_ = 0;
  std::thread thread_;
  std::atomic<std::thread::id> loopThread_{};  // set by the loop thread itself, first
  std::atomic<bool> running_{false};

  std::mutex mutex_;
  std::vector<std::function<void()>> posted_;
  bool accepting_ = true;
  std::vector<std::function<void()>> soon_;  // loop thread only

  struct Timer {
    std::function<void()> fn;
    std::multimap<Clock::time_point, TimerId>::iterator order;
  };
  TimerId nextTimer_ = 1;
  std::multimap<Clock::time_point, TimerId> timerOrder_;
  std::unordered_map<TimerId, Timer> timers_;
};

}  // namespace hoplite
