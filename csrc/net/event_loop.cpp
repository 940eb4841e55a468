#include "net/event_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
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

void EventLoop::start() {
  running_ = true;
  thread_ = std::thread([this] { run(); });
  // Wait until the thread id is known so inLoop() is exact from now on.
  while (threadId_ == std::thread::id()) std::this_thread::yield();
}

void EventLoop::stop() {
  if (!thread_.joinable()) return;
  running_ = false;
  wake();
  thread_.join();
}

void EventLoop::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    posted_.push_back(std::move(fn));
  }
  wake();
}

void EventLoop::wake() {
  uint64_t one = 1;
  ssize_t rc = ::write(wakeFd_, &one, sizeof(one));
  (void)rc;  // EAGAIN means a wake-up is already pending
}

EventLoop::TimerId EventLoop::addTimer(double seconds, std::function<void()> fn) {
  TimerId id = nextTimer_++;
  auto when = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  timerOrder_.emplace(when, id);
  timers_.emplace(id, std::move(fn));
  return id;
}

void EventLoop::cancelTimer(TimerId id) { timers_.erase(id); }

void EventLoop::addFd(int fd, uint32_t events, EventHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    HLOG(kError, "epoll add fd %d: %s", fd, std::strerror(errno));
  }
}

void EventLoop::modifyFd(int fd, uint32_t events, EventHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::removeFd(int fd) { epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr); }

void EventLoop::runPosted() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) fn();
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
    auto fnIt = timers_.find(id);
    if (fnIt == timers_.end()) continue;  // cancelled
    auto fn = std::move(fnIt->second);
    timers_.erase(fnIt);
    fn();
  }
  return -1;
}

void EventLoop::run() {
  threadId_ = std::this_thread::get_id();
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (true) {
    runPosted();
    int timeoutMs = runDueTimers();
    if (!running_) {
      runPosted();
      break;
    }
    int n = epoll_wait(epollFd_, events, kMaxEvents, timeoutMs);
    if (n < 0) {
      if (errno == EINTR) continue;
      HLOG(kError, "epoll_wait: %s", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      auto* handler = static_cast<EventHandler*>(events[i].data.ptr);
      if (handler == nullptr) {
        uint64_t v;
        while (::read(wakeFd_, &v, sizeof(v)) > 0) {
        }
        continue;
      }
      handler->handleEvents(events[i].events);
    }
  }
}

}  // namespace hoplite
