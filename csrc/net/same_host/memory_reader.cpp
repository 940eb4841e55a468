#include "net/same_host/memory_reader.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture
#endif

namespace hoplite {
namespace same_host {
namespace {

std::string namespaceOf(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) return "";
  return std::to_string(st.st_dev) + "." + std::to_string(st.st_ino);
}

}  // namespace

std::string hostIdentity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  const std::string net = namespaceOf("/proc/self/ns/net");
  const std::string pid = namespaceOf("/proc/self/ns/pid");
  if (boot.empty() || net.empty() || pid.empty()) return "";
  return boot + "/net:" + net + "/pid:" + pid;
}

std::shared_ptr<PeerMemory> PeerMemory::open(int pid) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return nullptr;
  return std::shared_ptr<PeerMemory>(new PeerMemory(pid, fd));
}

PeerMemory::~PeerMemory() { ::close(pidfd_); }

Status PeerMemory::read(uint64_t remote, uint8_t* dst, uint64_t n) const {
  uint64_t done = 0;
  while (done < n) {
    iovec local{dst + done, static_cast<size_t>(n - done)};
    iovec from{reinterpret_cast<void*>(static_cast<uintptr_t>(remote + done)), static_cast<size_t>(n - done)};
    ssize_t got = ::process_vm_readv(pid_, &local, 1, &from, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : EFAULT;
      return Status(Code::kPeerFailed, "reading the memory of process " + std::to_string(pid_) + " failed: " +
                                           std::strerror(err));
    }
    done += static_cast<uint64_t>(got);
  }
  // Alive now means alive during the read: the bytes are the peer's, not
  // those of a process that took over its pid.
  pollfd exited{pidfd_, POLLIN, 0};
  if (::poll(&exited, 1, 0) != 0) {
    return Status(Code::kPeerFailed, "process " + std::to_string(pid_) + " exited while its memory was read");
  }
  return Status();
}

}  // namespace same_host
}  // namespace hoplite
