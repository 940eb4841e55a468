#include "c10d/device_staging.h"

#include <ATen/ops/empty.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace hoplite::c10d {

at::Tensor DeviceStaging::stage(const at::Tensor& t, bool in, bool out) {
  if (!t.defined() || t.device().is_cpu()) return t;
  c10::impl::VirtualGuardImpl guard(t.device().type());
  // Page-locked, so the copies are DMA transfers, from torch's caching host allocator.
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  twins_.push_back(Twin{t, host, guard.getStream(t.device()), in, out});
  return host;
}

std::vector<at::Tensor> DeviceStaging::stage(const std::vector<at::Tensor>& ts, bool in, bool out) {
  std::vector<at::Tensor> staged;
  staged.reserve(ts.size());
  for (const auto& t : ts) staged.push_back(stage(t, in, out));
  return staged;
}

// A blocking copy_ between host and device runs on the current stream and
// synchronizes it before returning.
void DeviceStaging::copyIn() const {
  for (const auto& twin : twins_) {
    if (!twin.in) continue;
    c10::StreamGuard onIssuingStream(twin.stream);
    twin.host.copy_(twin.device);
  }
}

void DeviceStaging::copyOut() const {
  for (const auto& twin : twins_) {
    if (!twin.out) continue;
    c10::StreamGuard onIssuingStream(twin.stream);
    twin.device.copy_(twin.host);
  }
}

}  // namespace hoplite::c10d
