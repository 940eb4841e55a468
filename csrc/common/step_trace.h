// Timestamps of the steps of puts, gets, pulls, reduces and UCX frames, kept in memory for
// latency budgets (torch_hoplite.trace_events; `python -m torch_hoplite.bench
// --trace`). Process-wide, like logging; off by default, when a step costs one
// relaxed atomic load (gets and lookups keep a copy of their id either way).
// Times are on the steady clock (CLOCK_MONOTONIC, which every process of one
// kernel shares, as Python's time.monotonic does).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace hoplite {

enum class Step : uint8_t {
  kPutCall,         // put: on the caller's thread
  kPutRegistered,   // put: the shard's answer arrived (on the event loop)
  kGetCall,         // get: handed to the loop (no complete local copy)
  kGetLookup,       // get: on the loop, lookup sent
  kGetLocated,      // get: the shard's answer (peer: the sender it assigned)
  kGetDone,         // get: completion handed back to the caller
  kGetDelivered,    // get: its future completed (Python API; on the thread waiting for it, else the completion thread)
  kShardLookup,     // shard: a lookup arrived (peer: the asker)
  kShardAnswer,     // shard: its answer leaves (peer: the asker; waits for a put or a free sender)
  kPullSent,        // pull request sent (peer: the holder)
  kServePull,       // holder: a pull request arrived (peer: the puller)
  kPullFirstBytes,  // pull: its first bytes arrived (bytes: how many)
  kPullDone,        // pull: its last bytes arrived (before they wake the get)
  kReduceCall,      // reduce: on the caller's thread
  kReduceLinkKnown, // reduce: the link estimate is there (probes ran if stale)
  kReduceLocated,   // reduce: one input located (peer: its holder)
  kReduceTaskSent,  // reduce: a position's task sent (peer: its node; id: its output)
  kTaskStart,       // task: output registered, inputs start (id: its output)
  kTaskFirstOutput, // task: first output bytes reduced (bytes: how many)
  kTaskDone,        // task: output complete (before it wakes the output's readers)
  kReduceDone,      // reduce: the coordinator saw the result complete
  kLinkProbe,       // the link estimator's probes begin (peer: the probed node)
  // UCX data frames (id: "request/offset"; bytes: the frame's size; peer: the other rank)
  kFrameSend,       // sender: handed to UCX
  kFrameSent,       // sender: UCX says it is sent
  kFrameArrived,    // receiver: its header arrived (by rendezvous: the request to send)
  kFrameReceive,    // receiver: its receive into the destination posted (rendezvous only)
  kFrameLanded,     // receiver: its bytes landed
  kUcxProgress,     // a turn of progressing the UCX worker begins
};

const char* stepName(Step step);

struct StepRecord {
  double seconds;  // steady clock
  Step step;
  std::string id;
  int peer;
  uint64_t bytes;
};

namespace detail {
extern std::atomic<bool> gTracing;
void recordStep(Step step, const std::string& id, int peer, uint64_t bytes);
}  // namespace detail

// Turns recording on or off; records kept so far stay until taken.
void setTracing(bool on);

inline bool tracing() { return detail::gTracing.load(std::memory_order_relaxed); }

inline void traceStep(Step step, const std::string& id, int peer = -1, uint64_t bytes = 0) {
  if (tracing()) detail::recordStep(step, id, peer, bytes);
}

// The records since the last call, oldest first; at most kMaxStepRecords are
// kept between calls (later ones are counted in *dropped).
std::vector<StepRecord> takeTrace(uint64_t* dropped);

constexpr size_t kMaxStepRecords = 1u << 20;

}  // namespace hoplite
