#include "c10d/call_group.h"

#include <algorithm>

#include "c10d/algorithms.h"
#include "common/hash.h"
#include "common/object_meta.h"

namespace hoplite::c10d {

Status allreduceAmong(std::shared_ptr<TaggedMessenger> messenger, Channel::Allocator allocate, const std::string& id,
                      std::vector<int> members, int self, const uint8_t* input, uint8_t* output, size_t count,
                      size_t itemsize, const std::string& dtype, ReduceOp op, double timeoutSeconds,
                      std::shared_ptr<const void> keep) {
  const std::string name = "allreduce " + printableId(id);
  const int rank = groupRankOf(members, self);
  if (rank < 0 || !std::is_sorted(members.begin(), members.end()) ||
      std::adjacent_find(members.begin(), members.end()) != members.end()) {
    return Status(Code::kInvalidArgument, name + ": rank " + std::to_string(self) +
                                              " is not in its group, or the group is not ascending without repeats");
  }
  ReduceKernel kernel;
  Status s = reduceKernel(op, dtype, &kernel);
  if (!s.ok()) return Status(s.code, name + ": " + s.message);
  if (itemsize == 0 || (count && (!input || !output))) {
    return Status(Code::kInvalidArgument, name + ": no memory for " + std::to_string(count) + " elements");
  }
  const uint64_t context = fnv1a("allreduce:" + id);
  const int size = static_cast<int>(members.size());
  // Members that disagree on what they reduce meet a receive of another kind,
  // which fails naming the exchange instead of mixing their bytes.
  std::string group;
  for (int m : members) group += (group.empty() ? "" : ",") + std::to_string(m);
  if (members.size() > 8) group = std::to_string(size) + " ranks, " + std::to_string(fnv1a(group) % 10000);
  const std::string kind = "allreduce of " + std::to_string(count) + " " + dtype + " (" + reduceOpName(op) + ") among " +
                           group;
  Channel ch(messenger, std::move(allocate), context, rank, std::move(members));
  ch.nameNodeRanks();  // the object-store API names ranks so
  try {
    ch.begin(name, kind, 0, timeoutSeconds, std::move(keep));
    allreduce(ch, input, output, count, Elements{itemsize, kernel.combine});
    ch.end(Status());
  } catch (const std::exception& e) {
    const auto* comm = dynamic_cast<const CommError*>(&e);
    const Status failure = comm ? Status(comm->code(), e.what())
                                : Status(Code::kInternal, name + " on rank " + std::to_string(self) + ": " + e.what());
    ch.end(failure);
    // Peers' late messages for this call would wait for a receive forever.
    messenger->discard(context, [](uint64_t) { return true; });
    return failure;
  }
  if (kernel.divide) kernel.divide(output, count, static_cast<uint64_t>(size));
  return Status();
}

}  // namespace hoplite::c10d
