#include "net/event_loop.h"

#include <cstdio>
#include <cstdlib>

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/logging.h"

namespace hoplite {

EventLoop::EventLoop() {
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epollFd_ < 0 || wakeFd_ < 0) throw std::runtime_error(std::string("event loop: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // nullptr marks the wake-up fd
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev);
}

EventLoop::~EventLoop() {
  stop();
  ::close(wakeFd_);
  ::close(epollFd_);
}

void abortOffLoop(const char* file, int line, const char* function) {
  std::fprintf(stderr, "hoplite: %s (%s:%d) ran off the event loop thread\n", function, file, line);
  std::abort();
}

void EventLoop::start() {
  running_ = true;
  thread_ = std::thread([this] { run(); });
  ::pthread_setname_np(thread_.native_handle(), "hoplite-loop");
}

void EventLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    accepting_ = false;
  }
  if (!thread_.joinable()) return;
  running_ = false;
  wake();
  thread_.join();
}

bool EventLoop::post(std::function<void()> fn) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!accepting_) return false;
    first = posted_.empty();
    posted_.push_back(std::move(fn));
  }
  if (first) wake();  // else the one who posted first wakes the loop
  return true;
}

void EventLoop::runSoon(std::function<void()> fn) { soon_.push_back(std::move(fn)); }

void EventLoop::runSoonTasks() {
  std::vector<std::function<void()>> batch;
  batch.swap(soon_);
  for (auto& fn : batch) guarded(fn);
}

void EventLoop::wake() {
  uint64_t one = 1;
  ssize_t rc = ::write(wakeFd_, &one, sizeof(one));
  (void)rc;  // EAGAIN means a wake-up is already pending
}

EventLoop::TimerId EventLoop::addTimer(double seconds, std::function<void()> fn) {
  TimerId id = nextTimer_++;
  seconds = std::max(0.0, std::min(seconds, 365.0 * 86400));  // no overflow for huge or NaN-free inputs
  auto when = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  auto order = timerOrder_.emplace(when, id);
  timers_.emplace(id, Timer{std::move(fn), order});
  return id;
}

void EventLoop::cancelTimer(TimerId id) {
  auto it = timers_.find(id);
  if (it == timers_.end()) return;
  timerOrder_.erase(it->second.order);
  timers_.erase(it);
}

bool EventLoop::addFd(int fd, uint32_t events, EventHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    HLOG(kError, "epoll add fd %d: %s", fd, std::strerror(errno));
    return false;
  }
  return true;
}

void EventLoop::modifyFd(int fd, uint32_t events, EventHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::removeFd(int fd) { epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr); }

namespace {
// Stands in for a handler forgotten in the middle of a batch.
struct IgnoredEvents : EventHandler {
  void handleEvents(uint32_t) override {}
} ignoredEvents;
}  // namespace

void EventLoop::forget(const EventHandler* handler) {
  for (int i = batchNext_; i < batchEnd_; ++i) {
    if (batch_[i].data.ptr == handler) batch_[i].data.ptr = &ignoredEvents;
  }
}

void EventLoop::runPosted() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) guarded(fn);
}

void EventLoop::guarded(const std::function<void()>& fn) {
  // An exception must not take the process down with the loop thread.
  try {
    fn();
  } catch (const std::exception& e) {
    HLOG(kError, "event loop task failed: %s", e.what());
  }
}

int EventLoop::runDueTimers() {
  while (!timerOrder_.empty()) {
    auto it = timerOrder_.begin();
    auto now = Clock::now();
    if (it->first > now) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(it->first - now).count();
      return static_cast<int>(ms) + 1;
    }
    TimerId id = it->second;
    timerOrder_.erase(it);
    auto timer = timers_.find(id);
    auto fn = std::move(timer->second.fn);
    timers_.erase(timer);
    guarded(fn);
  }
  return -1;
}

void EventLoop::run() {
  loopThread_ = std::this_thread::get_id();
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (true) {
    runPosted();
    // One batch per turn: what soon tasks queue waits for the timers, posts and
    // events at hand (a UCX worker that progresses soon after every send it
    // makes would otherwise hold the loop for as long as data flows).
    runSoonTasks();
    int timeoutMs = runDueTimers();  // (what the soon tasks armed counts for the wait)
    if (!soon_.empty()) timeoutMs = 0;
    if (!running_) {
      runPosted();
      while (!soon_.empty()) runSoonTasks();
      break;
    }
    int n = epoll_wait(epollFd_, events, kMaxEvents, timeoutMs);
    if (n < 0) {
      if (errno == EINTR) continue;
      HLOG(kError, "epoll_wait: %s", std::strerror(errno));
      break;
    }
    batch_ = events;
    batchEnd_ = n;
    for (int i = 0; i < n; ++i) {
      batchNext_ = i + 1;
      auto* handler = static_cast<EventHandler*>(events[i].data.ptr);
      if (handler == nullptr) {
        uint64_t v;
        while (::read(wakeFd_, &v, sizeof(v)) > 0) {
        }
        continue;
      }
      try {
        handler->handleEvents(events[i].events);
      } catch (const std::exception& e) {
        HLOG(kError, "event handler failed: %s", e.what());
      }
    }
    batchEnd_ = 0;
  }
}

}  // namespace hoplite
