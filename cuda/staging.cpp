#include "staging.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "common/scalar_types.h"

namespace hoplite::cuda {
namespace {

Status statusOf(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status();
  cudaGetLastError();  // clear a non-sticky error so later calls do not report it again
  return Status(Code::kInternal, std::string(what) + ": " + cudaGetErrorString(error));
}

void throwIf(cudaError_t error, const char* what) {
  Status s = statusOf(error, what);
  if (!s.ok()) throw std::runtime_error(s.message);
}

// Makes `copies` wait for the work queued so far on the device's current
// stream (the caller's), without blocking the host or the whole device.
void followCurrentStream(int device, cudaStream_t copies) {
  cudaEvent_t ready;
  throwIf(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t error = cudaEventRecord(ready, c10::cuda::getCurrentCUDAStream(device).stream());
  if (error == cudaSuccess) error = cudaStreamWaitEvent(copies, ready, 0);
  cudaEventDestroy(ready);  // released once it has fired
  throwIf(error, "waiting for the caller's stream");
}

// One chunk's copy on `stream`, finished before returning: the caller then
// moves the object's watermark (put) or hands the tensor out (get).
Status copyChunk(void* to, const void* from, uint64_t n, cudaMemcpyKind kind, int device, cudaStream_t stream) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  Status s = statusOf(cudaMemcpyAsync(to, from, n, kind, stream), "cudaMemcpyAsync");
  if (s.ok()) s = statusOf(cudaStreamSynchronize(stream), "copy on the staging stream");
  return s;
}

class TensorSourceImpl final : public DeviceSource {
 public:
  explicit TensorSourceImpl(const at::Tensor& tensor)
      : tensor_(tensor),
        device_(tensor.get_device()),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, tensor.get_device())) {
    c10::cuda::CUDAGuard guard(tensor.device());
    followCurrentStream(device_, stream_.stream());
  }

  Status read(uint64_t offset, uint64_t n, uint8_t* to) override {
    const auto* from = static_cast<const uint8_t*>(tensor_.const_data_ptr()) + offset;
    return copyChunk(to, from, n, cudaMemcpyDeviceToHost, device_, stream_.stream());
  }

 private:
  at::Tensor tensor_;  // kept until the last chunk is read
  int device_;
  c10::cuda::CUDAStream stream_;
};

class TensorTargetImpl final : public TensorTarget {
 public:
  TensorTargetImpl(int device, const at::Tensor& out)
      : device_(device),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, static_cast<c10::DeviceIndex>(device))),
        out_(out) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    // `out` may still be read by the caller's earlier kernels.
    if (out_.defined()) followCurrentStream(device_, stream_.stream());
  }

  Status prepare(const std::string& id, const ObjectMeta& meta) override {
    auto type = scalarTypeNamed(meta.dtype);
    if (!type || c10::elementSize(*type) != meta.itemsize) {
      return Status(Code::kProtocol, "get of object " + printableId(id) + ": unknown dtype '" + meta.dtype + "'");
    }
    if (out_.defined() && (out_.scalar_type() != *type || out_.nbytes() != meta.nbytes)) {
      return Status(Code::kInvalidArgument, "get of object " + printableId(id) + " into out=: the object is " +
                                                describeMeta(meta) + " (" + std::to_string(meta.nbytes) +
                                                " bytes), out= is " + nameOf(out_.scalar_type()) + " with " +
                                                std::to_string(out_.nbytes()) + " bytes");
    }
    type_ = *type;
    shape_ = meta.shape;
    return Status();
  }

  Status write(uint64_t offset, uint64_t n, const uint8_t* from) override {
    try {
      allocate();
    } catch (const std::exception& e) {
      return Status(Code::kCapacity, std::string("out of device memory: ") + e.what());
    }
    auto* to = static_cast<uint8_t*>(result_.data_ptr()) + offset;
    return copyChunk(to, from, n, cudaMemcpyHostToDevice, device_, stream_.stream());
  }

  at::Tensor tensor() override {
    allocate();  // an empty object is never written
    return result_;
  }

 private:
  void allocate() {
    if (result_.defined()) return;
    if (out_.defined()) {
      result_ = out_;
      return;
    }
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    result_ = at::empty(shape_, at::TensorOptions().dtype(type_).device(at::kCUDA, device_));
  }

  int device_;
  c10::cuda::CUDAStream stream_;
  at::Tensor out_;
  c10::ScalarType type_ = c10::ScalarType::Byte;
  std::vector<int64_t> shape_;
  at::Tensor result_;
};

class HostRegistrar final : public HostMemoryLocker {
 public:
  bool lock(void* data, size_t size) override {
    // Portable: usable from every device's context, whichever copies from it;
    // mapped: the reduce kernels read and write it in place (device_reducer.cpp).
    const unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
    return statusOf(cudaHostRegister(data, size, flags), "cudaHostRegister").ok();
  }
  void unlock(void* data) override { statusOf(cudaHostUnregister(data), "cudaHostUnregister"); }
};

}  // namespace

std::shared_ptr<DeviceSource> tensorSource(const at::Tensor& tensor) {
  return std::make_shared<TensorSourceImpl>(tensor);
}

std::shared_ptr<TensorTarget> tensorTarget(int index, const at::Tensor& out) {
  return std::make_shared<TensorTargetImpl>(index, out);
}

std::shared_ptr<HostMemoryLocker> hostMemoryLocker() { return std::make_shared<HostRegistrar>(); }

}  // namespace hoplite::cuda
