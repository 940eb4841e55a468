// Collectives among members named per call, for the object-store API
// (torch_hoplite.allreduce): no process group is set up beforehand. The
// call's id names its message context, which every member derives alike, so
// calls with different ids never take each other's messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c10d/channel.h"
#include "coll/reduce_kernels.h"
#include "common/status.h"
#include "messenger/tagged_messenger.h"

namespace hoplite::c10d {

// Reduces `input` (`count` elements of `dtype`, `itemsize` bytes each) over
// `members` (node ranks, ascending; `self` among them) into `output`, with
// allreduce() of algorithms.h. Every member calls it with the same id, count,
// dtype and op; a member that differs fails the exchanges it takes part in,
// which name it. `keep` holds both memories as long as the node may touch
// them, also after a failure. After a failure the id's context drops what
// peers still send for it, so a new call needs a new id.
Status allreduceAmong(std::shared_ptr<TaggedMessenger> messenger, Channel::Allocator allocate, const std::string& id,
                      std::vector<int> members, int self, const uint8_t* input, uint8_t* output, size_t count,
                      size_t itemsize, const std::string& dtype, ReduceOp op, double timeoutSeconds,
                      std::shared_ptr<const void> keep);

}  // namespace hoplite::c10d
