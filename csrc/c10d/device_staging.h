// CUDA tensors in the backend's collectives. The algorithms move host memory,
// so each device tensor of a collective gets a page-locked host twin: those it
// reads are copied in on the collective's worker before it runs, those it
// writes copied back after it succeeded. Both copies run on the stream that
// was current when the collective was issued (after the kernels that produced
// its inputs) and are synchronized before the work completes, so whoever waits
// for the work sees the results on any stream. Written against torch's
// device-generic stream API: no CUDA header, the same code in CPU builds.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <vector>

namespace hoplite::c10d {

class DeviceStaging {
 public:
  // The tensor the collective works on: `t` itself on the CPU, else its host
  // twin. `in`: the collective reads `t`; `out`: it writes `t`. Call on the
  // issuing thread (its current stream is the one the copies follow).
  at::Tensor stage(const at::Tensor& t, bool in, bool out);
  std::vector<at::Tensor> stage(const std::vector<at::Tensor>& ts, bool in, bool out);
  // Twins to copy into before the collective; after it, twins to copy back
  // out of (each blocks until its copies are done).
  void copyIn() const;
  void copyOut() const;

 private:
  struct Twin {
    at::Tensor device, host;
    c10::Stream stream;
    bool in, out;
  };
  std::vector<Twin> twins_;
};

}  // namespace hoplite::c10d
