#include "common/step_trace.h"

#include <mutex>
#include <utility>

#include "common/timeouts.h"

namespace hoplite {
namespace detail {
std::atomic<bool> gTracing{false};
}  // namespace detail

namespace {
struct Records {
  std::mutex mutex;
  std::vector<StepRecord> kept;
  uint64_t dropped = 0;
};

// Never destroyed: node threads may still record while the process exits.
Records& records() {
  static Records* r = new Records;
  return *r;
}
}  // namespace

const char* stepName(Step step) {
  switch (step) {
    case Step::kPutCall: return "put.call";
    case Step::kPutRegistered: return "put.registered";
    case Step::kGetCall: return "get.call";
    case Step::kGetLookup: return "get.lookup";
    case Step::kGetLocated: return "get.located";
    case Step::kGetDone: return "get.done";
    case Step::kGetDelivered: return "get.delivered";
    case Step::kShardLookup: return "shard.lookup";
    case Step::kShardAnswer: return "shard.answer";
    case Step::kPullSent: return "pull.sent";
    case Step::kServePull: return "serve.pull";
    case Step::kPullFirstBytes: return "pull.first_bytes";
    case Step::kPullDone: return "pull.done";
    case Step::kReduceCall: return "reduce.call";
    case Step::kReduceLinkKnown: return "reduce.link_known";
    case Step::kReduceLocated: return "reduce.located";
    case Step::kReduceTaskSent: return "reduce.task_sent";
    case Step::kTaskStart: return "task.start";
    case Step::kTaskFirstOutput: return "task.first_output";
    case Step::kTaskDone: return "task.done";
    case Step::kReduceDone: return "reduce.done";
    case Step::kLinkProbe: return "link.probe";
    case Step::kFrameSend: return "frame.send";
    case Step::kFrameSent: return "frame.sent";
    case Step::kFrameArrived: return "frame.arrived";
    case Step::kFrameReceive: return "frame.receive";
    case Step::kFrameLanded: return "frame.landed";
    case Step::kUcxProgress: return "ucx.progress";
  }
  return "?";
}

void setTracing(bool on) { detail::gTracing.store(on, std::memory_order_relaxed); }

void detail::recordStep(Step step, const std::string& id, int peer, uint64_t bytes) {
  StepRecord record{steadySeconds(), step, id, peer, bytes};  // the copy of the id outside the lock
  Records& r = records();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.kept.size() >= kMaxStepRecords) {
    r.dropped++;
    return;
  }
  r.kept.push_back(std::move(record));
}

std::vector<StepRecord> takeTrace(uint64_t* dropped) {
  Records& r = records();
  std::lock_guard<std::mutex> lock(r.mutex);
  *dropped = std::exchange(r.dropped, 0);
  return std::exchange(r.kept, {});
}

}  // namespace hoplite
