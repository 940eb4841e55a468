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


def test_nodes_default_to_the_congestion_control_asked_for():
    allowed_path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
    available = open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split()
    allowed = open(allowed_path).read().split()
    # One the host does not allow namespaces to default to exercises the temporary addition.
    wanted = next((cc for cc in available if cc not in allowed), "reno")
    with EmulatedCluster(2, rate="1gbit", name="hplcc", congestion=wanted) as cluster:
        assert [cluster.node_congestion(i) for i in range(2)] == [wanted, wanted]
    assert open(allowed_path).read().split() == allowed
    with pytest.raises(ValueError, match="no-such-cc.*this kernel has"):
        with EmulatedCluster(1, rate="1gbit", name="hplcc", congestion="no-such-cc"):
            pass
    assert "hplcc-n0" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
