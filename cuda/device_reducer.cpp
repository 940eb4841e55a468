#include "device_reducer.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "reduce_kernels.h"

namespace hoplite::cuda {
namespace {

// The index in "cuda:N", or none for any other device name.
std::optional<int> cudaIndex(const std::string& device) {
  const std::string prefix = "cuda:";
  if (device.rfind(prefix, 0) != 0 || device.size() == prefix.size()) return std::nullopt;
  int index = 0;
  for (size_t i = prefix.size(); i < device.size(); ++i) {
    if (device[i] < '0' || device[i] > '9' || index > 1000) return std::nullopt;
    index = index * 10 + (device[i] - '0');
  }
  return index;
}

Status check(int code, const char* what) {
  if (code == 0) return Status();
  return Status(Code::kInternal, std::string(what) + ": " + hoplite_cuda_error_string(code));
}

class Kernel final : public DeviceReduceKernel {
 public:
  Kernel(int op, int dtype, int device) : op_(op), dtype_(dtype), device_(device) {}

  Status run(uint8_t* out, const uint8_t* in, const std::vector<const uint8_t*>& children, size_t n,
             uint64_t divisor) override {
    try {  // c10's stream pool and device guard throw on CUDA errors
      return launch(out, in, children, n, divisor);
    } catch (const std::exception& e) {
      return Status(Code::kInternal, e.what());
    }
  }

 private:
  Status launch(uint8_t* out, const uint8_t* in, const std::vector<const uint8_t*>& children, size_t n,
                uint64_t divisor) {
    if (!stream_) {
      // Here, on a worker, not in kernel(): the first CUDA call of a process
      // that never used its GPU creates a context (hundreds of milliseconds).
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess || device_ >= count) {
        cudaGetLastError();
        return Status(Code::kInvalidArgument, "no CUDA device " + std::to_string(device_) + " in this process");
      }
      int inPlace = 0;
      cudaDeviceGetAttribute(&inPlace, cudaDevAttrCanUseHostPointerForRegisteredMem, device_);
      if (!inPlace) {
        return Status(Code::kInvalidArgument,
                      "CUDA device " + std::to_string(device_) + " cannot read page-locked host memory in place");
      }
      stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, static_cast<c10::DeviceIndex>(device_));
    }
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    void* stream = stream_->stream();
    const void* a = in;
    Status s;
    for (size_t c = 0; c < children.size() && s.ok(); ++c) {
      s = check(hoplite_cuda_combine(op_, dtype_, out, a, children[c], n, stream), "reduce kernel");
      a = out;
    }
    if (s.ok() && divisor > 1) s = check(hoplite_cuda_divide(dtype_, out, n, divisor, stream), "AVG division");
    // Also after a failed launch: the kernels queued before it must not write
    // `out` while the CPU recomputes the step.
    const cudaError_t synced = cudaStreamSynchronize(stream_->stream());
    if (s.ok()) s = check(static_cast<int>(synced), "reduce stream");
    return s;
  }

  const int op_, dtype_, device_;
  std::optional<c10::cuda::CUDAStream> stream_;
};

class Reducer final : public DeviceReducer {
 public:
  std::shared_ptr<DeviceReduceKernel> kernel(ReduceOp op, const std::string& dtype,
                                             const std::string& device) override {
    const std::optional<int> index = cudaIndex(device);
    const int code = hoplite_cuda_dtype(dtype.c_str());
    if (!index || code < 0) return nullptr;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:  // a SUM, divided at the root
        return std::make_shared<Kernel>(HOPLITE_CUDA_SUM, code, *index);
      case ReduceOp::kProd:
        return std::make_shared<Kernel>(HOPLITE_CUDA_PROD, code, *index);
      case ReduceOp::kMin:
        return std::make_shared<Kernel>(HOPLITE_CUDA_MIN, code, *index);
      case ReduceOp::kMax:
        return std::make_shared<Kernel>(HOPLITE_CUDA_MAX, code, *index);
      default:  // bitwise ops: the CPU kernels have them
        return nullptr;
    }
  }
};

}  // namespace

std::shared_ptr<DeviceReducer> deviceReducer() { return std::make_shared<Reducer>(); }

}  // namespace hoplite::cuda
