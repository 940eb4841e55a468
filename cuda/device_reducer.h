// The DeviceReducer of CUDA builds (csrc/coll/device_reducer.h): tree reduce
// steps of objects put from CUDA tensors run the kernels of reduce_kernels.cu
// on a stream of the object's device, over page-locked store buffers in place.
#pragma once

#include <memory>

#include "coll/device_reducer.h"

namespace hoplite::cuda {

std::shared_ptr<DeviceReducer> deviceReducer();

}  // namespace hoplite::cuda
