#include "python/node_handle.h"

#include "c10d/call_group.h"

#include "common/scalar_types.h"
#include "common/step_trace.h"
#include "store/tensor_target.h"
#ifdef HOPLITE_WITH_CUDA
#include "device_reducer.h"
#include "staging.h"
#endif

#include <stdexcept>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <pthread.h>

#include <condition_variable>
#include <optional>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace py = pybind11;

namespace hoplite {
namespace {

c10::ScalarType scalarType(const std::string& name) {
  auto type = scalarTypeNamed(name);
  if (!type) throw std::invalid_argument("unknown dtype '" + name + "' in object metadata");
  return *type;
}

// A tensor over `buffer`'s memory that keeps the buffer alive (an empty tensor
// when there is no memory to point at).
at::Tensor tensorOver(std::shared_ptr<Buffer> buffer, at::IntArrayRef shape, const at::TensorOptions& options,
                      uint64_t nbytes) {
  if (!buffer || nbytes == 0) return at::empty(shape, options);
  void* data = buffer->data();
  return at::from_blob(
      data, shape, [keep = std::move(buffer)](void*) mutable { keep.reset(); }, options);
}

// The bytes of a completed get as a tensor that owns a reference to them.
at::Tensor tensorOf(const Completion& c) {
  c10::ScalarType type = scalarType(c.meta.dtype);
  if (c10::elementSize(type) != c.meta.itemsize) {
    throw std::invalid_argument("object metadata says " + c.meta.dtype + " with " + std::to_string(c.meta.itemsize) +
                                "-byte elements");
  }
  return tensorOver(c.buffer, c.meta.shape, at::TensorOptions().dtype(type), c.meta.nbytes);
}

// A contiguous tensor's memory as a Buffer that keeps the tensor alive.
std::shared_ptr<Buffer> borrow(const at::Tensor& tensor) {
  return std::make_shared<Buffer>(static_cast<uint8_t*>(tensor.data_ptr()), tensor.numel() * tensor.element_size(),
                                  [keep = tensor]() mutable { keep = at::Tensor(); });
}

// A get waiting for its completion: its future, the tensor it fills if the
// caller passed one (get(out=...)) or the device tensor it fills, and the
// object's id (for its traced step). A thread blocked in GetWaiter::wait
// takes its completion straight from the loop (`ready`), one thread hop
// instead of two; `wake` is set while it waits.
struct PendingGet {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  at::Tensor out;
  std::shared_ptr<TensorTarget> device;
  std::string id;
  std::shared_ptr<std::condition_variable> wake;
  std::optional<Completion> ready;
};

#ifdef HOPLITE_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

void requireCuda(const char* what) {
  if (!kWithCuda) {
    throw py::value_error(std::string(what) + ": this torch_hoplite was built without CUDA (build it where torch has "
                                              "CUDA and nvcc is installed, or with HOPLITE_BUILD_CUDA=1)");
  }
}

// A get's failure as its future keeps it: turned into a torch_hoplite
// exception whenever it is raised (registerGetErrorTranslator).
class GetFailed : public std::runtime_error {
 public:
  explicit GetFailed(const Status& s) : std::runtime_error(s.message), code_(static_cast<int>(s.code)) {}
  int code() const { return code_; }

 private:
  int code_;
};

// Sets a get's future: the tensor, or its failure.
void complete(const PendingGet& get, Completion c) {
  const auto& fut = get.fut;
  if (c.status.ok()) {
    try {
      at::Tensor tensor = get.device ? get.device->tensor() : get.out.defined() ? get.out : tensorOf(c);
      if (fut->completed()) return;  // completed by the user meanwhile
      traceStep(Step::kGetDelivered, get.id);
      fut->markCompleted(c10::IValue(std::move(tensor)));
      return;
    } catch (const std::exception& e) {
      c.status = Status(Code::kProtocol, std::string("get: ") + e.what());
    }
  }
  if (fut->completed()) return;  // completed by the user meanwhile
  traceStep(Step::kGetDelivered, get.id);
  try {
    fut->setError(std::make_exception_ptr(GetFailed(c.status)));
  } catch (const std::exception&) {
    // Completed already (e.g. by the user); nothing left to tell.
  }
}

}  // namespace

void registerGetErrorTranslator() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const GetFailed& e) {
      py::object error = py::module_::import("torch_hoplite.errors").attr("error_from_status")(e.code(), e.what());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    }
  });
}

