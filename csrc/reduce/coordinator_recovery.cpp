// Streaming reduce: recovery from a participant's death. A task that fails
// because a peer died reports it to the coordinator, which asks every
// participant whether it is alive (a roll call), then redoes only what
// depended on the dead: their positions (with the next ready inputs, since
// theirs died with them) and those positions' ancestors, up to the root. The
// result's readers are sent back to wait for the recomputed result. A task
// that failed although every participant answered the roll call (a handshake
// or a link that failed for a moment) is redone too, a few times.
#include <algorithm>

#include "common/logging.h"
#include "reduce/coordinator.h"

namespace hoplite {

namespace {
constexpr int kMaxBlamelessRedos = 2;
}  // namespace

void ReduceCoordinator::startRollCall(uint64_t key, const Status& why) {
  ReduceCoordination& c = *reduces_.at(key);
  if (c.recovery == ReduceCoordination::Recovery::kRollCall) return;
  c.recovery = ReduceCoordination::Recovery::kRollCall;
  c.failure = why;
  std::set<int> ranks, waiting, dead;
  for (const auto& p : c.positions) {
    if (p.state != ReducePosition::State::kVacant) ranks.insert(p.holder);
  }
  for (const auto& r : c.ready) ranks.insert(r.reply.sender);
  for (int r : ranks) {
    if (r == config_.rank) continue;
    (node_.peers().hasFailed(r) ? dead : waiting).insert(r);
  }
  // Who has not answered when the heartbeat timeout passes counts as dead.
  node_.probeRanks(waiting, config_.heartbeatTimeoutSeconds, [this, key, dead](std::set<int> silent) mutable {
    dead.insert(silent.begin(), silent.end());
    if (reduces_.count(key)) recover(key, dead);
  });
}

void ReduceCoordinator::recover(uint64_t key, const std::set<int>& dead) {
  ReduceCoordination& c = *reduces_.at(key);
  c.recovery = ReduceCoordination::Recovery::kNone;
  using State = ReducePosition::State;
  if (node_.shuttingDown()) return endReduce(key, c.failure);
  if (dead.empty()) {
    const bool failed = std::any_of(c.positions.begin(), c.positions.end(),
                                    [](const ReducePosition& p) { return p.state == State::kFailed; });
    if (!failed) return endReduce(key, c.failure);
    if (c.blamelessRedos == kMaxBlamelessRedos || node_.now() - c.started >= c.request.timeoutSeconds) {
      return endReduce(key, Status(c.failure.code, c.failure.message + " (redone " + std::to_string(c.blamelessRedos) +
                                                       " times; every participant answered each time)"));
    }
    c.blamelessRedos++;
  }
  const ReduceTree& tree = c.plan->tree;
  const int k = c.request.count;
  c.plan->recoveries++;
  counters_.recoveries++;
  std::string names;
  for (int r : dead) names += (names.empty() ? "" : ", ") + node_.peers().peerName(r);
  if (dead.empty()) {
    HLOG(kInfo, "reduce into %s: every participant answered after a task failed (%s); redoing it",
         printableId(c.request.resultId).c_str(), c.failure.message.c_str());
  } else {
    HLOG(kInfo, "reduce into %s: %s failed; redoing what depended on it", printableId(c.request.resultId).c_str(),
         names.c_str());
  }

  // Which positions to redo: those whose output is lost while still needed
  // (computed by the dead, or failed), and their ancestors, which consumed it.
  // Everything else keeps its output (outputs live until the result is complete).
  auto finished = [&](int p) { return p >= 0 && c.positions[p].state == State::kFinished; };
  std::vector<bool> redo(k, false);
  for (int p = 0; p < k; ++p) {
    const ReducePosition& pos = c.positions[p];
    const bool gone = pos.state != State::kVacant && dead.count(pos.holder) && !finished(tree.parent[p]);
    if (!gone && pos.state != State::kFailed) continue;
    for (int q = p; q >= 0 && !redo[q]; q = tree.parent[q]) redo[q] = true;
  }

  // Inputs held by the dead are lost; look for them again (a copy elsewhere,
  // or a rejoined rank putting them again).
  std::vector<std::pair<int, int>> relocate;  // (input, dead holder)
  std::deque<ReduceInput> ready;
  for (auto& r : c.ready) {
    if (dead.count(r.reply.sender)) {
      relocate.emplace_back(r.index, r.reply.sender);
    } else {
      ready.push_back(std::move(r));
    }
  }
  c.ready = std::move(ready);

  uint64_t oldRootEnd = 0;
  for (int p = 0; p < k; ++p) {
    if (!redo[p]) continue;
    ReducePosition& pos = c.positions[p];
    const bool holderDead = pos.state != State::kVacant && dead.count(pos.holder);
    if (pos.state == State::kRunning) {
      // Also to the "dead": one that only missed the roll call must stop too.
      node_.peers().send(pos.holder, wire::ReduceAbort{0, pos.output, /*retract=*/true});
      if (p == tree.root && !holderDead) oldRootEnd = pos.endRequest;  // it reports once it took the result back
    }
    if (p != tree.root && pos.state != State::kVacant) node_.directory().deleteEverywhere(pos.output);
    if (p != tree.root || !oldRootEnd) node_.directory().requests().forget(pos.endRequest);
    node_.directory().requests().forget(pos.stallRequest);
    if (holderDead) {
      relocate.emplace_back(pos.input, pos.holder);
      c.plan->lost.push_back(pos.input);
    }
    pos.generation++;
    pos.registered = false;
    pos.output = partialOutputId(c, p);
    if (holderDead || pos.state == State::kVacant) {
      pos = ReducePosition{State::kVacant, -1, -1, pos.generation, pos.output};
      c.plan->used[p] = -1;
      c.plan->holders[p] = -1;
    } else {
      pos.state = State::kPending;
    }
  }
  for (const auto& [index, holder] : relocate) {
    if (!reduces_.count(key)) return;
    relocateInput(key, index, holder);
  }
  if (!reduces_.count(key)) return;

  // The result's readers are sent back to wait for it; the old root, if
  // alive, takes its registration back itself before it reports.
  const uint64_t round = ++c.retractRound;
  c.recovery = ReduceCoordination::Recovery::kRetracting;
  auto retract = [this, key, round] {
    auto it = reduces_.find(key);
    if (it == reduces_.end() || it->second->retractRound != round) return;
    const std::string id = it->second->request.resultId;
    const bool registered = it->second->resultRegistered;
    it->second->resultRegistered = false;
    auto relaunch = [this, key, round](const Status&) {
      auto it = reduces_.find(key);
      if (it == reduces_.end() || it->second->retractRound != round) return;
      ReduceCoordination& c = *it->second;
      // (A roll call started since then stays on: its own recovery follows.)
      if (c.recovery == ReduceCoordination::Recovery::kRetracting) c.recovery = ReduceCoordination::Recovery::kNone;
      for (int p = 0; p < c.request.count; ++p) {
        if (c.positions[p].state == State::kPending && !sendTask(key, p)) return;
      }
      launchReadyInputs(key);
    };
    if (!registered) return relaunch(Status());  // the id may be someone else's: leave it
    node_.directory().requestDelete(id, /*retract=*/true, relaunch);
  };
  if (!oldRootEnd || !node_.directory().requests().replaceCallback(oldRootEnd, [retract](const Status&) { retract(); })) retract();
}

}  // namespace hoplite
