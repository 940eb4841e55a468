"""A live rank on a slow link is not taken for failed. Rank 1's link gets a
100 ms delay each way while its connections run BBR, which keeps sizing its
window for the old sub-millisecond round trip for about ten seconds: a 64 MiB
read from rank 1 then crawls, and rank 1's answers to pings wait behind the
data frame in flight, for longer than the heartbeat timeout. The bytes that
still arrive are its sign of life: the read completes."""

import datetime
import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from cluster import communicate_all
from torch_hoplite.bench.emulated_cluster import (MANAGEMENT_HOST, EmulatedCluster, available_congestion_controls,
                                                  links_can_be_delayed)

from slow_link_node import HEARTBEAT_TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


pytestmark = pytest.mark.skipif(not (links_can_be_delayed() and "bbr" in available_congestion_controls()),
                                reason="needs nft, iptables, cc, libnetfilter_queue and the bbr congestion control")


def test_a_rank_whose_link_slows_down_mid_run_is_not_taken_for_failed(tmp_path):
    world = 2
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    with EmulatedCluster(world, rate="1gbit", name="hplslow", congestion="bbr", management=True) as cluster:
        procs = [
            cluster.popen(r, [sys.executable, os.path.join(ROOT, "tests", "slow_link_node.py"), str(r), str(world),
                              MANAGEMENT_HOST, str(store.port), cluster.address(r), str(tmp_path / "rank0.json")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(world)
        ]
        try:
            store.wait(["dialed"])
            cluster.delay(1, 100, seed=7)
            store.set("delayed", "1")
        finally:
            communicate_all(procs, timeout=120)
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result.get("right"), result
    # The condition under test held: the read outlasted the heartbeat timeout.
    assert result["seconds"] > HEARTBEAT_TIMEOUT, result
    assert result["cut_offs"] == 0, result
