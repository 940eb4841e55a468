#include "c10d/backend.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <torch/version.h>

#include "c10d/algorithms.h"
#include "c10d/device_staging.h"
#include "common/hash.h"
#include "common/object_meta.h"
#include "common/scalar_types.h"
#include "common/timeouts.h"

namespace hoplite::c10d {
namespace {

using Tensors = HopliteBackend::Tensors;

// Tags: a collective's are (seq << 40 | sub-tag), send/recv's (1 << 62 | tag).
constexpr int kSeqShift = 40;
constexpr uint64_t kSeqMask = (1ull << 22) - 1;
// After a failed collective, late messages of it and of this many before it are dropped.
constexpr uint64_t kAbandonWindow = 1ull << 20;
// The kind of send/recv messages (collectives use their own name).
const std::string kPointToPoint = "send/recv";
constexpr uint64_t kPointToPointBit = 1ull << 62;
// torch 2.11 has no op type of its own for it (2.12 added one).
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 12
constexpr auto kReduceScatterTensorCoalesced = ::c10d::OpType::COALESCED;
#else
constexpr auto kReduceScatterTensorCoalesced = ::c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#endif

void checkTensor(const at::Tensor& t, const char* op, const std::string& what) {
  TORCH_CHECK(t.defined(), "hoplite ", op, ": ", what, " is undefined");
  TORCH_CHECK(t.layout() == at::kStrided, "hoplite ", op, ": ", what, " must be a dense tensor, got layout ", t.layout());
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "hoplite ", op, ": ", what, " is on ", t.device(),
              "; the backend moves CPU and CUDA tensors");
}

const at::Tensor& single(const Tensors& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "hoplite ", op, ": expects exactly one tensor per process, got ", tensors.size());
  checkTensor(tensors[0], op, "the tensor");
  return tensors[0];
}

void checkLike(const at::Tensor& t, const at::Tensor& like, const char* op, const std::string& what) {
  checkTensor(t, op, what);
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "hoplite ", op, ": ", what, " has dtype ", t.scalar_type(),
              ", expected ", like.scalar_type());
  TORCH_CHECK(t.numel() == like.numel(), "hoplite ", op, ": ", what, " has ", t.numel(), " elements, expected ",
              like.numel());
}

void checkRoot(int root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "hoplite ", op, ": root ", root, " is not a rank of this group");
}

void checkSameDtype(const at::Tensor& output, const at::Tensor& input, const char* op) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hoplite ", op, ": output dtype ", output.scalar_type(),
              " differs from input dtype ", input.scalar_type());
}

// A list of `size` tensors like `like`.
void checkList(const std::vector<at::Tensor>& list, int size, const at::Tensor& like, const char* op, const char* what) {
  TORCH_CHECK(static_cast<int>(list.size()) == size, "hoplite ", op, ": expects a list of ", size, " ", what,
              " tensors, got ", list.size());
  for (int i = 0; i < size; ++i) checkLike(list[i], like, op, std::string(what) + " " + std::to_string(i));
}

// The one list of `size` tensors like `like` that list-form collectives take.
const std::vector<at::Tensor>& checkedList(const std::vector<std::vector<at::Tensor>>& lists, int size,
                                           const at::Tensor& like, const char* op, const char* what) {
  TORCH_CHECK(lists.size() == 1, "hoplite ", op, ": expects one list of ", size, " ", what, " tensors");
  checkList(lists[0], size, like, op, what);
  return lists[0];
}

// A collective's tensors to keep alive: `list` and `t`.
Tensors plus(Tensors list, const at::Tensor& t) {
  list.push_back(t);
  return list;
}

// Memory a collective's body made (a contiguous copy, a joined tensor): kept
// as long as any of the collective's messages may still touch it.
void hold(Channel& ch, const at::Tensor& t) { ch.hold(std::make_shared<at::Tensor>(t)); }

uint8_t* bytesOf(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }
size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// Copies a tensor's bytes to `dst` (any layout).
void copyFrom(uint8_t* dst, const at::Tensor& src) {
  at::Tensor dense = src.contiguous();
  if (nbytes(dense) > 0) std::memcpy(dst, bytesOf(dense), nbytes(dense));
}

// A contiguous tensor to work on: `user` itself, or a copy that commit() writes back.
struct Dense {
  at::Tensor work, user;
  explicit Dense(const at::Tensor& t) : work(t.is_contiguous() ? t : t.contiguous()), user(t) {}
  void commit() const {
    if (!work.is_same(user)) user.copy_(work);
  }
};

