"""An idle node blocks in epoll_wait: no spinning, no wake-ups but the heap
trimmer's (every 30 s)."""

import time

import torch

import torch_hoplite as hop
import workers
from cluster import Cluster


def test_idle_nodes_use_almost_no_cpu():
    c = Cluster(3)
    try:
        # Do some work first so connections, threads and buffers all exist.
        ref = hop.put(torch.ones(1 << 20), "warm")
        for rank in (1, 2):
            c.call(rank, workers.get, ref, 30)
        time.sleep(0.5)
        pids = [c.pids[1], c.pids[2]]
        before = [workers.cpu_seconds(p) for p in pids]
        window = 3.0
        time.sleep(window)
        used = [workers.cpu_seconds(p) - b for p, b in zip(pids, before)]
        # /proc counts in 10 ms ticks; an idle node should not reach even 1% of a core.
        assert all(u <= 0.03 for u in used), f"idle CPU seconds over {window} s: {used}"
    finally:
        c.close()
