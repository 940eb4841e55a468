#include "reduce/link_estimator.h"

#include <algorithm>
#include <memory>

#include "common/step_trace.h"

namespace hoplite {

namespace {
constexpr uint64_t kProbeBytes = 1u << 20;
constexpr double kLinkMaxAge = 60.0;
constexpr double kProbeTimeout = 2.0;
constexpr int kProbeRounds = 3;
// Used when there is no peer to probe, or a probe fails: a 10 Gbit/s LAN.
constexpr LinkEstimate kDefaultLink{50e-6, 1.25e9};
}  // namespace

LinkEstimator::LinkEstimator(EventLoop& loop, ReduceServices& node, int rank, int worldSize)
    : loop_(loop), node_(node), rank_(rank), worldSize_(worldSize) {}

void LinkEstimator::withEstimate(std::function<void()> then) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  const bool fresh = measuredAt_ >= 0 && node_.now() - measuredAt_ < kLinkMaxAge;
  if (worldSize_ <= 1 || fresh) {
    if (measuredAt_ < 0) link_ = kDefaultLink;
    then();
    return;
  }
  waiters_.push_back(std::move(then));
  if (waiters_.size() > 1) return;  // a probe is already out
  const int peer = (rank_ + 1) % worldSize_;
  traceStep(Step::kLinkProbe, std::string(), peer);
  // Settled once: by the probes, or by the timer when the peer is slow to answer.
  struct Round {
    bool settled = false;
    EventLoop::TimerId timer = 0;
  };
  auto round = std::make_shared<Round>();
  auto finish = [this, round](bool measured, LinkEstimate link) {
    if (round->settled) return;
    round->settled = true;
    if (round->timer) loop_.cancelTimer(round->timer);
    link_ = measured ? link : kDefaultLink;
    measured_ = measured;
    measuredAt_ = node_.now();
    auto waiters = std::move(waiters_);
    waiters_.clear();
    for (auto& w : waiters) w();
  };
  // Small probes give the round trip; 1 MiB ones add the time to move 1 MiB.
  // Alternating rounds, keeping the fastest of each kind, filter out moments
  // when other traffic delayed a probe.
  struct Samples {
    int next = 0;
    double small = 1e9, big = 1e9;
  };
  auto samples = std::make_shared<Samples>();
  auto step = std::make_shared<std::function<void()>>();
  *step = [this, peer, round, samples, step, finish]() {
    if (samples->next == 2 * kProbeRounds) {
      loop_.post([step] { *step = nullptr; });  // breaks the self-reference, once this call is over
      const double moved = samples->big - samples->small;
      if (moved <= samples->small * 0.05) return finish(false, {});  // no measurable transfer time
      LinkEstimate link;
      link.latencySeconds = samples->small / 2;
      link.bytesPerSecond = static_cast<double>(kProbeBytes) / moved;
      return finish(true, link);
    }
    const bool big = samples->next++ % 2 == 1;
    probes_++;
    const double start = node_.now();
    node_.directory().probe(peer, std::string(big ? kProbeBytes : 0, '\0'),
                            [this, round, samples, step, finish, start, big](const Status& s) {
                              if (round->settled) return;  // by the timer
                              if (!s.ok()) {
                                loop_.post([step] { *step = nullptr; });  // may be answered inside (*step)()
                                return finish(false, {});
                              }
                              double& best = big ? samples->big : samples->small;
                              best = std::min(best, node_.now() - start);
                              (*step)();
                            });
  };
  round->timer = loop_.addTimer(kProbeTimeout, [round, finish, step] {
    round->timer = 0;
    *step = nullptr;
    finish(false, {});
  });
  (*step)();
}

}  // namespace hoplite
