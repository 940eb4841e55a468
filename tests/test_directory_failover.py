"""The directory survives the death of a shard's host: its share moves to the
next live rank, and every holder registers its copies there again."""

import time

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import Cluster, ids_with_shard, in_thread

WORLD = 4
DEAD = 2  # hosts the shard of every id below


def ids_on(prefix: str, count: int, shard: int = DEAD) -> list[str]:
    return ids_with_shard(prefix, count, WORLD, lambda s: s == shard)


def test_gets_puts_and_deletes_go_on_after_a_shard_host_dies():
    big, small, later, fresh, orphan = ids_on("failover", 5)
    big_data = torch.arange((8 << 20) // 4, dtype=torch.int32)
    small_data = torch.arange(256, dtype=torch.float64)
    c = Cluster(WORLD, options={"heartbeat_timeout": 5})
    try:
        c.call(1, workers.put_zero_copy, big_data, big)
        c.call(1, workers.put, small_data, small)  # inline: its bytes live in the shard
        c.call(DEAD, workers.put, torch.ones(1 << 18), orphan)  # only the dying rank holds it
        assert torch.equal(c.call(3, workers.get, big, 30), big_data)  # rank 3 holds a copy too
        waiting = hop.get(later, timeout=60)  # parked at the shard that is about to die
        deadline = time.monotonic() + 10
        while c.call(DEAD, workers.stats)["lookups_waiting"] < 1:
            assert time.monotonic() < deadline, f"the get of {later} never reached rank {DEAD}'s shard"
            time.sleep(0.01)
        c.kill(DEAD)
        # Every holder registers its copies at the next shard; lookups follow.
        assert torch.equal(hop.get(big, timeout=30).wait(), big_data)
        assert torch.equal(hop.get(small, timeout=30).wait(), small_data)
        c.call(1, workers.put, torch.full((1000,), 7.0), later)
        assert torch.equal(waiting.wait(), torch.full((1000,), 7.0))
        c.call(3, workers.put, torch.full((10,), 3), fresh)
        assert torch.equal(hop.get(fresh, timeout=30).wait(), torch.full((10,), 3))
        # An object nobody else held is lost with its holder (the standby knew where it was).
        with pytest.raises(hop.PeerFailedError, match=f"'{orphan}' was lost"):
            hop.get(orphan, timeout=30).wait()
        hop.delete(big)
        with pytest.raises(hop.ObjectDeletedError):
            c.call(3, workers.get, big, 5)
        assert hop.stats()["remote_gets"] >= 1
    finally:
        c.close()


def test_a_shard_host_dying_during_our_handshake_moves_its_shard():
    """Rank 0 dials the shard's host for a put's registration; the host has
    accepted the connection (the kernel did: it is stopped) and dies before it
    answers. That is a death, not a refusal: the registration goes to the next
    shard and the put succeeds, as any later get of it does."""
    (obj,) = ids_on("handshake-death", 1)
    c = Cluster(WORLD, options={"heartbeat_timeout": 30})
    try:
        c.freeze(DEAD)
        put = in_thread(hop.put, torch.arange(1000.0), obj, timeout=30, blocking=True)
        time.sleep(0.5)  # the hello waits, unread, in the stopped rank's socket
        c.kill(DEAD)  # its kernel resets that connection
        ref = put(30)
        assert torch.equal(c.call(1, workers.get, ref, 30), torch.arange(1000.0))
        assert torch.equal(hop.get(ref, timeout=30).wait(), torch.arange(1000.0))
    finally:
        c.close()


def wait_for_parked_lookup(c: Cluster, rank: int, obj: str) -> None:
    deadline = time.monotonic() + 10
    while c.call(rank, workers.stats)["lookups_waiting"] < 1:
        assert time.monotonic() < deadline, f"the get of {obj} never parked at rank {rank}'s shard"
        time.sleep(0.01)


def test_a_shard_returns_to_its_rank_when_it_rejoins():
    """Rank 2 dies (its shard moves to rank 3) and a new process takes its
    place: the shard comes back, with the copies registered there again and
    the gets parked at rank 3 handed over. So rank 3 may die next without
    taking rank 2's ids with it (moved shards used to stay put for good, and
    after every rank had died once, the last one's death lost its shard)."""
    held, later, unknown = ids_on("return", 3)
    c = Cluster(WORLD, options={"heartbeat_timeout": 2, "connect_timeout": 5})
    try:
        c.call(1, workers.put, torch.arange(1000.0), held)
        c.kill(DEAD)
        assert torch.equal(hop.get(held, timeout=30).wait(), torch.arange(1000.0))  # now listed at rank 3
        # A get that times out there says the shard stands in for a gone rank.
        with pytest.raises(hop.HopliteTimeoutError, match=f"'{unknown}' timed out after 0.5 s \\(waiting for the "
                           f"object to be put; directory shard on rank {DEAD + 1} at .*, standing in for rank "
                           f"{DEAD} at .*, which is gone"):
            hop.get(unknown, timeout=0.5).wait()
        deadline = time.monotonic() + 10
        while c.call(DEAD + 1, workers.stats)["lookups_waiting"]:  # its lookup's wait there ends too
            assert time.monotonic() < deadline
            time.sleep(0.01)
        waiting = hop.get(later, timeout=60)
        wait_for_parked_lookup(c, DEAD + 1, later)
        c.restart(DEAD)
        wait_for_parked_lookup(c, DEAD, later)  # handed over to the returned shard
        assert c.call(DEAD + 1, workers.stats)["lookups_waiting"] == 0
        c.call(1, workers.put, torch.full((10,), 5.0), later)
        assert torch.equal(waiting.wait(), torch.full((10,), 5.0))
        c.kill(DEAD + 1)
        assert torch.equal(c.call(DEAD, workers.get, held, 30), torch.arange(1000.0))
        assert torch.equal(c.call(1, workers.get, later, 30), torch.full((10,), 5.0))
    finally:
        c.close()


def test_a_shard_host_that_dies_leaves_its_deletes_with_its_successor():
    """A shard tells the rank that takes over its share (the next one) which
    ids it deleted, and which were put again: when it dies, a get of a deleted
    id still fails at once instead of waiting for a put; one put again after
    its delete is still found."""
    deleted, again = ids_on("standby", 2)
    c = Cluster(WORLD, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5})
    try:
        for obj in (deleted, again):
            c.call(1, workers.put, torch.ones(1 << 18), obj)
            c.call(1, workers.delete, obj, 10)
        c.call(1, workers.put, torch.full((1 << 18,), 2.0), again)
        time.sleep(0.2)  # the standby's news travels after the deletes' answers
        c.kill(DEAD)
        start = time.monotonic()
        with pytest.raises(hop.ObjectDeletedError, match=deleted):
            hop.get(deleted, timeout=20).wait()
        assert time.monotonic() - start < 10  # the failure's detection, not the get's 20 s
        assert torch.equal(hop.get(again, timeout=20).wait(), torch.full((1 << 18,), 2.0))
    finally:
        c.close()


