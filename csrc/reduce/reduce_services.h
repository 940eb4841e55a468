// What the reduce's parts (coordinator.h, task_runner.h) need from the node
// they run in: its peers, the directory and requests (DirectoryClient), and
// local copies of objects. The node implements it.
// Loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "common/status.h"
#include "directory/directory_client.h"
#include "net/peer_links.h"
#include "net/transport.h"
#include "store/local_object.h"
#include "wire/messages.h"

namespace hoplite {

class ReduceServices {
 public:
  // A local copy of an object (complete or still arriving), and the rank it is pulled from (-1: none).
  using FetchCallback = std::function<void(const Status&, std::shared_ptr<LocalObject>, int sender)>;

  virtual ~ReduceServices() = default;

  // Peers, the directory, and requests to both.
  virtual PeerLinks& peers() = 0;
  virtual DirectoryClient& directory() = 0;
  virtual bool shuttingDown() const = 0;
  // It just resumed from a stall or a cut-off, and handles what was waiting
  // for it then: sent before its peers could know it is back.
  virtual bool resuming() const = 0;
  virtual bool stopped() const = 0;  // shutdown() was called (any thread)
  virtual double now() const = 0;
  // Probes `ranks`; `done` runs once, with those that failed to answer or had
  // not answered after `timeoutSeconds`.
  virtual void probeRanks(const std::set<int>& ranks, double timeoutSeconds,
                          std::function<void(std::set<int> silent)> done) = 0;

  // Objects.
  virtual void fetch(const std::string& id, double timeoutSeconds, FetchCallback done, int preferred = -1) = 0;
  // Pulls that reached this node before its copy of the object existed.
  virtual void serveParkedPulls(const std::shared_ptr<LocalObject>& obj) = 0;
  virtual void dropLocalCopy(const std::string& id, const Status& why) = 0;
  virtual uint64_t chunkFor(uint64_t size) const = 0;
};

}  // namespace hoplite
