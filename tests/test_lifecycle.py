"""Shutdown never leaves a waiter hanging, blocking puts, and shutdown from a callback."""

import threading
import time

import pytest
import torch
import torch.distributed as dist

import torch_hoplite as hop


@pytest.fixture
def single_node():
    hop.init(dist.HashStore(), rank=0, world_size=1, timeout=60)
    yield
    hop.shutdown()


def test_shutdown_fails_pending_gets(single_node):
    fut = hop.get("never-put", timeout=60)
    start = time.monotonic()
    hop.shutdown()
    with pytest.raises(hop.HopliteError, match="shut down"):
        fut.wait()
    assert time.monotonic() - start < 5


def test_blocking_put_returns_after_the_local_copy(single_node):
    t = torch.arange(8 << 20, dtype=torch.int32)  # 32 MiB: copied in the background unless blocking
    ref = hop.put(t, "blocking", blocking=True)
    t.fill_(-1)  # at once: a put still copying would store some of these
    assert hop.stats()["store_used_bytes"] >= ref.nbytes
    assert torch.equal(hop.get(ref).wait(), torch.arange(8 << 20, dtype=torch.int32))


def test_shutdown_from_a_future_callback(single_node):
    fut = hop.get("later", timeout=30)
    done = threading.Event()

    def stop(_):
        hop.shutdown()  # runs on the node's completer thread
        done.set()

    fut.then(stop)
    hop.put(torch.ones(100_000), "later")
    assert done.wait(10)
    assert not hop.is_initialized()
