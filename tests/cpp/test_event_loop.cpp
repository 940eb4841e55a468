// The event loop's turns: soon tasks run before the loop waits, but what they
// queue waits for the next turn, so a chain of them (a transport that keeps
// progressing while data flows) cannot starve timers, posted tasks or events.
// And a handler forgotten in the middle of a batch gets no more of its events.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "check.h"
#include "net/event_loop.h"

using namespace hoplite;

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A soon task that queues itself again until told to stop (or 2 s pass).
struct Chain {
  EventLoop& loop;
  Clock::time_point began = Clock::now();
  std::atomic<bool> stop{false};
  std::atomic<long> links{0};
  std::promise<void> ended;

  void link() {
    links++;
    if (stop || secondsSince(began) > 2) {
      ended.set_value();
      return;
    }
    loop.runSoon([this] { link(); });
  }
};

struct PipeReader : EventHandler {
  int fd;
  std::function<void()> onReadable;
  void handleEvents(uint32_t) override {
    char c;
    while (::read(fd, &c, 1) > 0) {
    }
    onReadable();
  }
};

void testTimerFiresDuringAChain(EventLoop& loop) {
  Chain chain{loop};
  std::atomic<double> firedAfter{-1};
  loop.post([&] {
    chain.began = Clock::now();
    loop.addTimer(0.02, [&] {
      firedAfter = secondsSince(chain.began);
      chain.stop = true;
    });
    chain.link();
  });
  chain.ended.get_future().wait();
  CHECK(firedAfter >= 0.02);
  CHECK(firedAfter < 1.0);  // the chain ran 2 s when the loop ran it to its end
}

void testPostAndEventDuringAChain(EventLoop& loop) {
  Chain chain{loop};
  std::atomic<int> seen{0};
  int fds[2];
  CHECK(::pipe2(fds, O_NONBLOCK) == 0);
  PipeReader reader;
  reader.fd = fds[0];
  reader.onReadable = [&] {
    if (++seen == 2) chain.stop = true;
  };
  loop.post([&] {
    chain.began = Clock::now();
    loop.addFd(fds[0], EPOLLIN, &reader);
    chain.link();
  });
  while (chain.links < 100) std::this_thread::yield();
  CHECK(::write(fds[1], "x", 1) == 1);
  loop.post([&] {
    if (++seen == 2) chain.stop = true;
  });
  chain.ended.get_future().wait();
  CHECK(seen == 2);
  CHECK(secondsSince(chain.began) < 1.0);
  std::promise<void> removed;
  loop.post([&] {
    loop.removeFd(fds[0]);
    removed.set_value();
  });
  removed.get_future().wait();
  ::close(fds[0]);
  ::close(fds[1]);
}

void testSoonTasksRunBeforeTheLoopWaits(EventLoop& loop) {
  // With nothing else to do, each link and a timer it arms at 0 s run at once
  // (the loop does not sleep while soon tasks are queued).
  std::promise<double> done;
  loop.post([&] {
    const auto began = Clock::now();
    loop.runSoon([&, began] {
      loop.runSoon([&, began] { loop.addTimer(0, [&, began] { done.set_value(secondsSince(began)); }); });
    });
  });
  CHECK(done.get_future().get() < 0.05);
}

// Two pipes readable in one batch; whichever handler runs first forgets the
// other, as a handler destroying the other's owner does: the other is not called.
void testAForgottenHandlerGetsNoMoreEventsOfItsBatch(EventLoop& loop) {
  int a[2], b[2];
  CHECK(::pipe2(a, O_NONBLOCK) == 0);
  CHECK(::pipe2(b, O_NONBLOCK) == 0);
  PipeReader first, second;
  std::atomic<int> called{0};
  first.fd = a[0];
  second.fd = b[0];
  // As a destructor would: its fd no longer watched, and what the batch holds dropped.
  first.onReadable = [&] {
    called++;
    loop.removeFd(second.fd);
    loop.forget(&second);
  };
  second.onReadable = [&] {
    called++;
    loop.removeFd(first.fd);
    loop.forget(&first);
  };
  std::promise<void> handled;
  loop.post([&] {
    loop.addFd(a[0], EPOLLIN, &first);
    loop.addFd(b[0], EPOLLIN, &second);
    // Both readable before the loop waits again: one batch.
    CHECK(::write(a[1], "x", 1) == 1);
    CHECK(::write(b[1], "x", 1) == 1);
    loop.addTimer(0.1, [&] { handled.set_value(); });
  });
  handled.get_future().wait();
  CHECK(called == 1);
  std::promise<void> removed;
  loop.post([&] {
    loop.removeFd(a[0]);  // (the one still watched)
    loop.removeFd(b[0]);
    removed.set_value();
  });
  removed.get_future().wait();
  for (int fd : {a[0], a[1], b[0], b[1]}) ::close(fd);
}

}  // namespace

int main() {
  EventLoop loop;
  loop.start();
  testTimerFiresDuringAChain(loop);
  testPostAndEventDuringAChain(loop);
  testSoonTasksRunBeforeTheLoopWaits(loop);
  testAForgottenHandlerGetsNoMoreEventsOfItsBatch(loop);
  loop.stop();
  return finish("test_event_loop");
}
