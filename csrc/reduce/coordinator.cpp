// Streaming reduce, the coordinator's side (see coordinator.h).
#include "reduce/coordinator.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "common/step_trace.h"
#include "net/loop_call.h"

namespace hoplite {

namespace {
// Ended reduces remembered for reduceOutcome.
constexpr size_t kReduceHistory = 1024;
// Before locating again an input whose only holder is dead (for a copy put again).
constexpr double kRelocateDelay = 0.1;
// A task that has not started this long before the reduce times out says what
// it waits for (at most this share of the time left), in time for the timeout's message.
constexpr double kStallNoteLead = 1.0;
constexpr double kStallNoteLeadShare = 0.2;
}  // namespace

ReduceCoordinator::ReduceCoordinator(EventLoop& loop, ReduceServices& node, CoordinatorConfig config,
                                     LinkEstimator& link)
    : loop_(loop), node_(node), config_(config), link_(link) {}

void ReduceCoordinator::shutDown(const Status& why) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  std::vector<uint64_t> keys;
  for (const auto& entry : reduces_) keys.push_back(entry.first);
  for (uint64_t key : keys) endReduce(key, why);
}

Status ReduceCoordinator::reduce(const ReduceRequest& request, ReducePlan* plan) {
  Status s = validateId(request.resultId);
  for (size_t i = 0; s.ok() && i < request.inputIds.size(); ++i) s = validateId(request.inputIds[i]);
  const int n = static_cast<int>(request.inputIds.size());
  if (s.ok() && n == 0) s = Status(Code::kInvalidArgument, "reduce needs at least one input");
  if (s.ok() && (request.count < 1 || request.count > n)) {
    s = Status(Code::kInvalidArgument, "reduce of " + std::to_string(request.count) + " objects out of " +
                                           std::to_string(n) + " inputs: num_objects must be in [1, " +
                                           std::to_string(n) + "]");
  }
  if (s.ok() && static_cast<uint8_t>(request.op) > kMaxReduceOp) s = Status(Code::kInvalidArgument, "unknown reduce op");
  if (s.ok() && request.degree < 0) s = Status(Code::kInvalidArgument, "reduce tree degree must be >= 0");
  if (s.ok() && request.ordered && request.count != n) {
    s = Status(Code::kInvalidArgument, "an ordered reduce uses every input: num_objects must be " + std::to_string(n));
  }
  if (!s.ok()) return s;
  if (node_.stopped()) {
    return Status(Code::kShutdown, "reduce into " + printableId(request.resultId) + ": node is shut down");
  }
  traceStep(Step::kReduceCall, request.resultId);
  auto result = std::make_shared<ReducePlan>();
  auto started = startOnLoop(loop_, [this, request, result](std::function<void(Status)> done) {
    uint64_t key = nextReduce_++;
    auto c = std::make_unique<ReduceCoordination>();
    c->request = request;
    c->plan = std::make_shared<ReducePlan>();
    // The loop keeps changing its own plan (recovery): the caller gets a copy.
    c->returned = [result, done](const Status& s, const ReducePlan& plan) {
      if (s.ok()) *result = plan;
      done(s);
    };
    c->started = node_.now();
    c->arrived.assign(request.inputIds.size(), false);
    c->lost.assign(request.inputIds.size(), false);
    c->gone.assign(request.inputIds.size(), false);
    c->partialPrefix = kPartialResultPrefix + std::to_string(config_.rank) + "." + std::to_string(config_.incarnation) + "." +
                       std::to_string(key) + "/";
    reduces_[key] = std::move(c);
    startReduce(key);
  });
  s = awaitStatus(started, request.timeoutSeconds + kLoopAnswerGraceSeconds, "reduce into " + printableId(request.resultId));
  if (s.ok()) *plan = *result;
  return s;
}