// Writes `src` (the tensor's size in bytes) into a tensor of any layout.
void copyTo(const at::Tensor& dst, const uint8_t* src) {
  Dense d(dst);
  if (nbytes(d.work) > 0) std::memcpy(bytesOf(d.work), src, nbytes(d.work));
  d.commit();
}

struct Reduction {
  Elements elements;
  DivideFn divide = nullptr;  // AVG
};

Reduction reductionFor(const ::c10d::ReduceOp& op, const at::Tensor& t, const char* name) {
  ReduceOp mine = ReduceOp::kSum;
  switch (static_cast<::c10d::ReduceOp::RedOpType>(op)) {
    case ::c10d::ReduceOp::SUM: mine = ReduceOp::kSum; break;
    case ::c10d::ReduceOp::AVG: mine = ReduceOp::kAvg; break;
    case ::c10d::ReduceOp::PRODUCT: mine = ReduceOp::kProd; break;
    case ::c10d::ReduceOp::MIN: mine = ReduceOp::kMin; break;
    case ::c10d::ReduceOp::MAX: mine = ReduceOp::kMax; break;
    case ::c10d::ReduceOp::BAND: mine = ReduceOp::kBand; break;
    case ::c10d::ReduceOp::BOR: mine = ReduceOp::kBor; break;
    case ::c10d::ReduceOp::BXOR: mine = ReduceOp::kBxor; break;
    default: TORCH_CHECK(false, "hoplite ", name, ": reduce op ", static_cast<int>(op.op_), " is not supported");
  }
  ReduceKernel kernel;
  Status s = reduceKernel(mine, nameOf(t.scalar_type()), &kernel);
  TORCH_CHECK(s.ok(), "hoplite ", name, ": ", s.message);
  return Reduction{Elements{static_cast<size_t>(t.element_size()), kernel.combine}, kernel.divide};
}

void allreduceInPlace(Channel& ch, const at::Tensor& t, const Reduction& red) {
  const size_t count = t.numel();
  allreduce(ch, bytesOf(t), bytesOf(t), count, red.elements);
  if (red.divide) red.divide(bytesOf(t), count, ch.size());
}

// `flat` holds every rank's blocks for `out`: reduces them and leaves this rank's in `out`.
// Allgather of every input's bytes back to back, then place(rank, its block).
void gatherCoalesced(Channel& ch, const std::vector<at::Tensor>& inputs,
                     const std::function<void(int, const uint8_t*)>& place) {
  size_t block = 0;
  for (const auto& in : inputs) block += nbytes(in);
  uint8_t* flat = ch.scratch(block * ch.size());
  uint8_t* mine = flat + block * ch.rank();
  for (const auto& in : inputs) {
    copyFrom(mine, in);
    mine += nbytes(in);
  }
  ringAllgather(ch, flat, block);
  for (int r = 0; r < ch.size(); ++r) place(r, flat + block * r);
}

void reduceScatterInto(Channel& ch, uint8_t* flat, const at::Tensor& out, const Reduction& red) {
  ringReduceScatter(ch, flat, out.numel(), red.elements);
  uint8_t* mine = flat + nbytes(out) * ch.rank();
  if (red.divide) red.divide(mine, out.numel(), ch.size());
  copyTo(out, mine);
}

// What all_to_all sends to and receives from each rank.
struct Exchange {
  std::vector<const uint8_t*> send;
  std::vector<uint8_t*> recv;
  std::vector<size_t> sendBytes, recvBytes;
  void add(const uint8_t* s, size_t sBytes, uint8_t* r, size_t rBytes) {
    send.push_back(s), sendBytes.push_back(sBytes), recv.push_back(r), recvBytes.push_back(rBytes);
  }
  void run(Channel& ch) { allToAll(ch, send.data(), sendBytes.data(), recv.data(), recvBytes.data()); }
};

std::exception_ptr asBackendError(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

// ---------------------------------------------------------------- HopliteWork

namespace {
// The devices of a work's outputs other than the CPU: its future then records
// events on them when it completes, so then() callbacks and wait() on any
// stream are ordered after the outputs (as with NCCL's works).
std::vector<c10::Device> deviceOutputs(const std::vector<at::Tensor>& outputs) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs) {
    if (t.defined() && !t.device().is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}
}  // namespace

HopliteWork::HopliteWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs)
    : Work(rank, type),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       deviceOutputs(outputs_))) {}

