"""torch_hoplite.allreduce among processes that do not read each other's
memory (same_host=False, as between hosts): the static ring and butterfly over
the nodes' messages. Inputs hold integer values, so every result is exact.
The composition of the object store (one host, shards=, degree=) is in
test_reduce.py."""

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import Cluster
from test_reduce import allreduce_everywhere, expected, ints, uid
from torch_hoplite import ReduceOp


@pytest.fixture(scope="module")
def cluster4_apart():
    c = Cluster(4, options={"same_host": False})
    yield c
    c.close()


@pytest.mark.parametrize("group", [[0, 1, 2, 3], [0, 1, 3], [0, 2]])
@pytest.mark.parametrize("numel", [1000, (1 << 20) // 8 + 5])  # the butterfly, then the ring
def test_allreduce_by_default_runs_the_static_algorithms_exactly(cluster4_apart, group, numel):
    """Every op on integer-valued data; non-power-of-two groups fold into the
    butterfly; the members exchange messages and make no object."""
    for op, dtype in [(ReduceOp.SUM, torch.float64), (ReduceOp.MAX, torch.float32), (ReduceOp.AVG, torch.float64),
                      (ReduceOp.BXOR, torch.int32), (ReduceOp.PROD, torch.int64)]:
        tag = uid(f"ring-{op.name}")
        low, high = (-2, 3) if op == ReduceOp.PROD else (-50, 50)
        make = lambda r: ints(r * 7 + numel, numel, dtype, low, high).reshape(-1, 1)  # noqa: E731
        before = hop.stats()
        out = allreduce_everywhere(cluster4_apart, group, make, tag, group=group, op=op)
        after = hop.stats()
        want = expected(op, [make(r) for r in group])
        for r in group:
            assert out[r].shape == (numel, 1) and out[r].dtype == dtype, (op, r)
            assert torch.equal(out[r], want), (op, r)
        assert after["messages_sent"] > before["messages_sent"]
        assert (after["store_objects"], after["reduce_tasks"]) == (before["store_objects"], before["reduce_tasks"])


def test_allreduce_members_may_call_late_and_an_id_may_be_used_again(cluster4_apart):
    tag = uid("late")
    n = (1 << 20) // 4
    pending = {r: cluster4_apart.submit(r, workers.allreduce_after, 0.3 * r, torch.full((n,), float(r)), tag, {})
               for r in (1, 2, 3)}
    mine = hop.allreduce(torch.zeros(n), tag)
    assert torch.equal(mine, torch.full((n,), 6.0))
    assert all(torch.equal(p.result(), mine) for p in pending.values())
    again = allreduce_everywhere(cluster4_apart, range(4), lambda r: torch.full((n,), 2.0 * r), tag)
    assert all(torch.equal(t, torch.full((n,), 12.0)) for t in again.values())


def test_allreduce_fails_naming_the_member_that_differs_or_never_calls(cluster4_apart):
    tag = uid("differs")
    pending = {r: cluster4_apart.submit(r, workers.allreduce, torch.ones(100 if r == 2 else 200), tag, {"timeout": 4})
               for r in (1, 2, 3)}
    errors = {}
    with pytest.raises(hop.HopliteError) as info:
        hop.allreduce(torch.ones(200), tag, timeout=4)
    errors[0] = str(info.value)
    for r, p in pending.items():
        with pytest.raises(hop.HopliteError) as info:
            p.result()
        errors[r] = str(info.value)
    for r in (2, 3):  # the butterfly's partners of the member that differs find out at once
        assert "allreduce of 100 float32 (SUM) among 4" in errors[r] and "different exchanges" in errors[r], errors
    for r in (0, 1):  # the others when they give up on them
        assert f"allreduce '{tag}' on rank {r}: receiving from rank" in errors[r], errors
    tag = uid("absent")
    pending = cluster4_apart.submit(1, workers.allreduce, torch.ones(10), tag, {"group": [0, 1, 2], "timeout": 2})
    with pytest.raises(hop.HopliteTimeoutError, match="rank 2") as info:
        hop.allreduce(torch.ones(10), tag, group=[0, 1, 2], timeout=2)
    assert tag in str(info.value)
    with pytest.raises(hop.HopliteError):
        pending.result()