Status ReduceCoordinator::reduceOutcome(const std::string& resultId, double timeoutSeconds, ReducePlan* plan) {
  if (node_.stopped()) return Status(Code::kShutdown, "node is shut down");
  auto result = std::make_shared<ReducePlan>();
  auto ended = startOnLoop(loop_, [this, resultId, result, timeoutSeconds](std::function<void(Status)> done) {
    for (auto& [key, c] : reduces_) {
      if (c->request.resultId != resultId) continue;
      // Timed out on the loop, so that the error can say what the reduce still waits for.
      auto timer = std::make_shared<EventLoop::TimerId>();
      *timer = loop_.addTimer(timeoutSeconds, [this, key = key, resultId, timeoutSeconds, done] {
        auto it = reduces_.find(key);
        const std::string progress = it == reduces_.end() ? "" : " (" + describeProgress(*it->second) + ")";
        done(Status(Code::kTimeout, "waiting for the reduce into " + printableId(resultId) + " timed out after " +
                                        printableSeconds(timeoutSeconds) + progress));
      });
      c->waiters.push_back([this, result, done, timer](const Status& s, const ReducePlan& plan) {
        loop_.cancelTimer(*timer);
        *result = plan;
        done(s);
      });
      return;
    }
    auto it = history_.find(resultId);
    if (it == history_.end()) {
      return done(Status(Code::kNotFound, "no reduce into " + printableId(resultId) + " was coordinated on " +
                                              node_.peers().peerName(config_.rank) + " (or it ended too long ago)"));
    }
    *result = it->second.second;
    done(it->second.first);
  });
  Status s = awaitStatus(ended, timeoutSeconds + kLoopAnswerGraceSeconds,
                         "waiting for the reduce into " + printableId(resultId));
  if (s.ok()) *plan = *result;
  return s;
}

std::string ReduceCoordinator::describeProgress(const ReduceCoordination& c) const {
  using Recovery = ReduceCoordination::Recovery;
  using State = ReducePosition::State;
  if (c.recovery != Recovery::kNone) {
    return std::string(c.recovery == Recovery::kRollCall ? "asking its participants which of them are alive"
                                                         : "taking the result back from its readers") +
           ", after: " + c.failure.message;
  }
  const int placed = c.placedPositions();
  if (!c.planned || placed < c.request.count) {
    return std::to_string(placed) + " of the " + std::to_string(c.request.count) + " inputs it needs are placed";
  }
  // A task ends once its output is complete: name the ranks it reads its children's from.
  std::string unfinished;
  int shown = 0, more = 0;
  for (size_t p = 0; p < c.positions.size(); ++p) {
    if (c.positions[p].state == State::kFinished) continue;
    if (shown == 8) {
      ++more;
      continue;
    }
    ++shown;
    std::string from;
    for (int child : c.plan->tree.children[p]) {
      from += (from.empty() ? "" : ", ") + node_.peers().peerName(c.positions[child].holder);
    }
    unfinished += (unfinished.empty() ? "" : "; ") + node_.peers().peerName(c.positions[p].holder) +
                  (from.empty() ? "" : ", reading from " + from);
  }
  return "tasks not finished: " + unfinished + (more ? "; and " + std::to_string(more) + " more" : "");
}

void ReduceCoordinator::startReduce(uint64_t key) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  ReduceCoordination& c = *reduces_.at(key);
  counters_.coordinated++;
  if (node_.shuttingDown()) {
    endReduce(key, Status(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " is shut down"));
    return;
  }
  armInputTimer(key);
  const double timeout = c.request.timeoutSeconds;
  const std::vector<std::string> ids = c.request.inputIds;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint64_t request = node_.directory().requestLookup(ids[i], timeout, /*locate=*/true, /*failedHolder=*/-1,
                                           [this, key, i](const Status& s, const wire::LookupReply* reply) {
                                             onInput(key, static_cast<int>(i), s, reply);
                                           });
    // A send to a failed peer may end the reduce at once: look it up again each time.
    auto it = reduces_.find(key);
    if (it == reduces_.end()) return;
    it->second->lookups.push_back(request);
  }
  link_.withEstimate([this, key] {
    auto it = reduces_.find(key);
    if (it == reduces_.end()) return;
    it->second->linkKnown = true;
    traceStep(Step::kReduceLinkKnown, it->second->request.resultId);
    launchReadyInputs(key);
  });
}

