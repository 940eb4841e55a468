"""A peer that dies mid-transfer makes the get raise, naming object and peer;
one that dies during an allreduce fails every other member soon."""

import threading
import time
import uuid

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import Cluster


@pytest.fixture
def slow_pair():
    # Small socket buffers slow loopback down enough to kill the sender mid-transfer
    # (over TCP: the same-host path would not go through the sockets).
    c = Cluster(2, options={"socket_buffer_bytes": 4096, "chunk_bytes": 64 << 10, "same_host": False})
    yield c
    c.close()


def test_get_raises_when_the_holder_dies_mid_transfer(slow_pair):
    n = (512 << 20) // 4
    ref = slow_pair.call(1, workers.put_and_hold, "doomed", n, 1)
    fut = hop.get(ref, timeout=60)
    deadline = time.monotonic() + 30
    while hop.stats()["bytes_received"] == 0:
        assert time.monotonic() < deadline, "transfer never started"
        time.sleep(0.001)
    objects = hop.stats()["store_objects"]  # including the copy being received
    slow_pair.kill(1)
    received = hop.stats()["bytes_received"]
    assert received < ref.nbytes, "transfer finished before the kill; test is void"
    start = time.monotonic()
    with pytest.raises(hop.PeerFailedError) as info:
        fut.wait()
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "'doomed'" in message and "rank 1" in message
    # the half-written copy is not left behind
    assert hop.stats()["store_objects"] == objects - 1
    with pytest.raises(hop.PeerFailedError):
        hop.get(ref, timeout=10).wait()


def test_a_member_killed_during_allreduce_fails_every_other_member_soon():
    """Rank 2 comes late, so the ring stalls; rank 3 dies meanwhile. Rank 0,
    which receives from it, fails when its connection closes, and its abort
    fails ranks 1 and 2 (which wait on their neighbours) long before the
    call's 60 s timeout."""
    # Short heartbeats: where the kill shows only through them (UCX's shared memory).
    c = Cluster(4, options={"same_host": False, "heartbeat_interval": 0.2, "heartbeat_timeout": 2.0})
    try:
        tag = f"killed-{uuid.uuid4().hex[:8]}"
        n = (4 << 20) // 4
        pending = {1: c.submit(1, workers.allreduce, torch.ones(n), tag, {"timeout": 60}),
                   2: c.submit(2, workers.allreduce_after, 2.0, torch.ones(n), tag, {"timeout": 60})}
        c.submit(3, workers.allreduce, torch.ones(n), tag, {"timeout": 60})
        start = time.monotonic()
        threading.Timer(0.5, c.kill, args=(3,)).start()
        with pytest.raises(hop.PeerFailedError, match=f"allreduce '{tag}' on rank 0: receiving from rank 3"):
            hop.allreduce(torch.ones(n), tag, timeout=60)
        for r, p in pending.items():
            with pytest.raises(hop.PeerFailedError, match=f"allreduce '{tag}' on rank {r}") as info:
                p.result()
            # Rank 1 exchanges nothing with rank 3; rank 2 may find it gone itself, sending to it.
            told = "rank 0 gave up" in str(info.value)
            assert told or (r == 2 and "sending to rank 3" in str(info.value)), str(info.value)
        assert time.monotonic() - start < 15
    finally:
        c.close()
