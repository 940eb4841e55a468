#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <memory_resource>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace hoplite {

// A bounded memory of ids, the oldest forgotten first: what a shard remembers
// of objects that are gone, and what it keeps as another shard's standby.
//
// Its entries are made on the event loop for every delete and live until
// `capacity` newer ones came, so they come from a pool of their own. Taken one
// by one from malloc they would be scattered through the process's main heap
// (through its thread cache the loop reuses small blocks that the caller's
// thread freed) and would keep the holes that large tensors leave there from
// being merged and reused: the heap would grow by hundreds of MiB.
template <class Record>
class RecentIds {
 public:
  // The pool keeps what it took from malloc until destroyed: at most what
  // `capacity` entries needed at once.
  explicit RecentIds(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  RecentIds(const RecentIds&) = delete;
  RecentIds& operator=(const RecentIds&) = delete;

  Record* find(std::string_view id) {
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : &it->second.record;
  }
  const Record* find(std::string_view id) const {
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : &it->second.record;
  }
  bool contains(std::string_view id) const { return entries_.find(id) != entries_.end(); }

  // Remembers `record` for `id` as the newest entry, in place of what was
  // remembered for it; beyond capacity the oldest entry is forgotten.
  Record& remember(std::string_view id, Record record) {
    auto it = entries_.find(id);
    if (it != entries_.end()) {
      order_.erase(it->second.age);
      it->second.record = std::move(record);
    } else {
      it = entries_.emplace(std::piecewise_construct, std::forward_as_tuple(id),
                            std::forward_as_tuple(std::move(record), order_.end()))
               .first;
    }
    it->second.age = order_.insert(order_.end(), &it->first);
    while (entries_.size() > capacity_) forget(*order_.front());
    return it->second.record;
  }

  bool forget(std::string_view id) {
    auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    order_.erase(it->second.age);
    entries_.erase(it);
    return true;
  }

  // Forgets every entry for which pred(id, record) is true.
  template <class Pred>
  void forgetIf(Pred&& pred) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!pred(std::string_view(it->first), it->second.record)) {
        ++it;
        continue;
      }
      order_.erase(it->second.age);
      it = entries_.erase(it);
    }
  }

  // fn(id, record) for each entry, in no particular order.
  template <class Fn>
  void forEach(Fn&& fn) const {
    for (const auto& [id, entry] : entries_) fn(std::string_view(id), entry.record);
  }

  size_t size() const { return entries_.size(); }
  void clear() {
    order_.clear();
    entries_.clear();
  }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view id) const noexcept { return std::hash<std::string_view>{}(id); }
  };
  using Order = std::pmr::list<const std::pmr::string*>;  // oldest first
  struct Entry {
    Entry(Record r, typename Order::iterator a) : record(std::move(r)), age(a) {}
    Record record;
    typename Order::iterator age;
  };

  const size_t capacity_;
  std::pmr::unsynchronized_pool_resource pool_;  // declared first: destroyed after what it holds
  std::pmr::unordered_map<std::pmr::string, Entry, Hash, std::equal_to<>> entries_{&pool_};
  Order order_{&pool_};
};

}  // namespace hoplite
