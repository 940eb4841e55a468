// The loop-thread state of a streaming reduce: the coordinator's view of one
// reduce, and one tree position computed on this node (node_reduce.cpp).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "node/node.h"

namespace hoplite {

// An input the directory located: its index in the request, and where it is.
struct Node::ReduceInput {
  int index;
  wire::LookupReply reply;
};

struct Node::ReduceCoordination {
  ReduceRequest request;
  std::shared_ptr<ReducePlan> plan;
  std::function<void(Status)> done;
  double started = 0;
  EventLoop::TimerId timer = 0;
  std::vector<uint64_t> lookups;  // pending_ keys of locate lookups still out
  std::vector<ReduceInput> ready;      // located, waiting for the plan or their turn
  std::optional<ReduceInput> reserved;  // this node's own input, kept for the root position
  std::vector<bool> arrived;  // by input index
  int lost = 0;               // inputs that can no longer arrive (deleted)
  bool linkKnown = false;
  bool planned = false;
  ObjectMeta meta;
  std::string metaFrom;  // the input that fixed `meta`
  std::string partialPrefix;
  int launched = 0, startedTasks = 0;
  std::vector<int> taskRanks;
};

struct Node::ReduceTaskState {
  wire::ReduceTask msg;
  std::weak_ptr<Connection> coordinator;
  bool answered = false;
  ReduceKernel kernel;
  std::shared_ptr<LocalObject> input, output;
  bool alias = false;  // a leaf: the output shares the input's buffer
  std::vector<std::shared_ptr<LocalObject>> children;
  std::vector<std::pair<std::shared_ptr<LocalObject>, uint64_t>> listeners;
  uint64_t reduced = 0;
  bool busy = false;
  bool registered = false;  // the output is in the directory
  double started = 0;       // steady clock, for the debug log
};

}  // namespace hoplite
