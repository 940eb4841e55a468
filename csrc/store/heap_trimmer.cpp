#include "store/heap_trimmer.h"

#include <chrono>

#if defined(__GLIBC__)
#include <malloc.h>
#include <pthread.h>
#endif

namespace hoplite {

HeapTrimmer::HeapTrimmer(double intervalSeconds, std::function<void()> beforeTrim)
    : beforeTrim_(std::move(beforeTrim)) {
  if (intervalSeconds > 0) thread_ = std::thread([this, intervalSeconds] { run(intervalSeconds); });
}

HeapTrimmer::~HeapTrimmer() { stop(); }

void HeapTrimmer::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HeapTrimmer::run(double intervalSeconds) {
#if defined(__GLIBC__)
  pthread_setname_np(pthread_self(), "hoplite-trim");
#endif
  const auto interval = std::chrono::duration<double>(intervalSeconds);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, interval, [this] { return stopping_; })) {
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    if (beforeTrim_) beforeTrim_();
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    const auto spent = std::chrono::steady_clock::now() - start;
    trimMicros_ += std::chrono::duration_cast<std::chrono::microseconds>(spent).count();
    trims_++;
    lock.lock();
  }
}

}  // namespace hoplite
