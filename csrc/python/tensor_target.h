// A get's device destination that the binding hands back as a tensor (the
// CUDA one is in cuda/staging.h). Header of the binding layer: ATen types.
#pragma once

#include <ATen/core/Tensor.h>

#include "store/device_memory.h"

namespace hoplite {

class TensorTarget : public DeviceTarget {
 public:
  // The filled tensor, once the get succeeded (completer thread).
  virtual at::Tensor tensor() = 0;
};

}  // namespace hoplite
