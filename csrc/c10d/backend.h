// The torch.distributed backend "hoplite": a c10d::Backend whose collectives
// are the static algorithms of algorithms.h over the node's tagged messages.
// Collectives run one at a time, in issue order, on the group's worker thread;
// send/recv go straight to the node. Every Work completes exactly once, off
// the node's loop thread (user callbacks on its future must not stall the
// transport).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "c10d/channel.h"
#include "common/worker_pool.h"

namespace hoplite::c10d {

class DeviceStaging;

class HopliteWork : public ::c10d::Work {
 public:
  HopliteWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs);
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override { return sourceRank_; }
  // Once: the future gets the outputs or the error; waiters wake.
  void complete(std::exception_ptr error, int sourceRank = -1);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int sourceRank_ = -1;
};

class HopliteBackend : public ::c10d::Backend {
 public:
  // `globalRanks[i]` is the node rank of group rank i; `groupName` must be the
  // same on every member and differ between groups.
  HopliteBackend(std::shared_ptr<TaggedMessenger> messenger, Channel::Allocator allocate, const std::string& groupName,
                 int rank, std::vector<int> globalRanks, std::chrono::milliseconds timeout);
  ~HopliteBackend() override;

  const std::string getBackendName() const override { return "hoplite"; }
  // Without `override`: these virtuals are newer than some torch versions we build against.
  void shutdown();
  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  uint64_t getSequenceNumberForGroup() override {
    std::lock_guard<std::mutex> lock(issueMutex_);
    return seq_;
  }
  void setSequenceNumberForGroup() override {}  // every member starts at 0

  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<std::vector<at::Tensor>>;
  c10::intrusive_ptr<::c10d::Work> broadcast(Tensors& tensors, const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(Tensors& tensors, const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(Tensors& tensors,
                                                       const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(Tensors& tensors, const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(TensorLists& outputs, Tensors& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  // The coalesced forms run one ring pass over all their tensors' bytes.
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                                                       const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                                   const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(TensorLists& outputs, Tensors& inputs,
                                          const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(Tensors& outputs, TensorLists& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(Tensors& outputs, TensorLists& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(Tensors& outputs, Tensors& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(Tensors& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(Tensors& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(Tensors& tensors, int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;

 private:
  using Body = std::function<void(Channel&)>;
  // Queues a collective. `keep` holds every tensor it touches; `outputs` are the
  // Work's result. The body runs on the worker inside Channel::begin/end.
  // `staging`: the host twins of the collective's CUDA tensors (null: none).
  c10::intrusive_ptr<::c10d::Work> enqueue(::c10d::OpType type, const char* name, Tensors keep, Tensors outputs,
                                           std::chrono::milliseconds timeout,
                                           std::shared_ptr<const DeviceStaging> staging, Body body);
  c10::intrusive_ptr<::c10d::Work> pointToPoint(Tensors& tensors, int peer, int tag, bool isSend);
  double timeoutSeconds(std::chrono::milliseconds requested) const;
  // After collective `seq` ended (worker thread): once it failed, peers'
  // messages for it and the ones before are dropped, until enough later
  // collectives have run.
  void noteOutcome(uint64_t seq, bool failed);

  Channel channel_;  // its messenger is shared with send/recv; the rest is the worker thread's
  std::atomic<std::chrono::milliseconds> timeout_;
  std::atomic<bool> closed_{false};  // shut down: its context is closed for good
  std::optional<uint64_t> abandoned_;  // the last failed collective, while its tags are dropped (worker thread)
  std::mutex issueMutex_;  // numbers and queues a collective in one step
  uint64_t seq_ = 0;       // collectives issued: identical on every member
  WorkerPool worker_{"hoplite-c10d", 1};  // collectives, one at a time in issue order
  // Completes send/recv Works off the loop thread; shared with their callbacks,
  // which may outlive the backend (after stop() it runs them inline).
  std::shared_ptr<WorkerPool> completer_ = std::make_shared<WorkerPool>("hoplite-c10d-end", 1);
};

}  // namespace hoplite::c10d
