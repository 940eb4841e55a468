"""Receiver-driven broadcast: many gets of one object form a relay tree on the fly."""

import random
import time

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import Cluster


def test_broadcast_to_7_receivers_arriving_at_random_times_relays_through_receivers():
    c = Cluster(8)
    try:
        n = (64 << 20) // 4
        rng = random.Random(3)
        before = {r: c.call(r, workers.stats) for r in range(8)}
        # Two receivers wait before the put; the others arrive at random times after it.
        delays = {1: 0.0, 2: 0.0, **{r: 0.3 + rng.uniform(0.0, 0.3) for r in range(3, 8)}}
        pendings = {r: c.submit(r, workers.get_after, delays[r], "bcast", n, 21) for r in range(1, 8)}
        time.sleep(0.2)
        hop.put(workers.pattern(n, 21), "bcast")
        assert {r: p.result() for r, p in pendings.items()} == {r: True for r in range(1, 8)}
        after = {r: c.call(r, workers.stats) for r in range(8)}
        served = {r: after[r]["pulls_served"] - before[r]["pulls_served"] for r in range(8)}
        # Every receiver pulled exactly once, and some were served by other receivers.
        assert sum(served.values()) == 7
        assert sum(served[r] for r in range(1, 8)) >= 1, served
    finally:
        c.close()


def test_simultaneous_receivers_form_a_relay_chain():
    c = Cluster(4)
    try:
        n = (32 << 20) // 4
        pendings = {r: c.submit(r, workers.get_matches_pattern, "chain", n, 5, 60) for r in (1, 2, 3)}
        hop.put(workers.pattern(n, 5), "chain")  # all three are waiting already
        assert [p.result() for p in pendings.values()] == [True, True, True]
        served = {r: c.call(r, workers.stats)["pulls_served"] for r in range(4)}
        relayed = sum(c.call(r, workers.stats)["relays_served"] for r in range(4))
        # The source fed one receiver at a time: the others were served by receivers.
        assert served[0] < 3, served
        assert relayed >= 1
    finally:
        c.close()


def test_get_with_a_source_pulls_from_that_rank_even_before_it_has_a_copy(cluster4):
    n = (4 << 20) // 4
    hop.put(workers.pattern(n, 8), "sourced")
    before = {r: cluster4.call(r, workers.stats)["pulls_served"] for r in range(4)}
    # Rank 3 asks for rank 2, which has no copy yet: its node holds the pull until it has one.
    via_2 = cluster4.submit(3, workers.get_from, "sourced", 2, 30)
    time.sleep(0.3)
    assert torch.equal(cluster4.call(2, workers.get_keeping_copy, "sourced", 30), workers.pattern(n, 8))
    assert torch.equal(via_2.result(), workers.pattern(n, 8))
    served = {r: cluster4.call(r, workers.stats)["pulls_served"] - before[r] for r in range(4)}
    assert served == {0: 1, 1: 0, 2: 1, 3: 0}, served  # without the source, both pull from rank 0


def test_a_source_that_never_gets_a_copy_is_replaced_by_the_directory_s_choice(cluster4):
    n = (1 << 20) // 4
    hop.put(workers.pattern(n, 9), "unsourced")
    before = {r: cluster4.call(r, workers.stats)["pulls_served"] for r in range(4)}
    start = time.monotonic()
    assert torch.equal(cluster4.call(3, workers.get_from, "unsourced", 1, 30), workers.pattern(n, 9))
    waited = time.monotonic() - start
    served = {r: cluster4.call(r, workers.stats)["pulls_served"] - before[r] for r in range(4)}
    # Rank 1 never got a copy, so it served nothing; the holder the directory chose did.
    assert served == {0: 1, 1: 0, 2: 0, 3: 0}, served
    assert 4.5 < waited < 30  # the pull waited at rank 1 for its 5 s before it went elsewhere


@pytest.mark.parametrize("source", [4, -1, True, "1"])
def test_bad_source_is_refused(cluster4, source):
    with pytest.raises(ValueError, match="source"):
        hop.get("anything", source=source)
