// What the transfer client needs of the directory: where an id's entry
// lives, lookups of where an object is, and telling it about this node's
// copies. DirectoryClient implements it.
// Loop thread only.
#pragma once

#include <cstdint>
#include <string>

#include "net/request_tracker.h"
#include "wire/messages.h"

namespace hoplite {

class DirectoryAccess {
 public:
  using LookupCallback = RequestTracker::LookupCallback;

  virtual ~DirectoryAccess() = default;
  // The rank hosting an id's directory entry (it moves on when that rank fails).
  virtual int shardOf(const std::string& id) const = 0;
  // The rank whose share holds the id's entry while that rank is a member.
  virtual int homeShardOf(const std::string& id) const = 0;
  // A fresh id for a request (or a pull) this node makes.
  virtual uint64_t newRequest() = 0;
  // Sends a Lookup to the id's shard (again to its successor if that fails
  // first); `cb` runs once. `failedHolder`: a holder to skip; `preferred`: the
  // sender to ask for (see DirectoryShard::lookup). Returns the request id.
  virtual uint64_t requestLookup(const std::string& id, double timeoutSeconds, bool locate, int failedHolder,
                                 LookupCallback cb, int preferred = -1) = 0;
  // Tells the id's shard where this node's copy stands; `sender`: the holder
  // it was pulled from, now free for others (-1: none).
  virtual void updateHolder(const std::string& id, wire::HolderState state, int sender = -1) = 0;
};

}  // namespace hoplite
