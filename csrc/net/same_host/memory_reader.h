// The same-host path. Processes of one host read each other's store buffers
// with cross-memory attach (process_vm_readv) instead of streaming the bytes
// through loopback TCP: one copy on the reader instead of the socket's two
// (user to kernel, kernel to user), and no CPU at all on the holder.
//
// "One host" follows the design: one kernel (boot id), one pid namespace (the
// pid a peer reports means the same process here) and one network namespace.
// Processes in different network namespaces count as different hosts, so the
// emulated cluster keeps measuring the network.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace hoplite {
namespace same_host {

// This process's host as defined above; empty where it cannot be told (no
// /proc), which turns the path off.
std::string hostIdentity();

// A peer process whose memory this one reads. A pid alone could name another
// process once the peer exited; the pidfd held here names that very process.
class PeerMemory {
 public:
  // Null where the process cannot be pinned down (it exited, or the kernel
  // predates pidfds).
  static std::shared_ptr<PeerMemory> open(int pid);
  ~PeerMemory();
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;

  // Copies n bytes at address `remote` of the process into `dst`: all of
  // them, read while the process was alive, or an error naming the cause.
  Status read(uint64_t remote, uint8_t* dst, uint64_t n) const;

 private:
  PeerMemory(int pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  int pid_;
  int pidfd_;
};

}  // namespace same_host
}  // namespace hoplite
