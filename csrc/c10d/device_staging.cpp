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
  Twin twin{t, host, guard.getStream(t.device()), out, nullptr};
  if (in) {
    // Now, after what the issuing stream has queued so far, without holding it up.
    const c10::Stream side = guard.getStreamFromGlobalPool(t.device());
    c10::Event issued(t.device().type());
    issued.record(twin.stream);
    issued.block(side);
    {
      c10::StreamGuard onSide(side);
      host.copy_(t, /*non_blocking=*/true);
    }
    twin.copied = std::make_shared<c10::Event>(t.device().type());
    twin.copied->record(side);
  }
  twins_.push_back(std::move(twin));
  return host;
}

std::vector<at::Tensor> DeviceStaging::stage(const std::vector<at::Tensor>& ts, bool in, bool out) {
  std::vector<at::Tensor> staged;
  staged.reserve(ts.size());
  for (const auto& t : ts) staged.push_back(stage(t, in, out));
  return staged;
}

void DeviceStaging::awaitCopiesIn() const {
  for (const auto& twin : twins_) {
    if (twin.copied) twin.copied->synchronize();
  }
}

// A blocking copy_ between host and device runs on the current stream and
// synchronizes it before returning.
void DeviceStaging::copyOut() const {
  for (const auto& twin : twins_) {
    if (!twin.out) continue;
    c10::StreamGuard onIssuingStream(twin.stream);
    twin.device.copy_(twin.host);
  }
}

}  // namespace hoplite::c10d
