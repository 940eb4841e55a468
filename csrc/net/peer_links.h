// What the node's parts (mailbox, transfer server, directory client and
// shard server, reduce) need from the part that keeps the peers' connections
// (peers/peers.h): to reach a peer, and to know whether it failed. Loop
// thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "net/transport.h"
#include "wire/messages.h"

namespace hoplite {

class PeerLinks {
 public:
  virtual ~PeerLinks() = default;
  // Runs `write` with the connection this node dialed to `rank` once its
  // handshake is done; a peer that fails first drops it unrun.
  virtual void whenConnected(int rank, std::function<void(Connection&)> write) = 0;
  // The owning pointer of a connection a callback was given.
  virtual std::shared_ptr<Connection> sharedConnection(Connection& conn) = 0;
  // Reachable once and failed since.
  virtual bool hasFailed(int rank) = 0;
  // It told this node that it shuts down (a Leave).
  virtual bool isLeaving(int rank) const = 0;
  // Whether this node has a connection to or from `rank` that finished its handshake.
  virtual bool talksTo(int rank) const = 0;
  // Whether the connection this node dialed to `rank` finished its handshake
  // (what whenConnected waits for).
  virtual bool isReady(int rank) const = 0;
  // Id of the latest connection `rank` opened to this node (0: none): only
  // its close speaks for the peer (an older one is a previous process's).
  virtual uint64_t latestIncoming(int rank) = 0;
  // The random id of `rank`'s process as this node knows it (0: not heard
  // from yet); a rank that rejoins has a new one.
  virtual uint64_t incarnationOf(int rank) const = 0;
  virtual std::string peerName(int rank) const = 0;

  void sendTo(int rank, wire::MsgType type, std::string payload) {
    whenConnected(rank, [type, payload = std::move(payload)](Connection& c) mutable {
      c.sendControl(type, std::move(payload));
    });
  }
  template <typename M>
  void send(int rank, const M& msg) {
    sendTo(rank, M::kType, wire::encode(msg));
  }
};

}  // namespace hoplite
