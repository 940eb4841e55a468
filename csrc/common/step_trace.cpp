#include "common/step_trace.h"

#include <mutex>
#include <utility>

#include "common/timeouts.h"

namespace hoplite {
namespace detail {
std::atomic<bool> gTracing{false};
}  // namespace detail

namespace {
std::mutex gMutex;
std::vector<StepRecord> gRecords;
uint64_t gDropped = 0;
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
  }
  return "?";
}

void setTracing(bool on) { detail::gTracing.store(on, std::memory_order_relaxed); }

void detail::recordStep(Step step, const std::string& id, int peer, uint64_t bytes) {
  const double now = steadySeconds();
  std::lock_guard<std::mutex> lock(gMutex);
  if (gRecords.size() >= kMaxStepRecords) {
    gDropped++;
    return;
  }
  gRecords.push_back(StepRecord{now, step, id, peer, bytes});
}

std::vector<StepRecord> takeTrace(uint64_t* dropped) {
  std::lock_guard<std::mutex> lock(gMutex);
  *dropped = std::exchange(gDropped, 0);
  return std::exchange(gRecords, {});
}

}  // namespace hoplite
