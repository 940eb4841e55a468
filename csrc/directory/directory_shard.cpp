#include "directory/directory_shard.h"

namespace hoplite {
namespace {
constexpr size_t kMaxRememberedDeletes = 1u << 20;
}

DirectoryShard::~DirectoryShard() {
  for (auto& [id, list] : waiters_) {
    for (auto& w : list) loop_.cancelTimer(w.timer);
  }
}

Status DirectoryShard::registerObject(const wire::Register& msg) {
  if (entries_.count(msg.id)) {
    return Status(Code::kAlreadyExists, "object " + printableId(msg.id) + " already exists");
  }
  if (deleted_.erase(msg.id)) {
    // Re-using a deleted id is allowed; it is a new object from now on.
    for (auto it = deletedOrder_.begin(); it != deletedOrder_.end(); ++it) {
      if (*it == msg.id) {
        deletedOrder_.erase(it);
        break;
      }
    }
  }
  DirectoryEntry& entry = entries_[msg.id];
  entry.meta = msg.meta;
  entry.holders[msg.holder] = msg.complete;
  entry.hasInline = msg.hasInline;
  entry.inlineData = msg.inlineData;

  auto it = waiters_.find(msg.id);
  if (it != waiters_.end()) {
    std::vector<Waiter> list = std::move(it->second);
    waiters_.erase(it);
    for (auto& w : list) {
      loop_.cancelTimer(w.timer);
      w.reply(Status(), &entry);
    }
  }
  return Status();
}

bool DirectoryShard::updateHolder(const std::string& id, int holder, wire::HolderState state) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  if (state == wire::HolderState::kRemoved) {
    it->second.holders.erase(holder);
  } else {
    it->second.holders[holder] = state == wire::HolderState::kComplete;
  }
  return true;
}

void DirectoryShard::lookup(const std::string& id, double timeoutSeconds, LookupCallback reply) {
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    reply(Status(), &it->second);
    return;
  }
  if (deleted_.count(id)) {
    reply(Status(Code::kDeleted, "object " + printableId(id) + " was deleted"), nullptr);
    return;
  }
  uint64_t token = nextWaiter_++;
  auto timer = loop_.addTimer(timeoutSeconds, [this, id, token] {
    auto wit = waiters_.find(id);
    if (wit == waiters_.end()) return;
    auto& list = wit->second;
    for (auto w = list.begin(); w != list.end(); ++w) {
      if (w->token != token) continue;
      LookupCallback cb = std::move(w->reply);
      list.erase(w);
      if (list.empty()) waiters_.erase(wit);
      cb(Status(Code::kTimeout, "object " + printableId(id) + " does not exist"), nullptr);
      return;
    }
  });
  waiters_[id].push_back(Waiter{token, std::move(reply), timer});
}

Status DirectoryShard::remove(const std::string& id, std::vector<int>* holders) {
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    if (deleted_.count(id)) return Status(Code::kDeleted, "object " + printableId(id) + " was already deleted");
    return Status(Code::kNotFound, "object " + printableId(id) + " does not exist");
  }
  for (const auto& [rank, complete] : it->second.holders) holders->push_back(rank);
  entries_.erase(it);
  rememberDeleted(id);
  return Status();
}

void DirectoryShard::rememberDeleted(const std::string& id) {
  if (!deleted_.insert(id).second) return;
  deletedOrder_.push_back(id);
  if (deletedOrder_.size() > kMaxRememberedDeletes) {
    deleted_.erase(deletedOrder_.front());
    deletedOrder_.pop_front();
  }
}

}  // namespace hoplite
