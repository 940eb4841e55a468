#include "store/local_object.h"

#include <vector>

namespace hoplite {

void LocalObject::advance(uint64_t watermark) {
  if (watermark <= watermark_.load() || failed()) return;
  watermark_.store(watermark, std::memory_order_release);
  notify();
}

void LocalObject::fail(const Status& why) {
  if (failed()) return;
  error_ = why;
  failed_.store(true, std::memory_order_release);
  notify();
}

uint64_t LocalObject::addListener(Listener fn) {
  uint64_t token = nextListener_++;
  listeners_.emplace(token, std::move(fn));
  return token;
}

void LocalObject::removeListener(uint64_t token) { listeners_.erase(token); }

void LocalObject::notify() {
  // Listeners may remove themselves (or others) while running.
  std::vector<uint64_t> tokens;
  tokens.reserve(listeners_.size());
  for (const auto& entry : listeners_) tokens.push_back(entry.first);
  for (uint64_t token : tokens) {
    auto it = listeners_.find(token);
    if (it == listeners_.end()) continue;
    Listener fn = it->second;
    fn();
  }
}

}  // namespace hoplite