struct NodeHandle::State {
  struct Put {
    at::Tensor source;     // kept alive until copied into the store
    bool waiter = false;   // a blocking put waits for `done`, then forgets the entry
    bool done = false;
    Status status;
  };
  std::mutex mutex;
  std::condition_variable putDone;
  uint64_t nextToken = 1;
  std::unordered_map<uint64_t, PendingGet> gets;
  std::unordered_map<uint64_t, Put> puts;
  std::thread completer;
  std::thread::id completerId;  // set once, before any get: read without joining races
  std::once_flag stopped;
};

void completeLoop(Node& node, NodeHandle::State& state);
// Completes the future of a get, or releases the source of a finished put.
void deliver(NodeHandle::State& state, Completion c);
// Hands a get's completion to the thread waiting for it in GetWaiter::wait, if any.
bool handToWaiter(NodeHandle::State& state, Completion& c);

NodeHandle::NodeHandle(const NodeConfig& config)
    : node_(std::make_shared<Node>(config)), state_(std::make_shared<State>()) {
  node_->setDirectCompletion([state = std::weak_ptr<State>(state_)](Completion& c) {
    auto s = state.lock();
    return s && handToWaiter(*s, c);
  });
  state_->completer = std::thread([node = node_, state = state_] { completeLoop(*node, *state); });
  state_->completerId = state_->completer.get_id();
  ::pthread_setname_np(state_->completer.native_handle(), "hoplite-done");
#ifdef HOPLITE_WITH_CUDA
  node_->setHostMemoryLocker(cuda::hostMemoryLocker());
  node_->setDeviceReducer(cuda::deviceReducer());
#endif
}

NodeHandle::~NodeHandle() { shutdown(); }

py::tuple NodeHandle::put(const py::bytes& id, const std::string& dtype, const py::object& tensorObj,
                          double timeout, bool blocking, bool copy) {
  if (!THPVariable_Check(tensorObj.ptr())) throw py::type_error("put expects a tensor");
  at::Tensor tensor = THPVariable_Unpack(tensorObj.ptr());
  if (!(tensor.device().is_cpu() || tensor.device().is_cuda()) || !tensor.is_contiguous()) {
    throw py::value_error("put expects a contiguous CPU or CUDA tensor (torch_hoplite.put prepares it)");
  }
  std::shared_ptr<DeviceSource> source;
  if (tensor.device().is_cuda()) {
    requireCuda("put of a CUDA tensor");
    if (!copy) throw py::value_error("put of a CUDA tensor needs copy=True (the store keeps objects in host memory)");
#ifdef HOPLITE_WITH_CUDA
    source = cuda::tensorSource(tensor);
#endif
  }
  ObjectMeta meta;
  meta.dtype = dtype;
  meta.itemsize = static_cast<uint32_t>(tensor.element_size());
  meta.shape = tensor.sizes().vec();
  meta.nbytes = static_cast<uint64_t>(tensor.numel()) * meta.itemsize;
  meta.device = tensor.device().str();
  std::string key = id;
  Status s;
  {
    py::gil_scoped_release release;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    uint64_t token;
    bool copied = false;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      token = state_->nextToken++;
      state_->puts.emplace(token, State::Put{tensor, blocking});
    }
    try {
      auto* data = source ? nullptr : static_cast<uint8_t*>(tensor.data_ptr());
      std::shared_ptr<Buffer> borrowed;
      if (!copy) borrowed = borrow(tensor);
      s = node_->put(key, meta, data, token, timeout, &copied, std::move(borrowed), std::move(source));
    } catch (const std::exception& e) {
      s = Status(Code::kInternal, e.what());
    }
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!s.ok() || copied) {
      state_->puts.erase(token);  // no copy was started, or it is done
    } else if (blocking) {
      // A waiter's entry stays until it is read here (or shutdown fails it).
      auto done = [&] {
        auto it = state_->puts.find(token);
        return it == state_->puts.end() || it->second.done;
      };
      if (state_->putDone.wait_until(lock, deadline, done)) {
        auto it = state_->puts.find(token);
        if (it != state_->puts.end()) {
          s = it->second.status;  // e.g. deleted while copying, or shut down
          state_->puts.erase(it);
        }
      } else {
        state_->puts.at(token).waiter = false;  // deliver() forgets it when the copy ends
        s = Status(Code::kTimeout, "put of object " + printableId(key) +
                                       " is registered, but its local copy did not finish in time");
      }
    }
  }
  return py::make_tuple(static_cast<int>(s.code), s.message);
}

