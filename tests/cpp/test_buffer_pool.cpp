// The buffer pool's cache: freed buffers are handed out again by size class,
// the cache never holds more than its bound, and when it is full the buffers
// freed longest ago make room, so a workload whose sizes change stops mapping
// fresh memory once its new sizes have been freed once; buffers left unused
// for a while are given back.
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "check.h"
#include "store/buffer_pool.h"

using namespace hoplite;

namespace {

constexpr size_t kMiB = 1u << 20;

void testAFreedBufferIsHandedOutAgain() {
  auto pool = std::make_shared<BufferPool>(8 * kMiB);
  uint8_t* first = pool->allocate(kMiB)->data();  // freed at once
  CHECK(pool->cachedBytes() == kMiB);
  auto again = pool->allocate(kMiB);
  CHECK(again->data() == first);
  CHECK(pool->mappedBytes() == kMiB);
  CHECK(pool->cachedBytes() == 0);
}

void testTheCacheStaysWithinItsBound() {
  auto pool = std::make_shared<BufferPool>(4 * kMiB);
  {
    std::vector<std::shared_ptr<Buffer>> held;
    for (int i = 0; i < 10; ++i) held.push_back(pool->allocate(kMiB));
    CHECK(pool->heldBytes() == 10 * kMiB);
  }
  CHECK(pool->cachedBytes() == 4 * kMiB);
  CHECK(pool->heldBytes() == 4 * kMiB);  // the other six were unmapped
  // Larger than the whole cache: never kept.
  { auto huge = pool->allocate(8 * kMiB); }
  CHECK(pool->cachedBytes() == 4 * kMiB);
  CHECK(pool->heldBytes() == 4 * kMiB);
}

void testNewSizesTakeTheRoomOfTheOldest() {
  auto pool = std::make_shared<BufferPool>(8 * kMiB);
  {
    std::vector<std::shared_ptr<Buffer>> small;
    for (int i = 0; i < 8; ++i) small.push_back(pool->allocate(kMiB));
  }
  CHECK(pool->cachedBytes() == 8 * kMiB);  // full of 1 MiB buffers
  const size_t mappedBefore = pool->mappedBytes();
  // The workload moves on to 4 MiB buffers: the first is mapped, and when it is
  // freed four of the old 1 MiB ones make room for it; every later one reuses it
  // (the kernel may hand back the same address after an unmap: count mappings).
  for (int i = 0; i < 5; ++i) pool->allocate(4 * kMiB);
  CHECK(pool->mappedBytes() == mappedBefore + 4 * kMiB);
  CHECK(pool->cachedBytes() == 8 * kMiB);
  CHECK(pool->heldBytes() == 8 * kMiB);
  // Four 1 MiB buffers are still there, without a fresh mapping.
  std::vector<std::shared_ptr<Buffer>> small;
  for (int i = 0; i < 4; ++i) small.push_back(pool->allocate(kMiB));
  CHECK(pool->mappedBytes() == mappedBefore + 4 * kMiB);
  CHECK(pool->cachedBytes() == 4 * kMiB);
}

void testTheOldestAreEvictedFirst() {
  auto pool = std::make_shared<BufferPool>(3 * kMiB);
  auto a = pool->allocate(kMiB);
  auto b = pool->allocate(kMiB);
  auto c = pool->allocate(kMiB);
  auto d = pool->allocate(kMiB);
  uint8_t* bData = b->data();
  uint8_t* cData = c->data();
  uint8_t* dData = d->data();
  a.reset();  // freed first: evicted when the fourth comes
  b.reset();
  c.reset();
  d.reset();
  CHECK(pool->cachedBytes() == 3 * kMiB);
  CHECK(pool->heldBytes() == 3 * kMiB);
  // Handed out newest first: d, c, b; then a fresh mapping.
  auto x = pool->allocate(kMiB);
  auto y = pool->allocate(kMiB);
  auto z = pool->allocate(kMiB);
  CHECK(pool->mappedBytes() == 4 * kMiB);  // no fresh mapping that could reuse an address
  CHECK(x->data() == dData);
  CHECK(y->data() == cData);
  CHECK(z->data() == bData);
  auto w = pool->allocate(kMiB);
  CHECK(pool->mappedBytes() == 5 * kMiB);
}

// Records what it locks and unlocks (no device needed).
struct FakeLocker : HostMemoryLocker {
  std::vector<void*> locked;
  std::vector<void*> unlocked;
  bool lock(void* data, size_t) override {
    locked.push_back(data);
    return true;
  }
  void unlock(void* data) override { unlocked.push_back(data); }
};

void testAnEvictedLockedBufferIsUnlocked() {
  auto pool = std::make_shared<BufferPool>(2 * kMiB);
  auto locker = std::make_shared<FakeLocker>();
  pool->setLocker(locker);
  auto a = pool->allocate(kMiB);
  uint8_t* aData = a->data();
  CHECK(pool->pageLock(*a));
  CHECK(pool->pageLock(*a));  // once per mapping
  CHECK(locker->locked.size() == 1);
  a.reset();
  CHECK(locker->unlocked.empty());  // cached, still locked
  { auto big = pool->allocate(2 * kMiB); }  // freed: evicts a
  CHECK(locker->unlocked.size() == 1 && locker->unlocked[0] == aData);
  CHECK(pool->cachedBytes() == 2 * kMiB);
}

void testBuffersLeftUnusedAreReleased() {
  using std::chrono::milliseconds;
  auto pool = std::make_shared<BufferPool>(8 * kMiB);
  auto a = pool->allocate(kMiB);
  auto b = pool->allocate(2 * kMiB);
  auto c = pool->allocate(kMiB);
  uint8_t* cData = c->data();
  a.reset();
  b.reset();
  std::this_thread::sleep_for(milliseconds(1000));
  c.reset();
  CHECK(pool->releaseIdle(milliseconds(500)) == 3 * kMiB);  // a and b, not c
  CHECK(pool->cachedBytes() == kMiB);
  CHECK(pool->heldBytes() == kMiB);
  CHECK(pool->allocate(kMiB)->data() == cData);  // still cached, handed out and freed again
  CHECK(pool->mappedBytes() == 4 * kMiB);
  CHECK(pool->releaseIdle(milliseconds(500)) == 0);  // freed just now
  CHECK(pool->releaseIdle(milliseconds(0)) == kMiB);
  CHECK(pool->cachedBytes() == 0);
  CHECK(pool->heldBytes() == 0);
  // What is handed out is never released, however long ago it was allocated.
  auto d = pool->allocate(kMiB);
  std::this_thread::sleep_for(milliseconds(50));
  CHECK(pool->releaseIdle(milliseconds(0)) == 0);
  CHECK(pool->heldBytes() == kMiB);
}

}  // namespace

int main() {
  testAFreedBufferIsHandedOutAgain();
  testTheCacheStaysWithinItsBound();
  testNewSizesTakeTheRoomOfTheOldest();
  testTheOldestAreEvictedFirst();
  testAnEvictedLockedBufferIsUnlocked();
  testBuffersLeftUnusedAreReleased();
  return finish("test_buffer_pool");
}
