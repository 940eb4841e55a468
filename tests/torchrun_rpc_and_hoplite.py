"""Run by test_bootstrap under torchrun: RPC, a process group and torch_hoplite
initialized in the order given by argv[1], then each used once."""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

import torch_hoplite as hop


def plus_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def main(order: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    name = f"worker{rank}"
    if order == "hoplite-first":
        hop.init(timeout=60)
        rpc.init_rpc(name, rank=rank, world_size=world)
    elif order == "rpc-first":
        rpc.init_rpc(name, rank=rank, world_size=world)
        hop.init(timeout=60)
    else:
        dist.init_process_group("gloo")
        rpc.init_rpc(name, rank=rank, world_size=world)
        hop.init(timeout=60)
    hop.put(torch.full((100_000,), float(rank)), f"from-{rank}")
    answer = rpc.rpc_sync(f"worker{(rank + 1) % world}", plus_one, args=(torch.tensor([rank]),))
    pulled = hop.get(f"from-{(rank + 1) % world}", timeout=60).wait()
    assert torch.equal(pulled, torch.full((100_000,), float((rank + 1) % world)))
    print(f"rank {rank}: rpc {int(answer)} hoplite {int(pulled[0])}", flush=True)
    hop.barrier(timeout=60)
    rpc.shutdown()
    hop.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