// Fails the reduce if positions still lack inputs when the timeout passes (at
// the start, or while waiting for replacements of inputs that died).
void ReduceCoordinator::armInputTimer(uint64_t key) {
  ReduceCoordination& c = *reduces_.at(key);
  if (c.timer) return;
  c.deadline = node_.now() + c.request.timeoutSeconds;
  c.timer = loop_.addTimer(c.request.timeoutSeconds, [this, key] {
    auto it = reduces_.find(key);
    if (it == reduces_.end()) return;
    ReduceCoordination& c = *it->second;
    c.timer = 0;
    const int placed = c.placedPositions();
    if (c.planned && placed == c.request.count && c.filled == c.request.count) {
      // Every position has an input, but not every task registered in time.
      std::string waiting;
      for (const auto& p : c.positions) {
        if (p.registered) continue;
        waiting += (waiting.empty() ? "" : "; ") + node_.peers().peerName(p.holder);
        if (!p.waitsFor.empty()) waiting += ": " + p.waitsFor;
      }
      return endReduce(key, Status(Code::kTimeout, "reduce into " + printableId(c.request.resultId) + " timed out after " +
                                                        printableSeconds(c.request.timeoutSeconds) +
                                                        ": no answer to its tasks from " + waiting));
    }
    std::string missing;
    int shown = 0;
    for (size_t i = 0; i < c.arrived.size() && shown < 8; ++i) {
      if (c.arrived[i] && !c.lost[i]) continue;
      const std::string& id = c.request.inputIds[i];
      missing += (shown++ ? ", " : "") + printableId(id) +
                 (c.gone[i] ? " (deleted, or not locatable)" : c.lost[i] ? " (its holder failed)" : unreachedShard(id));
    }
    endReduce(key, Status(Code::kTimeout, "reduce into " + printableId(c.request.resultId) + " timed out after " +
                                               printableSeconds(c.request.timeoutSeconds) + ": needed " +
                                               std::to_string(c.request.count) + " of " +
                                               std::to_string(c.arrived.size()) + " inputs, " +
                                               std::to_string(c.planned ? placed : 0) + " ready" +
                                               (missing.empty() ? std::string() : "; still missing " + missing)));
  });
}

// Why an input's lookup may have had no answer besides the input not being
// put yet: the connection to its shard has not finished its handshake.
std::string ReduceCoordinator::unreachedShard(const std::string& id) {
  const int shard = node_.directory().shardOf(id);
  if (shard == config_.rank || node_.peers().isReady(shard)) return std::string();
  return " (no connection yet to its directory shard, " + node_.peers().peerName(shard) + ")";
}

void ReduceCoordinator::onInput(uint64_t key, int index, const Status& status, const wire::LookupReply* reply) {
  auto it = reduces_.find(key);
  if (it == reduces_.end()) return;
  ReduceCoordination& c = *it->second;
  const std::string& id = c.request.inputIds[index];
  if (status.code == Code::kTimeout) return;  // the reduce's own timer reports it
  if (status.ok() && (reply->sender < -1 || reply->sender >= config_.worldSize)) {
    return endReduce(key, Status(Code::kProtocol, "reduce into " + printableId(c.request.resultId) + ": input " +
                                                       printableId(id) + " located on rank " +
                                                       std::to_string(reply->sender) + ", which does not exist"));
  }
  if (status.code == Code::kDeleted || status.code == Code::kPeerFailed || status.code == Code::kInvalidArgument) {
    // Deleted, its directory shard died and no other took over, or the
    // result of a reduce that failed: this input will not come. Once too
    // few can, the reduce fails now, not at its timeout.
    c.lost[index] = status.code != Code::kInvalidArgument;
    c.gone[index] = true;
    int possible = 0;
    for (bool gone : c.gone) possible += !gone;
    if (possible < c.request.count) {
      const std::string why = status.code == Code::kDeleted ? " was deleted" : ": " + status.message;
      endReduce(key, Status(status.code, "reduce into " + printableId(c.request.resultId) + " cannot get " +
                                              std::to_string(c.request.count) + " inputs: object " +
                                              printableId(id) + why));
    }
    return;
  }
  if (!status.ok()) {
    endReduce(key, Status(status.code, "reduce into " + printableId(c.request.resultId) + ": locating input " +
                                            printableId(id) + " failed: " + status.message));
    return;
  }
  ReduceInput input{index, *reply};
  if (input.reply.sender < 0 && input.reply.hasInline) input.reply.sender = config_.rank;  // bytes in the directory: any node can compute it
  const int holder = input.reply.sender;
  const bool dead = holder != config_.rank && (holder < 0 || node_.peers().hasFailed(holder));
  if (dead) {
    // No copy left, or the directory has not heard of its holder's death yet: ask again shortly.
    return relocateInput(key, index, holder, kRelocateDelay);
  }
  traceStep(Step::kReduceLocated, id, holder);
  c.arrived[index] = true;
  c.lost[index] = false;
  c.ready.push_back(std::move(input));
  launchReadyInputs(key);
}

