"""Reduce recovery: participants SIGKILLed in the middle of a streaming reduce.
The coordinator redoes what depended on them with the next ready inputs, the
result is exact over the inputs it reports, and its readers wait for it."""

import time

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import Cluster, ids_with_shard, in_thread

WORLD = 8
VICTIMS = (1, 2)


def ids_avoiding(prefix: str, count: int, avoid) -> list[str]:
    """Ids whose directory shard is not on a rank that will be killed."""
    return ids_with_shard(prefix, count, WORLD, lambda s: s not in avoid)


@pytest.fixture(scope="module")
def cluster8():
    # Over TCP, as between hosts: these tests freeze a holder to stop its
    # stream mid-way, and on one host its memory stays readable while it is
    # stopped (what it had announced is read anyway). The recovery logic is
    # the same on both paths.
    c = Cluster(WORLD, options={"heartbeat_timeout": 5, "same_host": False})
    yield c
    c.close()


def seed_of(input_id: str, ids: list[str]) -> int:
    return 1000 * (ids.index(input_id) + 1)


def test_two_inputs_killed_while_a_4_of_8_reduce_streams(cluster8):
    c = cluster8
    numel = (128 << 20) // 4
    # Inputs i is held by rank i (rank 0 is this process, the coordinator).
    ids = ids_avoiding("rr-in", WORLD, VICTIMS)
    result_id = ids_avoiding("rr-out", 1, VICTIMS)[0]
    # The first four to be ready, victims among them; the others come later.
    for rank in (1, 2, 3, 4):
        c.call(rank, workers.put_pattern, ids[rank], numel, seed_of(ids[rank], ids))
    result, unused = hop.reduce(ids, num_objects=4, id=result_id, degree=1, timeout=60)
    for rank in VICTIMS:  # frozen mid-stream: the chain cannot finish without them
        c.freeze(rank)
    first = result.reduce_plan
    assert {hop.object_ref.id_of(r) for r in first.inputs} == {ids[r] for r in (1, 2, 3, 4)}
    # Readers that started before the failure: this process and rank 7.
    local = hop.get(result, timeout=60, copy=False)
    remote = c.submit(7, workers.get_digest, result_id, 60)
    for rank in (5, 6):  # rank 7 is busy reading
        c.call(rank, workers.put_pattern, ids[rank], numel, seed_of(ids[rank], ids))
    hop.put(workers.pattern(numel, seed_of(ids[0], ids)), ids[0])
    t0 = time.monotonic()
    for rank in VICTIMS:
        c.kill(rank)
    plan = hop.wait_reduce(result, timeout=60)
    recovered_s = time.monotonic() - t0
    used = [hop.object_ref.id_of(r) for r in plan.inputs]
    assert plan.recoveries >= 1
    assert len(used) == 4 and not set(used) & {ids[r] for r in VICTIMS}
    assert {hop.object_ref.id_of(r) for r in plan.lost} <= {ids[r] for r in VICTIMS}
    seeds = [seed_of(i, ids) for i in used]
    assert torch.equal(local.wait(), workers.pattern_sum(numel, seeds))
    assert remote.result(60) == workers.digest(workers.pattern_sum(numel, seeds))
    assert hop.stats()["reduce_recoveries"] >= 1
    assert recovered_s < 30


def test_an_input_lost_before_its_task_started_is_waited_for_until_put_again(cluster8):
    """With no input to spare, the reduce waits for the lost one to appear
    again: here rank 5 puts the same id, as a restarted rank would."""
    c = cluster8
    numel = (16 << 20) // 4
    holders = (6, 3, 4)
    dead = (*VICTIMS, 6)  # the directory does not survive its shard's host yet
    ids = ids_avoiding("rw-in", len(holders), dead)
    result_id = ids_avoiding("rw-out", 1, dead)[0]
    for rank, obj in zip(holders, ids):
        c.call(rank, workers.put_pattern, obj, numel, rank)
    c.freeze(6)  # its task is sent but never answered ...
    join = in_thread(hop.reduce, ids, id=result_id, degree=1, timeout=60)
    time.sleep(0.5)
    c.kill(6)  # ... and it dies
    time.sleep(0.5)
    c.call(5, workers.put_pattern, ids[0], numel, 6)
    result, unused = join(60)
    assert unused == []
    plan = hop.wait_reduce(result, timeout=60)
    assert plan.recoveries >= 1 and plan.lost == ()  # put again and used: not lost in the end
    assert sorted(hop.object_ref.id_of(r) for r in plan.inputs) == sorted(ids)
    assert plan.holders[[hop.object_ref.id_of(r) for r in plan.inputs].index(ids[0])] == 5
    assert c.call(4, workers.get_equals_pattern_sum, result, numel, holders, 60)


def test_too_few_surviving_inputs_raise_after_the_timeout(cluster8):
    c = cluster8
    numel = (1 << 20) // 4
    dead = (*VICTIMS, 6, 7)
    ids = ids_avoiding("rt-in", 2, dead)
    for rank, obj in zip((7, 3), ids):
        c.call(rank, workers.put_filled, obj, numel, rank)
    c.freeze(7)
    join = in_thread(hop.reduce, ids, id=ids_avoiding("rt-out", 1, dead)[0], timeout=4)
    time.sleep(0.5)
    c.kill(7)
    t0 = time.monotonic()
    with pytest.raises(hop.HopliteTimeoutError, match=f"still missing '{ids[0]}' \\(its holder failed\\)"):
        join(30)
    assert time.monotonic() - t0 < 10
