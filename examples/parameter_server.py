"""Asynchronous parameter server on torch_hoplite: no process group, no static
schedule. The server publishes weights as objects; workers fetch the newest
version whenever they are ready, push gradients as objects, and the server
applies each gradient as soon as it can get it.

    python examples/parameter_server.py [--workers 3] [--steps 5] [--size 1MB]

Gradients are integer-valued, so the final weights are checked exactly.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_hoplite as hop
from torch_hoplite.config import parse_size
from torch_hoplite.ports import free_port


def server(workers: int, steps: int, n: int) -> None:
    weights = torch.zeros(n)
    version = 0
    hop.put(weights, f"w{version}")
    hop.put(torch.tensor(version), "latest")
    pending = {(w, s): hop.get(f"g{w}-{s}") for w in range(1, workers + 1) for s in range(steps)}
    while pending:
        # Apply whichever gradient is there first.
        done = [key for key, fut in pending.items() if fut.done()] or [next(iter(pending))]
        for key in done:
            weights -= pending.pop(key).wait()
            hop.delete(f"g{key[0]}-{key[1]}")
            version += 1
            hop.put(weights, f"w{version}")
            hop.delete("latest")
            hop.put(torch.tensor(version), "latest")
            if version > 1:
                hop.delete(f"w{version - 2}")  # keep the last two versions for slow readers
    expected = -sum(w + s for w in range(1, workers + 1) for s in range(steps))
    assert torch.equal(weights, torch.full((n,), float(expected))), "weights differ from the exact sum"
    print(f"server: applied {workers * steps} gradients asynchronously; weights exact ({expected:g} everywhere)")


def fetch_recent_weights() -> torch.Tensor:
    # "latest" is replaced by delete + put, and old versions are deleted: a reader
    # can lose a race with the server, and then simply reads again.
    for _ in range(100):
        try:
            version = int(hop.get("latest", timeout=30).wait())
            return hop.get(f"w{version}", timeout=30).wait()
        except hop.ObjectDeletedError:
            continue
    raise RuntimeError("could not read any recent weights")


def worker(rank: int, steps: int, n: int) -> None:
    for step in range(steps):
        weights = fetch_recent_weights()
        assert weights.shape == (n,)
        hop.put(torch.full((n,), float(rank + step)), f"g{rank}-{step}")  # "gradient"


def main_rank(rank: int, world: int, port: int, steps: int, n: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), wait_for_workers=False)
    hop.init(store, rank=rank, world_size=world)
    if rank == 0:
        server(world - 1, steps, n)
    else:
        worker(rank, steps, n)
    hop.barrier()
    hop.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--size", default="1MB")
    args = parser.parse_args()
    port = free_port()
    n = parse_size(args.size) // 4
    mp.spawn(main_rank, args=(args.workers + 1, port, args.steps, n), nprocs=args.workers + 1, join=True)


if __name__ == "__main__":
    main()
