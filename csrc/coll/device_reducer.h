// A reduce step's arithmetic on an accelerator: for objects put from a CUDA
// tensor, a tree position combines its chunks with the kernels in cuda/,
// reading and writing the page-locked store buffers where they lie, so the
// CPU that drives the transfers is not also the one adding. The CUDA
// implementation is cuda/device_reducer.cpp; the core sees only this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coll/reduce_kernels.h"
#include "common/status.h"

namespace hoplite {

class DeviceReduceKernel {
 public:
  virtual ~DeviceReduceKernel() = default;
  // out = in op children[0] op children[1] ... over n elements, then
  // out /= divisor when divisor > 1 (the end of AVG). Every pointer is
  // page-locked host memory. Blocks until done: call it from a worker thread,
  // one call at a time.
  virtual Status run(uint8_t* out, const uint8_t* in, const std::vector<const uint8_t*>& children, size_t n,
                     uint64_t divisor) = 0;
};

class DeviceReducer {
 public:
  virtual ~DeviceReducer() = default;
  // A kernel computing `op` over torch dtype `dtype` on `device` (an object's
  // device, e.g. "cuda:1"), or null where there is none (a CPU object, an op
  // or dtype the kernels lack, a device that cannot read host memory in
  // place): the reduce then runs on the CPU. Loop thread; does not block.
  virtual std::shared_ptr<DeviceReduceKernel> kernel(ReduceOp op, const std::string& dtype,
                                                     const std::string& device) = 0;
};

}  // namespace hoplite
