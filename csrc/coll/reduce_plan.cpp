#include "coll/reduce_plan.h"

#include <algorithm>
#include <functional>
#include <limits>

namespace hoplite {
namespace {

// Edges from the deepest node of a heap-shaped d-ary tree of `count` nodes to its root.
int heapDepth(int count, int d) {
  int depth = 0;
  for (int b = count - 1; b > 0; b = (b - 1) / d) ++depth;
  return depth;
}

}  // namespace

ReduceTree buildReduceTree(int count, int degree) {
  ReduceTree tree;
  tree.degree = std::max(1, degree);
  if (count <= 0) return tree;
  const int d = tree.degree;
  // Heap layout by breadth-first index b: children of b are d*b+1 .. d*b+d.
  std::vector<int> position(count, -1);  // breadth-first index -> arrival position
  int next = 0;
  std::function<void(int)> visit = [&](int b) {
    const int first = d * b + 1;
    if (first < count) visit(first);
    position[b] = next++;
    for (int c = first + 1; c < std::min(count, first + d); ++c) visit(c);
  };
  // The recursion depth is the tree height: count for a chain, so walk chains iteratively.
  if (d == 1) {
    for (int b = count - 1; b >= 0; --b) position[b] = count - 1 - b;
  } else {
    visit(0);
  }
  tree.parent.assign(count, -1);
  tree.children.assign(count, {});
  for (int b = 1; b < count; ++b) {
    int p = (b - 1) / d;
    tree.parent[position[b]] = position[p];
    tree.children[position[p]].push_back(position[b]);
  }
  tree.root = position[0];
  tree.depth = heapDepth(count, d);
  return tree;
}

double reduceTreeCost(int count, int degree, uint64_t bytes, uint64_t chunkBytes, const LinkEstimate& link) {
  if (count <= 1) return link.latencySeconds;
  const double b = std::max(link.bytesPerSecond, 1.0);
  const int d = std::max(1, std::min(degree, count - 1));
  const int depth = heapDepth(count, d);
  const double chunk = static_cast<double>(std::min<uint64_t>(chunkBytes, bytes));
  return depth * (link.latencySeconds + chunk / b) + d * static_cast<double>(bytes) / b;
}

int chooseReduceDegree(int count, uint64_t bytes, uint64_t chunkBytes, const LinkEstimate& link) {
  int best = 1;
  double bestCost = std::numeric_limits<double>::infinity();
  for (int d = 1; d <= std::max(1, count - 1); ++d) {
    double cost = reduceTreeCost(count, d, bytes, chunkBytes, link);
    if (cost < bestCost) best = d, bestCost = cost;
  }
  return best;
}

}  // namespace hoplite
