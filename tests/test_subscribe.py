"""Directory subscriptions: the shard pushes where an object is, from before
its put to after its delete, through copies, deaths and a moving shard."""

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import Cluster, ids_with_shard


def id_on(prefix: str, shard: int, world: int) -> str:
    return ids_with_shard(prefix, 1, world, lambda s: s == shard)[0]


@pytest.mark.parametrize("shard", [0, 2], ids=["local-shard", "remote-shard"])
def test_locations_follow_an_object_from_before_its_put_to_after_its_delete(shard):
    obj = id_on("life", shard, 3)
    data = torch.arange((4 << 20) // 4, dtype=torch.int32)
    c = Cluster(3)
    try:
        with hop.subscribe(obj) as sub:
            first = sub.next(timeout=10)
            assert (first.state, first.holders) == ("absent", ())
            with pytest.raises(hop.HopliteTimeoutError, match=obj):
                sub.next(timeout=0.3)  # nothing changed
            c.call(1, workers.put, data, obj)
            loc = sub.wait_for(lambda loc: loc.complete == (1,), timeout=10)
            assert loc.state == "present" and not loc.inline
            assert torch.equal(c.call(2, workers.get_keeping_copy, obj, 30), data)
            loc = sub.wait_for(lambda loc: loc.complete == (1, 2), timeout=10)
            assert loc.partial == () and loc.holders == (1, 2)
            # A subscriber on another rank is told too.
            assert c.call(2, workers.wait_for_holders, obj, (1, 2), 10) == (1, 2)
            hop.delete(obj)
            loc = sub.wait_for(lambda loc: loc.state == "deleted", timeout=10)
            assert loc.holders == ()
            c.call(2, workers.put, torch.ones(3), obj)  # an id may be used again after its delete
            loc = sub.wait_for(lambda loc: loc.state == "present", timeout=10)
            assert loc.complete == (2,) and loc.inline  # 12 bytes: kept in the shard too
            assert hop.stats()["subscriptions"] == 1
        assert hop.stats()["subscriptions"] == 0
        with pytest.raises(ValueError, match="closed"):
            sub.next(timeout=1)
        hop.delete(obj)
    finally:
        c.close()


def test_a_dead_holder_leaves_the_list_and_the_last_copy_lost_is_reported():
    world = 4
    shared, alone = id_on("dead-shared", 1, world), id_on("dead-alone", 1, world)
    c = Cluster(world, options={"heartbeat_timeout": 5})
    try:
        c.call(3, workers.put, torch.ones(1 << 18), shared)
        c.call(2, workers.get_keeping_copy, shared, 30)
        c.call(3, workers.put, torch.ones(1 << 18), alone)
        c.call(2, workers.subscribe_forever, shared)  # a subscriber about to die
        with hop.subscribe(shared) as both, hop.subscribe(alone) as one:
            both.wait_for(lambda loc: loc.complete == (2, 3), timeout=10)
            one.wait_for(lambda loc: loc.complete == (3,), timeout=10)
            c.kill(3)
            c.kill(2)
            loc = both.wait_for(lambda loc: loc.state == "lost", timeout=20)
            assert loc.holders == () and loc.last_holder in (2, 3)
            loc = one.wait_for(lambda loc: loc.state == "lost", timeout=20)
            assert loc.last_holder == 3
            # The shard goes on serving subscriptions after its dead subscriber left.
            hop.put(torch.zeros(1 << 18), shared)
            assert both.wait_for(lambda loc: loc.complete == (0,), timeout=10).state == "present"
    finally:
        c.close()


def test_a_subscription_moves_with_its_shard_when_the_shard_host_dies():
    world, dead = 4, 2
    obj = id_on("moving", dead, world)
    data = torch.arange(1 << 18, dtype=torch.float32)
    c = Cluster(world, options={"heartbeat_timeout": 5})
    try:
        c.call(1, workers.put, data, obj)
        with hop.subscribe(obj) as sub:
            sub.wait_for(lambda loc: loc.complete == (1,), timeout=10)
            c.kill(dead)
            # The next shard learns of rank 1's copy when rank 1 registers it
            # again, and of rank 3's when it pulls; only it can tell the
            # subscription, which moved there.
            assert torch.equal(c.call(3, workers.get_keeping_copy, obj, 30), data)
            loc = sub.wait_for(lambda loc: loc.complete == (1, 3), timeout=20)
            assert loc.state == "present"
    finally:
        c.close()


def test_bad_arguments_are_refused():
    c = Cluster(2)
    try:
        with pytest.raises(TypeError, match="str or bytes"):
            hop.subscribe(42)
        with hop.subscribe("bad-args") as sub:
            with pytest.raises(ValueError, match="timeout"):
                sub.next(timeout=-1)
            with pytest.raises(hop.HopliteTimeoutError, match="bad-args"):
                sub.wait_for(lambda loc: loc.state == "present", timeout=0.5)
            assert sub.latest is not None and sub.latest.state == "absent"
    finally:
        c.close()
