// Transports by name: the node asks for the one its config names ("tcp" by
// default), so that another transport is a folder of its own that registers
// itself here, and nothing above net/ changes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "net/event_loop.h"
#include "net/transport.h"

namespace hoplite {

using TransportFactory = std::function<std::unique_ptr<Transport>(EventLoop&, const TransportOptions&)>;

// Called from a static initializer of the transport's own file; returns true
// (for that initializer). Throws std::logic_error if the name is taken.
bool registerTransport(const std::string& name, TransportFactory factory);

// A transport not built in is looked for as a shared object beside this
// library (`_transport_<name>.*so`) and loaded on first use. Throws
// std::invalid_argument naming the known transports if none is called `name`,
// std::runtime_error naming what is missing if its shared object cannot be
// loaded, and whatever the factory throws (e.g. a bad option).
std::unique_ptr<Transport> makeTransport(const std::string& name, EventLoop& loop, const TransportOptions& options);

// Built in or built apart (loaded or not), sorted.
std::vector<std::string> transportNames();

}  // namespace hoplite