void ReduceCoordinator::relocateInput(uint64_t key, int index, int deadHolder, double delay) {
  reduces_.at(key)->lost[index] = true;
  auto ask = [this, key, index, deadHolder] {
    auto it = reduces_.find(key);
    if (it == reduces_.end()) return;
    const ReduceCoordination& c = *it->second;
    uint64_t request = node_.directory().requestLookup(c.request.inputIds[index], c.request.timeoutSeconds, /*locate=*/true, deadHolder,
                                           [this, key, index](const Status& s, const wire::LookupReply* reply) {
                                             onInput(key, index, s, reply);
                                           });
    it = reduces_.find(key);
    if (it != reduces_.end()) it->second->lookups.push_back(request);
  };
  if (delay <= 0) return ask();
  loop_.addTimer(delay, ask);
}

void ReduceCoordinator::launchReadyInputs(uint64_t key) {
  ReduceCoordination& c = *reduces_.at(key);
  if (!c.linkKnown || c.recovery != ReduceCoordination::Recovery::kNone) return;
  const int k = c.request.count;
  using State = ReducePosition::State;
  // The input for position p: the next ready one, or in an ordered reduce its own.
  auto inputFor = [&c](int p) {
    if (!c.request.ordered) return c.ready.begin();
    return std::find_if(c.ready.begin(), c.ready.end(), [p](const ReduceInput& r) { return r.index == p; });
  };
  while (true) {
    // A task that failed as it was sent started a recovery, which relaunches what is ready.
    if (c.recovery != ReduceCoordination::Recovery::kNone) return;
    // Positions vacated by a failure first, then the first pass in arrival order.
    int vacancy = -1;
    auto input = c.ready.end();
    for (int p = 0; p < c.filled && input == c.ready.end(); ++p) {
      if (c.positions[p].state != State::kVacant) continue;
      vacancy = p;
      input = inputFor(p);
    }
    if (vacancy >= 0) {
      if (input == c.ready.end()) break;
      ReduceInput ready = std::move(*input);
      c.ready.erase(input);
      if (!planInput(key, ready)) return;
      assignInput(key, vacancy, ready);
      if (!sendTask(key, vacancy)) return;
      continue;
    }
    if (c.filled == k) break;
    // The caller wants the result here: an input this node holds takes the
    // root position, which saves the result a hop over this node's link
    // (unless the caller ordered the positions).
    if (c.planned && c.filled == c.plan->tree.root && c.reserved) {
      ReduceInput reserved = std::move(*c.reserved);
      c.reserved.reset();
      assignInput(key, c.filled, reserved);
      if (!sendTask(key, c.filled++)) return;
      continue;
    }
    auto next = inputFor(c.filled);
    if (next == c.ready.end()) break;
    ReduceInput ready = std::move(*next);
    c.ready.erase(next);
    if (!planInput(key, ready)) return;  // failed the reduce
    if (!c.request.ordered && ready.reply.sender == config_.rank && !c.reserved && c.filled < c.plan->tree.root) {
      c.reserved = std::move(ready);
      continue;
    }
    assignInput(key, c.filled, ready);
    if (!sendTask(key, c.filled++)) return;
  }
  if (c.filled < k || c.placedPositions() < static_cast<int>(c.positions.size())) {
    armInputTimer(key);
  } else if (c.timer && !c.returned) {  // until reduce() returned, its timeout holds
    loop_.cancelTimer(c.timer);
    c.timer = 0;
  }
}

