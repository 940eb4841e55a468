// Runs test steps on an event loop's thread, as the node's own code runs.
#pragma once

#include <functional>
#include <future>

#include "net/event_loop.h"

// Runs `fn` on the loop thread, and waits until the tasks it left for the
// loop's same turn (runSoon) ran too.
inline void onLoop(hoplite::EventLoop& loop, const std::function<void()>& fn) {
  for (const auto& step : {fn, std::function<void()>([] {})}) {
    std::promise<void> done;
    loop.post([&] {
      step();
      done.set_value();
    });
    done.get_future().wait();
  }
}
