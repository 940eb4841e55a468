// Probes to peers: whether they answer (a rejoining node's introduction, a
// reduce's roll call) and how fast the link to one is (the reduce cost model).
#include "common/logging.h"
#include "node/node.h"

namespace hoplite {

namespace {
constexpr uint64_t kProbeBytes = 1u << 20;
constexpr double kLinkMaxAge = 60.0;
constexpr double kProbeTimeout = 2.0;
constexpr int kProbeRounds = 3;
// Used when there is no peer to probe, or a probe fails: a 10 Gbit/s LAN.
constexpr LinkEstimate kDefaultLink{50e-6, 1.25e9};
}  // namespace

void Node::probeRanks(const std::set<int>& ranks, double timeoutSeconds,
                      std::function<void(std::set<int> silent)> done) {
  struct Call {
    std::set<int> waiting, silent;
    EventLoop::TimerId timer = 0;
    std::function<void(std::set<int>)> done;  // empty once called
  };
  auto call = std::make_shared<Call>();
  call->waiting = ranks;
  call->done = std::move(done);
  auto settle = [this, call] {
    if (!call->done) return;
    if (call->timer) loop_.cancelTimer(call->timer);
    call->silent.insert(call->waiting.begin(), call->waiting.end());
    std::exchange(call->done, nullptr)(std::move(call->silent));
  };
  if (ranks.empty()) return settle();
  call->timer = loop_.addTimer(timeoutSeconds, [call, settle] {
    call->timer = 0;
    settle();
  });
  for (int r : ranks) {
    uint64_t request = newRequest();
    requestStatus(r, wire::MsgType::kProbe, wire::encode(wire::Probe{request, std::string()}), request,
                  [call, r, settle](const Status& s) {
                    if (!call->done) return;
                    if (!s.ok()) call->silent.insert(r);
                    call->waiting.erase(r);
                    if (call->waiting.empty()) settle();
                  });
  }
}

void Node::withLinkEstimate(std::function<void()> then) {
  const bool fresh = linkMeasuredAt_ >= 0 && now() - linkMeasuredAt_ < kLinkMaxAge;
  if (config_.worldSize <= 1 || fresh) {
    if (linkMeasuredAt_ < 0) link_ = kDefaultLink;
    then();
    return;
  }
  linkWaiters_.push_back(std::move(then));
  if (linkWaiters_.size() > 1) return;  // a probe is already out
  const int peer = (config_.rank + 1) % config_.worldSize;
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
    linkMeasured_ = measured;
    linkMeasuredAt_ = now();
    auto waiters = std::move(linkWaiters_);
    linkWaiters_.clear();
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
    counters_.probes++;
    uint64_t request = newRequest();
    const double start = now();
    requestStatus(peer, wire::MsgType::kProbe, wire::encode(wire::Probe{request, std::string(big ? kProbeBytes : 0, '\0')}),
                  request, [this, round, samples, step, finish, start, big](const Status& s) {
                    if (round->settled) return;  // by the timer
                    if (!s.ok()) {
                      loop_.post([step] { *step = nullptr; });  // may be answered inside (*step)()
                      return finish(false, {});
                    }
                    double& best = big ? samples->big : samples->small;
                    best = std::min(best, now() - start);
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
