// Start-time fair queueing over bytes, shared by the transports: flows that
// have data share a connection equally whatever their frame sizes (a relay
// sends what has arrived, a few hundred KB; a finished copy whole chunks of
// MBs), each flow's frames stay in order, and an idle flow builds up no credit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <unordered_map>

namespace hoplite {

class FlowTags {
 public:
  // The start tag of the next frame of `bytes` for `flow`, when `now` is the
  // tag of the frame being sent (or of the last one sent): frames go out in
  // the order of their tags.
  uint64_t next(uint64_t flow, uint64_t bytes, uint64_t now) {
    uint64_t& end = ends_[flow];
    const uint64_t start = std::max(now, end);
    end = start + bytes;
    if (ends_.size() > kPruneAbove) {  // flows that ended before now weigh nothing any more
      for (auto it = ends_.begin(); it != ends_.end();) it = it->second <= now ? ends_.erase(it) : std::next(it);
    }
    return start;
  }

 private:
  static constexpr size_t kPruneAbove = 64;
  std::unordered_map<uint64_t, uint64_t> ends_;  // flow -> end tag of its last frame
};

}  // namespace hoplite
