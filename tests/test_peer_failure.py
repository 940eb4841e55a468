"""A peer that dies mid-transfer makes the get raise, naming object and peer."""

import time

import pytest

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
