"""What the RPC tests run: the ranks' main function and the functions they call
on each other through torch.distributed.rpc (importable by spawned processes)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed.rpc as rpc

import torch_hoplite as hop
import torch_hoplite.rpc as hop_rpc
from workers import pattern

THRESHOLD = 1 << 20
KEEP_S = 5.0  # unchanged objects outlive their last send by this (the tests check both sides)


def backend_options(init_method: str = "env://") -> rpc.TensorPipeRpcBackendOptions:
    return rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=60, init_method=init_method)


def start(rank: int, world_size: int, port: int, hoplite_first: bool = True) -> None:
    """hop.init, rpc.init_rpc (in the order asked: the same on every rank, as
    both wait for all ranks) and the offload, through one rendezvous."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    if hoplite_first:
        hop.init(timeout=60, heartbeat_timeout=2)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size, rpc_backend_options=backend_options())
    if not hoplite_first:
        hop.init(timeout=60, heartbeat_timeout=2)
    hop_rpc.enable(THRESHOLD, keep_s=KEEP_S)


def serve(rank: int, world_size: int, port: int) -> None:
    """A helper rank: serves RPCs until every rank shuts RPC down."""
    start(rank, world_size, port)
    rpc.shutdown()
    hop_rpc.disable(timeout=10)
    hop.shutdown()


# ---------------------------------------------------------------- ObjectRefs through RPC


def ping() -> str:
    return "pong"


def checksum(ref: hop.ObjectRef) -> int:
    return int(hop.get(ref, timeout=30).wait().sum(dtype=torch.int64))


def make_object(n: int, seed: int, obj_id: str) -> hop.ObjectRef:
    return hop.put(pattern(n, seed), obj_id, blocking=True)


class Holder:
    """An object held by an RRef that publishes a tensor as an ObjectRef."""

    def __init__(self, n: int, seed: int):
        self.ref = hop.put(pattern(n, seed), blocking=True)

    def publish(self) -> hop.ObjectRef:
        return self.ref

    def checksum_of(self, ref: hop.ObjectRef) -> int:
        return checksum(ref)


@rpc.functions.async_execution
def fetch(ref) -> torch.futures.Future:
    """Returns the get's future: the RPC answers when the bytes are here, and no
    RPC thread waits for them."""
    return hop.get(ref, timeout=60)


@rpc.functions.async_execution
def fetch_doubled(ref) -> torch.futures.Future:
    return hop.get(ref, timeout=60).then(lambda fut: fut.value() * 2)


# ---------------------------------------------------------------- offload

WEIGHTS = pattern(2 << 20, 7)  # 8 MiB of int32


def weights() -> torch.Tensor:
    return WEIGHTS


def bump_weights() -> None:
    WEIGHTS.add_(1)


def weights_checksum_from(peer: str) -> int:
    return int(rpc.rpc_sync(peer, weights).sum(dtype=torch.int64))


def sum_and_size(t: torch.Tensor) -> tuple[int, tuple, torch.dtype]:
    return int(t.detach().sum(dtype=torch.int64)), tuple(t.shape), t.dtype


def module_checksum(module: torch.nn.Module) -> int:
    return int(sum(p.detach().sum(dtype=torch.int64) for p in module.parameters()))


def complex_sums(a: torch.Tensor, b: torch.Tensor) -> tuple[complex, complex]:
    return complex(a.sum()), complex(b.sum())


def offload_stats() -> dict:
    return hop_rpc.offload_stats()


def wait_for_stat(name: str, value: int, timeout: float = 20.0) -> dict:
    """Polls this process's offload counters until `name` equals `value`."""
    deadline = time.monotonic() + timeout
    stats = hop_rpc.offload_stats()
    while stats.get(name) != value and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = hop_rpc.offload_stats()
    return stats


# ---------------------------------------------------------------- a caller that dies


def sender_that_dies(rank: int, world_size: int, port: int, queue) -> None:
    """Sends a large offloaded tensor to w0 and dies once w0 is pulling it (over
    TCP: the world runs with HOPLITE_SAME_HOST=0)."""
    start(rank, world_size, port)
    rpc.rpc_async("w0", sum_and_size, args=(pattern(64 << 20, 1),))
    deadline = time.monotonic() + 30
    while hop.stats()["bytes_sent"] < (1 << 20) and time.monotonic() < deadline:
        pass
    queue.put(("w1", hop.stats()["bytes_sent"]))
    os._exit(0)


def survivor(rank: int, world_size: int, port: int, queue) -> None:
    """w0: its pull of w1's tensor fails; it says so and goes on serving."""
    start(rank, world_size, port)
    queue.put(("w0", wait_for_stat("pulls_failed", 1, timeout=30)))
    time.sleep(3.0)  # w2 calls
    rpc.shutdown(graceful=False)
    hop.shutdown()


def bystander(rank: int, world_size: int, port: int, queue) -> None:
    """w2: once w1 has died, w0 still answers."""
    start(rank, world_size, port)
    time.sleep(1.0)
    try:
        queue.put(("w2", rpc.rpc_sync("w0", sum_and_size, args=(pattern(4 << 20, 3),), timeout=30)))
    except Exception as e:  # the test shows it
        queue.put(("w2", repr(e)))
    rpc.shutdown(graceful=False)
    hop.shutdown()
