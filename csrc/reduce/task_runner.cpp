// Tree positions of streaming reduces computed on this node (see task_runner.h).
#include "reduce/task_runner.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "common/logging.h"
#include "common/step_trace.h"

namespace hoplite {

namespace {
// A step waits for a chunk of every source's bytes, or for this much where
// chunks are larger (or for what is left), and takes at most kMaxStep: every
// step delays the parent by its own length, so steps stay short (the cost
// model's tree takes a chunk per level).
constexpr uint64_t kMinStep = 128u << 10;
constexpr uint64_t kMaxStep = 2u << 20;
// Steps up to this size run on the loop thread (~100 us of arithmetic), which
// spares a hand-off to a worker; larger ones (a fast link's backlog) on a worker.
constexpr uint64_t kLoopStep = 512u << 10;

// A step on the device, whose kernels read and write the objects' buffers in
// place: each must be page-locked (once per pool buffer; memory the caller
// lent the store cannot be).
Status stepOnDevice(BufferPool& pool, DeviceReduceKernel& kernel, const LocalObject& out, const LocalObject& in,
                    const std::vector<std::shared_ptr<LocalObject>>& children, uint64_t from, size_t n,
                    uint64_t divisor) {
  auto lockable = [&pool](const LocalObject& obj) { return obj.buffer() && pool.pageLock(*obj.buffer()); };
  bool locked = lockable(out) && lockable(in);
  std::vector<const uint8_t*> sources;
  for (const auto& child : children) {
    locked = locked && lockable(*child);
    sources.push_back(child->data() + from);
  }
  if (!locked) return Status(Code::kInvalidArgument, "its buffers could not all be page-locked");
  return kernel.run(out.data() + from, in.data() + from, sources, n, divisor);
}

const Status kAbandoned(Code::kPeerFailed,
                        "this process stalled or was cut off, and its coordinator most likely took it for failed and "
                        "computes it elsewhere");

Status orphanedStatus(const ReduceTaskState& task) {
  // (kPeerFailed: the readers of a root's output wait for the result computed again.)
  return Status(Code::kPeerFailed, "the connection from its coordinator, rank " + std::to_string(task.coordinatorRank) +
                                       ", closed: the coordinator computes " + printableId(task.msg.outputId) + " again");
}
}  // namespace

ReduceTaskRunner::ReduceTaskRunner(EventLoop& loop, ReduceServices& node, int rank, ObjectStore& store,
                                   BufferPool& pool, WorkerPool& workers)
    : loop_(loop), node_(node), rank_(rank), store_(store), pool_(pool), workers_(workers) {}

void ReduceTaskRunner::registerHandlers(MessageRouter& router) {
  router.on<wire::ReduceTask>(Route::kOnEither, [this](Connection& c, const wire::ReduceTask& m) { handleTask(c, m); });
  router.on<wire::ReduceAbort>(Route::kOnEither,
                               [this](Connection& c, const wire::ReduceAbort& m) { handleAbort(c, m); });
}

void ReduceTaskRunner::shutDown(const Status& why) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  failTasksWhere([](const ReduceTaskState&) { return true; }, [&why](const ReduceTaskState&) { return why; });
}

size_t ReduceTaskRunner::failTasksWhere(const std::function<bool(const ReduceTaskState&)>& doomed,
                                        const std::function<Status(const ReduceTaskState&)>& why) {
  std::vector<uint64_t> ids;
  for (const auto& [id, task] : tasks_) {
    if (doomed(*task)) ids.push_back(id);
  }
  size_t failed = 0;
  for (uint64_t id : ids) {
    auto it = tasks_.find(id);  // (a failure may end others)
    if (it == tasks_.end()) continue;
    failTask(id, why(*it->second));
    ++failed;
  }
  return failed;
}

