// The loop-thread state of a streaming reduce: the coordinator's view of one
// reduce (coordinator.h), and one tree position computed on this node
// (task_runner.h).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coll/device_reducer.h"
#include "coll/reduce_kernels.h"
#include "net/event_loop.h"
#include "net/transport.h"
#include "reduce/reduce_types.h"
#include "store/local_object.h"
#include "wire/messages.h"

namespace hoplite {

// An input the directory located: its index in the request, and where it is.
struct ReduceInput {
  int index;
  wire::LookupReply reply;
};

// One tree position as the coordinator sees it.
struct ReducePosition {
  enum class State : uint8_t {
    kVacant,    // waiting for an input (not reached yet, or its holder died)
    kPending,   // has an input; its task goes out once the result is retracted
    kRunning,   // its task was sent
    kFinished,  // its task reported its output complete
    kFailed,    // its task reported a failure
  };
  State state = State::kVacant;
  int input = -1;   // index into the request's inputs
  int holder = -1;  // the rank computing it
  // Bumped whenever the position is redone after a failure; what older tasks report is ignored.
  int generation = 0;
  std::string output;       // what its task writes: the result's id at the root
  bool registered = false;  // its task registered `output`
  uint64_t endRequest = 0;  // the request of the task's end report
  // The request its task answers if it has not registered in time, until it
  // did, and what it said it waits for (its stall note), if it did.
  uint64_t stallRequest = 0;
  std::string waitsFor;
};

struct ReduceCoordination {
  ReduceRequest request;
  std::shared_ptr<ReducePlan> plan;
  // reduce()'s caller, told once every position has registered its output; empty after.
  std::function<void(const Status&, const ReducePlan&)> returned;
  // reduceOutcome() callers, told when the result is complete or the reduce failed.
  std::vector<std::function<void(const Status&, const ReducePlan&)>> waiters;
  double started = 0;
  EventLoop::TimerId timer = 0;    // waiting for inputs: the first ones, or replacements
  double deadline = 0;             // when `timer` fires (node_.now())
  std::vector<uint64_t> lookups;   // requests of locate lookups still out
  std::deque<ReduceInput> ready;   // located, not used yet
  std::optional<ReduceInput> reserved;  // this node's own input, kept for the root position
  std::vector<bool> arrived;  // by input index: located at least once
  std::vector<bool> lost;     // by input index: deleted, or its holder died
  std::vector<bool> gone;     // by input index: deleted, or not locatable (no lookup for it is out any more)
  bool linkKnown = false;
  bool planned = false;
  ObjectMeta meta;
  std::string metaFrom;  // the input that fixed `meta`
  std::string partialPrefix;
  int filled = 0;  // positions given an input by the first pass (in arrival order)
  std::vector<ReducePosition> positions;  // by tree position, once planned
  // Positions given an input (not vacant).
  int placedPositions() const {
    int placed = 0;
    for (const auto& p : positions) placed += p.state != ReducePosition::State::kVacant;
    return placed;
  }
  bool resultRegistered = false;  // a root task registered the result (its id is this reduce's)
  // Its inputs cannot be reduced (they differ, or the op does not apply to
  // their dtype): the same call fails again, and gets of the result hear why.
  bool inputsRefused = false;
  // After a failure: kRollCall while asking the participants who is alive
  // (startRollCall), then kRetracting while the result's readers are sent
  // back (recover), then kNone once the redone positions are relaunched. A
  // failure during kRetracting starts another roll call. New inputs are
  // launched only in kNone (launchReadyInputs); a retraction that ends
  // during a later roll call still relaunches the positions it redid.
  enum class Recovery : uint8_t { kNone, kRollCall, kRetracting };
  Recovery recovery = Recovery::kNone;
  uint64_t retractRound = 0;  // the latest recovery's, so an older one's answer is ignored
  Status failure;           // what started the recovery
  int blamelessRedos = 0;   // recoveries after which every participant answered
};

struct ReduceTaskState {
  wire::ReduceTask msg;
  // The connection the task came on: answers go back on it. Once it closed,
  // the coordinator computes this position again (it redoes every task of a
  // rank whose link it lost), so the task is an orphan.
  std::weak_ptr<Connection> coordinator;
  // The coordinator's process; while it lives, it frees the partial results
  // (its redo may still read a child an orphan had).
  int coordinatorRank = -1;
  uint64_t coordinatorIncarnation = 0;
  bool answered = false;
  ReduceKernel kernel;
  // Computes the steps when the input was put from a device (null: the CPU
  // does); dropped after its first failure, the step then redone on the CPU.
  std::shared_ptr<DeviceReduceKernel> onDevice;
  std::shared_ptr<LocalObject> input, output;
  bool alias = false;  // a leaf: the output shares the input's buffer
  std::vector<std::shared_ptr<LocalObject>> children;
  std::vector<std::pair<std::shared_ptr<LocalObject>, uint64_t>> listeners;
  uint64_t reduced = 0;
  bool busy = false;  // a step is being computed
  // The output's registration: kRegistering while on its way, then
  // kRegistered (in the directory) or, refused, kUnregistered again.
  enum class Registration : uint8_t { kUnregistered, kRegistering, kRegistered };
  Registration registration = Registration::kUnregistered;
  uint64_t token = 0;        // names the output's registration (wire::Register::token)
  bool closing = false;      // a failed root, taking its registration back (closeRoot)
  Status endStatus;          // what a closing root reports at the end
  double started = 0;        // steady clock, for the debug log
  EventLoop::TimerId stallNote = 0;  // sends the stall note (wire::ReduceTask::stallRequest)
};

}  // namespace hoplite
