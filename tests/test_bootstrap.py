"""init() finds its store the ways torchrun users expect: from MASTER_ADDR /
MASTER_PORT / RANK / WORLD_SIZE, or from an initialized default process group."""

import multiprocessing as mp
import os
import socket

import pytest
import torch
import torch.distributed as dist

import torch_hoplite as hop


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _via_env(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    try:
        hop.init()
        _exchange(rank, queue, "env")
    except BaseException as e:
        queue.put((rank, repr(e)))


def _via_process_group(rank: int, port: int, queue) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        hop.init()
        _exchange(rank, queue, "pg")
        dist.destroy_process_group()
    except BaseException as e:
        queue.put((rank, repr(e)))


def _exchange(rank: int, queue, tag: str) -> None:
    assert (hop.get_rank(), hop.get_world_size()) == (rank, 2)
    hop.put(torch.full((100_000,), float(rank)), f"{tag}-{rank}")
    other = hop.get(f"{tag}-{1 - rank}", timeout=30).wait()
    hop.barrier(timeout=30)
    hop.shutdown()
    queue.put((rank, float(other[0])))


@pytest.mark.parametrize("target", [_via_env, _via_process_group], ids=["torchrun-env", "process-group"])
def test_init_finds_the_store(target):
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = dict(queue.get() for _ in procs if not queue.empty())
    assert results == {0: 1.0, 1: 0.0}


def test_init_without_any_store_says_what_is_missing(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RANK and WORLD_SIZE"):
        hop.init()
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        hop.init(rank=0, world_size=2)
    with pytest.raises(ValueError, match="out of range"):
        hop.init(dist.HashStore(), rank=3, world_size=2)
    assert not hop.is_initialized()
