// The shape of a streaming reduce: a d-ary tree over the k inputs in the order
// they become ready, and the cost model that picks d. Pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace hoplite {

// Tree positions are arrival indices: the j-th input to become ready takes
// position j. Positions follow a generalised in-order traversal of a
// heap-shaped d-ary tree (first child's subtree, the node, the other
// children's subtrees), so early arrivals form whole subtrees that reduce
// while later inputs are still missing, and the last arrival is a leaf whose
// data then only has to stream up once.
struct ReduceTree {
  int degree = 1;
  int root = 0;
  std::vector<int> parent;                 // -1 for the root
  std::vector<std::vector<int>> children;  // in the order they are combined
  int depth = 0;                           // edges on the longest leaf-to-root path
};

ReduceTree buildReduceTree(int count, int degree);

// What the model needs, all measured at run time except the chunk size.
struct LinkEstimate {
  double latencySeconds = 0;     // one-way small-message latency
  double bytesPerSecond = 0;     // per-node bandwidth
};

// Modelled completion time after the last input is ready, for `count` inputs
// of `bytes` each, streamed in `chunkBytes` pieces (the Hoplite paper's T(d),
// with pipelining): every level adds a latency and a chunk; a node's inbound
// link carries one stream per child.
double reduceTreeCost(int count, int degree, uint64_t bytes, uint64_t chunkBytes, const LinkEstimate& link);

// The degree in [1, count-1] with the smallest modelled time (1 when count <= 2).
int chooseReduceDegree(int count, uint64_t bytes, uint64_t chunkBytes, const LinkEstimate& link);

}  // namespace hoplite
