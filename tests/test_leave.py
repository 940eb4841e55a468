"""A graceful shutdown is a leave, not a failure: the peers move the leaving
rank's share of the directory at once, its new host keeps what it remembered
of deleted ids, lookups parked there are asked again at the new host, and what
waited on the leaving rank fails saying that it left."""

import time

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import ids_with_shard


def test_a_rank_that_shuts_down_hands_over_its_share_of_the_directory(cluster3_fast_heartbeats):
    c = cluster3_fast_heartbeats
    deleted, kept, later = ids_with_shard("leave", 3, 3, lambda s: s == 1)
    c.call(2, workers.put, torch.full((1 << 18,), 2.0), deleted)
    c.call(2, workers.delete, deleted, 10)
    c.call(2, workers.put, torch.full((1 << 18,), 3.0), kept)
    parked = hop.get(later, timeout=30)  # waits at rank 1's shard for a put
    time.sleep(0.2)
    assert c.call(1, workers.stats)["lookups_waiting"] == 1
    c.call(1, workers.shutdown)
    # Moved at once by the leave (no heartbeat timeout, no failure).
    assert c.call(0, workers.stats)["shards_moved"] == 1
    assert c.call(2, workers.stats)["shards_moved"] == 1
    # Its new host (rank 2) remembers the delete: a get fails at once, not after
    # its timeout. (Rank 2 is also rank 1's standby, which knows it too; the
    # hand-over alone is checked in tests/cpp/test_directory_shard.cpp.)
    start = time.monotonic()
    with pytest.raises(hop.ObjectDeletedError, match=deleted):
        hop.get(deleted, timeout=10).wait()
    assert time.monotonic() - start < 2
    # Listed again at the new host by its holder.
    assert torch.equal(hop.get(kept, timeout=10).wait(), torch.full((1 << 18,), 3.0))
    # The parked get was asked again there, and sees the put.
    c.call(2, workers.put, torch.full((1 << 18,), 4.0), later)
    assert torch.equal(parked.wait(), torch.full((1 << 18,), 4.0))


def test_what_waits_on_a_rank_that_left_fails_saying_it_left(cluster3_fast_heartbeats):
    """Objects only the leaver held are lost, wherever their entry was: at a
    peer's shard, or at the leaver's own (handed over as lost)."""
    c = cluster3_fast_heartbeats
    (at_peer,) = ids_with_shard("leave-only", 1, 3, lambda s: s == 2)
    (at_leaver,) = ids_with_shard("leave-own", 1, 3, lambda s: s == 1)
    for obj in (at_peer, at_leaver):
        c.call(1, workers.put, torch.full((1 << 18,), 1.0), obj)  # only rank 1 holds it
    c.call(1, workers.shutdown)
    for obj in (at_peer, at_leaver):
        start = time.monotonic()
        with pytest.raises(hop.PeerFailedError, match=r"its last holder, rank 1, left \(it shut down\)"):
            hop.get(obj, timeout=10).wait()
        assert time.monotonic() - start < 2
