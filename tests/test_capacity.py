"""The store's capacity holds: cached copies are evicted least-recently-used;
primary copies stay, and a put that cannot fit raises. The buffer pool gives
back what it cached and left unused."""

import time

import pytest
import torch
import torch.distributed as dist

import torch_hoplite as hop
import workers
from cluster import Cluster

MiB = 1 << 20


@pytest.fixture
def small_stores():
    # Over TCP: a get that reads a holder on its own host hands its copy to
    # the caller instead of keeping it (nothing would be cached to evict).
    c = Cluster(3, options={"capacity_bytes": 4 * MiB, "same_host": False})
    yield c
    c.close()


def test_eviction_and_capacity_error(small_stores):
    c = small_stores
    n = MiB // 4  # int32 elements of 1 MiB
    refs = [c.call(1, workers.put_and_hold, f"r1-{i}", n, 100 * i) for i in range(3)]
    refs += [c.call(2, workers.put_and_hold, f"r2-{i}", n, 1000 + 100 * i) for i in range(2)]
    seeds = [0, 100, 200, 1000, 1100]

    for ref, seed in zip(refs, seeds):
        assert torch.equal(hop.get(ref, timeout=30).wait(), workers.pattern(n, seed))
    s = hop.stats()
    assert s["evictions"] == 1  # the fifth copy pushed out the least recently used
    assert s["store_used_bytes"] <= 4 * MiB

    # The evicted copy is fetched again from its primary holder.
    assert torch.equal(hop.get(refs[0], timeout=30).wait(), workers.pattern(n, 0))
    assert hop.stats()["evictions"] == 2

    # A primary copy may evict cached copies...
    hop.put(torch.zeros(3 * MiB, dtype=torch.uint8), "big-primary")
    # ...but never another primary copy.
    with pytest.raises(hop.CapacityError, match="'too-big'"):
        hop.put(torch.zeros(2 * MiB, dtype=torch.uint8), "too-big")
    with pytest.raises(hop.CapacityError, match="'huge'"):
        hop.put(torch.zeros(5 * MiB, dtype=torch.uint8), "huge")
    # The failed puts left nothing registered.
    name, _, _ = c.call(1, workers.get_error, "too-big", 0.5)
    assert name == "HopliteTimeoutError"
    # A get that cannot fit raises too, naming the object.
    name, message, _ = c.call(2, workers.get_error, "big-primary", 30)
    assert name == "CapacityError" and "'big-primary'" in message


def pool_stat_reaches(key: str, value: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while hop.stats()[key] != value and time.monotonic() < deadline:
        time.sleep(0.05)
    return hop.stats()[key]


@pytest.mark.parametrize("interval", [1.0, 0])
def test_buffers_the_pool_left_unused_for_a_trim_interval_are_given_back(interval):
    """A long-running process holds what its workload used lately, not the
    pool cache's bound: a freed buffer is reused within the heap trim interval,
    and unmapped at a trim once it was left unused for a whole interval."""
    hop.init(dist.HashStore(), rank=0, world_size=1, timeout=60, heap_trim_interval=interval)
    try:
        size = 16 * MiB
        hop.put(torch.ones(size, dtype=torch.uint8), "first")
        hop.delete("first")
        assert pool_stat_reaches("pool_cached_bytes", size, 0.5) == size
        hop.put(torch.ones(size, dtype=torch.uint8), "second")  # reuses the cached buffer
        hop.delete("second")
        assert hop.stats()["pool_mapped_bytes"] == size
        if interval:
            assert pool_stat_reaches("pool_held_bytes", 0, 10) == 0
        else:
            time.sleep(2.0)
            assert hop.stats()["pool_held_bytes"] == size
    finally:
        hop.shutdown()
