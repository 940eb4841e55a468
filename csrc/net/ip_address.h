// IPv4 socket addresses as the transports take and print them.
#pragma once

#include <netinet/in.h>

#include <string>

namespace hoplite {

// Throws std::runtime_error if `host` is not a dotted IPv4 address.
sockaddr_in makeAddress(const std::string& host, int port);
// "a.b.c.d:port"
std::string addressString(const sockaddr_in& addr);

}  // namespace hoplite
