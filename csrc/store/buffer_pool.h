// Reusable, page-aligned buffers. Fresh anonymous memory costs a page fault per
// page on first touch (measured here to cost more than the transfer itself), so
// freed buffers are kept by size class and handed out again. When the cache is
// full, the buffers freed longest ago make room, so a workload whose sizes
// change is served from the cache again once its new sizes were freed once.
// Buffers left unused for a while are given back (`releaseIdle`), so a process
// whose workload settles holds its working set, not the cache's bound.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace hoplite {

// Memory holding one object's bytes: from the pool, or borrowed from the caller
// (a zero-copy put), released through `release` when the last user lets go.
class Buffer {
 public:
  Buffer(uint8_t* data, size_t size, std::function<void()> release)
      : data_(data), size_(size), release_(std::move(release)) {}
  // A pool's buffer: `capacity` bytes mapped at `data`, of which `size` are used.
  Buffer(uint8_t* data, size_t size, size_t capacity, const void* pool, std::function<void()> release)
      : data_(data), size_(size), capacity_(capacity), pool_(pool), release_(std::move(release)) {}
  ~Buffer() {
    if (release_) release_();
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  const void* pool() const { return pool_; }

 private:
  uint8_t* data_;
  size_t size_;
  size_t capacity_ = 0;
  const void* pool_ = nullptr;  // the BufferPool it came from; none for borrowed memory
  std::function<void()> release_;
};

// Page-locks host memory so a device's DMA engine can copy from and to it
// asynchronously (cudaHostRegister in CUDA builds). Both calls are thread-safe.
class HostMemoryLocker {
 public:
  virtual ~HostMemoryLocker() = default;
  virtual bool lock(void* data, size_t size) = 0;
  virtual void unlock(void* data) = 0;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // `maxCachedBytes`: how much freed memory to keep for reuse.
  explicit BufferPool(size_t maxCachedBytes) : maxCachedBytes_(maxCachedBytes) {}
  ~BufferPool();

  // Thread-safe. Throws std::bad_alloc when memory cannot be mapped.
  std::shared_ptr<Buffer> allocate(size_t size);
  size_t cachedBytes() const;
  // Unmaps the cached buffers freed `idleFor` or longer ago; returns their bytes.
  size_t releaseIdle(std::chrono::steady_clock::duration idleFor);
  // Bytes mapped fresh from the kernel so far (each costs first-touch faults).
  size_t mappedBytes() const;
  // Bytes the pool holds now: in buffers handed out and in its cache.
  size_t heldBytes() const;

  // Device copies use page-locked buffers where `locker` can lock them.
  void setLocker(std::shared_ptr<HostMemoryLocker> locker);
  // Page-locks one of this pool's buffers, once per mapping: it stays locked
  // while cached and is unlocked before it is unmapped. False for memory not
  // from this pool, without a locker, or when locking failed: copies to and
  // from it still work, staged by the driver.
  bool pageLock(const Buffer& buffer);

  // Rounds up to a size class: multiples of 1/8 of the enclosing power of two.
  static size_t sizeClass(size_t size);

 private:
  struct Cached {
    uint8_t* data;
    size_t capacity;
    std::chrono::steady_clock::time_point freedAt;
  };
  using CachedList = std::list<Cached>;

  void release(uint8_t* data, size_t capacity);
  // Takes the buffer freed longest ago out of the cache (mutex_ held).
  Cached takeOldest();
  void unmap(uint8_t* data, size_t capacity);

  const size_t maxCachedBytes_;
  mutable std::mutex mutex_;
  CachedList cached_;  // freed longest ago first
  // By size class, freed last at the back: handed out from there (warmest),
  // evicted from the front (which is where cached_ begins for that class).
  std::map<size_t, std::deque<CachedList::iterator>> free_;
  size_t cachedBytes_ = 0;
  size_t mappedBytes_ = 0;
  size_t heldBytes_ = 0;
  // Separate from mutex_: locking takes milliseconds and must not hold up allocations.
  std::mutex lockMutex_;
  std::shared_ptr<HostMemoryLocker> locker_;
  std::map<uint8_t*, bool> locked_;  // mapping -> locked (false: locking failed, not tried again)
};

}  // namespace hoplite
