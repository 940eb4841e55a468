"""torch_hoplite.allreduce among processes that do not read each other's
memory (same_host=False, as between hosts): the static ring and butterfly over
the nodes' messages. Inputs hold integer values, so every result is exact.
The composition of the object store (one host, shards=, degree=) is in
test_reduce.py."""

import time

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


def test_allreduce_fails_at_once_everywhere_naming_the_member_that_differs(cluster4_apart):
    """The member that differs meets its partners' messages of another kind;
    they fail, and their aborts fail the others long before the timeout."""
    tag = uid("differs")
    pending = {r: cluster4_apart.submit(r, workers.allreduce, torch.ones(100 if r == 2 else 200), tag, {"timeout": 60})
               for r in (1, 2, 3)}
    errors = {}
    start = time.monotonic()
    with pytest.raises(hop.HopliteError) as info:
        hop.allreduce(torch.ones(200), tag, timeout=60)
    elapsed = time.monotonic() - start
    errors[0] = str(info.value)
    for r, p in pending.items():
        with pytest.raises(hop.HopliteError) as info:
            p.result()
        errors[r] = str(info.value)
    assert elapsed < 10, f"rank 0 gave up after {elapsed:.1f} s (timeout 60 s)"
    for r in range(4):
        assert f"allreduce '{tag}' on rank {r}" in errors[r], errors
        assert "allreduce of 100 float32 (SUM) among 0,1,2,3" in errors[r] and "different exchanges" in errors[r], errors


def test_allreduce_that_a_member_never_calls_times_out_naming_it(cluster4_apart):
    tag = uid("absent")
    pending = cluster4_apart.submit(1, workers.allreduce, torch.ones(10), tag, {"group": [0, 1, 2], "timeout": 2})
    with pytest.raises(hop.HopliteTimeoutError, match=f"allreduce '{tag}' on rank 0: receiving from rank 2"):
        hop.allreduce(torch.ones(10), tag, group=[0, 1, 2], timeout=2)
    with pytest.raises(hop.HopliteTimeoutError, match=f"allreduce '{tag}' on rank 1"):
        pending.result()


def test_allreduce_edge_cases_between_hosts(cluster4_apart):
    """The caller's tensor is left as it was; empty, 0-d, conjugated and
    one-member calls give what torch would compute."""
    n = (1 << 20) // 8 + 3
    make = lambda r: ints(r, n, torch.float64)  # noqa: E731
    mine = make(0)
    kept = mine.clone()
    tag = uid("input-kept")
    pending = {r: cluster4_apart.submit(r, workers.allreduce, make(r), tag, {}) for r in (1, 2, 3)}
    out = hop.allreduce(mine, tag)
    assert torch.equal(mine, kept) and out.data_ptr() != mine.data_ptr()
    assert torch.equal(out, expected(ReduceOp.SUM, [make(r) for r in range(4)]))
    assert all(torch.equal(p.result(), out) for p in pending.values())

    empty = allreduce_everywhere(cluster4_apart, range(4), lambda r: torch.zeros(0, 3), uid("empty"))
    assert all(t.shape == (0, 3) for t in empty.values())
    scalar = allreduce_everywhere(cluster4_apart, range(4), lambda r: torch.tensor(float(r)), uid("scalar"))
    assert all(t.shape == () and t.item() == 6.0 for t in scalar.values())

    # A conjugated view on rank 0 (the pipe to the other ranks would drop the bit: theirs are resolved).
    z = lambda r: torch.complex(ints(r, 1000, torch.float32), ints(r + 9, 1000, torch.float32))  # noqa: E731
    conj = allreduce_everywhere(cluster4_apart, range(4),
                                lambda r: z(r).conj() if r == 0 else z(r).conj().resolve_conj(), uid("conj"))
    want = sum(z(r) for r in range(4)).conj().resolve_conj()
    assert all(torch.equal(t, want) for t in conj.values())

    alone = hop.allreduce(kept, uid("alone"), group=[0])
    assert torch.equal(alone, kept) and alone.data_ptr() != kept.data_ptr()

