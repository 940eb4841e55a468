// Streaming reduce. The caller's node coordinates: it locates the inputs, puts
// each into the next tree position as it becomes ready, and sends a task to the
// node holding it. Each task streams `input op children` chunk by chunk into its
// own output object, which its parent fetches like any object while it is being
// written; the root's output is the result.
#include <algorithm>

#include "common/logging.h"
#include "node/node.h"
#include "node/reduce_state.h"

namespace hoplite {

namespace {
// Reduce at least this much at a time (or what is left), at most kMaxStep:
// every step delays the parent by its own length, so steps stay short.
constexpr uint64_t kMinStep = 128u << 10;
constexpr uint64_t kMaxStep = 2u << 20;
// Steps up to this size run on the loop thread (~100 us of arithmetic), which
// spares a hand-off to a worker; larger ones (a fast link's backlog) on a worker.
constexpr uint64_t kLoopStep = 512u << 10;
constexpr uint64_t kProbeBytes = 1u << 20;
constexpr double kLinkMaxAge = 60.0;
constexpr double kProbeTimeout = 2.0;
constexpr int kProbeRounds = 3;
// Used when there is no peer to probe, or a probe fails: a 10 Gbit/s LAN.
constexpr LinkEstimate kDefaultLink{50e-6, 1.25e9};

std::string describeMeta(const ObjectMeta& m) {
  std::string shape;
  for (size_t i = 0; i < m.shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(m.shape[i]);
  return m.dtype + "[" + shape + "] on " + m.device;
}

bool sameContents(const ObjectMeta& a, const ObjectMeta& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.device == b.device && a.nbytes == b.nbytes;
}

}  // namespace

// ---------------------------------------------------------------- coordinator

Status Node::reduce(const ReduceRequest& request, ReducePlan* plan) {
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
  if (!s.ok()) return s;
  if (stopped()) return Status(Code::kShutdown, "reduce into " + printableId(request.resultId) + ": node is shut down");
  auto result = std::make_shared<ReducePlan>();
  auto started = startOnLoop([this, request, result](std::function<void(Status)> done) {
    uint64_t key = nextReduce_++;
    auto c = std::make_unique<ReduceCoordination>();
    c->request = request;
    c->plan = result;
    c->done = std::move(done);
    c->started = now();
    c->arrived.assign(request.inputIds.size(), false);
    c->partialPrefix = std::string("\x01reduce/") + std::to_string(config_.rank) + "." + reduceNonce_ + "." +
                       std::to_string(key) + "/";
    reduces_[key] = std::move(c);
    startReduce(key);
  });
  // The loop enforces the reduce's own timeout; this one only guards against a stuck loop.
  s = awaitStatus(started, request.timeoutSeconds + 5, "reduce into " + printableId(request.resultId));
  if (s.ok()) *plan = *result;
  return s;
}

void Node::startReduce(uint64_t key) {
  ReduceCoordination& c = *reduces_.at(key);
  counters_.reducesCoordinated++;
  if (shuttingDown_) {
    failReduce(key, Status(Code::kShutdown, "node on rank " + std::to_string(config_.rank) + " is shut down"));
    return;
  }
  c.timer = loop_.addTimer(c.request.timeoutSeconds, [this, key] {
    auto it = reduces_.find(key);
    if (it == reduces_.end()) return;
    ReduceCoordination& c = *it->second;
    c.timer = 0;
    std::string missing;
    int shown = 0;
    for (size_t i = 0; i < c.arrived.size() && shown < 8; ++i) {
      if (c.arrived[i]) continue;
      missing += (shown++ ? ", " : "") + printableId(c.request.inputIds[i]);
    }
    failReduce(key, Status(Code::kTimeout, "reduce into " + printableId(c.request.resultId) + " timed out after " +
                                               printableSeconds(c.request.timeoutSeconds) + ": needed " + std::to_string(c.request.count) + " of " +
                                               std::to_string(c.arrived.size()) + " inputs, " +
                                               std::to_string(c.launched + (c.reserved ? 1 : 0)) + " ready" +
                                               (missing.empty() ? std::string() : "; still missing " + missing)));
  });
  const double timeout = c.request.timeoutSeconds;
  const std::vector<std::string> ids = c.request.inputIds;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint64_t request = requestLookup(ids[i], timeout, /*locate=*/true, /*failedHolder=*/-1,
                                     [this, key, i](const Status& s, const wire::LookupReply* reply) {
                                       onReduceInput(key, static_cast<int>(i), s, reply);
                                     });
    // A send to a failed peer fails the reduce at once: look it up again each time.
    auto it = reduces_.find(key);
    if (it == reduces_.end()) return;
    it->second->lookups.push_back(request);
  }
  if (!reduces_.count(key)) return;
  withLinkEstimate([this, key] {
    auto it = reduces_.find(key);
    if (it == reduces_.end()) return;
    it->second->linkKnown = true;
    launchReadyInputs(key);
  });
}

void Node::onReduceInput(uint64_t key, int index, const Status& status, const wire::LookupReply* reply) {
  auto it = reduces_.find(key);
  if (it == reduces_.end()) return;
  ReduceCoordination& c = *it->second;
  const std::string& id = c.request.inputIds[index];
  if (status.code == Code::kTimeout) return;  // the reduce's own timer reports it
  if (status.code == Code::kDeleted) {
    if (static_cast<int>(c.arrived.size()) - ++c.lost < c.request.count) {
      failReduce(key, Status(Code::kDeleted, "reduce into " + printableId(c.request.resultId) + " cannot get " +
                                                 std::to_string(c.request.count) + " inputs: object " +
                                                 printableId(id) + " was deleted"));
    }
    return;
  }
  if (!status.ok()) {
    failReduce(key, Status(status.code, "reduce into " + printableId(c.request.resultId) + ": locating input " +
                                            printableId(id) + " failed: " + status.message));
    return;
  }
  c.arrived[index] = true;
  c.ready.push_back(ReduceInput{index, *reply});
  launchReadyInputs(key);
}

void Node::launchReadyInputs(uint64_t key) {
  ReduceCoordination& c = *reduces_.at(key);
  if (!c.linkKnown) return;
  const int k = c.request.count;
  while (c.launched < k) {
    // The caller wants the result here: an input this node holds takes the
    // root position, which saves the result a hop over this node's link.
    if (c.planned && c.launched == c.plan->tree.root && c.reserved) {
      auto reserved = std::move(*c.reserved);
      c.reserved.reset();
      if (!launchInput(key, reserved)) return;
      continue;
    }
    if (c.ready.empty()) break;
    auto ready = std::move(c.ready.front());
    c.ready.erase(c.ready.begin());
    if (!planInput(key, ready)) return;  // failed the reduce
    if (ready.reply.sender == config_.rank && !c.reserved && c.launched < c.plan->tree.root) {
      c.reserved = std::move(ready);
      continue;
    }
    if (!launchInput(key, ready)) return;
  }
  if (c.launched == k) {
    // The choice is made: later arrivals are not used.
    for (uint64_t request : c.lookups) pending_.erase(request);
    c.lookups.clear();
    c.ready.clear();
  }
}

bool Node::planInput(uint64_t key, const ReduceInput& ready) {
  ReduceCoordination& c = *reduces_.at(key);
  const std::string resultName = printableId(c.request.resultId);
  const std::string& id = c.request.inputIds[ready.index];
  const ObjectMeta& meta = ready.reply.meta;
  const int k = c.request.count;
  if (!c.planned) {
    ReduceKernel kernel;
    Status s = reduceKernel(c.request.op, meta.dtype, &kernel);
    if (!s.ok()) {
      failReduce(key, Status(s.code, "reduce into " + resultName + ": input " + printableId(id) + ": " + s.message));
      return false;
    }
    c.meta = meta;
    c.metaFrom = id;
    c.plan->meta = meta;
    const int degree = c.request.degree > 0 ? std::min(c.request.degree, std::max(1, k - 1))
                                            : chooseReduceDegree(k, meta.nbytes, chunkFor(meta.nbytes), link_);
    c.plan->tree = buildReduceTree(k, degree);
    c.plan->link = link_;
    c.plan->linkMeasured = linkMeasured_;
    c.planned = true;
  } else if (!sameContents(meta, c.meta)) {
    failReduce(key, Status(Code::kInvalidArgument, "reduce into " + resultName + ": inputs differ: object " +
                                                       printableId(c.metaFrom) + " is " + describeMeta(c.meta) +
                                                       ", object " + printableId(id) + " is " + describeMeta(meta)));
    return false;
  }
  if (ready.reply.sender < 0) {
    failReduce(key, Status(Code::kNotFound, "reduce into " + resultName + ": no node holds a copy of input " +
                                                printableId(id)));
    return false;
  }
  return true;
}

bool Node::launchInput(uint64_t key, const ReduceInput& ready) {
  ReduceCoordination& c = *reduces_.at(key);
  const int k = c.request.count;
  const int position = c.launched++;
  const ReduceTree& tree = c.plan->tree;
  auto outputOf = [&](int p) { return p == tree.root ? c.request.resultId : c.partialPrefix + std::to_string(p); };
  wire::ReduceTask task;
  task.request = newRequest();
  task.reduceId = c.request.resultId;
  task.inputId = c.request.inputIds[ready.index];
  task.outputId = outputOf(position);
  for (int child : tree.children[position]) task.childIds.push_back(outputOf(child));
  task.meta = c.meta;
  task.op = static_cast<uint8_t>(c.request.op);
  task.count = static_cast<uint32_t>(k);
  task.root = position == tree.root;
  task.timeoutMs = static_cast<uint64_t>(c.request.timeoutSeconds * 1000) + 1;
  std::string payload = wire::encode(task);
  if (payload.size() > limits_.maxControl) {
    failReduce(key, Status(Code::kInvalidArgument, "reduce into " + printableId(c.request.resultId) + ": degree " +
                                                       std::to_string(tree.degree) +
                                                       " makes a tree node's list of children too long to send"));
    return false;
  }
  const int holder = ready.reply.sender;
  c.plan->used.push_back(ready.index);
  c.plan->holders.push_back(holder);
  if (std::find(c.taskRanks.begin(), c.taskRanks.end(), holder) == c.taskRanks.end()) c.taskRanks.push_back(holder);
  requestStatus(holder, wire::MsgType::kReduceTask, std::move(payload), task.request, [this, key](const Status& s) {
    auto it = reduces_.find(key);
    if (it == reduces_.end()) return;
    if (!s.ok()) {
      failReduce(key, s);
      return;
    }
    if (++it->second->startedTasks == it->second->request.count) finishReduce(key);
  });
  return reduces_.count(key) > 0;  // a send to a failed peer fails the reduce at once
}

void Node::finishReduce(uint64_t key) {
  auto it = reduces_.find(key);
  auto c = std::move(it->second);
  reduces_.erase(it);
  if (c->timer) loop_.cancelTimer(c->timer);
  for (uint64_t request : c->lookups) pending_.erase(request);
  c->plan->planSeconds = now() - c->started;
  HLOG(kDebug, "reduce into %s: called at %.3f s, every task started %.3f s later (degree %d)",
       printableId(c->request.resultId).c_str(), c->started, c->plan->planSeconds, c->plan->tree.degree);
  c->done(Status());
}

void Node::failReduce(uint64_t key, const Status& why) {
  auto it = reduces_.find(key);
  if (it == reduces_.end()) return;
  auto c = std::move(it->second);
  reduces_.erase(it);
  if (c->timer) loop_.cancelTimer(c->timer);
  for (uint64_t request : c->lookups) pending_.erase(request);
  for (int rank : c->taskRanks) send(rank, wire::ReduceAbort{0, c->request.resultId});
  // Tasks that already finished (leaves) are out of the abort's reach: their
  // outputs are freed here. Outputs still being registered are freed by their task.
  for (int p = 0; p < c->launched; ++p) {
    if (p != c->plan->tree.root) deleteEverywhere(c->partialPrefix + std::to_string(p));
  }
  c->done(why);
}

// ---------------------------------------------------------------- link estimate

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

// ---------------------------------------------------------------- tasks

void Node::handleReduceTask(Connection& conn, const wire::ReduceTask& msg) {
  const uint64_t taskId = nextReduce_++;
  auto t = std::make_unique<ReduceTaskState>();
  t->msg = msg;
  t->coordinator = sharedConnection(conn);
  t->started = now();
  ReduceTaskState& task = *t;
  tasks_[taskId] = std::move(t);
  counters_.reduceTasks++;
  Status s;
  if (msg.op > kMaxReduceOp) s = Status(Code::kInvalidArgument, "unknown reduce op");
  if (s.ok()) s = reduceKernel(static_cast<ReduceOp>(msg.op), msg.meta.dtype, &task.kernel);
  if (!s.ok()) return failTask(taskId, s);
  fetch(msg.inputId, static_cast<double>(msg.timeoutMs) / 1000.0,
        [this, taskId](const Status& s, std::shared_ptr<LocalObject> input, int) {
          if (!tasks_.count(taskId)) return;
          if (!s.ok()) return failTask(taskId, s);
          startTask(taskId, std::move(input));
        });
}

void Node::startTask(uint64_t taskId, std::shared_ptr<LocalObject> input) {
  ReduceTaskState& task = *tasks_.at(taskId);
  const wire::ReduceTask& msg = task.msg;
  if (!sameContents(input->meta(), msg.meta)) {
    return failTask(taskId, Status(Code::kInvalidArgument, "input " + printableId(msg.inputId) + " is " +
                                                               describeMeta(input->meta()) + ", expected " +
                                                               describeMeta(msg.meta)));
  }
  task.input = input;
  // A leaf's output is its input: share the buffer instead of copying it.
  task.alias = msg.childIds.empty();
  Status s = store_->create(msg.outputId, msg.meta, /*primary=*/true, &task.output,
                            task.alias ? input->buffer() : nullptr, /*sharedWithStored=*/task.alias);
  if (!s.ok()) return failTask(taskId, s);
  serveParkedPulls(task.output);
  task.children.assign(msg.childIds.size(), nullptr);
  wire::Register reg;
  reg.request = newRequest();
  reg.id = msg.outputId;
  reg.meta = msg.meta;
  reg.holder = config_.rank;
  reg.complete = false;
  requestStatus(shardOf(msg.outputId), wire::MsgType::kRegister, wire::encode(reg), reg.request,
                [this, taskId, outputId = msg.outputId](const Status& s) {
                  auto it = tasks_.find(taskId);
                  if (it == tasks_.end()) {
                    if (s.ok()) deleteEverywhere(outputId);  // aborted meanwhile: free the id
                    return;
                  }
                  if (!s.ok()) return failTask(taskId, s);
                  it->second->registered = true;
                  answerTask(*it->second, Status());
                  startTaskInputs(taskId);
                });
}

// Watches the input and fetches the children; any of these may end the task
// at once (a complete leaf, a failed fetch), so the task is looked up each time.
void Node::startTaskInputs(uint64_t taskId) {
  const ReduceTaskState& task = *tasks_.at(taskId);
  const std::vector<std::string> childIds = task.msg.childIds;
  const double timeout = static_cast<double>(task.msg.timeoutMs) / 1000.0;
  watchTaskObject(taskId, task.input);
  for (size_t i = 0; i < childIds.size() && tasks_.count(taskId); ++i) {
    fetch(childIds[i], timeout, [this, taskId, i](const Status& s, std::shared_ptr<LocalObject> child, int) {
      auto it = tasks_.find(taskId);
      if (it == tasks_.end()) return;
      if (!s.ok()) return failTask(taskId, s);
      it->second->children[i] = child;
      watchTaskObject(taskId, child);
    });
  }
}

void Node::answerTask(ReduceTaskState& task, const Status& status) {
  if (task.answered) return;
  task.answered = true;
  if (auto c = task.coordinator.lock()) {
    c->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{task.msg.request, status}));
  }
}