bool ReduceCoordinator::planInput(uint64_t key, const ReduceInput& ready) {
  ReduceCoordination& c = *reduces_.at(key);
  const std::string resultName = printableId(c.request.resultId);
  const std::string& id = c.request.inputIds[ready.index];
  const ObjectMeta& meta = ready.reply.meta;
  const int k = c.request.count;
  if (!c.planned) {
    ReduceKernel kernel;
    Status s = reduceKernel(c.request.op, meta.dtype, &kernel);
    if (!s.ok()) {
      c.inputsRefused = true;
      endReduce(key, Status(s.code, "reduce into " + resultName + ": input " + printableId(id) + ": " + s.message));
      return false;
    }
    c.meta = meta;
    c.metaFrom = id;
    c.plan->meta = meta;
    const int degree = c.request.degree > 0 ? std::min(c.request.degree, std::max(1, k - 1))
                                            : chooseReduceDegree(k, meta.nbytes, node_.chunkFor(meta.nbytes), link_.estimate());
    c.plan->tree = buildReduceTree(k, degree);
    c.plan->link = link_.estimate();
    c.plan->linkMeasured = link_.measured();
    c.plan->used.assign(k, -1);
    c.plan->holders.assign(k, -1);
    c.positions.assign(k, ReducePosition{});
    for (int p = 0; p < k; ++p) c.positions[p].output = partialOutputId(c, p);
    c.planned = true;
  } else if (!sameContents(meta, c.meta)) {
    c.inputsRefused = true;
    endReduce(key, Status(Code::kInvalidArgument, "reduce into " + resultName + ": inputs differ: object " +
                                                       printableId(c.metaFrom) + " is " + describeMeta(c.meta) +
                                                       ", object " + printableId(id) + " is " + describeMeta(meta)));
    return false;
  }
  return true;
}

// Partial results are registered at the shard that hosts this node's share of
// the directory (its own, unless it rejoined): their fate is shared with the
// coordinator's (which the reduce cannot outlive anyway), not with whichever
// node their id would hash to.
std::string ReduceCoordinator::partialOutputId(const ReduceCoordination& c, int position) const {
  if (position == c.plan->tree.root) return c.request.resultId;
  const std::string base = c.partialPrefix + std::to_string(position) + "." +
                           std::to_string(c.positions[position].generation) + "#";
  const int home = node_.directory().shardHost(config_.rank);
  for (uint64_t salt = 0;; ++salt) {  // each salt lands there with probability >= 1/world
    std::string id = base + std::to_string(salt);
    if (node_.directory().shardOf(id) == home) return id;
  }
}

void ReduceCoordinator::assignInput(uint64_t key, int position, const ReduceInput& ready) {
  ReduceCoordination& c = *reduces_.at(key);
  ReducePosition& p = c.positions[position];
  p.input = ready.index;
  p.holder = ready.reply.sender;
  p.state = ReducePosition::State::kPending;
  c.plan->used[position] = ready.index;
  c.plan->holders[position] = ready.reply.sender;
}