void HopliteWork::complete(std::exception_ptr error, int sourceRank) {
  sourceRank_ = sourceRank;
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

// ---------------------------------------------------------------- HopliteBackend

HopliteBackend::HopliteBackend(std::shared_ptr<TaggedMessenger> messenger, Channel::Allocator allocate,
                               const std::string& groupName, int rank, std::vector<int> globalRanks,
                               std::chrono::milliseconds timeout)
    : Backend(rank, static_cast<int>(globalRanks.size())),
      channel_(std::move(messenger), std::move(allocate), fnv1a("c10d:" + groupName), rank, std::move(globalRanks)),
      timeout_(timeout) {}

HopliteBackend::~HopliteBackend() { shutdown(); }

void HopliteBackend::shutdown() {
  closed_ = true;
  worker_.stop();
  completer_->stop();
  // Peers' messages for this group, waiting or late, have no receiver any more.
  channel_.messenger().discard(channel_.context(), [](uint64_t) { return true; });
}

void HopliteBackend::noteOutcome(uint64_t seq, bool failed) {
  if (closed_) return;  // the whole context is stale for good
  if (failed) {
    // Tags of collective `seq` and of the kAbandonWindow before it (seq
    // numbers wrap); send/recv's stay.
    abandoned_ = seq;
    const uint64_t last = seq & kSeqMask;
    channel_.messenger().discard(channel_.context(), [last](uint64_t tag) {
      return !(tag & kPointToPointBit) && ((last - (tag >> kSeqShift)) & kSeqMask) < kAbandonWindow;
    });
  } else if (abandoned_ && seq - *abandoned_ >= kAbandonWindow) {
    // Forgotten before the ring brings live tags into the window.
    abandoned_.reset();
    channel_.messenger().discard(channel_.context(), nullptr);
  }
}

double HopliteBackend::timeoutSeconds(std::chrono::milliseconds requested) const {
  auto ms = requested == ::c10d::kUnsetTimeout ? timeout_.load() : requested;
  return std::clamp(std::chrono::duration<double>(ms).count(), 1e-3, kMaxTimeoutSeconds);
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::enqueue(::c10d::OpType type, const char* name, Tensors keep,
                                                         Tensors outputs, std::chrono::milliseconds timeout,
                                                         std::shared_ptr<const DeviceStaging> staging, Body body) {
  auto work = c10::make_intrusive<HopliteWork>(getRank(), type, std::move(outputs));
  std::lock_guard<std::mutex> lock(issueMutex_);
  const uint64_t seq = seq_++;
  const double seconds = timeoutSeconds(timeout);
  auto owner = std::make_shared<Tensors>(std::move(keep));
  std::string label = std::string("hoplite ") + name + " #" + std::to_string(seq);
  worker_.submit([this, work, seq, seconds, owner, label, kind = std::string(name), staging = std::move(staging),
                  body = std::move(body)] {
    std::exception_ptr error;
    Status failure;  // what the other members are told
    try {
      channel_.begin(label, kind, (seq & kSeqMask) << kSeqShift, seconds, owner, seq);
      if (staging) staging->awaitCopiesIn();
      body(channel_);
      if (staging) staging->copyOut();
    } catch (const CommError& e) {
      error = asBackendError(e.what());
      failure = Status(e.code(), e.what());
    } catch (const std::exception& e) {
      error = std::current_exception();
      failure = Status(Code::kInternal, label + " on rank " + std::to_string(getRank()) + ": " + e.what());
    } catch (...) {
      error = std::current_exception();
      failure = Status(Code::kInternal, label + " on rank " + std::to_string(getRank()) + " failed");
    }
    channel_.end(failure);
    noteOutcome(seq, error != nullptr);  // after a failure, what peers sent for it would wait forever
    work->complete(error);
  });
  return work;
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::broadcast(Tensors& tensors, const ::c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  checkRoot(root, getSize(), "broadcast");
  auto staging = std::make_shared<DeviceStaging>();
  Dense d(staging->stage(t, getRank() == root, getRank() != root));
  return enqueue(::c10d::OpType::BROADCAST, "broadcast", {d.work, t}, tensors, opts.timeout, staging, [d, root](Channel& ch) {
    hoplite::c10d::broadcast(ch, bytesOf(d.work), nbytes(d.work), root);
    d.commit();
  });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::allreduce(Tensors& tensors, const ::c10d::AllreduceOptions& opts) {
  const at::Tensor& t = single(tensors, "allreduce");
  Reduction red = reductionFor(opts.reduceOp, t, "allreduce");
  auto staging = std::make_shared<DeviceStaging>();
  Dense d(staging->stage(t, true, true));
  return enqueue(::c10d::OpType::ALLREDUCE, "allreduce", {d.work, t}, tensors, opts.timeout, staging, [d, red](Channel& ch) {
    allreduceInPlace(ch, d.work, red);
    d.commit();
  });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::allreduce_coalesced(Tensors& tensors,
                                                                     const ::c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "hoplite allreduce_coalesced: no tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    checkTensor(tensors[i], "allreduce_coalesced", "tensor " + std::to_string(i));
    TORCH_CHECK(tensors[i].scalar_type() == tensors[0].scalar_type(), "hoplite allreduce_coalesced: tensor ", i,
                " has dtype ", tensors[i].scalar_type(), ", tensor 0 has ", tensors[0].scalar_type());
  }
  Reduction red = reductionFor(opts.reduceOp, tensors[0], "allreduce_coalesced");
  auto staging = std::make_shared<DeviceStaging>();
  Tensors work = staging->stage(tensors, true, true);
  Tensors keep = tensors;
  keep.insert(keep.end(), work.begin(), work.end());
  return enqueue(::c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", keep, tensors, opts.timeout, staging,
                 [work, red](Channel& ch) {
                   std::vector<at::Tensor> flat;
                   for (const auto& t : work) flat.push_back(t.reshape({-1}));
                   at::Tensor joined = at::cat(flat);
                   hold(ch, joined);
                   allreduceInPlace(ch, joined, red);
                   int64_t at = 0;
                   for (const auto& t : work) {
                     t.copy_(joined.narrow(0, at, t.numel()).view(t.sizes()));
                     at += t.numel();
                   }
                 });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::reduce(Tensors& tensors, const ::c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  const int root = static_cast<int>(opts.rootRank);
  checkRoot(root, getSize(), "reduce");
  Reduction red = reductionFor(opts.reduceOp, t, "reduce");
  auto staging = std::make_shared<DeviceStaging>();
  Dense d(staging->stage(t, true, getRank() == root));
  return enqueue(::c10d::OpType::REDUCE, "reduce", {d.work, t}, tensors, opts.timeout, staging, [d, red, root](Channel& ch) {
    chainReduce(ch, bytesOf(d.work), d.work.numel(), red.elements, root);
    if (ch.rank() == root) {
      if (red.divide) red.divide(bytesOf(d.work), d.work.numel(), ch.size());
      d.commit();
    }
  });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::allgather(TensorLists& outputs, Tensors& inputs,
                                                           const ::c10d::AllgatherOptions& opts) {
  const at::Tensor& in = single(inputs, "allgather");
  const Tensors& userOuts = checkedList(outputs, getSize(), in, "allgather", "output");
  auto staging = std::make_shared<DeviceStaging>();
  Tensors outs = staging->stage(userOuts, false, true);
  at::Tensor src = staging->stage(in, true, false);
  Tensors keep = plus(outs, src);
  return enqueue(::c10d::OpType::ALLGATHER, "allgather", keep, userOuts, opts.timeout, staging, [in = src, outs](Channel& ch) {
    const size_t block = nbytes(in);
    uint8_t* flat = ch.scratch(block * ch.size());
    copyFrom(flat + block * ch.rank(), in);
    ringAllgather(ch, flat, block);
    for (int i = 0; i < ch.size(); ++i) copyTo(outs[i], flat + block * i);
  });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const ::c10d::AllgatherOptions& opts) {
  checkTensor(input, "all_gather_into_tensor", "the input");
  checkTensor(output, "all_gather_into_tensor", "the output");
  checkSameDtype(output, input, "all_gather_into_tensor");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "hoplite all_gather_into_tensor: output has ",
              output.numel(), " elements, expected ", input.numel() * getSize(), " (input × group size)");
  auto staging = std::make_shared<DeviceStaging>();
  Dense d(staging->stage(output, false, true));
  at::Tensor src = staging->stage(input, true, false);
  return enqueue(::c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {d.work, output, src}, {output},
                 opts.timeout, staging, [d, input = src](Channel& ch) {
                   copyFrom(bytesOf(d.work) + nbytes(input) * ch.rank(), input);
                   ringAllgather(ch, bytesOf(d.work), nbytes(input));
                   d.commit();
                 });
}

// Every rank's block is all inputs' bytes back to back: one ring pass gathers
// them all, then `place(rank, block)` copies rank r's block out.
c10::intrusive_ptr<::c10d::Work> HopliteBackend::allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                                                                     const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "hoplite allgather_coalesced: ", outputs.size(),
              " output lists for ", inputs.size(), " inputs");
  Tensors keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "allgather_coalesced", "input " + std::to_string(i));
    checkList(outputs[i], getSize(), inputs[i], "allgather_coalesced", "output");
    keep.insert(keep.end(), outputs[i].begin(), outputs[i].end());
    keep.push_back(inputs[i]);
  }
  Tensors flatOutputs;
  for (const auto& list : outputs) flatOutputs.insert(flatOutputs.end(), list.begin(), list.end());
  auto staging = std::make_shared<DeviceStaging>();
  Tensors ins = staging->stage(inputs, true, false);
  TensorLists outs;
  for (const auto& list : outputs) outs.push_back(staging->stage(list, false, true));
  for (const auto& list : outs) keep.insert(keep.end(), list.begin(), list.end());
  keep.insert(keep.end(), ins.begin(), ins.end());
  return enqueue(::c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", keep, flatOutputs, opts.timeout, staging,
                 [inputs = ins, outputs = outs](Channel& ch) {
                   gatherCoalesced(ch, inputs, [&](int rank, const uint8_t* block) {
                     for (size_t i = 0; i < inputs.size(); ++i) {
                       copyTo(outputs[i][rank], block);
                       block += nbytes(inputs[i]);
                     }
                   });
                 });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                                                 const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "hoplite allgather_into_tensor_coalesced: ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "allgather_into_tensor_coalesced", "input " + std::to_string(i));
    checkTensor(outputs[i], "allgather_into_tensor_coalesced", "output " + std::to_string(i));
    checkSameDtype(outputs[i], inputs[i], "allgather_into_tensor_coalesced");
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize(), "hoplite allgather_into_tensor_coalesced: output ",
                i, " has ", outputs[i].numel(), " elements, expected ", inputs[i].numel() * getSize(),
                " (input × group size)");
  }
  auto staging = std::make_shared<DeviceStaging>();
  Tensors ins = staging->stage(inputs, true, false), outs = staging->stage(outputs, false, true);
  Tensors keep = outs;
  keep.insert(keep.end(), ins.begin(), ins.end());
  return enqueue(::c10d::OpType::COALESCED, "allgather_into_tensor_coalesced", keep, outputs, opts.timeout, staging,
                 [inputs = ins, outputs = outs](Channel& ch) {
                   std::vector<Dense> dense(outputs.begin(), outputs.end());
                   gatherCoalesced(ch, inputs, [&](int rank, const uint8_t* block) {
                     for (size_t i = 0; i < inputs.size(); ++i) {
                       const size_t size = nbytes(inputs[i]);
                       if (size > 0) std::memcpy(bytesOf(dense[i].work) + size * rank, block, size);
                       block += size;
                     }
                   });
                   for (const auto& d : dense) d.commit();
                 });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::gather(TensorLists& outputs, Tensors& inputs,
                                                        const ::c10d::GatherOptions& opts) {
  const at::Tensor& in = single(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  checkRoot(root, getSize(), "gather");
  Tensors outs;
  if (getRank() == root) {
    outs = checkedList(outputs, getSize(), in, "gather", "output");
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "hoplite gather: only the root takes output tensors");
  }
  auto staging = std::make_shared<DeviceStaging>();
  Tensors work = staging->stage(outs, false, true);
  at::Tensor src = staging->stage(in, true, false);
  Tensors keep = plus(work, src);
  return enqueue(::c10d::OpType::GATHER, "gather", keep, outs, opts.timeout, staging,
                 [in = src, outs = work, root](Channel& ch) {
    at::Tensor src = in.contiguous();
    hold(ch, src);
    std::vector<Dense> dense;
    std::vector<uint8_t*> blocks;
    for (const auto& o : outs) {
      dense.emplace_back(o);
      hold(ch, dense.back().work);
      blocks.push_back(bytesOf(dense.back().work));
    }
    hoplite::c10d::gather(ch, bytesOf(src), blocks.data(), nbytes(src), root);
    for (const auto& d : dense) d.commit();
  });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::scatter(Tensors& outputs, TensorLists& inputs,
                                                         const ::c10d::ScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  checkRoot(root, getSize(), "scatter");
  Tensors ins;
  if (getRank() == root) {
    ins = checkedList(inputs, getSize(), out, "scatter", "input");
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "hoplite scatter: only the root takes input tensors");
  }
  auto staging = std::make_shared<DeviceStaging>();
  Tensors work = staging->stage(ins, true, false);
  at::Tensor dst = staging->stage(out, false, true);
  Tensors keep = plus(work, dst);
  return enqueue(::c10d::OpType::SCATTER, "scatter", keep, outputs, opts.timeout, staging,
                 [ins = work, out = dst, root](Channel& ch) {
    std::vector<at::Tensor> dense;
    std::vector<const uint8_t*> blocks;
    for (const auto& i : ins) {
      dense.push_back(i.contiguous());
      hold(ch, dense.back());
      blocks.push_back(bytesOf(dense.back()));
    }
    Dense d(out);
    hold(ch, d.work);
    hoplite::c10d::scatter(ch, blocks.data(), bytesOf(d.work), nbytes(d.work), root);
    d.commit();
  });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::reduce_scatter(Tensors& outputs, TensorLists& inputs,
                                                                const ::c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "reduce_scatter");
  const Tensors& ins = checkedList(inputs, getSize(), out, "reduce_scatter", "input");
  Reduction red = reductionFor(opts.reduceOp, out, "reduce_scatter");
  auto staging = std::make_shared<DeviceStaging>();
  Tensors work = staging->stage(ins, true, false);
  at::Tensor dst = staging->stage(out, false, true);
  Tensors keep = plus(work, dst);
  return enqueue(::c10d::OpType::REDUCE_SCATTER, "reduce_scatter", keep, outputs, opts.timeout, staging,
                 [ins = work, out = dst, red](Channel& ch) {
                   const size_t block = nbytes(out);
                   uint8_t* flat = ch.scratch(block * ch.size());
                   for (int i = 0; i < ch.size(); ++i) copyFrom(flat + block * i, ins[i]);
                   reduceScatterInto(ch, flat, out, red);
                 });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const ::c10d::ReduceScatterOptions& opts) {
  checkTensor(output, "reduce_scatter_tensor", "the output");
  checkTensor(input, "reduce_scatter_tensor", "the input");
  checkSameDtype(output, input, "reduce_scatter_tensor");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "hoplite reduce_scatter_tensor: input has ", input.numel(),
              " elements, expected ", output.numel() * getSize(), " (output × group size)");
  Reduction red = reductionFor(opts.reduceOp, output, "reduce_scatter_tensor");
  auto staging = std::make_shared<DeviceStaging>();
  at::Tensor dst = staging->stage(output, false, true), src = staging->stage(input, true, false);
  return enqueue(::c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {dst, src}, {output},
                 opts.timeout, staging, [output = dst, input = src, red](Channel& ch) {
                   // Work on a copy: the ring clobbers the blocks it does not own.
                   uint8_t* flat = ch.scratch(nbytes(input));
                   copyFrom(flat, input);
                   reduceScatterInto(ch, flat, output, red);
                 });
}