void ReduceTaskRunner::handleTask(Connection& conn, const wire::ReduceTask& msg) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  const uint64_t taskId = nextTask_++;
  auto t = std::make_shared<ReduceTaskState>();
  t->msg = msg;
  t->coordinator = node_.peers().sharedConnection(conn);
  t->coordinatorRank = conn.peerRank();
  t->coordinatorIncarnation = node_.peers().incarnationOf(conn.peerRank());
  t->started = node_.now();
  ReduceTaskState& task = *t;
  tasks_[taskId] = std::move(t);
  counters_.tasks++;
  Status s;
  if (task.coordinatorRank != rank_ && node_.resuming()) {
    counters_.abandoned++;
    return failTask(taskId, kAbandoned);
  }
  if (msg.stallRequest && msg.stallNoteMs) {
    task.stallNote = loop_.addTimer(static_cast<double>(msg.stallNoteMs) / 1000.0, [this, taskId] {
      auto it = tasks_.find(taskId);
      if (it == tasks_.end()) return;
      it->second->stallNote = 0;
      sendStallNote(*it->second);
    });
  }
  if (msg.op > kMaxReduceOp) s = Status(Code::kInvalidArgument, "unknown reduce op");
  if (s.ok()) s = reduceKernel(static_cast<ReduceOp>(msg.op), msg.meta.dtype, &task.kernel);
  if (!s.ok()) return failTask(taskId, s);
  node_.fetch(msg.inputId, static_cast<double>(msg.timeoutMs) / 1000.0,
              [this, taskId](const Status& s, std::shared_ptr<LocalObject> input, int) {
                if (!tasks_.count(taskId)) return;
                if (!s.ok()) return failTask(taskId, s);
                startTask(taskId, std::move(input));
              });
}

void ReduceTaskRunner::startTask(uint64_t taskId, std::shared_ptr<LocalObject> input) {
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
  if (!task.alias && deviceReducer_) {
    task.onDevice = deviceReducer_->kernel(static_cast<ReduceOp>(msg.op), msg.meta.dtype, input->meta().device);
  }
  Status s = store_.create(msg.outputId, msg.meta, /*primary=*/true, &task.output,
                                   task.alias ? input->buffer() : nullptr, /*sharedWithStored=*/task.alias);
  if (!s.ok()) return failTask(taskId, s);
  task.output->recomputable = msg.root;  // its coordinator computes the result again if a participant dies
  // Each task's cleanups remove only its own registration of its output. (It
  // matters for a root: its output id is the result's, the same in every
  // computation of it.)
  task.token = tokens_() | 1;
  task.output->registrationToken = task.token;
  node_.serveParkedPulls(task.output);
  task.children.assign(msg.childIds.size(), nullptr);
  wire::Register reg;
  reg.id = msg.outputId;
  reg.meta = msg.meta;
  reg.holder = rank_;
  reg.complete = false;
  reg.recomputable = msg.root;
  reg.token = task.token;
  task.registration = ReduceTaskState::Registration::kRegistering;
  node_.directory().requestRegister(std::move(reg), [this, taskId, state = tasks_.at(taskId)](const Status& s) {
    using Registration = ReduceTaskState::Registration;
    state->registration = s.ok() ? Registration::kRegistered : Registration::kUnregistered;
    auto it = tasks_.find(taskId);
    if (it == tasks_.end()) {  // failed meanwhile
      if (state->closing) return closeRoot(state);
      if (s.ok()) node_.directory().deleteEverywhere(state->msg.outputId, state->token);  // free the id
      return;
    }
    if (!s.ok()) return failTask(taskId, s);
    traceStep(Step::kTaskStart, state->msg.outputId);
    answerTask(*it->second, Status());
    startTaskInputs(taskId);
  });
}