bool ReduceCoordinator::sendTask(uint64_t key, int position) {
  ReduceCoordination& c = *reduces_.at(key);
  ReducePosition& p = c.positions[position];
  const ReduceTree& tree = c.plan->tree;
  wire::ReduceTask task;
  task.request = node_.directory().newRequest();
  task.endRequest = node_.directory().newRequest();
  task.reduceId = c.request.resultId;
  task.inputId = c.request.inputIds[p.input];
  task.outputId = p.output;
  for (int child : tree.children[position]) task.childIds.push_back(c.positions[child].output);
  task.meta = c.meta;
  task.op = static_cast<uint8_t>(c.request.op);
  task.count = static_cast<uint32_t>(c.request.count);
  task.root = position == tree.root;
  task.timeoutMs = static_cast<uint64_t>(c.request.timeoutSeconds * 1000) + 1;
  if (c.timer) {
    const double left = c.deadline - node_.now();
    const double noteAfter = left - std::min(kStallNoteLead, kStallNoteLeadShare * left);
    if (noteAfter > 0) {
      task.stallRequest = node_.directory().newRequest();
      task.stallNoteMs = static_cast<uint64_t>(noteAfter * 1000) + 1;
    }
  }
  std::string payload = wire::encode(task);
  if (payload.size() > config_.maxControl) {
    endReduce(key, Status(Code::kInvalidArgument, "reduce into " + printableId(c.request.resultId) + ": degree " +
                                                       std::to_string(tree.degree) +
                                                       " makes a tree node's list of children too long to send"));
    return false;
  }
  traceStep(Step::kReduceTaskSent, p.output, p.holder);
  p.state = ReducePosition::State::kRunning;
  p.registered = false;
  p.endRequest = task.endRequest;
  p.stallRequest = task.stallRequest;
  p.waitsFor.clear();
  const int generation = p.generation;
  if (!node_.shuttingDown()) {
    node_.directory().requests().expectStatus(task.endRequest, p.holder, [this, key, position, generation](const Status& s) {
      onTaskEnd(key, position, generation, s);
    });
    if (task.stallRequest) {
      node_.directory().requests().expectStatus(task.stallRequest, p.holder, [this, key, position, generation](const Status& s) {
        onStallNote(key, position, generation, s);
      });
    }
  }
  node_.directory().requestStatus(p.holder, wire::MsgType::kReduceTask, std::move(payload), task.request,
                      [this, key, position, generation](const Status& s) {
                        onTaskRegistered(key, position, generation, s);
                      });
  return reduces_.count(key) > 0;  // a send to a failed peer may end the reduce at once
}

void ReduceCoordinator::onTaskRegistered(uint64_t key, int position, int generation, const Status& status) {
  auto it = reduces_.find(key);
  if (it == reduces_.end()) return;
  ReducePosition& p = it->second->positions[position];
  if (p.generation != generation) return;  // a task since replaced
  if (!status.ok()) return onTaskFailed(key, position, status);
  p.registered = true;
  node_.directory().requests().forget(std::exchange(p.stallRequest, 0));  // (no note follows the answer)
  if (position == it->second->plan->tree.root) it->second->resultRegistered = true;
  maybeReturn(key);
}

void ReduceCoordinator::onStallNote(uint64_t key, int position, int generation, const Status& status) {
  auto it = reduces_.find(key);
  if (it == reduces_.end()) return;
  ReducePosition& p = it->second->positions[position];
  // (Pending requests are also answered when the holder fails or this node shuts down.)
  if (p.generation != generation || status.code != Code::kTimeout) return;
  p.waitsFor = status.message;
}

void ReduceCoordinator::onTaskEnd(uint64_t key, int position, int generation, const Status& status) {
  auto it = reduces_.find(key);
  if (it == reduces_.end()) return;
  ReduceCoordination& c = *it->second;
  ReducePosition& p = c.positions[position];
  if (p.generation != generation) return;  // a task since replaced
  if (!status.ok()) return onTaskFailed(key, position, status);
  p.state = ReducePosition::State::kFinished;
  if (position == c.plan->tree.root) endReduce(key, Status());
}

void ReduceCoordinator::onTaskFailed(uint64_t key, int position, const Status& status) {
  ReduceCoordination& c = *reduces_.at(key);
  c.positions[position].state = ReducePosition::State::kFailed;
  // Only a participant's death is recovered from; anything else is the
  // caller's error or a resource limit, and redoing it would fail again.
  if (status.code != Code::kPeerFailed) return endReduce(key, status);
  startRollCall(key, status);
}

