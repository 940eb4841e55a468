// What the transfer client needs of the directory: where an id's entry
// lives, and lookups of where an object is. DirectoryClient implements it.
// Loop thread only.
#pragma once

#include <cstdint>
#include <string>

#include "net/request_tracker.h"

namespace hoplite {

class DirectoryAccess {
 public:
  using LookupCallback = RequestTracker::LookupCallback;

  virtual ~DirectoryAccess() = default;
  // The rank hosting an id's directory entry (it moves on when that rank fails).
  virtual int shardOf(const std::string& id) const = 0;
  // A fresh id for a request (or a pull) this node makes.
  virtual uint64_t newRequest() = 0;
  // Sends a Lookup to the id's shard (again to its successor if that fails
  // first); `cb` runs once. `failedHolder`: a holder to skip; `preferred`: the
  // sender to ask for (see DirectoryShard::lookup). Returns the request id.
  virtual uint64_t requestLookup(const std::string& id, double timeoutSeconds, bool locate, int failedHolder,
                                 LookupCallback cb, int preferred = -1) = 0;
};

}  // namespace hoplite