void Node::watchTaskObject(uint64_t taskId, const std::shared_ptr<LocalObject>& obj) {
  auto it = tasks_.find(taskId);
  if (it == tasks_.end()) return;
  ReduceTaskState& task = *it->second;
  task.listeners.emplace_back(obj, obj->addListener([this, taskId] { progressTask(taskId); }));
  progressTask(taskId);
}

void Node::progressTask(uint64_t taskId) {
  auto it = tasks_.find(taskId);
  if (it == tasks_.end()) return;
  ReduceTaskState& task = *it->second;
  if (task.busy || !task.registered) return;
  // What every source has: the input and all children, whole elements only.
  const uint64_t size = task.output->size();
  uint64_t ready = task.input->watermark();
  if (task.input->failed()) return failTask(taskId, task.input->error());
  for (size_t i = 0; i < task.children.size(); ++i) {
    const auto& child = task.children[i];
    if (!child) return;
    if (child->failed()) return failTask(taskId, child->error());
    ready = std::min(ready, child->watermark());
  }
  const uint64_t item = std::max<uint64_t>(1, task.msg.meta.itemsize);
  if (ready < size) ready -= ready % item;
  if (task.alias) {
    if (ready > task.output->watermark()) task.output->advance(ready);
    if (ready == size) finishTask(taskId);
    return;
  }
  const uint64_t from = task.reduced;
  if (from == size) return finishTask(taskId);
  if (ready - from < std::min(kMinStep, size - from)) return;
  const uint64_t to = std::min(ready, from + kMaxStep);
  const bool divide = task.msg.root && task.kernel.divide != nullptr && task.msg.count > 1;
  auto work = [kernel = task.kernel, out = task.output, in = task.input, children = task.children, from, to, item,
               divide, count = task.msg.count] {
    const size_t n = (to - from) / item;
    kernel.combine(out->data() + from, in->data() + from, children[0]->data() + from, n);
    for (size_t c = 1; c < children.size(); ++c) {
      kernel.combine(out->data() + from, out->data() + from, children[c]->data() + from, n);
    }
    if (divide) kernel.divide(out->data() + from, n, count);
  };
  auto done = [this, taskId, to] {
    auto it = tasks_.find(taskId);
    if (it == tasks_.end()) return;  // aborted meanwhile
    ReduceTaskState& task = *it->second;
    task.busy = false;
    task.reduced = to;
    counters_.reduceBytes += to - (task.output->watermark());
    task.output->advance(to);
    progressTask(taskId);
  };
  task.busy = true;
  if (to - from <= kLoopStep) {
    work();
    done();
    return;
  }
  workers_->submit([this, work, done] {
    work();
    loop_.post(done);
  });
}

