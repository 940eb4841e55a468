"""The torch.distributed backend "hoplite": every operation against gloo's
answer on the same inputs, with 2 to 5 ranks and in a subgroup; DDP; a rank
killed mid-allreduce."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time

import pytest
import torch.distributed as dist

import c10d_cases
import torch_hoplite  # noqa: F401

WORLDS = [2, 3, 4, 5]
_results: dict[int, list[dict]] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(target, world: int, timeout: float) -> list:
    ctx = mp.get_context("spawn")
    port = _free_port()
    pipes, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=target, args=(rank, world, port, child), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    out = []
    deadline = time.monotonic() + timeout
    for pipe, proc in zip(pipes, procs):
        # A process that died without reporting gives None at once.
        while not pipe.poll(0.2) and proc.is_alive() and time.monotonic() < deadline:
            pass
        out.append(pipe.recv() if pipe.poll() else None)
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return out


def _world(world: int) -> list[dict]:
    if world not in _results:
        _results[world] = _spawn(c10d_cases.run_rank, world, timeout=240)
    return _results[world]


CASE_NAMES = [c.__name__ for c in c10d_cases.CASES] + [f"subgroup_{c.__name__}" for c in c10d_cases.SUBGROUP_CASES]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", CASE_NAMES)
def test_matches_gloo(world: int, case: str):
    results = _world(world)
    for rank, r in enumerate(results):
        assert r is not None, f"rank {rank} of {world} reported nothing"
        assert "setup" not in r, f"rank {rank}: {r['setup']}"
        assert r.get(case) is None, f"rank {rank} of {world}:\n{r.get(case)}"


def test_backend_is_registered():
    assert "hoplite" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map.get("cpu") in ("gloo", "hoplite")
    assert dist.Backend.backend_capability["hoplite"] == ["cpu", "cuda"]


def test_killed_rank_makes_the_others_raise_within_the_timeout():
    world = 3
    results = _spawn(c10d_cases.run_killed_peer, world, timeout=60)
    assert results[world - 1] is None  # killed before it could report
    for rank in range(world - 1):
        assert results[rank] is not None, f"rank {rank} did not report (hung?)"
        outcome, seconds = results[rank]
        # The dead rank's neighbours fail at once; a survivor may instead see
        # another survivor leave after its own failure, or time out.
        assert "DistBackendError" in outcome and "hoplite allreduce" in outcome, f"rank {rank}: {outcome}"
        assert "closed" in outcome or "failed" in outcome or "timed out" in outcome, outcome
        assert seconds < 10 + 5, f"rank {rank} took {seconds:.1f} s (timeout 10 s)"
