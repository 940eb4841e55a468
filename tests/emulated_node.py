"""One rank of tests/test_emulated_cluster.py, run inside a network namespace."""

import json
import sys

import torch
import torch.distributed as dist

import torch_hoplite as hop
import torch_hoplite.api as api


def main() -> None:
    rank, world, master, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    store = dist.TCPStore(master, 29512, world, is_master=(rank == 0), wait_for_workers=False)
    hop.init(store, rank=rank, world_size=world, timeout=60)
    n = (8 << 20) // 4
    if rank == 0:
        hop.put(torch.arange(n, dtype=torch.int32), "across-namespaces")
    got = hop.get("across-namespaces").wait()
    ok = bool(torch.equal(got, torch.arange(n, dtype=torch.int32)))
    hop.barrier()
    stats = hop.stats()
    result = {"ok": ok, "address": api._rt().address[0], "served": stats["pulls_served"],
              "same_host_bytes": stats["bytes_received_same_host"]}
    hop.barrier()
    hop.shutdown()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