void Node::finishTask(uint64_t taskId) {
  auto it = tasks_.find(taskId);
  if (it == tasks_.end()) return;
  auto task = std::move(it->second);
  tasks_.erase(it);
  for (auto& [obj, listener] : task->listeners) obj->removeListener(listener);
  const std::string& out = task->msg.outputId;
  HLOG(kDebug, "reduce task for %s (%zu children) ran %.3f to %.3f s (steady clock)", printableId(out).c_str(),
       task->msg.childIds.size(), task->started, now());
  send(shardOf(out), wire::HolderUpdate{out, config_.rank, wire::HolderState::kComplete, -1});
  // The children's partial results are consumed: drop them everywhere.
  for (const auto& child : task->msg.childIds) deleteEverywhere(child);
}

void Node::failTask(uint64_t taskId, const Status& why) {
  auto it = tasks_.find(taskId);
  if (it == tasks_.end()) return;
  auto task = std::move(it->second);
  tasks_.erase(it);
  for (auto& [obj, listener] : task->listeners) obj->removeListener(listener);
  const wire::ReduceTask& msg = task->msg;
  Status status(why.code, "reduce into " + printableId(msg.reduceId) + " failed on " + peerName(config_.rank) + ": " +
                              why.message);
  if (why.message.rfind("reduce into ", 0) == 0) status.message = why.message;  // already says so
  answerTask(*task, status);
  if (task->output) {
    if (store_->find(msg.outputId) == task->output) store_->remove(msg.outputId);
    task->output->fail(status);  // fails the parent's pull, and so on up to the result's readers
  }
  // Free the ids (the result's too, so a retry may reuse it) and the children's memory.
  if (task->registered) deleteEverywhere(msg.outputId);
  for (const auto& child : msg.childIds) deleteEverywhere(child);
}

void Node::deleteEverywhere(const std::string& id) {
  uint64_t request = newRequest();
  requestStatus(shardOf(id), wire::MsgType::kDelete, wire::encode(wire::Delete{request, id}), request,
                [](const Status&) {});
}

void Node::handleReduceAbort(Connection&, const wire::ReduceAbort& msg) {
  std::vector<uint64_t> doomed;
  for (const auto& [id, task] : tasks_) {
    if (task->msg.reduceId == msg.id) doomed.push_back(id);
  }
  for (uint64_t id : doomed) failTask(id, Status(Code::kInternal, "reduce into " + printableId(msg.id) + " was aborted"));
}

}  // namespace hoplite
