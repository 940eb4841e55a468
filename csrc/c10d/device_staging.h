// CUDA tensors in the backend's collectives. The algorithms move host memory,
// so each device tensor of a collective gets a page-locked host twin. Those it
// reads are copied in when the collective is issued, on a side stream that
// waits for what the issuing stream had queued until then (the kernels that
// produced the inputs, and none queued after the call, as with async_op=True):
// the worker waits for that copy before the collective runs. Those it writes
// are copied back after it succeeded, on the issuing stream, synchronized
// before the work completes, so whoever waits for the work sees the results on
// any stream. Written against torch's device-generic stream and event API: no
// CUDA header, the same code in CPU builds.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <memory>
#include <vector>

namespace hoplite::c10d {

class DeviceStaging {
 public:
  // The tensor the collective works on: `t` itself on the CPU, else its host
  // twin. `in`: the collective reads `t`; `out`: it writes `t`. Call on the
  // issuing thread (its current stream is the one the copies follow).
  at::Tensor stage(const at::Tensor& t, bool in, bool out);
  std::vector<at::Tensor> stage(const std::vector<at::Tensor>& ts, bool in, bool out);
  // Waits for the copies into the twins (before the collective); after it,
  // copies the twins back out (both block until their copies are done).
  void awaitCopiesIn() const;
  void copyOut() const;

 private:
  struct Twin {
    at::Tensor device, host;
    c10::Stream stream;  // the issuing one
    bool out;
    std::shared_ptr<c10::Event> copied;  // read by the collective: the copy into `host` is done
  };
  std::vector<Twin> twins_;
};

}  // namespace hoplite::c10d
