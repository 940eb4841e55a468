// A public call that hands its work to the event loop and waits for the
// Status the work reports.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "common/object_meta.h"
#include "common/status.h"
#include "net/event_loop.h"

namespace hoplite {

// Runs fn on the loop; the future gets the Status fn reports (the first, if
// it reports more than once), or kShutdown when the loop no longer runs tasks.
inline std::future<Status> startOnLoop(EventLoop& loop, std::function<void(std::function<void(Status)>)> fn) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  auto once = std::make_shared<std::atomic<bool>>(false);
  bool posted = loop.post([fn = std::move(fn), promise, once] {
    fn([promise, once](Status s) {
      if (!once->exchange(true)) promise->set_value(std::move(s));
    });
  });
  if (!posted) promise->set_value(Status(Code::kShutdown, "node is shut down"));
  return future;
}

// Added to a wait whose work enforces its own timeout on the loop (and
// reports it, saying more): the wait's own only guards against a stuck loop.
constexpr double kLoopAnswerGraceSeconds = 5.0;

// The future's Status, or a timeout naming `what`.
inline Status awaitStatus(std::future<Status>& future, double timeoutSeconds, const std::string& what) {
  if (future.wait_for(std::chrono::duration<double>(timeoutSeconds)) != std::future_status::ready) {
    return Status(Code::kTimeout, what + " timed out after " + printableSeconds(timeoutSeconds));
  }
  return future.get();
}

}  // namespace hoplite
