"""The store's capacity holds: cached copies are evicted least-recently-used;
primary copies stay, and a put that cannot fit raises."""

import pytest
import torch

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