py::tuple NodeHandle::allreduce(const py::bytes& id, std::vector<int> members, const py::object& tensorObj, int op,
                                double timeout) {
  if (!THPVariable_Check(tensorObj.ptr())) throw py::type_error("allreduce expects a tensor");
  at::Tensor input = THPVariable_Unpack(tensorObj.ptr());
  if (!input.device().is_cpu() || !input.is_contiguous() || input.is_conj() || input.is_neg()) {
    throw py::value_error("allreduce expects a contiguous CPU tensor, conjugation and negation resolved "
                          "(torch_hoplite.allreduce prepares it)");
  }
  if (op < 0 || op > kMaxReduceOp) throw py::value_error("allreduce: unknown reduce op " + std::to_string(op));
  const size_t count = static_cast<size_t>(input.numel());
  const size_t itemsize = input.element_size();
  const size_t nbytes = count * itemsize;
  std::shared_ptr<Buffer> result = nbytes ? node_->allocate(nbytes) : nullptr;
  std::string key = id;
  // The node holds both memories as long as its messages may touch them; a
  // failed call's sends may read the input after the call returns.
  auto keep = std::make_shared<std::pair<at::Tensor, std::shared_ptr<Buffer>>>(input, result);
  Status s;
  {
    py::gil_scoped_release release;
    std::shared_ptr<TaggedMessenger> messenger(node_, &node_->messenger());
    auto allocate = [node = node_](size_t bytes) { return node->allocate(bytes); };
    s = c10d::allreduceAmong(std::move(messenger), std::move(allocate), key, std::move(members), node_->rank(),
                             static_cast<const uint8_t*>(input.data_ptr()), result ? result->data() : nullptr, count,
                             itemsize, nameOf(input.scalar_type()), static_cast<ReduceOp>(op), timeout, keep);
    // The node lets go of them just after its last message completes. The
    // tensor is released here, with the GIL, rather than by the loop thread,
    // which would have to take the GIL to do it.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (keep.use_count() > 1 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  keep.reset();
  if (!s.ok()) return py::make_tuple(static_cast<int>(s.code), s.message, py::none());
  at::Tensor tensor = tensorOver(result, {input.numel()}, at::TensorOptions().dtype(input.scalar_type()), nbytes);
  return py::make_tuple(0, std::string(), py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(tensor))));
}

py::object NodeHandle::empty(int64_t numel, const std::string& dtype) {
  const c10::ScalarType type = scalarType(dtype);
  if (numel < 0) throw py::value_error("empty: numel must be >= 0");
  const uint64_t nbytes = static_cast<uint64_t>(numel) * c10::elementSize(type);
  const auto options = at::TensorOptions().dtype(type);
  at::Tensor tensor = tensorOver(nbytes ? node_->allocate(nbytes) : nullptr, {numel}, options, nbytes);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(tensor)));
}

uint64_t NodeHandle::get(const py::bytes& id, double timeout, bool copy, const py::object& future, const py::object& out,
                         const std::string& outDtype, int cudaDevice, int source) {
  auto wrapper = future.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>();
  std::string key = id;
  PendingGet pending{wrapper->fut, at::Tensor(), nullptr, key};
  GetTarget target;
  if (!out.is_none()) {
    if (!THPVariable_Check(out.ptr())) throw py::type_error("get: out must be a tensor");
    pending.out = THPVariable_Unpack(out.ptr());
    const bool here = pending.out.device().is_cpu() ||
                      (pending.out.device().is_cuda() && pending.out.device().index() == cudaDevice);
    if (!here || !pending.out.is_contiguous()) {
      throw py::value_error("get expects out to be a contiguous tensor on the get's device (torch_hoplite.get checks it)");
    }
    if (cudaDevice < 0) {
      // The target keeps `out` alive while a worker may still write into it.
      target.buffer = borrow(pending.out);
      target.dtype = outDtype;
    }
  }
  if (cudaDevice >= 0) {
    requireCuda("get to a CUDA device");
#ifdef HOPLITE_WITH_CUDA
    pending.device = cuda::tensorTarget(cudaDevice, pending.out);
    target.device = pending.device;
#endif
  }
  const bool targeted = target.buffer || target.device;
  py::gil_scoped_release release;
  uint64_t token;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    token = state_->nextToken++;
    state_->gets.emplace(token, std::move(pending));
  }
  Completion now;
  try {
    if (!node_->get(key, timeout, copy, token, &now, targeted ? &target : nullptr, source)) return token;
  } catch (const std::exception& e) {
    now = Completion{token, Completion::Kind::kGet, Status(Code::kInternal, e.what()), nullptr, {}};
  }
  deliver(*state_, std::move(now));  // served at once, or failed
  return token;
}

