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
from torch_hoplite.bench.emulated_cluster import (EmulatedCluster, available, available_congestion_controls,
                                                  links_can_be_delayed)

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
    available = available_congestion_controls()
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


# Numbered datagrams, each with its send time, 0.2 ms apart; the receiver
# prints [(number, one-way delay in ms), ...] in arrival order.
_DATAGRAM_SENDER = """
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(struct.pack("<Id", i, time.time()), (sys.argv[1], 6000))
    time.sleep(0.0002)
"""
_DATAGRAM_RECEIVER = """
import json, socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# Room for all of them at once: a heal lets everything held through together.
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind((sys.argv[1], 6000))
s.settimeout(5)
print("bound", flush=True)
got = []
try:
    while len(got) < int(sys.argv[2]):
        i, sent = struct.unpack("<Id", s.recv(64))
        got.append((i, (time.time() - sent) * 1e3))
except socket.timeout:
    pass
print(json.dumps(got))
"""


def _datagrams(cluster: EmulatedCluster, count: int, sender: int, receiver: int, then=lambda: None) -> list:
    """Sends `count` datagrams from node `sender` to node `receiver`; calls
    `then` once they are all sent; returns what arrived."""
    to = cluster.address(receiver)
    listening = cluster.popen(receiver, [sys.executable, "-c", _DATAGRAM_RECEIVER, to, str(count)],
                              stdout=subprocess.PIPE, text=True)
    assert listening.stdout.readline().strip() == "bound"
    sending = cluster.popen(sender, [sys.executable, "-c", _DATAGRAM_SENDER, to, str(count)])
    assert sending.wait(timeout=30) == 0
    then()
    out, _ = listening.communicate(timeout=30)
    return json.loads(out)


@pytest.mark.skipif(not links_can_be_delayed(), reason="needs nft, iptables, cc and libnetfilter_queue")
def test_a_delayed_link_delivers_everything_late_and_out_of_order_until_healed():
    count = 300
    with EmulatedCluster(2, rate="1gbit", name="hpldly") as cluster:
        cluster.delay(1, 20, 10, seed=5)
        with pytest.raises(ValueError, match="node 1's link is delayed already"):
            cluster.delay(1, 20)
        to_delayed = _datagrams(cluster, count, sender=0, receiver=1)
        from_delayed = _datagrams(cluster, count, sender=1, receiver=0)
        cluster.heal(1)
        healed = _datagrams(cluster, count, sender=0, receiver=1)
        # Healed while most are held: those are let through, not dropped.
        cluster.delay(1, 500, seed=6)
        cut_short = _datagrams(cluster, count, sender=0, receiver=1, then=lambda: cluster.heal(1))
    for late in (to_delayed, from_delayed):
        assert sorted(i for i, _ in late) == list(range(count)), "a delayed datagram was lost"
        assert min(ms for _, ms in late) >= 10 - 0.5  # 20 ms - 10 ms jitter, one way
        assert sorted(ms for _, ms in late)[count // 2] <= 30 + 5
        inversions = sum(1 for a, b in zip(late, late[1:]) if b[0] < a[0])
        assert inversions > count // 10, f"{inversions} of {count} datagrams overtook one sent before them"
    assert [i for i, _ in healed] == list(range(count))
    assert sorted(ms for _, ms in healed)[count // 2] < 5
    assert sorted(i for i, _ in cut_short) == list(range(count)), "datagrams held at the heal were lost"
    assert sorted(ms for _, ms in cut_short)[count // 2] < 500  # let through before their time
    with pytest.raises(ValueError, match="jitter_ms"):
        with EmulatedCluster(1, rate="1gbit", name="hpldly") as cluster:
            cluster.delay(0, 5, 10)
