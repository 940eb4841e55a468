// A get's device destination that the binding hands back as a tensor (the
// CUDA one is in cuda/staging.h): the ATen-facing side of a DeviceTarget,
// shared by the binding and cuda/ so that neither includes the other.
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
