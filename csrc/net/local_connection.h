// A node's connection to itself: control frames are delivered back to the same
// observer on a later loop turn, so requests to the local directory shard take
// the same code path as remote ones.
#pragma once

#include "net/event_loop.h"
#include "net/transport.h"

namespace hoplite {

class LocalConnection : public Connection, public std::enable_shared_from_this<LocalConnection> {
 public:
  LocalConnection(EventLoop& loop, ConnectionObserver* observer, int rank);

  void sendControl(wire::MsgType type, std::string payload) override;
  // Objects are never pulled from the node itself; a data frame here is a bug.
  void sendData(uint64_t flow, uint64_t request, uint64_t offset, const uint8_t* data, size_t size,
                std::shared_ptr<const void> keepalive) override;
  void close(const Status& why) override;
  bool isOpen() const override { return open_; }
  std::string describe() const override { return "rank " + std::to_string(peerRank()) + " (self)"; }

 private:
  EventLoop& loop_;
  ConnectionObserver* observer_;
  bool open_ = true;
};

}  // namespace hoplite