GetWaiter NodeHandle::getWaiter() const { return GetWaiter(state_); }

GetWaiter::GetWaiter(std::shared_ptr<NodeHandle::State> state) : state_(std::move(state)) {}

void GetWaiter::wait(uint64_t token, double timeout) {
  py::gil_scoped_release release;
  // The completer thread itself must not wait here for a completion it has
  // yet to deliver (a future's callback waiting for another get).
  if (std::this_thread::get_id() == state_->completerId) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  auto it = state_->gets.find(token);
  if (it == state_->gets.end() || it->second.wake) return;  // delivered already, or another thread waits
  auto wake = std::make_shared<std::condition_variable>();
  it->second.wake = wake;
  auto arrived = [&] {
    it = state_->gets.find(token);
    return it == state_->gets.end() || it->second.ready.has_value();
  };
  if (!wake->wait_for(lock, std::chrono::duration<double>(timeout), arrived)) {
    it->second.wake.reset();  // the completer thread delivers it
    return;
  }
  if (it == state_->gets.end()) return;  // delivered by the completer thread, or failed by shutdown
  PendingGet get = std::move(it->second);
  state_->gets.erase(it);
  lock.unlock();
  Completion c = std::move(*get.ready);
  complete(get, std::move(c));
}

void completeLoop(Node& node, NodeHandle::State& state) {
  std::vector<Completion> batch;
  while (node.waitCompletions(&batch, 3600.0)) {
    for (auto& c : batch) deliver(state, std::move(c));
    batch.clear();
  }
}

bool handToWaiter(NodeHandle::State& state, Completion& c) {
  if (c.kind != Completion::Kind::kGet) return false;
  std::shared_ptr<std::condition_variable> wake;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.gets.find(c.token);
    if (it == state.gets.end() || !it->second.wake) return false;
    it->second.ready = std::move(c);
    wake = it->second.wake;
  }
  wake->notify_one();
  return true;
}

void deliver(NodeHandle::State& state, Completion c) {
  std::unique_lock<std::mutex> lock(state.mutex);
  if (c.kind == Completion::Kind::kPutCopied) {
    auto it = state.puts.find(c.token);
    if (it == state.puts.end()) return;
    at::Tensor source = std::move(it->second.source);
    if (it->second.waiter) {
      it->second.done = true;
      it->second.status = c.status;
    } else {
      state.puts.erase(it);
    }
    lock.unlock();
    state.putDone.notify_all();
    return;  // `source` is released here, without the GIL
  }
  auto it = state.gets.find(c.token);
  if (it == state.gets.end()) return;
  PendingGet get = std::move(it->second);
  state.gets.erase(it);
  lock.unlock();
  if (get.wake) get.wake->notify_one();  // a waiter that came too late for this one stops waiting
  complete(get, std::move(c));
}

void NodeHandle::shutdown() {
  bool first = false;
  {
    py::gil_scoped_release release;  // a concurrent shutdown may need the GIL to finish
    std::call_once(state_->stopped, [&] {
      first = true;
      node_->shutdown();
      if (std::this_thread::get_id() == state_->completerId) {
        state_->completer.detach();  // called from a future's callback: the loop ends when it returns
      } else {
        state_->completer.join();
      }
    });
  }
  if (!first) return;
  {
    // The node failed its pending gets before stopping; anything left could
    // never complete, so fail it here rather than leave a waiter hanging.
    std::unordered_map<uint64_t, PendingGet> left;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      left.swap(state_->gets);
      for (auto it = state_->puts.begin(); it != state_->puts.end();) {
        if (it->second.waiter) {  // a blocking put still waits: tell it
          it->second.done = true;
          it->second.status = Status(Code::kShutdown, "node shut down during put");
          it->second.source = at::Tensor();
          ++it;
        } else {
          it = state_->puts.erase(it);
        }
      }
    }
    state_->putDone.notify_all();
    for (auto& [token, get] : left) {
      if (get.wake) get.wake->notify_one();
      Completion c = get.ready ? std::move(*get.ready)
                               : Completion{token, Completion::Kind::kGet, Status(Code::kShutdown, "node shut down"),
                                            nullptr, {}};
      complete(get, std::move(c));
    }
  }
}

}  // namespace hoplite