// Watches the input and fetches the children; any of these may end the task
// at once (a complete leaf, a failed fetch), so the task is looked up each time.
void ReduceTaskRunner::startTaskInputs(uint64_t taskId) {
  const ReduceTaskState& task = *tasks_.at(taskId);
  const std::vector<std::string> childIds = task.msg.childIds;
  const double timeout = static_cast<double>(task.msg.timeoutMs) / 1000.0;
  watchTaskObject(taskId, task.input);
  for (size_t i = 0; i < childIds.size() && tasks_.count(taskId); ++i) {
    node_.fetch(childIds[i], timeout, [this, taskId, i](const Status& s, std::shared_ptr<LocalObject> child, int) {
      auto it = tasks_.find(taskId);
      if (it == tasks_.end()) return;
      if (!s.ok()) return failTask(taskId, s);
      it->second->children[i] = child;
      watchTaskObject(taskId, child);
    });
  }
}

void ReduceTaskRunner::answerTask(ReduceTaskState& task, const Status& status) {
  if (task.answered) return;
  task.answered = true;
  loop_.cancelTimer(std::exchange(task.stallNote, 0));
  if (auto c = task.coordinator.lock()) {
    c->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{task.msg.request, status}));
  }
}

void ReduceTaskRunner::sendStallNote(const ReduceTaskState& task) {
  auto c = task.coordinator.lock();
  if (!c) return;
  std::string stage;
  if (task.registration == ReduceTaskState::Registration::kUnregistered) {
    stage = "fetching its input " + printableId(task.msg.inputId);
  } else {
    const int shard = node_.directory().shardOf(task.msg.outputId);  // (named for the coordinator: not "self")
    stage = "registering its output " + printableId(task.msg.outputId) + " at the directory shard on " +
            (shard == rank_ ? "rank " + std::to_string(rank_) + " itself" : node_.peers().peerName(shard));
  }
  Status note(Code::kTimeout, "still " + stage);
  c->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{task.msg.stallRequest, note}));
}

void ReduceTaskRunner::reportTaskEnd(const ReduceTaskState& task, const Status& status) {
  if (auto c = task.coordinator.lock()) {
    c->sendControl(wire::MsgType::kStatusReply, wire::encode(wire::StatusReply{task.msg.endRequest, status}));
  }
}

void ReduceTaskRunner::watchTaskObject(uint64_t taskId, const std::shared_ptr<LocalObject>& obj) {
  auto it = tasks_.find(taskId);
  if (it == tasks_.end()) return;
  ReduceTaskState& task = *it->second;
  task.listeners.emplace_back(obj, obj->addListener([this, taskId] { progressTask(taskId); }));
  progressTask(taskId);
}

void ReduceTaskRunner::progressTask(uint64_t taskId) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  auto it = tasks_.find(taskId);
  if (it == tasks_.end()) return;
  ReduceTaskState& task = *it->second;
  if (task.busy || task.registration != ReduceTaskState::Registration::kRegistered) return;
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
    if (ready > task.output->watermark()) advanceOutput(task, ready);
    if (ready == size) finishTask(taskId);
    return;
  }
  const uint64_t from = task.reduced;
  if (from == size) return finishTask(taskId);
  if (ready - from < std::min({kMinStep, node_.chunkFor(size), size - from})) return;
  const uint64_t to = std::min(ready, from + kMaxStep);
  const bool divide = task.msg.root && task.kernel.divide != nullptr && task.msg.count > 1;
  const uint64_t divisor = divide ? task.msg.count : 1;
  // Returns the device's outcome, if it was asked: the CPU redoes a step it failed.
  auto work = [this, kernel = task.kernel, device = task.onDevice, out = task.output, in = task.input,
               children = task.children, from, to, item, divisor]() -> std::optional<Status> {
    const size_t n = (to - from) / item;
    std::optional<Status> onDevice;
    if (device) {
      onDevice = stepOnDevice(pool_, *device, *out, *in, children, from, n, divisor);
      if (onDevice->ok()) return onDevice;
    }
    kernel.combine(out->data() + from, in->data() + from, children[0]->data() + from, n);
    for (size_t c = 1; c < children.size(); ++c) {
      kernel.combine(out->data() + from, out->data() + from, children[c]->data() + from, n);
    }
    if (divisor > 1) kernel.divide(out->data() + from, n, divisor);
    return onDevice;
  };
  auto done = [this, taskId, to](const std::optional<Status>& onDevice) {
    auto it = tasks_.find(taskId);
    if (it == tasks_.end()) return;  // aborted meanwhile
    ReduceTaskState& task = *it->second;
    task.busy = false;
    const uint64_t bytes = to - task.output->watermark();
    task.reduced = to;
    counters_.bytes += bytes;
    if (onDevice && onDevice->ok()) counters_.bytesOnDevice += bytes;
    if (onDevice && !onDevice->ok() && task.onDevice) {
      HLOG(kWarn, "reduce into %s continues on the CPU: the device step failed (%s)",
           printableId(task.msg.reduceId).c_str(), onDevice->message.c_str());
      task.onDevice.reset();
    }
    advanceOutput(task, to);
    progressTask(taskId);
  };
  task.busy = true;
  // Device steps block on their stream: never on the loop thread.
  if (!task.onDevice && to - from <= kLoopStep) {
    done(work());
    return;
  }
  workers_.submit([this, work, done] {
    auto onDevice = work();
    loop_.post([done, onDevice] { done(onDevice); });
  });
}

