// Tagged messages between ranks, for layers built on the node (collectives,
// point-to-point). A message is matched with the receive posted at its
// destination for the same (context, tag) and source, in send order; one that
// arrives before its receive waits in a mailbox. Both ends name the `kind` of
// exchange they take part in: a match of different kinds fails the receive,
// so ranks that are in different exchanges get an error, not each other's
// bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace hoplite {

class TaggedMessenger {
 public:
  // Runs exactly once, on the node's loop thread: for a send once its bytes
  // are handed to the kernel, for a receive once they are in its memory.
  using Callback = std::function<void(const Status&, int sourceRank)>;

  virtual ~TaggedMessenger() = default;

  // `keepalive` holds `data` until `done`. timeoutSeconds > 0: `done` reports
  // a timeout if by then the message can still be stopped (one not yet
  // announced is dropped, a deferred one not yet asked for withdrawn; one
  // whose bytes are on their way reports how that ended instead). Returns a
  // handle for cancelSend. Any thread.
  virtual uint64_t send(int rank, uint64_t context, uint64_t tag, const std::string& kind, const uint8_t* data,
                        uint64_t size, std::shared_ptr<const void> keepalive, Callback done,
                        double timeoutSeconds = 0) = 0;
  // rank -1: from any source. timeoutSeconds > 0: the receive is cancelled
  // with a timeout then. Returns a handle for cancelReceive. Any thread.
  virtual uint64_t receive(int rank, uint64_t context, uint64_t tag, const std::string& kind, uint8_t* dest,
                           uint64_t size, std::shared_ptr<const void> keepalive, Callback done,
                           double timeoutSeconds = 0) = 0;
  // Fails a receive that has not completed with `why` (its caller gave up). No
  // byte is written to its memory once the loop has run the cancel, also not
  // the rest of a frame being read.
  virtual void cancelReceive(uint64_t handle, const Status& why) = 0;
  // Gives up a send that is not under way, failing it with `why`: one not yet
  // announced never is, a deferred one that no receive asked for yet is
  // withdrawn; a send whose bytes are on their way goes on.
  virtual void cancelSend(uint64_t handle, const Status& why) = 0;

  // Whether a message of a context has a tag no receive will ask for any more.
  using StaleTags = std::function<bool(uint64_t tag)>;
  // From now on the messages of `context` whose tags are `stale` are dropped:
  // those waiting for a receive at once, later ones as they arrive (an eager
  // one's sender gets its window back, a deferred one's send is refused), and
  // receives posted for such tags fail. Replaces what an earlier call said of
  // the context; an empty `stale` forgets it. For a layer whose exchange
  // failed (its peers' late messages would wait forever) or that closed the
  // context. Any thread.
  virtual void discard(uint64_t context, StaleTags stale) = 0;
};

}  // namespace hoplite
