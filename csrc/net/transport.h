// The transport contract the node is written against. A Connection carries
// control frames (small, decoded by the observer) and data frames (object bytes
// the transport reads straight into a buffer the observer names). Every callback
// runs on the loop thread; onClosed is called exactly once per connection.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "net/event_loop.h"
#include "wire/frame.h"

namespace hoplite {

class Connection;

class ConnectionObserver {
 public:
  virtual ~ConnectionObserver() = default;
  virtual void onFrame(Connection& conn, wire::MsgType type, const uint8_t* payload, size_t size) = 0;
  // Where `size` bytes of data for `request` at `offset` go; nullptr discards them.
  // `keepalive` must hold the memory until the frame is read, whatever happens
  // to the request meanwhile.
  virtual uint8_t* dataDestination(Connection& conn, uint64_t request, uint64_t offset, uint64_t size,
                                   std::shared_ptr<const void>* keepalive) = 0;
  // Bytes up to `end` of `request` have arrived (called as they arrive, not per frame).
  virtual void onDataReceived(Connection& conn, uint64_t request, uint64_t end) = 0;
  virtual void onClosed(Connection& conn, const Status& why) = 0;
};

class Connection {
 public:
  virtual ~Connection() = default;
  virtual void sendControl(wire::MsgType type, std::string payload) = 0;
  // Sends [data, data+size) as one data frame; `keepalive` holds the memory until written.
  // Frames of one `flow` go out in the order sent; flows with frames queued on
  // one connection share it equally by bytes, so no flow's backlog holds
  // another back (a relay and a partial result pulled over one connection
  // must both keep up).
  virtual void sendData(uint64_t flow, uint64_t request, uint64_t offset, const uint8_t* data, size_t size,
                        std::shared_ptr<const void> keepalive) = 0;
  // The rest of the data frame being read for `request`, if one is, is
  // dropped instead of written to its destination: the memory's owner gave
  // up on it and may reuse it as soon as this returns.
  virtual void abandonData(uint64_t request) { (void)request; }
  virtual void close(const Status& why) = 0;
  // Ends the connection without losing what was handed to the kernel: frames
  // still queued are dropped, the stream is ended, and what the peer still
  // sends is read and dropped until it ends its side too; then it closes with
  // `why`. (Closing at once while the peer's bytes still arrive makes the
  // kernel reset the connection and throw away what it has not transmitted,
  // e.g. the last message of a collective that already completed here.)
  virtual void closeGracefully(const Status& why) { close(why); }
  // Open until closed, also while ending (closeGracefully): frames dropped
  // then were not sent, which isEnding tells.
  virtual bool isOpen() const = 0;
  virtual bool isEnding() const { return false; }
  // Whether the connection was ever set up (TCP: the connect completed), so a
  // close means the peer went away rather than that it is not listening yet.
  virtual bool wasEstablished() const { return true; }
  // Until called, a connection takes only small control frames (the
  // handshake), so a stranger cannot make us allocate or write anything.
  virtual void markTrusted() {}

  uint64_t id() const { return id_; }
  int peerRank() const { return peerRank_; }
  void setPeerRank(int rank) { peerRank_ = rank; }
  virtual std::string describe() const = 0;

 protected:
  explicit Connection(uint64_t id) : id_(id) {}

 private:
  uint64_t id_;
  int peerRank_ = -1;
};

struct TransportOptions {
  wire::FrameLimits limits;
  int socketBufferBytes = 0;  // 0: leave the kernel's autotuning on
  std::string congestion;     // TCP congestion control (TCP_CONGESTION); empty: the system's
  // The cluster's, for a transport that must admit a peer before the node's
  // handshake can run (ucx's bootstrap): the peer proves it knows them first.
  std::string secret;
  std::string clusterId;
};

class Listener {
 public:
  virtual ~Listener() = default;
  virtual std::string host() const = 0;
  virtual int port() const = 0;
  virtual void close() = 0;
};

using AcceptCallback = std::function<void(std::shared_ptr<Connection>)>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::unique_ptr<Listener> listen(const std::string& host, int port, ConnectionObserver* observer,
                                           AcceptCallback onAccept) = 0;
  // Starts connecting; failures arrive as observer->onClosed.
  virtual std::shared_ptr<Connection> connect(const std::string& host, int port, ConnectionObserver* observer) = 0;
  // Connections that failed before the node's handshake because the
  // secrets differ: this side found the peer's proof wrong, or was refused
  // (unlike the handshake, which counts on the side that checks a proof
  // only). Any thread.
  virtual uint64_t peersRefused() const { return 0; }
};

}  // namespace hoplite
