// Routes a control frame to the handler registered for its type, decoded into
// its message struct: each part of the node registers what it handles, in
// place of one switch over every type. Loop thread only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <utility>

#include "net/transport.h"
#include "wire/codec.h"
#include "wire/frame.h"

namespace hoplite {

// Which of a peer's two connections may carry a message: requests travel on
// the connection their sender dialed, answers come back on it.
enum class Route : uint8_t { kOnDialed = 1, kOnAccepted = 2, kOnEither = 3 };

class MessageRouter {
 public:
  // `maxControl` bounds the variable parts of messages that take a limit.
  explicit MessageRouter(uint64_t maxControl) : maxControl_(maxControl) {}

  template <typename M>
  void on(Route route, std::function<void(Connection&, const M&)> handler) {
    Entry& entry = entries_[static_cast<size_t>(M::kType)];
    if (entry.run) throw std::logic_error("two handlers for one message type");
    entry.route = route;
    entry.run = [limit = maxControl_, handler = std::move(handler)](Connection& conn, wire::Reader& reader) {
      if constexpr (requires { M::decode(reader, limit); }) {
        handler(conn, M::decode(reader, limit));
      } else {
        handler(conn, M::decode(reader));
      }
    };
  }

  // Decodes the frame and runs its handler (wire::DecodeError propagates).
  // False, with nothing run, when no handler takes the type on this kind of
  // connection (`accepted`: the peer dialed it): a protocol error.
  bool route(Connection& conn, bool accepted, wire::MsgType type, wire::Reader& reader) const {
    const auto index = static_cast<size_t>(type);
    if (index >= entries_.size() || !entries_[index].run) return false;
    const Entry& entry = entries_[index];
    const auto side = accepted ? Route::kOnAccepted : Route::kOnDialed;
    if ((static_cast<uint8_t>(entry.route) & static_cast<uint8_t>(side)) == 0) return false;
    entry.run(conn, reader);
    return true;
  }

 private:
  struct Entry {
    Route route = Route::kOnEither;
    std::function<void(Connection&, wire::Reader&)> run;
  };
  std::array<Entry, wire::kMaxMsgType + 1> entries_{};
  uint64_t maxControl_;
};

}  // namespace hoplite