def test_a_second_failover_still_knows_the_first_ones_deletes():
    """The rank that took a dead shard's share over tells its own standby
    what it adopted: when it dies too, a get of an id deleted before the
    first failover still fails at once."""
    (deleted,) = ids_on("second", 1)
    c = Cluster(WORLD, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5})
    try:
        c.call(1, workers.put, torch.ones(1 << 18), deleted)
        c.call(1, workers.delete, deleted, 10)
        time.sleep(0.2)  # the standby's news travels after the delete's answer
        c.kill(DEAD)
        with pytest.raises(hop.ObjectDeletedError, match=deleted):
            hop.get(deleted, timeout=20).wait()  # known at rank 3, the share's host now
        time.sleep(0.2)  # and from it at rank 3's standby, this process
        c.kill(DEAD + 1)
        start = time.monotonic()
        with pytest.raises(hop.ObjectDeletedError, match=deleted):
            hop.get(deleted, timeout=20).wait()
        assert time.monotonic() - start < 10  # the failure's detection, not the get's 20 s
    finally:
        c.close()


def test_an_object_lost_with_its_shard_host_fails_a_get_at_once():
    """A shard also tells its standby where each put's copy is: when its host
    dies holding the only copy, the successor fails a get of it at once
    ("lost") instead of waiting for a put that never comes; an object with a
    copy elsewhere is still found."""
    own, copied = ids_on("lost-own", 2)
    c = Cluster(WORLD, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5})
    try:
        for obj in (own, copied):
            c.call(DEAD, workers.put, torch.full((1 << 18,), 3.0), obj)
        c.call(1, workers.get_keeping_copy, copied, 10)  # a copy at rank 1, listed at the shard
        time.sleep(0.2)  # the standby's news travels after the puts' answers
        c.kill(DEAD)
        start = time.monotonic()
        with pytest.raises(hop.PeerFailedError, match=rf"'{own}' was lost: its last holder, rank {DEAD}, failed"):
            hop.get(own, timeout=20).wait()
        assert time.monotonic() - start < 10  # the failure's detection, not the get's 20 s
        assert torch.equal(hop.get(copied, timeout=20).wait(), torch.full((1 << 18,), 3.0))
    finally:
        c.close()


