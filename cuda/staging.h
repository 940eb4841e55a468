// CUDA tensors through the store's host memory (issue #5), for the binding
// layer. A put reads its tensor chunk by chunk on a copy stream, after the
// work already queued on the caller's stream; a get writes chunks into a
// device tensor as they arrive. Store buffers are page-locked once (and stay
// so while the pool keeps them), so the copies are DMA transfers that do not
// occupy a CPU core. Built only when torch has CUDA (HOPLITE_WITH_CUDA).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "store/tensor_target.h"
#include "store/buffer_pool.h"
#include "store/device_memory.h"

namespace hoplite::cuda {

// Reads `tensor` (contiguous, on a CUDA device) once the work queued so far on
// the device's current stream is done. Throws std::runtime_error on CUDA errors.
std::shared_ptr<DeviceSource> tensorSource(const at::Tensor& tensor);

// A get's destination on CUDA device `index`: a new tensor, or `out` (defined:
// contiguous, on that device, written only after the work queued so far on the
// current stream). Throws std::runtime_error on CUDA errors.
std::shared_ptr<TensorTarget> tensorTarget(int index, const at::Tensor& out);

// cudaHostRegister / cudaHostUnregister for the store's buffer pool.
std::shared_ptr<HostMemoryLocker> hostMemoryLocker();

}  // namespace hoplite::cuda
