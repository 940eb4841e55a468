#include "net/local_connection.h"


#include "common/logging.h"

namespace hoplite {

LocalConnection::LocalConnection(EventLoop& loop, ConnectionObserver* observer, int rank)
    : Connection(0), loop_(loop), observer_(observer) {
  setPeerRank(rank);
}

void LocalConnection::sendControl(wire::MsgType type, std::string payload) {
  if (!open_) return;
  auto self = shared_from_this();
  loop_.post([self, type, payload = std::move(payload)] {
    if (self->open_) {
      self->observer_->onFrame(*self, type, reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
    }
  });
}

void LocalConnection::sendData(uint64_t, uint64_t request, uint64_t, const uint8_t*, size_t,
                               std::shared_ptr<const void>) {
  HLOG(kError, "internal: data frame for request %llu sent to self", static_cast<unsigned long long>(request));
}

void LocalConnection::close(const Status& why) {
  if (!open_) return;
  open_ = false;
  observer_->onClosed(*this, why);
}

}  // namespace hoplite
