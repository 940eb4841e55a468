// Link latency and bandwidth for the reduce's cost model, from probes to a
// peer, refreshed when older than a minute. Loop thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "coll/reduce_plan.h"
#include "net/event_loop.h"
#include "reduce/reduce_services.h"

namespace hoplite {

class LinkEstimator {
 public:
  LinkEstimator(EventLoop& loop, ReduceServices& node, int rank, int worldSize);

  // Runs `then` once the estimate is fresh (at once if it is).
  void withEstimate(std::function<void()> then);
  const LinkEstimate& estimate() const { return link_; }
  bool measured() const { return measured_; }  // false: defaults (no peer to probe, or the probe failed)
  uint64_t probesSent() const { return probes_.load(); }

 private:
  EventLoop& loop_;
  ReduceServices& node_;
  const int rank_, worldSize_;
  LinkEstimate link_;
  bool measured_ = false;
  double measuredAt_ = -1;
  std::vector<std::function<void()>> waiters_;  // non-empty while probing
  std::atomic<uint64_t> probes_{0};
};

}  // namespace hoplite