void ReduceTaskRunner::advanceOutput(ReduceTaskState& task, uint64_t to) {
  if (task.output->watermark() == 0) traceStep(Step::kTaskFirstOutput, task.msg.outputId, -1, to);
  // Before the advance, whose listeners (a get of the result) may complete at once.
  if (to == task.output->size()) traceStep(Step::kTaskDone, task.msg.outputId);
  task.output->advance(to);
}

void ReduceTaskRunner::finishTask(uint64_t taskId) {
  auto it = tasks_.find(taskId);
  if (it == tasks_.end()) return;
  if (store_.find(it->second->msg.outputId) != it->second->output) {
    // Dropped meanwhile (a retract reached it before an abort did): announcing
    // it complete would list a holder without a copy.
    return failTask(taskId, Status(Code::kRetry, "its output " + printableId(it->second->msg.outputId) + " was dropped"));
  }
  // A root announcing its output complete would publish a result its coordinator has moved on from.
  if (orphaned(*it->second)) return failTask(taskId, orphanedStatus(*it->second));
  auto task = std::move(it->second);
  tasks_.erase(it);
  for (auto& [obj, listener] : task->listeners) obj->removeListener(listener);
  const std::string& out = task->msg.outputId;
  HLOG(kDebug, "reduce task for %s (%zu children) ran %.3f to %.3f s (steady clock)", printableId(out).c_str(),
       task->msg.childIds.size(), task->started, node_.now());
  node_.directory().updateHolder(out, wire::HolderState::kComplete);
  reportTaskEnd(*task, Status());
  // The children's outputs stay until the coordinator frees them with the
  // result complete: if this node dies first, only this position is redone.
  if (!coordinatorLives(*task)) {
    for (const auto& child : task->msg.childIds) node_.directory().deleteEverywhere(child);
  }
}

bool ReduceTaskRunner::coordinatorLives(const ReduceTaskState& task) {
  PeerLinks& peers = node_.peers();
  return task.coordinatorRank == rank_ ||
         (!peers.hasFailed(task.coordinatorRank) && peers.incarnationOf(task.coordinatorRank) == task.coordinatorIncarnation);
}

bool ReduceTaskRunner::orphaned(const ReduceTaskState& task, const Connection* closed) {
  const auto coordinator = task.coordinator.lock();
  return !coordinator || coordinator.get() == closed;
}

void ReduceTaskRunner::failOrphanedTasks(const Connection* closed) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  failTasksWhere([closed](const ReduceTaskState& task) { return orphaned(task, closed); }, orphanedStatus);
}

void ReduceTaskRunner::abandonRemoteTasks() {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  counters_.abandoned += failTasksWhere([this](const ReduceTaskState& task) { return task.coordinatorRank != rank_; },
                                        [](const ReduceTaskState&) { return kAbandoned; });
}

