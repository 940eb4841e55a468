"""One rank of tests/test_slow_link.py, inside its network namespace: rank 1
holds an object, rank 0 reads it once the driver has slowed rank 1's link."""

import json
import sys
import time

import torch
import torch.distributed as dist

import torch_hoplite as hop

HEARTBEAT_TIMEOUT = 2.0
ELEMENTS = 16 << 20  # 64 MiB of float32


def main() -> None:
    rank, world, store_host, port, host, out = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                                sys.argv[5], sys.argv[6])
    store = dist.TCPStore(store_host, port, world, is_master=False)
    hop.init(store, rank=rank, world_size=world, host=host, timeout=30, heartbeat_interval=0.25,
             heartbeat_timeout=HEARTBEAT_TIMEOUT, connect_timeout=3, same_host=False)
    if rank == 1:
        hop.put(torch.arange(ELEMENTS, dtype=torch.float32), "slow")
        hop.put(torch.ones(4), "warm")
    store.set(f"ready/{rank}", "1")
    store.wait([f"ready/{r}" for r in range(world)])
    if rank == 0:
        assert hop.get("warm").wait().tolist() == [1, 1, 1, 1]  # rank 0 has dialed rank 1
        store.set("dialed", "1")
        store.wait(["delayed"])
        start = time.monotonic()
        try:
            got = hop.get("slow", timeout=60).wait()
            result = {"right": bool(torch.equal(got, torch.arange(ELEMENTS, dtype=torch.float32)))}
        except hop.HopliteError as e:  # reported by the test, after rank 1 is let go
            result = {"error": f"{type(e).__name__}: {e}"}
        result["seconds"] = time.monotonic() - start
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in range(world)])
    if rank == 0:
        result["cut_offs"] = hop.stats()["cut_offs"]
        with open(out, "w") as f:
            json.dump(result, f)
    hop.shutdown()


if __name__ == "__main__":
    main()