// Rank r's block of the joined input is every input's r-th block back to back;
// one reduce-scatter over it leaves this rank's block, which is split out again.
c10::intrusive_ptr<::c10d::Work> HopliteBackend::reduce_scatter_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const ::c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "hoplite reduce_scatter_tensor_coalesced: ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  int64_t total = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "reduce_scatter_tensor_coalesced", "input " + std::to_string(i));
    checkTensor(outputs[i], "reduce_scatter_tensor_coalesced", "output " + std::to_string(i));
    checkSameDtype(outputs[i], inputs[0], "reduce_scatter_tensor_coalesced");
    checkSameDtype(inputs[i], inputs[0], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize(), "hoplite reduce_scatter_tensor_coalesced: input ",
                i, " has ", inputs[i].numel(), " elements, expected ", outputs[i].numel() * getSize(),
                " (output × group size)");
    total += outputs[i].numel();
  }
  Reduction red = reductionFor(opts.reduceOp, outputs[0], "reduce_scatter_tensor_coalesced");
  auto staging = std::make_shared<DeviceStaging>();
  Tensors ins = staging->stage(inputs, true, false), outs = staging->stage(outputs, false, true);
  at::Tensor joined = at::empty({total}, outputs[0].options().device(at::kCPU));
  Tensors keep = outs;
  keep.insert(keep.end(), ins.begin(), ins.end());
  keep.push_back(joined);
  return enqueue(kReduceScatterTensorCoalesced, "reduce_scatter_tensor_coalesced", keep, outputs,
                 opts.timeout, staging, [inputs = ins, outputs = outs, joined, red](Channel& ch) {
                   const size_t block = nbytes(joined);
                   uint8_t* flat = ch.scratch(block * ch.size());
                   for (int r = 0; r < ch.size(); ++r) {
                     uint8_t* at = flat + block * r;
                     for (size_t i = 0; i < inputs.size(); ++i) {
                       const size_t size = nbytes(outputs[i]);
                       copyFrom(at, inputs[i].reshape({-1}).narrow(0, outputs[i].numel() * r, outputs[i].numel()));
                       at += size;
                     }
                   }
                   reduceScatterInto(ch, flat, joined, red);
                   int64_t offset = 0;
                   for (const auto& out : outputs) {
                     out.copy_(joined.narrow(0, offset, out.numel()).view(out.sizes()));
                     offset += out.numel();
                   }
                 });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& outputSplits,
                                                               std::vector<int64_t>& inputSplits,
                                                               const ::c10d::AllToAllOptions& opts) {
  checkTensor(output, "all_to_all_single", "the output");
  checkTensor(input, "all_to_all_single", "the input");
  checkSameDtype(output, input, "all_to_all_single");
  const int n = getSize();
  auto splits = [&](const at::Tensor& t, std::vector<int64_t> given, const char* what) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (given.empty()) {
      TORCH_CHECK(rows % n == 0, "hoplite all_to_all_single: ", what, " has ", rows,
                  " rows, not divisible by the group size ", n, "; give split sizes");
      given.assign(n, rows / n);
    }
    TORCH_CHECK(static_cast<int>(given.size()) == n, "hoplite all_to_all_single: ", what, " split sizes have ",
                given.size(), " entries, expected ", n);
    int64_t sum = 0;
    for (int64_t s : given) {
      TORCH_CHECK(s >= 0, "hoplite all_to_all_single: negative split size in ", what);
      sum += s;
    }
    TORCH_CHECK(sum == rows, "hoplite all_to_all_single: ", what, " split sizes add up to ", sum, ", it has ", rows,
                " rows");
    return given;
  };
  auto outRows = splits(output, outputSplits, "the output");
  auto inRows = splits(input, inputSplits, "the input");
  auto staging = std::make_shared<DeviceStaging>();
  Dense d(staging->stage(output, false, true));
  at::Tensor src = staging->stage(input, true, false);
  return enqueue(::c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {d.work, output, src}, {output}, opts.timeout,
                 staging, [d, input = src, outRows, inRows](Channel& ch) {
                   at::Tensor src = input.contiguous();
                   hold(ch, src);
                   const int64_t inRow = input.dim() == 0 ? nbytes(input) : nbytes(input) / std::max<int64_t>(input.size(0), 1);
                   const int64_t outRow = d.work.dim() == 0 ? nbytes(d.work) : nbytes(d.work) / std::max<int64_t>(d.work.size(0), 1);
                   Exchange x;
                   int64_t inAt = 0, outAt = 0;
                   for (int i = 0; i < ch.size(); ++i) {
                     x.add(bytesOf(src) + inAt * inRow, inRows[i] * inRow, bytesOf(d.work) + outAt * outRow,
                           outRows[i] * outRow);
                     inAt += inRows[i];
                     outAt += outRows[i];
                   }
                   TORCH_CHECK(x.sendBytes[ch.rank()] == x.recvBytes[ch.rank()], "hoplite all_to_all_single: rank ",
                               ch.rank(), " sends itself ", x.sendBytes[ch.rank()], " bytes but expects ",
                               x.recvBytes[ch.rank()]);
                   x.run(ch);
                   d.commit();
                 });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::alltoall(Tensors& outputs, Tensors& inputs,
                                                          const ::c10d::AllToAllOptions& opts) {
  const int n = getSize();
  TORCH_CHECK(static_cast<int>(outputs.size()) == n && static_cast<int>(inputs.size()) == n,
              "hoplite all_to_all: expects ", n, " input and ", n, " output tensors, got ", inputs.size(), " and ",
              outputs.size());
  for (int i = 0; i < n; ++i) {
    checkTensor(inputs[i], "all_to_all", "input " + std::to_string(i));
    checkTensor(outputs[i], "all_to_all", "output " + std::to_string(i));
    TORCH_CHECK(inputs[i].scalar_type() == outputs[i].scalar_type(), "hoplite all_to_all: input ", i, " has dtype ",
                inputs[i].scalar_type(), ", output ", i, " has ", outputs[i].scalar_type());
  }
  TORCH_CHECK(inputs[getRank()].numel() == outputs[getRank()].numel(), "hoplite all_to_all: rank ", getRank(),
              " sends itself ", inputs[getRank()].numel(), " elements but expects ", outputs[getRank()].numel());
  auto staging = std::make_shared<DeviceStaging>();
  Tensors ins = staging->stage(inputs, true, false), outs = staging->stage(outputs, false, true);
  Tensors keep = ins;
  keep.insert(keep.end(), outs.begin(), outs.end());
  return enqueue(::c10d::OpType::ALLTOALL, "all_to_all", keep, outputs, opts.timeout, staging, [ins, outs](Channel& ch) {
    std::vector<at::Tensor> src;
    std::vector<Dense> dst;
    Exchange x;
    for (int i = 0; i < ch.size(); ++i) {
      src.push_back(ins[i].contiguous());
      dst.emplace_back(outs[i]);
      hold(ch, src.back());
      hold(ch, dst.back().work);
      x.add(bytesOf(src.back()), nbytes(src.back()), bytesOf(dst.back().work), nbytes(dst.back().work));
    }
    x.run(ch);
    for (const auto& d : dst) d.commit();
  });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::barrier(const ::c10d::BarrierOptions& opts) {
  return enqueue(::c10d::OpType::BARRIER, "barrier", {}, {}, opts.timeout, nullptr,
                 [](Channel& ch) { hoplite::c10d::barrier(ch); });
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::send(Tensors& tensors, int dstRank, int tag) {
  return pointToPoint(tensors, dstRank, tag, true);
}
c10::intrusive_ptr<::c10d::Work> HopliteBackend::recv(Tensors& tensors, int srcRank, int tag) {
  return pointToPoint(tensors, srcRank, tag, false);
}
c10::intrusive_ptr<::c10d::Work> HopliteBackend::recvAnysource(Tensors& tensors, int tag) {
  return pointToPoint(tensors, -1, tag, false);
}

c10::intrusive_ptr<::c10d::Work> HopliteBackend::pointToPoint(Tensors& tensors, int peer, int tag, bool isSend) {
  const char* name = isSend ? "send" : "recv";
  const at::Tensor& t = single(tensors, name);
  const bool any = !isSend && peer == -1;
  TORCH_CHECK(any || (peer >= 0 && peer < getSize()), "hoplite ", name, ": rank ", peer,
              " is not a rank of this group of ", getSize());
  TORCH_CHECK(peer != getRank(), "hoplite ", name, ": rank ", peer, " cannot ", name, " to itself");
  auto type = isSend ? ::c10d::OpType::SEND : any ? ::c10d::OpType::RECVANYSOURCE : ::c10d::OpType::RECV;
  auto work = c10::make_intrusive<HopliteWork>(getRank(), type, tensors);
  auto staging = std::make_shared<DeviceStaging>();
  Dense d(staging->stage(t, isSend, !isSend));
  if (isSend) staging->awaitCopiesIn();  // the bytes leave from the twin as soon as the send starts
  auto keep = std::make_shared<at::Tensor>(d.work);
  const uint64_t tagValue = kPointToPointBit | static_cast<uint32_t>(tag);
  const int global = any ? -1 : channel_.globalRank(peer);
  const std::string what = std::string("hoplite ") + name + (isSend ? " to rank " : " from rank ") +
                           (any ? std::string("any") : std::to_string(peer)) + " (tag " + std::to_string(tag) + ")";
  auto completer = completer_;
  // Runs on the loop thread; the Work completes on the completer thread.
  auto done = [work, d, staging, what, completer, isSend, ranks = channel_.globalRanks()](const Status& status,
                                                                                        int source) {
    const int from = groupRankOf(*ranks, source);
    completer->submit([work, d, staging, what, status, from, isSend] {
      if (!status.ok()) {
        work->complete(asBackendError(what + " failed: " + status.message));
        return;
      }
      if (!isSend) {
        try {
          d.commit();
          staging->copyOut();
        } catch (...) {
          work->complete(std::current_exception(), from);
          return;
        }
      }
      work->complete(nullptr, from);
    });
  };
  const double seconds = timeoutSeconds(::c10d::kUnsetTimeout);
  if (isSend) {
    channel_.messenger().send(global, channel_.context(), tagValue, kPointToPoint, bytesOf(d.work), nbytes(d.work), keep,
                              done, seconds);
  } else {
    channel_.messenger().receive(global, channel_.context(), tagValue, kPointToPoint, bytesOf(d.work), nbytes(d.work),
                                 keep, done, seconds);
  }
  return work;
}

}  // namespace hoplite::c10d