// A coordinator that failed frees none of its partial results: their holders do.
void ReduceTaskRunner::dropPartialResultsOf(int rank) {
  HOPLITE_ASSERT_ON_LOOP(loop_);
  const std::string prefix = kPartialResultPrefix + std::to_string(rank) + ".";
  for (const auto& obj : store_.snapshot()) {
    if (obj->id().rfind(prefix, 0) != 0) continue;
    node_.dropLocalCopy(obj->id(), Status(Code::kPeerFailed, "its reduce's coordinator, " + node_.peers().peerName(rank) + ", failed"));
  }
}

void ReduceTaskRunner::failTask(uint64_t taskId, const Status& why) {
  auto it = tasks_.find(taskId);
  if (it == tasks_.end()) return;
  auto task = std::move(it->second);
  tasks_.erase(it);
  for (auto& [obj, listener] : task->listeners) obj->removeListener(listener);
  const wire::ReduceTask& msg = task->msg;
  // Sent to the coordinator: "rank N", not this node's "(self)".
  Status status(why.code, "reduce into " + printableId(msg.reduceId) + " failed on rank " + std::to_string(rank_) + ": " +
                              why.message);
  if (why.message.rfind("reduce into ", 0) == 0) status.message = why.message;  // already says so
  answerTask(*task, status);
  // A live coordinator recovers from a participant's death and frees the
  // partial results itself, also after it lost the link to this node or this
  // node leaves (its redo may read this task's children); without one, nobody
  // else will.
  const bool coordinated = coordinatorLives(*task);
  if (task->output) {
    if (store_.find(msg.outputId) == task->output) store_.remove(msg.outputId);
    Status seen = status;
    // The result's readers wait for the recomputed result instead of failing.
    if (msg.root && coordinated && why.code == Code::kPeerFailed) seen.code = Code::kRetry;
    task->output->fail(seen);  // fails the parent's pull, and so on up to the result's readers
  }
  if (msg.root && coordinated) {
    task->closing = true;
    task->endStatus = status;
    if (task->registration != ReduceTaskState::Registration::kRegistering) closeRoot(task);  // else once answered
    return;
  }
  reportTaskEnd(*task, status);
  // An orphan's output id is this generation's alone: its coordinator, which
  // took it back before the orphan registered it perhaps, no longer frees it.
  if (coordinated && !orphaned(*task)) return;
  if (task->registration == ReduceTaskState::Registration::kRegistered) {
    node_.directory().deleteEverywhere(msg.outputId, task->token);
  }
  if (coordinated) return;
  for (const auto& child : msg.childIds) node_.directory().deleteEverywhere(child);
}

// A failed root takes its registration back before it reports: the
// coordinator registers the result again only after that report, so a stale
// registration can never overtake the new one. Readers of the retracted result
// look it up again and wait for the new one.
void ReduceTaskRunner::closeRoot(const std::shared_ptr<ReduceTaskState>& task) {
  if (task->registration != ReduceTaskState::Registration::kRegistered) return reportTaskEnd(*task, task->endStatus);
  const std::string& id = task->msg.outputId;
  node_.directory().requestDelete(
      id, /*retract=*/true, [this, task](const Status&) { reportTaskEnd(*task, task->endStatus); }, task->token);
}

void ReduceTaskRunner::handleAbort(Connection&, const wire::ReduceAbort& msg) {
  Status why = msg.retract ? Status(Code::kRetry, "object " + printableId(msg.id) +
                                                      " is being recomputed after a participant failed")
                           : Status(Code::kInternal, "the reduce computing " + printableId(msg.id) + " was aborted");
  if (!msg.refused.ok()) why = msg.refused;  // readers of the output hear why
  failTasksWhere([&msg](const ReduceTaskState& task) { return task.msg.outputId == msg.id; },
                 [&why](const ReduceTaskState&) { return why; });
}

}  // namespace hoplite
