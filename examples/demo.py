"""torch_hoplite demo: 4 local processes put, get, broadcast and exchange tensors.

    python examples/demo.py [--nodes 4] [--size 64MB]

Each step prints what moved, how long it took (to the slowest receiver) and the
throughput. Processes rendezvous through a TCPStore as torchrun would set it up.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_hoplite as hop
from torch_hoplite.config import parse_size
from torch_hoplite.ports import free_port


def report(store: dist.Store, step: str, rank: int, **values) -> None:
    store.set(f"demo/{step}/{rank}", json.dumps(values))


def collect(store: dist.Store, step: str, world: int) -> list[dict]:
    keys = [f"demo/{step}/{r}" for r in range(world)]
    store.wait(keys)
    return [json.loads(store.get(k)) for k in keys]


def human(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def timed_steps(rank: int, world: int, store: dist.Store, size: int, tag: str) -> dict:
    """One round of the demo's transfers; returns what rank 0 should print."""
    n = size // 4
    lines = {}
    source = torch.arange(n, dtype=torch.float32)  # made before timing starts
    mine = torch.full((n,), float(rank))

    # 1. Point to point: rank 0 puts, rank 1 gets.
    hop.barrier()
    t0 = time.time()
    if rank == 0:
        hop.put(source, f"p2p{tag}")
    if rank == 1:
        assert torch.equal(hop.get(f"p2p{tag}").wait(), source)
    report(store, f"p2p{tag}", rank, start=t0, end=time.time())
    res = collect(store, f"p2p{tag}", world)
    took = res[1]["end"] - res[0]["start"]
    lines["p2p"] = f"put/get      rank 0 -> rank 1      {human(size):>9} in {took * 1e3:7.1f} ms  {size / took / 1e9:6.2f} GB/s"

    # 2. Broadcast: every other rank gets one object.
    hop.barrier()
    before = hop.stats()["pulls_served"]
    t0 = time.time()
    if rank == 0:
        hop.put(source, f"bcast{tag}")
    else:
        assert torch.equal(hop.get(f"bcast{tag}").wait(), source)
    report(store, f"bcast{tag}", rank, start=t0, end=time.time())
    res = collect(store, f"bcast{tag}", world)
    took = max(r["end"] for r in res) - res[0]["start"]
    # Everyone has the object now; count who served whom.
    report(store, f"bcast-served{tag}", rank, served=hop.stats()["pulls_served"] - before)
    served = ", ".join(f"rank {r}: {x['served']}" for r, x in enumerate(collect(store, f"bcast-served{tag}", world)))
    lines["bcast"] = (
        f"broadcast    rank 0 -> {world - 1} ranks       {human(size):>9} in {took * 1e3:7.1f} ms  "
        f"{size / took / 1e9:6.2f} GB/s  (transfers served: {served})"
    )

    # 3. Exchange: every rank puts one tensor and gets everybody else's.
    hop.barrier()
    t0 = time.time()
    hop.put(mine, f"xchg{tag}-{rank}")
    futs = {r: hop.get(f"xchg{tag}-{r}") for r in range(world) if r != rank}
    for r, f in futs.items():
        assert float(f.wait()[-1]) == float(r)
    report(store, f"xchg{tag}", rank, start=t0, end=time.time())
    res = collect(store, f"xchg{tag}", world)
    took = max(r["end"] for r in res) - min(r["start"] for r in res)
    moved = world * (world - 1) * size
    lines["xchg"] = (
        f"exchange     all-to-all, {world} ranks   {human(moved):>9} in {took * 1e3:7.1f} ms  "
        f"{moved / took / 1e9:6.2f} GB/s aggregate"
    )

    # 4. Small objects: stored inline in the directory, one round trip per get.
    count = 200
    if rank == 1:
        for i in range(count):
            hop.put(torch.full((256,), float(i)), f"small{tag}-{i}")
    hop.barrier()
    latency = 0.0
    if rank == 2:
        t0 = time.time()
        for i in range(count):
            assert float(hop.get(f"small{tag}-{i}").wait()[0]) == float(i)
        latency = (time.time() - t0) / count
    report(store, f"small{tag}", rank, latency=latency)
    res = collect(store, f"small{tag}", world)
    lines["small"] = f"small gets   {count} x 1 KB, one by one        {res[2]['latency'] * 1e6:7.0f} us per get"

    # Free the objects so the next round reuses their (already touched) buffers.
    hop.barrier()
    if rank == 0:
        for obj in (f"p2p{tag}", f"bcast{tag}"):
            hop.delete(obj)
    hop.delete(f"xchg{tag}-{rank}")
    if rank == 1:
        for i in range(count):
            hop.delete(f"small{tag}-{i}")
    return lines


def node(rank: int, world: int, port: int, size: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), wait_for_workers=False)
    hop.init(store, rank=rank, world_size=world)
    for round_, label in enumerate(("cold: first use of fresh memory", "warm: buffers reused from the pool")):
        lines = timed_steps(rank, world, store, size, f"-{round_}")
        if rank == 0:
            print(f"\n{label}")
            for line in lines.values():
                print("  " + line)
    hop.barrier()
    if rank == 0:
        s = hop.stats()
        print(f"\nrank 0 sent {human(s['bytes_sent'])}, received {human(s['bytes_received'])}"
              f" ({human(s['bytes_received_same_host'])} of it read from the other processes' memory:"
              f" the same-host path, HOPLITE_SAME_HOST)")
    hop.barrier()
    hop.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--size", default="64MB", help="object size, e.g. 16MB, 256MB")
    args = parser.parse_args()
    if args.nodes < 3:
        parser.error("--nodes must be at least 3")
    size = parse_size(args.size, "--size")
    print(f"torch_hoplite demo: {args.nodes} processes on localhost, objects of {human(size)}")
    mp.spawn(node, args=(args.nodes, free_port(), size), nprocs=args.nodes, join=True)


if __name__ == "__main__":
    main()
