"""One rank of tests/test_partition.py, inside its network namespace: it puts
and reads objects before its link (or another rank's) is cut, waits out the
cut, and then puts and reads again, retrying while the cluster reconciles."""

import itertools
import json
import sys
import time
from typing import Optional

import torch
import torch.distributed as dist

import torch_hoplite as hop
from torch_hoplite.bench.local_cluster import shard_of

N = 1 << 16


def get_soon(obj_id: str, deadline: float) -> tuple[torch.Tensor, float]:
    """The object, read again until `deadline` while failures are reported;
    and how long after the first try it came."""
    start = time.monotonic()
    while True:
        try:
            return hop.get(obj_id, timeout=2).wait(), time.monotonic() - start
        except hop.HopliteError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stale_copy_dropped_after(obj_id: str, deadline: float) -> Optional[float]:
    """Seconds until a get of a deleted object this rank held a copy of fails
    as deleted (None: its copy was still served at `deadline`)."""
    start = time.monotonic()
    while time.monotonic() < deadline:
        try:
            hop.get(obj_id, timeout=2).wait()
        except hop.ObjectDeletedError:
            return time.monotonic() - start
        except hop.HopliteError:
            pass  # the cluster still reconciling: asked again
        time.sleep(0.2)
    return None


def main() -> None:
    rank, world, store_host, port, host, out, cut = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                                     int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]))
    store = dist.TCPStore(store_host, port, world, is_master=False)
    hop.init(store, rank=rank, world_size=world, host=host, timeout=30, heartbeat_interval=0.2,
             heartbeat_timeout=1.5, connect_timeout=2, same_host=False)
    hop.put(torch.full((N,), float(rank)), f"before.{rank}")
    store.set(f"put-before/{rank}", "1")
    store.wait([f"put-before/{r}" for r in range(world)])
    for r in range(world):  # every rank talks to every other: all are watched by heartbeats
        assert torch.equal(hop.get(f"before.{r}").wait(), torch.full((N,), float(r)))
    # An object of the cut rank's, with its directory entry there, that rank 0
    # holds a copy of: the cut rank deletes it while cut off, and rank 0's copy
    # must go once they meet again.
    held = next(f"held-{i}" for i in itertools.count() if shard_of(f"held-{i}", world) == cut)
    if rank == cut:
        hop.put(torch.full((N,), 7.0), held)
    store.set(f"held/{rank}", "1")
    store.wait([f"held/{cut}"])
    if rank == 0:
        assert torch.equal(hop.get(held, copy=False).wait(), torch.full((N,), 7.0))
    store.set(f"ready/{rank}", "1")
    delete_error = None
    if rank == cut:
        store.wait(["cut"])
        time.sleep(2.5)  # past the heartbeat timeout: it took itself for cut off
        try:
            hop.delete(held, timeout=10)
        except hop.HopliteError as e:
            delete_error = f"{type(e).__name__}: {e}"
    store.wait(["healed"])
    hop.put(torch.full((N,), 10.0 + rank), f"after.{rank}")
    store.set(f"put-after/{rank}", "1")
    store.wait([f"put-after/{r}" for r in range(world)])
    deadline = time.monotonic() + 20
    waited, right = {}, {}
    for name, value in [(f"after.{r}", 10.0 + r) for r in range(world)] + [(f"before.{r}", float(r)) for r in range(world)]:
        got, waited[name] = get_soon(name, deadline)
        right[name] = bool(torch.equal(got, torch.full((N,), value)))
    result = {"right": right, "waited": waited, "cut_offs": hop.stats()["cut_offs"], "delete_error": delete_error}
    if rank == 0:
        result["stale_copy_dropped_after"] = stale_copy_dropped_after(held, time.monotonic() + 20)
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in range(world)])
    hop.shutdown()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
