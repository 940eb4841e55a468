#include "store/object_store.h"

#include <new>
#include <vector>

namespace hoplite {

ObjectStore::ObjectStore(std::shared_ptr<BufferPool> pool, uint64_t capacityBytes, EvictCallback onEvict)
    : pool_(std::move(pool)), capacity_(capacityBytes), onEvict_(std::move(onEvict)) {}

namespace {
// A copy that may go: complete, not primary, and nobody streams from or into
// it or holds its memory (a zero-copy get's tensor would keep it mapped).
bool evictable(const std::shared_ptr<LocalObject>& obj) {
  return obj.use_count() == 1 && !obj->primary() && obj->complete() && obj->buffer().use_count() == 1;
}
}  // namespace

bool ObjectStore::makeRoom(uint64_t bytes, std::vector<std::string>* evicted) {
  if (used_ + bytes <= capacity_) return true;
  // Evict only if that makes enough room.
  uint64_t freeable = 0;
  for (const auto& [id, entry] : objects_) {
    if (evictable(entry.object)) freeable += entry.charged;
  }
  if (bytes > capacity_ || used_ - freeable + bytes > capacity_) return false;
  // Walk from the least recently used end.
  auto it = lru_.end();
  while (used_ + bytes > capacity_ && it != lru_.begin()) {
    --it;
    const Entry& entry = objects_.at(*it);
    if (!evictable(entry.object)) continue;
    used_ -= entry.charged;
    evicted->push_back(*it);
    std::string id = *it;
    it = lru_.erase(it);
    objects_.erase(id);
  }
  return used_ + bytes <= capacity_;
}

Status ObjectStore::create(const std::string& id, const ObjectMeta& meta, bool primary,
                           std::shared_ptr<LocalObject>* out, std::shared_ptr<Buffer> borrowed,
                           bool sharedWithStored) {
  const uint64_t charge = sharedWithStored && borrowed ? 0 : meta.nbytes;
  std::vector<std::string> evicted;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (objects_.count(id)) {
      status = Status(Code::kAlreadyExists, "object " + printableId(id) + " already exists on this node");
    } else if (!makeRoom(charge, &evicted)) {
      status = Status(Code::kCapacity, "no room for object " + printableId(id) + " of " +
                                           std::to_string(meta.nbytes) + " bytes: store holds " +
                                           std::to_string(used_) + " of " + std::to_string(capacity_) +
                                           " bytes in copies that cannot be evicted");
    } else {
      used_ += charge;  // reserved; the buffer is mapped outside the lock
    }
  }
  for (const auto& e : evicted) onEvict_(e);
  if (!status.ok()) return status;

  std::shared_ptr<Buffer> buffer = std::move(borrowed);
  try {
    if (!buffer) buffer = pool_->allocate(meta.nbytes);
  } catch (const std::bad_alloc&) {
    std::lock_guard<std::mutex> lock(mutex_);
    used_ -= charge;
    return Status(Code::kCapacity, "out of memory allocating " + std::to_string(meta.nbytes) + " bytes for object " +
                                       printableId(id));
  }
  auto obj = std::make_shared<LocalObject>(id, meta, std::move(buffer), primary);
  std::lock_guard<std::mutex> lock(mutex_);
  if (objects_.count(id)) {  // lost a race with another creator of the same id
    used_ -= charge;
    return Status(Code::kAlreadyExists, "object " + printableId(id) + " already exists on this node");
  }
  lru_.push_front(id);
  objects_.emplace(id, Entry{obj, lru_.begin(), charge});
  *out = std::move(obj);
  return Status();
}

std::shared_ptr<LocalObject> ObjectStore::find(const std::string& id, std::shared_ptr<Buffer>* pin) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = objects_.find(id);
  if (it == objects_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  if (pin) *pin = it->second.object->buffer();
  return it->second.object;
}

std::shared_ptr<LocalObject> ObjectStore::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = objects_.find(id);
  return it == objects_.end() ? nullptr : eraseLocked(it);
}

bool ObjectStore::removeUnshared(const LocalObject& object) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = objects_.find(object.id());
  if (it == objects_.end() || it->second.object.get() != &object || object.buffer().use_count() != 1) return false;
  eraseLocked(it);
  return true;
}

std::shared_ptr<LocalObject> ObjectStore::eraseLocked(std::unordered_map<std::string, Entry>::iterator it) {
  auto obj = std::move(it->second.object);
  used_ -= it->second.charged;
  lru_.erase(it->second.lru);
  objects_.erase(it);
  return obj;
}

uint64_t ObjectStore::usedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

size_t ObjectStore::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return objects_.size();
}

std::vector<std::shared_ptr<LocalObject>> ObjectStore::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<LocalObject>> all;
  all.reserve(objects_.size());
  for (const auto& [id, entry] : objects_) all.push_back(entry.object);
  return all;
}

}  // namespace hoplite