def test_a_new_standby_is_sent_what_the_shard_already_knows():
    """When a shard's standby dies, the shard sends the next one all it knows
    (the ids it deleted, where each put's copy is), not only what changes from
    then on: when the shard's host dies next, a get of an id deleted before the
    standby died fails at once, as does a get of an object whose only copy died
    with the host."""
    deleted, own = ids_on("snapshot", 2)
    standby = DEAD + 1  # then rank 0, this process, once rank 3 is gone
    c = Cluster(WORLD, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5})
    try:
        c.call(1, workers.put, torch.ones(1 << 18), deleted)
        c.call(1, workers.delete, deleted, 10)
        c.call(DEAD, workers.put, torch.full((1 << 18,), 3.0), own)
        time.sleep(0.2)  # rank 3 hears of both, as the standby then
        c.kill(standby)
        deadline = time.monotonic() + 10
        while c.call(DEAD, workers.stats)["shards_moved"] < 1:  # rank 2 noticed rank 3's death
            assert time.monotonic() < deadline, "rank 3's death was never noticed"
            time.sleep(0.05)
        time.sleep(0.3)  # and sent what its shard knows to rank 0
        c.kill(DEAD)
        start = time.monotonic()
        with pytest.raises(hop.ObjectDeletedError, match=deleted):
            hop.get(deleted, timeout=20).wait()
        with pytest.raises(hop.PeerFailedError, match=rf"'{own}' was lost: its last holder, rank {DEAD}, failed"):
            hop.get(own, timeout=20).wait()
        assert time.monotonic() - start < 10  # the failures' detection, not the gets' 20 s
    finally:
        c.close()


@pytest.mark.parametrize("holder_fate", ["killed", "hung"])
def test_an_object_lost_with_its_holder_and_its_shard_host_fails_a_get(holder_fate):
    """The put's holder dies with the id's shard host ("killed"), or hangs
    (SIGSTOP) with no live rank talking to it ("hung"). The standby, which
    takes the shard over, expects that holder to list its copy, and fails
    gets of the object once it hears that the holder is gone too: the news
    of the moves reaches every rank, and a hung one is found failed when its
    handshake times out (as is a dead host by a getter that never talked to
    it: hence the short connect timeout)."""
    (obj,) = ids_on(f"lost-{holder_fate}", 1)
    holder = 1
    c = Cluster(WORLD, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5, "connect_timeout": 3})
    try:
        c.call(holder, workers.put, torch.full((1 << 18,), 4.0), obj)
        time.sleep(0.2)
        if holder_fate == "killed":
            c.kill(holder)
        else:
            c.freeze(holder)
        c.kill(DEAD)
        start = time.monotonic()
        with pytest.raises(hop.PeerFailedError, match=rf"'{obj}' was lost: its last holder, rank {holder}, failed"):
            hop.get(obj, timeout=30).wait()
        assert time.monotonic() - start < 20  # not the get's 30 s
    finally:
        if holder_fate == "hung":
            c.kill(holder)
        c.close()


def test_a_copy_that_outlives_the_puts_holder_outlives_the_shard_host_too():
    """The put's holder dies first, a copy lives on: the shard tells its
    standby so, and when the shard's host dies next, the object is found, not
    reported lost with the put's holder."""
    (obj,) = ids_on("outlives", 1)
    c = Cluster(WORLD, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5})
    try:
        c.call(1, workers.put, torch.full((1 << 18,), 5.0), obj)
        c.call(3, workers.get_keeping_copy, obj, 10)
        c.kill(1)
        deadline = time.monotonic() + 10
        while c.call(DEAD, workers.stats)["shards_moved"] < 1:  # rank 2 noticed rank 1's death
            assert time.monotonic() < deadline, "rank 1's death was never noticed"
            time.sleep(0.05)
        time.sleep(0.3)  # it dropped rank 1's copy, and its standby heard of rank 3's
        c.kill(DEAD)
        assert torch.equal(hop.get(obj, timeout=20).wait(), torch.full((1 << 18,), 5.0))
    finally:
        c.close()


def test_a_delete_applied_by_a_shard_host_that_died_before_answering_succeeds():
    """The shard's host drops every copy, then dies before it answers; its
    standby never heard of the delete. Asked again at the successor, which
    does not know the id, the delete still succeeds: it took effect."""
    world, host, standby = 5, 1, 2  # rank 2 is rank 1's standby and holds a copy
    (obj,) = ids_with_shard("applied-delete", 1, world, lambda s: s == host)
    c = Cluster(world, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5, "same_host": False})
    try:
        hop.put(torch.arange(100_000, dtype=torch.float32), obj)
        assert c.call(standby, workers.get_keeping_copy, obj, 30).shape == (100_000,)
        # Rank 0 pulls from the standby too, so it hears the standby fall silent.
        c.call(standby, workers.put, torch.ones(100_000), "from-the-standby")
        assert hop.get("from-the-standby", timeout=30).wait().shape == (100_000,)
        objects = hop.stats()["store_objects"]
        # Frozen, the standby hears nothing of the delete, and the host waits
        # for its copy to be dropped before answering.
        c.freeze(standby)
        delete = in_thread(hop.delete, obj)
        deadline = time.monotonic() + 10
        while hop.stats()["store_objects"] == objects:
            assert time.monotonic() < deadline, "the shard's host never dropped rank 0's copy"
            time.sleep(0.01)
        c.kill(host)
        delete(30)
        with pytest.raises(hop.HopliteError):
            hop.get(obj, timeout=2).wait()
    finally:
        if standby in c.procs and c.procs[standby].is_alive():
            c.kill(standby)
        c.close()
