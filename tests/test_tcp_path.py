"""Reduce, allreduce and gather with every byte over TCP (same_host=False),
as between hosts. The other tests run their processes on one host, where pulls
read the holders' memory; test_resume.py and test_same_host.py cover both paths."""

import os
import subprocess

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import Cluster
from torch_hoplite import ReduceOp
from torch_hoplite.bench.emulated_cluster import available_congestion_controls
from test_reduce import allreduce_everywhere, check_exact, expected, ints, put_on, uid


def test_reduce_allreduce_and_gather_over_tcp():
    c = Cluster(4, options={"same_host": False})
    try:
        tag = uid("tcp")
        n = (6 << 20) // 4 + 5  # several chunks and an odd tail
        inputs = {f"{tag}/{r}": ints(r, n, torch.float64) for r in range(4)}
        for r, (obj_id, tensor) in enumerate(inputs.items()):
            put_on(c, r, tensor, obj_id)
        result, _ = hop.reduce(list(inputs), id=f"{tag}/sum", timeout=60)
        check_exact(result, inputs)
        gathered = hop.gather(list(inputs))
        assert all(torch.equal(t, inputs[i]) for t, i in zip(gathered, inputs))
        # The composition of the object store (between hosts the default is the ring: test_allreduce.py).
        out = allreduce_everywhere(c, range(4), lambda r: ints(r, n, torch.float64), f"{tag}-all", degree=1)
        want = expected(ReduceOp.SUM, [ints(r, n, torch.float64) for r in range(4)])
        assert all(torch.equal(out[r], want) for r in range(4))
        stats = [c.call(r, workers.stats) for r in range(4)]
        assert all(s["bytes_received_same_host"] == 0 for s in stats)
        assert all(s["copies_handed_over"] == 0 for s in stats)  # copies pulled over TCP stay
        assert sum(s["bytes_received"] for s in stats) >= 3 * n * 8
    finally:
        c.close()


def _congestion_of_connections(ports: set[int]) -> list[str]:
    """The congestion control of every established TCP connection of this
    process from or to one of `ports`, from `ss -tip`."""
    known = set(available_congestion_controls())
    out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    # Each connection is an address line (with its process) and an indented line of TCP info naming its algorithm.
    return [
        next(t for t in info.split() if t in known)
        for head, info in zip(lines, lines[1:])
        if f"pid={os.getpid()}," in head and any(f":{p} " in head for p in ports) and info[:1].isspace()
    ]


def test_tcp_congestion_applies_to_every_connection():
    c = Cluster(3, options={"same_host": False, "tcp_congestion": "reno"})
    try:
        tag = uid("cc")
        n = (4 << 20) // 4
        inputs = {f"{tag}/{r}": ints(r, n, torch.float32) for r in range(3)}
        for r, (obj_id, tensor) in enumerate(inputs.items()):
            put_on(c, r, tensor, obj_id)
        assert all(torch.equal(t, inputs[i]) for t, i in zip(hop.gather(list(inputs)), inputs))
        # This process is rank 0: its connections to the other ranks' ports and theirs to its own.
        ports = {workers.node_port()} | {c.call(r, workers.node_port) for r in (1, 2)}
        algorithms = _congestion_of_connections(ports)
        assert len(algorithms) >= 2, algorithms  # the gather pulled from both peers
        assert set(algorithms) == {"reno"}, algorithms
    finally:
        c.close()


def test_unknown_tcp_congestion_is_refused():
    with pytest.raises(ValueError, match="tcp_congestion 'no-such-algorithm'.*this kernel has"):
        Cluster(1, options={"tcp_congestion": "no-such-algorithm"})
    assert not hop.is_initialized()


def test_the_transport_is_chosen_by_name():
    assert "tcp" in hop.transports()
    c = Cluster(2, options={"transport": "tcp", "same_host": False})
    try:
        ref = c.call(1, workers.put, torch.arange(8.0), "by-name")
        assert torch.equal(c.call(0, workers.get, ref), torch.arange(8.0))
    finally:
        c.close()
    with pytest.raises(ValueError, match=r"unknown transport 'carrier-pigeon' \(this build has: .*tcp"):
        Cluster(1, options={"transport": "carrier-pigeon"})
    assert not hop.is_initialized()
