// Probes to peers: whether they answer (a rejoining node's introduction, a
// reduce's roll call). The link estimate's are in reduce/link_estimator.cpp.
#include "node/node.h"

namespace hoplite {

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
    directory_->probe(r, "", [call, r, settle](const Status& s) {
      if (!call->done) return;
      if (!s.ok()) call->silent.insert(r);
      call->waiting.erase(r);
      if (call->waiting.empty()) settle();
    });
  }
}

}  // namespace hoplite
