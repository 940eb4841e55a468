"""Nodes in separate network namespaces (separate hosts, as far as the network
goes): each advertises its own interface address, found through the route to
the store's host, and a broadcast crosses the emulated links."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from cluster import communicate_all
from torch_hoplite.bench.emulated_cluster import EmulatedCluster, available

pytestmark = pytest.mark.skipif(not available(), reason="needs root and iproute2 for network namespaces")


def test_broadcast_across_namespaces(tmp_path):
    world = 3
    with EmulatedCluster(world, rate="1gbit", name="hpltest") as cluster:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
        procs = [
            cluster.popen(r, [sys.executable, os.path.join(ROOT, "tests", "emulated_node.py"), str(r), str(world),
                              cluster.address(0), str(tmp_path / f"rank{r}.json")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(world)
        ]
        communicate_all(procs, timeout=120)
        results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(r["ok"] for r in results)
    assert [r["address"] for r in results] == [cluster.address(r) for r in range(world)]
    assert sum(r["served"] for r in results) == world - 1  # one transfer per receiver
    # Separate network namespaces are separate hosts: nothing was read from a peer's memory.
    assert all(r["same_host_bytes"] == 0 for r in results)
