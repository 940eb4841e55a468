// One node's copy of an object. The buffer fills from the front; `watermark`
// says how many leading bytes are valid, so readers can stream a copy that is
// still being written. State is touched only on the loop thread, except
// `abandoned`, which tells a background writer to stop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/object_meta.h"
#include "common/status.h"
#include "store/buffer_pool.h"

namespace hoplite {

class LocalObject {
 public:
  using Listener = std::function<void()>;

  LocalObject(std::string id, ObjectMeta meta, std::shared_ptr<Buffer> buffer, bool primary)
      : id_(std::move(id)), meta_(std::move(meta)), buffer_(std::move(buffer)), primary_(primary) {}

  const std::string& id() const { return id_; }
  const ObjectMeta& meta() const { return meta_; }
  uint64_t size() const { return meta_.nbytes; }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  uint8_t* data() const { return buffer_ ? buffer_->data() : nullptr; }
  bool primary() const { return primary_; }

  // Readable from any thread; written on the loop thread.
  uint64_t watermark() const { return watermark_.load(std::memory_order_acquire); }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  bool complete() const { return watermark() >= meta_.nbytes && !failed(); }
  // Loop thread only.
  const Status& error() const { return error_; }

  // Loop thread: more bytes are valid; wakes listeners.
  void advance(uint64_t watermark);
  // Loop thread: the copy will never complete; wakes listeners.
  void fail(const Status& why);

  // Listeners run on every advance and on failure; they check the state themselves.
  uint64_t addListener(Listener fn);
  void removeListener(uint64_t token);
  size_t listenerCount() const { return listeners_.size(); }

  std::atomic<bool> abandoned{false};
  // A reduce's result, which its coordinator recomputes if a participant dies:
  // a reader that loses its sender waits for it (loop thread only).
  bool recomputable = false;
  // A reduce output's registration token (wire::Register::token; loop thread only).
  uint64_t registrationToken = 0;
  // A put's copy whose registration is not answered yet (wire::Register::putPending; loop thread only).
  bool registering = false;
  // The get that pulled this copy and may take its buffer when the pull ends
  // (0: none); see TransferClient::handOver (loop thread only).
  uint64_t handOverTo = 0;

 private:
  void notify();

  std::string id_;
  ObjectMeta meta_;
  std::shared_ptr<Buffer> buffer_;
  bool primary_;
  std::atomic<uint64_t> watermark_{0};
  std::atomic<bool> failed_{false};
  Status error_;
  uint64_t nextListener_ = 1;
  std::map<uint64_t, Listener> listeners_;
};

}  // namespace hoplite
