#include "store/buffer_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace hoplite {
namespace {

constexpr size_t kPage = 4096;
// Below this, buffers come from malloc (cheap); above, from mmap (page aligned,
// returned to the kernel whole). No MADV_HUGEPAGE: a huge page needs a free 2 MB
// block, and a guest whose hypervisor takes back free blocks (free page
// reporting) pays a host fault per page on first touch of one: five times the
// cost of small pages (benchmarks/README.md, "Fresh memory").
constexpr size_t kMapThreshold = 256u << 10;

uint8_t* mapMemory(size_t capacity) {
  if (capacity < kMapThreshold) {
    void* p = std::aligned_alloc(kPage, capacity);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<uint8_t*>(p);
  }
  void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return static_cast<uint8_t*>(p);
}

void unmapMemory(uint8_t* data, size_t capacity) {
  if (capacity < kMapThreshold) {
    std::free(data);
  } else {
    ::munmap(data, capacity);
  }
}

}  // namespace

BufferPool::~BufferPool() {
  for (const Cached& c : cached_) unmap(c.data, c.capacity);
}

void BufferPool::setLocker(std::shared_ptr<HostMemoryLocker> locker) {
  std::lock_guard<std::mutex> lock(lockMutex_);
  locker_ = std::move(locker);
}

bool BufferPool::pageLock(const Buffer& buffer) {
  if (buffer.pool() != this || buffer.capacity() == 0) return false;
  std::lock_guard<std::mutex> lock(lockMutex_);
  if (!locker_) return false;
  auto [it, fresh] = locked_.emplace(buffer.data(), false);
  if (fresh) it->second = locker_->lock(buffer.data(), buffer.capacity());
  return it->second;
}

void BufferPool::unmap(uint8_t* data, size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(lockMutex_);
    auto it = locked_.find(data);
    if (it != locked_.end()) {
      if (it->second) locker_->unlock(data);
      locked_.erase(it);
    }
  }
  unmapMemory(data, capacity);
  std::lock_guard<std::mutex> lock(mutex_);
  heldBytes_ -= capacity;
}

size_t BufferPool::sizeClass(size_t size) {
  if (size <= kPage) return kPage;
  size_t power = kPage;
  while (power * 2 < size) power *= 2;
  size_t step = power / 8 < kPage ? kPage : power / 8;
  return (size + step - 1) / step * step;
}

std::shared_ptr<Buffer> BufferPool::allocate(size_t size) {
  size_t capacity = sizeClass(size);
  uint8_t* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(capacity);
    if (it != free_.end() && !it->second.empty()) {
      CachedList::iterator newest = it->second.back();
      it->second.pop_back();
      data = newest->data;
      cached_.erase(newest);
      cachedBytes_ -= capacity;
    }
  }
  if (data == nullptr) {
    data = mapMemory(capacity);
    std::lock_guard<std::mutex> lock(mutex_);
    mappedBytes_ += capacity;
    heldBytes_ += capacity;
  }
  auto pool = shared_from_this();
  return std::make_shared<Buffer>(data, size, capacity, this, [pool, data, capacity] { pool->release(data, capacity); });
}

void BufferPool::release(uint8_t* data, size_t capacity) {
  if (capacity > maxCachedBytes_) return unmap(data, capacity);
  std::vector<Cached> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Timed under the lock: cached_ stays in order of freedAt, which releaseIdle relies on.
    const Cached freed{data, capacity, std::chrono::steady_clock::now()};
    free_[capacity].push_back(cached_.insert(cached_.end(), freed));
    cachedBytes_ += capacity;
    while (cachedBytes_ > maxCachedBytes_) evicted.push_back(takeOldest());
  }
  // Outside the lock: munmap takes time. One large buffer may evict many small
  // ones here, on the thread that freed it (the loop's, when the store drops a copy).
  for (const Cached& c : evicted) unmap(c.data, c.capacity);
}

BufferPool::Cached BufferPool::takeOldest() {
  const Cached oldest = cached_.front();
  free_[oldest.capacity].pop_front();  // its class's oldest: the one at cached_'s front
  cached_.pop_front();
  cachedBytes_ -= oldest.capacity;
  return oldest;
}

size_t BufferPool::releaseIdle(std::chrono::steady_clock::duration idleFor) {
  const auto freedBefore = std::chrono::steady_clock::now() - idleFor;
  std::vector<Cached> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!cached_.empty() && cached_.front().freedAt <= freedBefore) idle.push_back(takeOldest());
  }
  size_t bytes = 0;
  for (const Cached& c : idle) {
    unmap(c.data, c.capacity);
    bytes += c.capacity;
  }
  return bytes;
}

size_t BufferPool::mappedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mappedBytes_;
}

size_t BufferPool::heldBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return heldBytes_;
}

size_t BufferPool::cachedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cachedBytes_;
}

}  // namespace hoplite
