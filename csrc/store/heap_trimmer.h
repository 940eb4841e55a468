// Gives the kernel back the pages that glibc's malloc keeps in its heaps after
// they were freed. A process that frees tensors of a few MiB at a high rate
// (the program's own, which torch_hoplite does not allocate) otherwise grows
// for as long as it runs under glibc's defaults: large freed chunks stay in the heaps,
// pinned between small live ones. A thread of its own, every interval, first
// runs the owner's `beforeTrim` (the node's: the buffer pool gives back what it
// cached and left unused since the last trim), then calls malloc_trim(0) (only
// with glibc).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace hoplite {

class HeapTrimmer {
 public:
  // intervalSeconds <= 0: never trims (no thread).
  HeapTrimmer(double intervalSeconds, std::function<void()> beforeTrim);
  ~HeapTrimmer();
  HeapTrimmer(const HeapTrimmer&) = delete;
  HeapTrimmer& operator=(const HeapTrimmer&) = delete;
  // Ends the thread (at once, between calls); later calls do nothing.
  void stop();

  uint64_t trims() const { return trims_.load(); }
  // Time spent trimming so far (malloc_trim holds each arena's lock in turn), µs.
  uint64_t trimMicros() const { return trimMicros_.load(); }

 private:
  void run(double intervalSeconds);

  const std::function<void()> beforeTrim_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<uint64_t> trims_{0};
  std::atomic<uint64_t> trimMicros_{0};
  std::thread thread_;
};

}  // namespace hoplite
