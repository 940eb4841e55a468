// A streaming reduce as the caller asks for it, and what ran.
#pragma once

#include <string>
#include <vector>

#include "coll/reduce_kernels.h"
#include "coll/reduce_plan.h"
#include "common/object_meta.h"

namespace hoplite {

struct ReduceRequest {
  std::string resultId;
  std::vector<std::string> inputIds;
  int count = 0;  // reduce the first `count` inputs to become ready
  ReduceOp op = ReduceOp::kSum;
  int degree = 0;  // 0: chosen by the cost model
  double timeoutSeconds = 0;
  // Input i takes tree position i (positions in launchReadyInputs' order)
  // instead of the next one free when it is located; needs count == inputs.
  bool ordered = false;
};

// What ran: observable for tests and benchmarks.
struct ReducePlan {
  ObjectMeta meta;           // the result's (every input's)
  std::vector<int> used;     // indices into inputIds, by tree position (see launchReadyInputs)
  std::vector<int> holders;  // rank that computed each position
  std::vector<int> lost;     // inputs given up because their holder died (indices into inputIds)
  int recoveries = 0;        // times positions were redone after a participant died
  ReduceTree tree;
  LinkEstimate link;         // what the degree was chosen from
  bool linkMeasured = false;  // false: defaults (no peer to probe, or the probe failed)
  double planSeconds = 0;    // from the call until every task had started
};

// Ids of a reduce's partial results start with this, then the coordinator's
// rank and "." (so the results of a dead coordinator can be found and dropped).
inline const std::string kPartialResultPrefix = std::string("\x01reduce/");

}  // namespace hoplite
