// The node's local copies, bounded by a capacity in bytes. Primary copies (made
// by put) stay until deleted; other copies are evicted least-recently-used when
// room is needed. Thread-safe: put creates objects from the caller's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/buffer_pool.h"
#include "store/local_object.h"

namespace hoplite {

class ObjectStore {
 public:
  using EvictCallback = std::function<void(const std::string& id)>;

  ObjectStore(std::shared_ptr<BufferPool> pool, uint64_t capacityBytes, EvictCallback onEvict);

  // Reserves room (evicting if needed) and allocates the buffer, or adopts
  // `borrowed` memory. Fails with kAlreadyExists if the id is present, kCapacity
  // if no room can be made. `sharedWithStored`: the borrowed buffer is another
  // stored object's, already counted against the capacity.
  Status create(const std::string& id, const ObjectMeta& meta, bool primary, std::shared_ptr<LocalObject>* out,
                std::shared_ptr<Buffer> borrowed = nullptr, bool sharedWithStored = false);
  // Marks it recently used. `pin`: also a reference to its memory, taken under
  // the store's lock, for readers off the loop thread (see removeUnshared).
  std::shared_ptr<LocalObject> find(const std::string& id, std::shared_ptr<Buffer>* pin = nullptr);
  std::shared_ptr<LocalObject> remove(const std::string& id);
  // Removes `object` if it is still the stored copy and nothing else owns its
  // memory (no pinned reader, memory lent, send in flight or tensor handed
  // out), so that its buffer can be given away; false (nothing done) otherwise.
  bool removeUnshared(const LocalObject& object);

  uint64_t usedBytes() const;
  uint64_t capacityBytes() const { return capacity_; }
  size_t count() const;
  std::vector<std::shared_ptr<LocalObject>> snapshot() const;  // every copy, in no order

 private:
  struct Entry {
    std::shared_ptr<LocalObject> object;
    std::list<std::string>::iterator lru;
    uint64_t charged;  // bytes counted in used_
  };
  bool makeRoom(uint64_t bytes, std::vector<std::string>* evicted);
  std::shared_ptr<LocalObject> eraseLocked(std::unordered_map<std::string, Entry>::iterator it);

  std::shared_ptr<BufferPool> pool_;
  const uint64_t capacity_;
  EvictCallback onEvict_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> objects_;
  std::list<std::string> lru_;  // front: most recently used
  uint64_t used_ = 0;
};

}  // namespace hoplite
