"""One rank of test_same_host.py's fallback test. Rank 0 makes itself
non-dumpable; rank 1 gives up CAP_SYS_PTRACE: the kernel then refuses rank 1's
reads of rank 0's memory, as Yama's ptrace_scope does on many hosts, and rank 1
must get rank 0's object over TCP instead."""

import ctypes
import json
import sys

import torch
import torch.distributed as dist

import torch_hoplite as hop

PR_SET_DUMPABLE = 4
CAP_SYS_PTRACE = 19
SYS_CAPGET, SYS_CAPSET = 125, 126  # x86-64
LINUX_CAPABILITY_VERSION_3 = 0x20080522


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_ptrace_capability(libc) -> None:
    header = CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (CapData * 2)()
    if libc.syscall(SYS_CAPGET, ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective &= ~(1 << CAP_SYS_PTRACE)
    data[0].permitted &= ~(1 << CAP_SYS_PTRACE)
    if libc.syscall(SYS_CAPSET, ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def main() -> None:
    rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    libc = ctypes.CDLL(None, use_errno=True)
    if rank == 0:
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    else:
        drop_ptrace_capability(libc)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=(rank == 0), wait_for_workers=False)
    hop.init(store, rank=rank, world_size=2, timeout=60)
    n = (4 << 20) // 4
    if rank == 0:
        hop.put(torch.arange(n, dtype=torch.int32), "refused")
    hop.barrier()
    result = {}
    if rank == 1:
        got = hop.get("refused").wait()
        stats = hop.stats()
        result = {"exact": bool(torch.equal(got, torch.arange(n, dtype=torch.int32))),
                  "received": stats["bytes_received"], "same_host": stats["bytes_received_same_host"]}
    hop.barrier()
    hop.shutdown()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
