"""A killed rank restarted with the same rank rejoins the running cluster: it
gets objects, others reach it at its new address, and it serves as a reduce
input again."""

import os
import signal
import time

import torch

import torch_hoplite as hop
import workers
from cluster import Cluster, in_thread


def test_a_restarted_rank_rejoins_and_is_a_reduce_input_again():
    c = Cluster(4, options={"heartbeat_timeout": 5})
    numel = (8 << 20) // 4
    try:
        data = torch.arange((4 << 20) // 4, dtype=torch.int32)
        c.call(1, workers.put_zero_copy, data, "rejoin-data")
        inputs = ["rejoin-in-1", "rejoin-in-2"]
        c.call(1, workers.put_pattern, inputs[0], numel, 1)
        c.call(2, workers.put_pattern, inputs[1], numel, 2)
        c.freeze(2)  # its reduce task is sent but never answered ...
        join = in_thread(hop.reduce, inputs, id="rejoin-sum", timeout=60)
        time.sleep(0.5)
        c.kill(2)  # ... and it dies with its input
        c.restart(2, connect_timeout=3)
        # The new process gets objects, and puts its input again: the reduce,
        # which waited for it, uses it.
        assert torch.equal(c.call(2, workers.get, "rejoin-data", 30), data)
        c.call(2, workers.put_pattern, inputs[1], numel, 2)
        result, unused = join(60)
        plan = hop.wait_reduce(result, timeout=60)
        assert unused == [] and plan.recoveries >= 1 and 2 in plan.holders
        out = hop.get(result, timeout=30).wait()
        assert torch.equal(out, workers.pattern_sum(numel, (1, 2)))
        # Others reach it at its new address.
        c.call(2, workers.put, torch.full((1 << 18,), 5.0), "rejoin-new")
        assert torch.equal(c.call(3, workers.get, "rejoin-new", 30), torch.full((1 << 18,), 5.0))
        assert torch.equal(hop.get("rejoin-new", timeout=30).wait(), torch.full((1 << 18,), 5.0))
        assert hop.stats()["rejoins"] == 1
    finally:
        c.close()


def test_a_rank_paused_while_a_peer_rejoined_reaches_the_new_process():
    """Found by the 30-minute soak: rank 1 was stopped past the heartbeat
    timeout while rank 2 was killed and restarted. The new rank 2's
    introduction went unanswered, so each took the other for failed, and
    after rank 1 resumed everything between them failed ("has failed")
    until one of them was restarted again."""
    c = Cluster(3, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5, "connect_timeout": 1.0})
    try:
        c.call(1, workers.put, torch.full((10,), 1.0), "paused-rejoin-1")
        c.call(2, workers.put, torch.full((10,), 2.0), "paused-rejoin-2")
        assert torch.equal(c.call(1, workers.get, "paused-rejoin-2", 10), torch.full((10,), 2.0))
        assert torch.equal(c.call(2, workers.get, "paused-rejoin-1", 10), torch.full((10,), 1.0))
        c.freeze(1)
        c.kill(2)
        c.restart(2)  # its introduction to rank 1 goes unanswered
        time.sleep(2.0)
        os.kill(c.pids[1], signal.SIGCONT)
        time.sleep(2.0)  # rank 1 notices its stall and redials
        c.call(2, workers.put, torch.full((1 << 18,), 3.0), "paused-rejoin-new")
        assert torch.equal(c.call(1, workers.get, "paused-rejoin-new", 10), torch.full((1 << 18,), 3.0))
        assert torch.equal(c.call(2, workers.get, "paused-rejoin-1", 10), torch.full((10,), 1.0))
    finally:
        c.close()
