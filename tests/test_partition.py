"""A network partition on the emulated cluster: one rank's link is cut, both
ways, for longer than the heartbeat timeout, then healed. The cut-off rank
takes itself for cut off (it declares no one failed) while the others declare
it failed; once the link is back the two sides find each other again, with no
rank restarted, and every object, old and new, can be read everywhere, but
for one the cut-off rank deleted meanwhile: a copy of it elsewhere goes too."""

import datetime
import json
import os
import subprocess
import sys
import time


import pytest
import torch.distributed as dist

from cluster import communicate_all
from torch_hoplite.bench.emulated_cluster import MANAGEMENT_HOST, EmulatedCluster, links_can_fail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not links_can_fail(),
                                reason="needs root, iproute2 and nft for network namespaces and link faults")


def test_a_rank_cut_off_and_healed_rejoins_its_peers_without_a_restart(tmp_path):
    world, cut = 4, 3
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    with EmulatedCluster(world, rate="1gbit", name="hplpart", management=True) as cluster:
        procs = [
            cluster.popen(r, [sys.executable, os.path.join(ROOT, "tests", "partition_node.py"), str(r), str(world),
                              MANAGEMENT_HOST, str(store.port), cluster.address(r), str(tmp_path / f"rank{r}.json"), str(cut)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(world)
        ]
        try:
            store.wait([f"ready/{r}" for r in range(world)])
            cluster.cut(cut)
            store.set("cut", "1")
            time.sleep(4)  # heartbeat timeout 1.5 s: both sides have given up on each other
            cluster.heal(cut)
            store.set("healed", "1")
        finally:
            logs = communicate_all(procs, timeout=120)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r, result in enumerate(results):
        assert all(result["right"].values()), (r, result, logs[r][-3000:])
        assert max(result["waited"].values()) < 15, (r, result)
    # The cut rank deleted an object while cut off. Rank 0 had listed its copy
    # at the share's interim host (itself), which dropped it once the cut
    # rank, hearing of the move, handed over what it remembered.
    assert results[cut]["delete_error"] is None, results[cut]
    assert results[0]["stale_copy_dropped_after"] is not None, (results[0], logs[0][-3000:])
    # Only the rank whose link was cut took itself for cut off.
    assert [result["cut_offs"] for result in results] == [0, 0, 0, 1], logs[cut][-3000:]
