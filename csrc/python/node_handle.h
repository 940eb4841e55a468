// The node as Python sees it. Completes torch futures and releases put sources
// from a C++ thread, so a finished get reaches a waiting Python thread without
// a hop through a Python thread (measured here: ~110 us per get saved); a
// thread blocked in the future's wait() takes the outcome from the loop itself.
// Torch headers stay in node_handle.cpp; this header is pybind11-only.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "node/node.h"

namespace hoplite {

class NodeHandle {
 public:
  explicit NodeHandle(const NodeConfig& config);
  ~NodeHandle();

  Node& node() { return *node_; }
  std::shared_ptr<Node> sharedNode() const { return node_; }
  // Registers `tensor` (contiguous, CPU or CUDA) under `id`; keeps it alive until copied
  // (copy=false: until deleted, as the store's copy). Returns (code, message).
  // blocking=true also waits for the local copy.
  pybind11::tuple put(const pybind11::bytes& id, const std::string& dtype, const pybind11::object& tensor,
                      double timeout, bool blocking, bool copy);
  // Completes `future` (a torch.futures.Future) with the tensor or a typed error.
  // With `out` (a contiguous tensor of dtype `outDtype` on the get's device,
  // or None) the bytes land in `out`, which the future then gives back.
  // cudaDevice >= 0: the tensor is on that CUDA device (CUDA builds).
  // source >= 0: the rank to pull from if it holds a copy (Node::get).
  // Returns the get's token, for GetWaiter::wait.
  uint64_t get(const pybind11::bytes& id, double timeout, bool copy, const pybind11::object& future,
               const pybind11::object& out, const std::string& outDtype, int cudaDevice, int source);
  // What a get's future waits with (it does not keep the node alive).
  class GetWaiter getWaiter() const;
  // Allreduce of `tensor` (contiguous, CPU) among node ranks `members`
  // (ascending) with the static algorithms of c10d/ (c10d/call_group.h).
  // Returns (code, message, result): a new 1-D tensor over a pool buffer, or
  // None when code is not 0.
  pybind11::tuple allreduce(const pybind11::bytes& id, std::vector<int> members, const pybind11::object& tensor, int op,
                            double timeout);
  // A 1-D CPU tensor of `numel` elements of `dtype` over a buffer of the
  // node's pool (returned to it when the tensor is freed): contents undefined.
  pybind11::object empty(int64_t numel, const std::string& dtype);
  void shutdown();

  struct State;  // internal: what the completer thread shares with the handle

 private:
  // The completer thread shares ownership of the node and this state, so a
  // future callback may shut the node down and drop this handle while the
  // thread is still inside it.
  std::shared_ptr<Node> node_;
  std::shared_ptr<State> state_;
};

// Raising a failed get's error creates a new Python exception each time
// (torch_hoplite.errors.error_from_status): the future keeps only the status.
// A Python exception kept in the future would, once raised, hold its
// traceback's frames (the caller's locals) in a cycle through C++ that the
// garbage collector cannot see.
void registerGetErrorTranslator();

// Waits for the gets of one NodeHandle.
class GetWaiter {
 public:
  explicit GetWaiter(std::shared_ptr<NodeHandle::State> state);
  // Blocks (GIL released) until get `token` completes, up to `timeout`, and
  // completes its future on this thread: the loop hands the outcome straight
  // here instead of through the completer thread, and the future's callbacks
  // run here. Returns at once if the get was delivered already, another thread
  // waits for it, or this is the completer thread.
  void wait(uint64_t token, double timeout);

 private:
  std::shared_ptr<NodeHandle::State> state_;
};

}  // namespace hoplite