// reduce() returns once every position's output is registered: from then on
// the result exists and others may fetch it while it fills.
void ReduceCoordinator::maybeReturn(uint64_t key) {
  ReduceCoordination& c = *reduces_.at(key);
  if (!c.returned || c.filled < c.request.count) return;
  for (const auto& p : c.positions) {
    if (!p.registered) return;
  }
  c.plan->planSeconds = node_.now() - c.started;
  HLOG(kDebug, "reduce into %s: called at %.3f s, every task started %.3f s later (degree %d)",
       printableId(c.request.resultId).c_str(), c.started, c.plan->planSeconds, c.plan->tree.degree);
  auto returned = std::move(c.returned);
  c.returned = nullptr;
  if (c.timer) {
    loop_.cancelTimer(c.timer);
    c.timer = 0;
  }
  returned(Status(), *c.plan);
}

// The result is complete (ok), or the reduce failed: free what it made and tell
// whoever waits. After a failure, running tasks are aborted and the result's
// readers fail at once; an id this reduce never registered (e.g. one that was
// taken) is someone else's and stays.
void ReduceCoordinator::endReduce(uint64_t key, const Status& outcome) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = reduces_.find(key);
  if (it == reduces_.end()) return;
  auto c = std::move(it->second);
  reduces_.erase(it);
  if (c->timer) loop_.cancelTimer(c->timer);
  for (uint64_t request : c->lookups) node_.directory().requests().forget(request);
  using State = ReducePosition::State;
  bool rootRetracts = false;  // see below
  for (size_t p = 0; p < c->positions.size(); ++p) {
    const ReducePosition& pos = c->positions[p];
    const bool root = static_cast<int>(p) == c->plan->tree.root;
    if (c->inputsRefused && root && pos.state == State::kRunning) {
      rootRetracts = true;
      // The root reports its end once it took its registration back; a
      // registration that reached the shard after the note below cleared
      // it, so the note goes again then. Answered without the root's report
      // (its holder or the link to it failed), the result may still be
      // registered, and the shard drops a note for a registered id: it is
      // deleted first, as with no root.
      const std::string& id = c->request.resultId;
      const bool registered = c->resultRegistered;
      node_.directory().requests().replaceCallback(pos.endRequest, [this, id, outcome, registered](const Status& s) {
        if (s.code == Code::kPeerFailed && registered) node_.directory().deleteEverywhere(id);
        node_.directory().reportResultFailed(id, outcome);
      });
    } else {
      node_.directory().requests().forget(pos.endRequest);
    }
    node_.directory().requests().forget(pos.stallRequest);
    if (!outcome.ok() && pos.state == State::kRunning) {
      node_.peers().send(pos.holder, wire::ReduceAbort{0, pos.output, false, c->inputsRefused ? outcome : Status()});
    }
    // Partial results, consumed or not (tasks leave them to a live coordinator);
    // inputs located but not used stay where they are.
    if (!root && (pos.state != State::kVacant || pos.generation > 0)) {
      node_.directory().deleteEverywhere(pos.output);
    }
  }
  // A running root whose inputs were refused takes its result back itself
  // (closeRoot): its readers then look it up again and hear the reason from
  // the note below, where a delete from here could reach them first.
  if (!outcome.ok() && c->resultRegistered && !rootRetracts) node_.directory().deleteEverywhere(c->request.resultId);
  // Who waits for the result hears why instead of waiting out a timeout.
  if (c->inputsRefused) node_.directory().reportResultFailed(c->request.resultId, outcome);
  if (outcome.ok()) traceStep(Step::kReduceDone, c->request.resultId);
  remember(*c, outcome);
  if (c->returned) c->returned(outcome, *c->plan);
  for (auto& w : c->waiters) w(outcome, *c->plan);
}

void ReduceCoordinator::remember(ReduceCoordination& c, const Status& outcome) {
  // Lost inputs that were put again and used in the end are not lost.
  auto& lost = c.plan->lost;
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  const auto& used = c.plan->used;
  lost.erase(std::remove_if(lost.begin(), lost.end(),
                            [&](int i) { return std::find(used.begin(), used.end(), i) != used.end(); }),
             lost.end());
  const std::string& id = c.request.resultId;
  if (!history_.count(id)) historyOrder_.push_back(id);
  history_[id] = {outcome, *c.plan};
  if (historyOrder_.size() > kReduceHistory) {
    history_.erase(historyOrder_.front());
    historyOrder_.pop_front();
  }
}

}  // namespace hoplite
