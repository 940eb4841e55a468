"""The UCX transport (``transport="ucx"``): its own shared object, loaded when
asked for, and the transport-independent tests run over it (UCX_TLS=tcp)."""

import glob
import os
import subprocess
import sys

import pytest
import torch

import torch_hoplite as hop
from cluster import Cluster

import workers

BUILT = bool(glob.glob(os.path.join(os.path.dirname(hop.__file__), "_transport_ucx*.so")))
needs_ucx = pytest.mark.skipif(not BUILT, reason="built without UCX's headers (apt install libucx-dev, then rebuild)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every test of these runs again in a process whose nodes all use UCX.
OVER_UCX = [
    "tests/test_object_store.py",
    "tests/test_broadcast.py",
    "tests/test_reduce.py",
    "tests/test_peer_failure.py",
    "tests/test_lifecycle.py",
    "tests/test_c10d_backend.py",
    "tests/test_bad_peers.py::test_nodes_with_different_secrets_cannot_talk",
]


def test_ucx_is_listed_exactly_when_built():
    assert ("ucx" in hop.transports()) == BUILT


@needs_ucx
def test_put_and_get_over_ucx(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "tcp")
    c = Cluster(2, options={"transport": "ucx", "same_host": False}, env={"UCX_TLS": "tcp"})
    try:
        # Eager and rendezvous sizes, several data frames at the largest.
        for n in (1, 1000, 300_000, 5_000_000):
            x = torch.arange(n, dtype=torch.float32) * 3 - 7
            ref = c.call(1, workers.put, x, f"ucx-{n}")
            assert torch.equal(hop.get(ref, timeout=60).wait(), x), n
        assert hop.stats()["bytes_received"] >= 4 * 5_000_000
        # Loaded only because this node asked for it (makeTransport), with UCX.
        maps = open("/proc/self/maps").read()
        assert "_transport_ucx" in maps and "libucp.so" in maps
    finally:
        c.close()
    assert not hop.is_initialized()


@needs_ucx
def test_tcp_options_are_refused_over_ucx():
    with pytest.raises(ValueError, match="tcp_congestion applies to the tcp transport, not to ucx"):
        Cluster(1, options={"transport": "ucx", "tcp_congestion": "reno"})
    assert not hop.is_initialized()


@needs_ucx
@pytest.mark.parametrize("tests", OVER_UCX)
def test_transport_independent_tests_pass_over_ucx(tests):
    env = {**os.environ, "HOPLITE_TRANSPORT": "ucx", "UCX_TLS": "tcp"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", tests],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-2000:]
