// IPv4 addresses and the non-blocking TCP sockets the transports start from.
#pragma once

#include <netinet/in.h>

#include <functional>
#include <string>

namespace hoplite {

// Throws std::runtime_error if `host` is not a dotted IPv4 address.
sockaddr_in makeAddress(const std::string& host, int port);
// "a.b.c.d:port"
std::string addressString(const sockaddr_in& addr);

// A non-blocking socket bound and listening at host:port (0: any port), whose
// bound port goes to *boundPort. Throws std::runtime_error naming the address.
int listeningSocket(const std::string& host, int port, int* boundPort);
// A non-blocking socket connecting to `addr`, given to `configure` first
// (options that must precede the connect): *inProgress when the connect
// completes later (EPOLLOUT); a connect that failed at once leaves *error set
// (0 otherwise). Throws std::runtime_error if no socket can be made.
int connectingSocket(const sockaddr_in& addr, const std::function<void(int)>& configure, bool* inProgress,
                     int* error);

}  // namespace hoplite
