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

 private:
  void run();
  void wake();
  void runPosted();
  void runSoonTasks();
  static void guarded(const std::function<void()>& fn);
  int runDueTimers();  // returns ms until the next timer, or -1

  int epollFd_ = -1;
  int wakeFd_ = -1;
  std::thread thread_;
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
