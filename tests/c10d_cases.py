"""Every operation of the "hoplite" torch.distributed backend next to gloo's
answer on the same inputs, run in spawned processes (see test_c10d_backend.py).

Each rank runs every case and records, per case, None or what differed. Values
are integer-valued, so every reduction is exact whatever the summation order.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
import traceback
from typing import Callable

import torch
import torch.distributed as dist

import torch_hoplite  # noqa: F401  (registers the backend)

TIMEOUT = datetime.timedelta(seconds=60)
SMALL, LARGE = 37, 300_003  # below the butterfly/binomial thresholds, and well above (several pieces)
CHAINED = 5_000_003  # 20 MB: more pieces than a chain (broadcast, reduce) posts ahead (8 MiB)


def _values(rank: int, n: int, dtype=torch.float32, salt: int = 0) -> torch.Tensor:
    """Distinct small integers per rank (products of up to 5 ranks stay exact)."""
    base = torch.arange(n, dtype=torch.int64) * 7 + rank * 13 + salt
    return (base % 3 + 1).to(dtype)


def _check(a, b, what: str) -> None:
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{what}: {len(a)} tensors vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _check(x, y, f"{what}[{i}]")
        return
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}: differs from gloo at {(a != b).nonzero()[:5].tolist()}"


def _global(group, group_rank: int) -> int:
    return group_rank if group is dist.GroupMember.WORLD else dist.get_global_rank(group, group_rank)


def _raises(fn: Callable[[], object], error: type, *fragments: str) -> None:
    """fn() raises `error` whose message contains every fragment."""
    try:
        fn()
    except error as e:
        assert all(f in str(e) for f in fragments), str(e)
    else:
        raise AssertionError(f"no {error.__name__} mentioning {fragments}")


# --------------------------------------------------------------------------- cases
# Each case takes (group_hoplite, group_gloo, rank, world) and raises on a mismatch.


def allreduce_ops(h, g, rank, world):
    for n in (SMALL, LARGE):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
            a, b = _values(rank, n), _values(rank, n)
            dist.all_reduce(a, op=op, group=h)
            dist.all_reduce(b, op=op, group=g)
            _check(a, b, f"all_reduce {op} n={n}")


def allreduce_dtypes(h, g, rank, world):
    for dtype in (torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.int8):
        for n in (SMALL, LARGE):
            a, b = _values(rank, n, dtype), _values(rank, n, dtype)
            dist.all_reduce(a, group=h)
            dist.all_reduce(b, group=g)
            _check(a, b, f"all_reduce {dtype} n={n}")


def allreduce_bitwise(h, g, rank, world):
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        for n in (SMALL, LARGE):
            a = torch.arange(n, dtype=torch.int64) * (rank + 3) + rank
            b = a.clone()
            dist.all_reduce(a, op=op, group=h)
            dist.all_reduce(b, op=op, group=g)
            _check(a, b, f"all_reduce {op} n={n}")


def allreduce_avg(h, g, rank, world):
    # gloo has no AVG: compare with its SUM divided by the group size.
    for n in (SMALL, LARGE):
        a, b = _values(rank, n), _values(rank, n)
        dist.all_reduce(a, op=dist.ReduceOp.AVG, group=h)
        dist.all_reduce(b, group=g)
        _check(a, b / dist.get_world_size(g), f"all_reduce AVG n={n}")


def allreduce_noncontiguous_async(h, g, rank, world):
    a = _values(rank, 600 * 500).view(600, 500).t()
    b = a.clone()
    work = dist.all_reduce(a, group=h, async_op=True)
    fut_value = work.get_future().wait()
    work.wait()
    dist.all_reduce(b, group=g)
    _check(a, b, "non-contiguous all_reduce")
    _check(fut_value[0], b, "future value")
    assert work.is_completed() and work.is_success()


def allreduce_coalesced(h, g, rank, world):
    a = [_values(rank, SMALL), _values(rank, 1000, salt=1).view(10, 100)]
    expect = [t.clone() for t in a]
    for t in expect:
        dist.all_reduce(t, group=g)
    dist.all_reduce_coalesced(a, group=h)
    _check(a, expect, "all_reduce_coalesced")


def gathers_and_scatters_coalesced(h, g, rank, world):
    size = dist.get_world_size(h)
    # One dtype (torch's all_gather_coalesced asks for it), several shapes and sizes.
    xs = [_values(rank, SMALL), _values(rank, 1000, salt=2).view(10, 100), _values(rank, LARGE, salt=3)]
    a = [[torch.zeros_like(x) for _ in range(size)] for x in xs]
    dist.all_gather_coalesced(a, xs, group=h)
    for x, outs in zip(xs, a):
        b = [torch.zeros_like(x) for _ in range(size)]
        dist.all_gather(b, x, group=g)
        _check(outs, b, "all_gather_coalesced")
    flat = [x.reshape(-1) for x in xs]
    # One allgather_into_tensor_coalesced, then one reduce_scatter_tensor_coalesced.
    _coalesced_like_gloo(dist.all_gather_into_tensor, [torch.zeros(size * x.numel()) for x in flat], flat, h, g)
    ins = [_values(rank, size * SMALL, salt=4), _values(rank, size * LARGE, salt=5)]
    _coalesced_like_gloo(dist.reduce_scatter_tensor, [torch.zeros(SMALL), torch.zeros(LARGE)], ins, h, g)


def _coalesced_like_gloo(op, outs, ins, h, g) -> None:
    """op(out, in) for every pair under one _coalescing_manager with hoplite, one by one with gloo."""
    with dist._coalescing_manager(group=h):
        for o, i in zip(outs, ins):
            op(o, i, group=h)
    for o, i in zip(outs, ins):
        b = torch.zeros_like(o)
        op(b, i, group=g)
        _check(o, b, f"coalesced {op.__name__}")


def broadcast(h, g, rank, world):
    for n in (SMALL, LARGE, CHAINED, 0):
        for src_index in (0, dist.get_world_size(h) - 1):
            src = _global(h, src_index)
            a = _values(rank, n) if rank == src else torch.zeros(n)
            b = a.clone()
            dist.broadcast(a, src, group=h)
            dist.broadcast(b, src, group=g)
            _check(a, b, f"broadcast n={n} src={src}")


def reduce(h, g, rank, world):
    size = dist.get_world_size(h)
    for n in (SMALL, LARGE, CHAINED):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            dst = _global(h, 1 % size)
            a, b = _values(rank, n), _values(rank, n)
            before = a.clone()
            dist.reduce(a, dst, op=op, group=h)
            dist.reduce(b, dst, op=op, group=g)
            if rank == dst:
                _check(a, b, f"reduce {op} n={n}")
            else:
                _check(a, before, f"reduce {op} n={n}: a non-root input changed")


def allgather(h, g, rank, world):
    size = dist.get_world_size(h)
    for n in (SMALL, LARGE, 0):
        x = _values(rank, n)
        a = [torch.zeros(n) for _ in range(size)]
        b = [torch.zeros(n) for _ in range(size)]
        dist.all_gather(a, x, group=h)
        dist.all_gather(b, x, group=g)
        _check(a, b, f"all_gather n={n}")
        a, b = torch.zeros(size * n), torch.zeros(size * n)
        dist.all_gather_into_tensor(a, x, group=h)
        dist.all_gather_into_tensor(b, x, group=g)
        _check(a, b, f"all_gather_into_tensor n={n}")


def gather_scatter(h, g, rank, world):
    size = dist.get_world_size(h)
    root = _global(h, size - 1)
    for n in (SMALL, LARGE):
        x = _values(rank, n)
        a = [torch.zeros(n) for _ in range(size)] if rank == root else None
        b = [torch.zeros(n) for _ in range(size)] if rank == root else None
        dist.gather(x, a, dst=root, group=h)
        dist.gather(x, b, dst=root, group=g)
        if rank == root:
            _check(a, b, f"gather n={n}")
        chunks = [_values(i, n, salt=5) for i in range(size)] if rank == root else None
        a, b = torch.zeros(n), torch.zeros(n)
        dist.scatter(a, chunks, src=root, group=h)
        dist.scatter(b, chunks, src=root, group=g)
        _check(a, b, f"scatter n={n}")


def reduce_scatter(h, g, rank, world):
    size = dist.get_world_size(h)
    for n in (SMALL, LARGE // size):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN):
            inputs = [_values(rank, n, salt=i) for i in range(size)]
            a, b = torch.zeros(n), torch.zeros(n)
            dist.reduce_scatter(a, inputs, op=op, group=h)
            dist.reduce_scatter(b, inputs, op=op, group=g)
            _check(a, b, f"reduce_scatter {op} n={n}")
            flat = torch.cat(inputs)
            kept = flat.clone()
            a, b = torch.zeros(n), torch.zeros(n)
            dist.reduce_scatter_tensor(a, flat, op=op, group=h)
            dist.reduce_scatter_tensor(b, flat.clone(), op=op, group=g)
            _check(a, b, f"reduce_scatter_tensor {op} n={n}")
            _check(flat, kept, "reduce_scatter_tensor changed its input")


def all_to_all(h, g, rank, world):
    size = dist.get_world_size(h)
    me = dist.get_rank(h)
    ranks = [_global(h, i) for i in range(size)]
    # Against the values sent, not gloo: torch 2.11's gloo has no list all_to_all.
    ins = [_values(rank, 1000, salt=j) for j in range(size)]
    a = [torch.zeros(1000) for _ in range(size)]
    dist.all_to_all(a, ins, group=h)
    _check(a, [_values(ranks[j], 1000, salt=me) for j in range(size)], "all_to_all")
    # Uneven sizes (gloo refuses them): group rank i sends (i + j + 1) * 100 elements to j.
    ins = [_values(rank, (me + j + 1) * 100, salt=j) for j in range(size)]
    a = [torch.zeros((j + me + 1) * 100) for j in range(size)]
    dist.all_to_all(a, ins, group=h)
    _check(a, [_values(ranks[j], (j + me + 1) * 100, salt=me) for j in range(size)], "uneven all_to_all")
    x = _values(rank, size * 4000).view(size * 1000, 4)
    a, b = torch.zeros_like(x), torch.zeros_like(x)
    dist.all_to_all_single(a, x, group=h)
    dist.all_to_all_single(b, x, group=g)
    _check(a, b, "all_to_all_single")
    in_splits = [me + j + 1 for j in range(size)]
    out_splits = [j + me + 1 for j in range(size)]
    x = _values(rank, sum(in_splits) * 3).view(-1, 3)
    a, b = torch.zeros(sum(out_splits), 3), torch.zeros(sum(out_splits), 3)
    dist.all_to_all_single(a, x, out_splits, in_splits, group=h)
    dist.all_to_all_single(b, x, out_splits, in_splits, group=g)
    _check(a, b, "all_to_all_single with splits")


def send_recv(h, g, rank, world):
    size = dist.get_world_size(h)
    me = dist.get_rank(h)
    if size == 1:
        return  # nobody to talk to
    right, left = _global(h, (me + 1) % size), _global(h, (me - 1) % size)
    for n in (SMALL, LARGE):
        out = _values(rank, n, salt=3)
        got = torch.zeros(n)
        reqs = [dist.isend(out, right, group=h, tag=5), dist.irecv(got, left, group=h, tag=5)]
        for r in reqs:
            r.wait()
        _check(got, _values(left, n, salt=3), f"isend/irecv n={n}")
    # Same tag, several messages: received in send order.
    if me == 0:
        for i in range(3):
            dist.send(torch.full((10,), float(i)), right, group=h, tag=9)
    elif me == 1:
        for i in range(3):
            t = torch.zeros(10)
            dist.recv(t, left, group=h, tag=9)
            _check(t, torch.full((10,), float(i)), f"in-order recv {i}")


def recv_any_source(h, g, rank, world):
    size = dist.get_world_size(h)
    me = dist.get_rank(h)
    if size == 1:
        return
    root = _global(h, 0)
    if me == 0:
        seen = set()
        for _ in range(size - 1):
            t = torch.zeros(100)
            sender = dist.recv(t, None, group=h, tag=11)
            _check(t, torch.full((100,), float(sender)), f"recv from any source (sender {sender})")
            seen.add(sender)
        others = {_global(h, i) for i in range(1, size)}
        assert seen == others, f"senders {seen}, expected {others}"
    else:
        dist.send(torch.full((100,), float(rank)), root, group=h, tag=11)


def p2p_timeout(h, g, rank, world):
    """A recv that nothing matches fails with the group's timeout, not never."""
    quick = dist.new_group(backend="hoplite", timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        start = time.monotonic()
        work = dist.irecv(torch.zeros(3), 1, group=quick, tag=99)
        _raises(work.wait, dist.DistBackendError, "timed out", "from rank 1")
        took = time.monotonic() - start
        assert 1.5 < took < 6, f"took {took:.1f} s with a 2 s timeout"
    dist.barrier(group=h)  # not `quick`: the others would time out waiting for rank 0


def barrier(h, g, rank, world):
    for _ in range(3):
        dist.barrier(group=h)


def bad_arguments(h, g, rank, world):
    size = dist.get_world_size(h)
    _raises(lambda: dist.all_reduce(torch.zeros(3), op=dist.ReduceOp.BAND, group=h), RuntimeError, "BAND", "float32")
    if size > 1 and dist.get_rank(h) == 0:
        # The other side sends another size: the mismatch is named.
        work = dist.irecv(torch.zeros(5), _global(h, 1), group=h, tag=21)
        _raises(work.wait, RuntimeError, "sent 24 bytes", "expects 20")
    elif size > 1 and dist.get_rank(h) == 1:
        root = _global(h, 0)
        dist.send(torch.zeros(6), root, group=h, tag=21)
    dist.barrier(group=h)


def ddp(h, g, rank, world):
    """20 steps of DDP with each backend from the same start: the parameters
    agree bitwise for 2 ranks (one addition per element: order cannot matter);
    otherwise gloo's and our ring add in different orders, so to float32
    rounding (relative 1e-5)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    results = []
    for group in (h, g):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        net = DDP(model, process_group=group, bucket_cap_mb=0.01)  # several buckets
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(20):
            x = torch.randn(16, 32, generator=gen)
            y = torch.randn(16, 4, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    for i, (a, b) in enumerate(zip(*results)):
        if dist.get_world_size(h) == 2:
            _check(a, b, f"DDP parameter {i}")
        else:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"DDP parameter {i}: max diff {(a - b).abs().max()}"


CASES = [
    allreduce_ops, allreduce_dtypes, allreduce_bitwise, allreduce_avg, allreduce_noncontiguous_async,
    allreduce_coalesced, gathers_and_scatters_coalesced, broadcast, reduce, allgather, gather_scatter,
    reduce_scatter, all_to_all, send_recv, recv_any_source, p2p_timeout, barrier, bad_arguments, ddp,
]
SUBGROUP_CASES = [allreduce_ops, gathers_and_scatters_coalesced, broadcast, reduce, allgather, reduce_scatter,
                  all_to_all, send_recv, recv_any_source, barrier]


def run_rank(rank: int, world: int, port: int, conn) -> None:
    """Runs every case on the whole world and the subgroup of even ranks;
    sends {case: None or error} back."""
    results: dict[str, str | None] = {}
    try:
        dist.init_process_group(
            "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=TIMEOUT
        )
        gloo = dist.new_group(backend="gloo")
        evens = list(range(0, world, 2))
        sub_h = dist.new_group(evens, backend="hoplite")
        sub_g = dist.new_group(evens, backend="gloo")
        for case in CASES:
            results[case.__name__] = _run(case, dist.GroupMember.WORLD, gloo, rank, world)
        for case in SUBGROUP_CASES:
            key = f"subgroup_{case.__name__}"
            results[key] = _run(case, sub_h, sub_g, rank, world) if rank in evens else None
        dist.barrier()
        dist.destroy_process_group()
        torch_hoplite.shutdown()
    except BaseException:
        results["setup"] = traceback.format_exc()
    conn.send(results)


def _run(case, h, g, rank, world):
    try:
        case(h, g, rank, world)
        return None
    except BaseException:
        return traceback.format_exc()


def run_killed_peer(rank: int, world: int, port: int, conn) -> None:
    """Rank world-1 is killed in the middle of large allreduces; the others
    report how their allreduce ended and how long it took."""
    dist.init_process_group(
        "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=10),
    )
    t = torch.ones(4_000_000)
    dist.all_reduce(t)  # everyone is up and connected
    dist.barrier()
    if rank == world - 1:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()
    outcome = "completed"
    try:
        for _ in range(1000):
            dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001  (reported to the test)
        outcome = f"{type(e).__name__}: {e}"
    conn.send((outcome, time.monotonic() - start))
    torch_hoplite.shutdown()
    os._exit(0)  # the process group cannot be destroyed cleanly with a dead member


def run_leave_at_once(rank: int, world: int, port: int, conn) -> None:
    """Large allreduces, then every rank leaves as soon as its own last one
    completed: a rank that finished first must not take with it the last
    pieces the others still receive from it."""
    dist.init_process_group(
        "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    t = torch.full((16 << 20,), float(rank + 1))
    outcome = "completed"
    try:
        for _ in range(3):
            dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001  (reported to the test)
        outcome = f"{type(e).__name__}: {e}"
    dist.destroy_process_group()
    torch_hoplite.shutdown()
    # Checked only now: checking first would give the others time to finish.
    expected = float(sum(range(1, world + 1)) * world**2)  # three sums of sums
    if outcome == "completed" and not torch.equal(t, torch.full_like(t, expected)):
        outcome = f"wrong values: {t.unique().tolist()[:4]}"
    conn.send(outcome)


def run_mismatched(rank: int, world: int, port: int, conn) -> None:
    """Rank 0 calls all_reduce while the others call all_gather_into_tensor
    (both rings, so their messages meet); each reports how its call ended."""
    dist.init_process_group(
        "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=20),
    )
    dist.barrier()
    t = torch.ones(2 * 300_000)
    start = time.monotonic()
    outcome = "completed"
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.all_gather_into_tensor(t, torch.ones(300_000))
    except Exception as e:  # noqa: BLE001  (reported to the test)
        outcome = f"{type(e).__name__}: {e}"
    conn.send((outcome, time.monotonic() - start))
    time.sleep(2)  # leaving at once could fail the other rank's receive before it sees the mismatch itself
    torch_hoplite.shutdown()
    os._exit(0)  # the group's ranks disagree on what ran: no clean teardown


def run_flood(rank: int, world: int, port: int, conn) -> None:
    """Rank 0 sends 32 messages of 1 MiB and one of 16 MiB before rank 1 posts
    any receive; rank 1 then receives them in reverse order. With an 8 MiB
    mailbox, rank 1 may hold at most 8 MiB of them before its receives."""
    os.environ["HOPLITE_MAILBOX_BYTES"] = "8MiB"
    dist.init_process_group(
        "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=TIMEOUT
    )
    small, tags = 1 << 18, list(range(32))  # float32 elements: 1 MiB
    report: dict = {}
    if rank == 0:
        works = [dist.isend(torch.full((small,), float(t)), dst=1, tag=t) for t in tags]
        works.append(dist.isend(torch.full((4 * small * 4,), 100.0), dst=1, tag=100))
        for w in works:
            w.wait()
        report["deferred"] = torch_hoplite.stats()["messages_deferred"]
    else:
        time.sleep(2.0)  # everything rank 0 may send unasked has arrived by now
        report["mailbox_bytes"] = torch_hoplite.stats()["mailbox_bytes"]
        big = torch.empty(4 * small * 4)
        dist.recv(big, src=0, tag=100)
        report["big_ok"] = bool((big == 100.0).all())
        got = torch.empty(small)
        report["small_ok"] = True
        for t in reversed(tags):
            dist.recv(got, src=0, tag=t)
            report["small_ok"] &= bool((got == float(t)).all())
        report["mailbox_after"] = torch_hoplite.stats()["mailbox_bytes"]
    dist.barrier()
    conn.send(report)
    dist.destroy_process_group()
    torch_hoplite.shutdown()


def run_withdrawn_send(rank: int, world: int, port: int, conn) -> None:
    """Rank 0's send of 8 MiB (deferred: its bytes wait for a receive) times out
    before rank 1 posts a receive; rank 1 then receives on that tag and must get
    rank 0's next message, not wait for the abandoned one's bytes."""
    dist.init_process_group(
        "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=TIMEOUT
    )
    quick = dist.new_group(backend="hoplite", timeout=datetime.timedelta(seconds=2))
    n = 2 << 20  # float32 elements: 8 MiB, over the 4 MiB sent ahead of a receive
    report: dict = {}
    if rank == 0:
        try:
            dist.isend(torch.full((n,), 1.0), dst=1, group=quick, tag=7).wait()
            report["first"] = "completed"
        except Exception as e:  # noqa: BLE001  (reported to the test)
            report["first"] = f"{type(e).__name__}: {e}"
        dist.barrier()  # rank 1 posts its receive after this ...
        dist.barrier()  # ... and before this
        dist.send(torch.full((n,), 2.0), dst=1, group=quick, tag=7)
    else:
        dist.barrier()
        got = torch.zeros(n)
        work = dist.irecv(got, src=0, group=quick, tag=7)
        dist.barrier()
        try:
            work.wait()
            report["received"] = sorted(set(got.tolist()))
        except Exception as e:  # noqa: BLE001  (reported to the test)
            report["received"] = f"{type(e).__name__}: {e}"
    dist.barrier()
    conn.send(report)
    dist.destroy_process_group()
    torch_hoplite.shutdown()


def run_abandoned_alltoall(rank: int, world: int, port: int, conn) -> None:
    """Ranks 0 and 1 call all_to_all with 8 MiB blocks (deferred sends), rank 2,
    a second later, a scatter from itself, which only sends. The receives from
    rank 2 meet its scatter message and fail at once (rank 2's sends are
    refused); rank 0's and 1's sends to rank 2, which nobody will ever receive,
    must then be withdrawn by their senders or refused by rank 2 (whose failed
    collective discards what was sent for it), not kept (with their memory)
    until the group's 60 s timeout. Reports how each call ended, the rank's
    withdrawals, the messages it discarded, the bytes of deferred sends it
    still holds and (ranks 0 and 1) the most it held before rank 2 called."""
    dist.init_process_group(
        "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    n = 2 << 20  # float32 elements per block: 8 MiB, over the 4 MiB sent ahead of a receive
    report: dict = {}
    dist.barrier()
    if rank == 2:
        time.sleep(1)  # ranks 0 and 1 have posted their receives and exchanged their blocks
    peak_held = [0]

    def watch_held() -> None:  # while rank 2 sleeps, the block for it waits, deferred
        end = time.monotonic() + 0.9
        while time.monotonic() < end:
            peak_held[0] = max(peak_held[0], torch_hoplite.stats()["messages_deferred_bytes"])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_held, daemon=True)
    if rank != 2:
        watcher.start()
    start = time.monotonic()
    try:
        if rank == 2:
            dist.scatter(torch.zeros(n), [torch.full((n,), 2.0)] * world, src=2)
        else:
            dist.all_to_all_single(torch.zeros(world * n), torch.full((world * n,), float(rank)))
        report["outcome"] = "completed"
    except Exception as e:  # noqa: BLE001  (reported to the test)
        report["outcome"] = f"{type(e).__name__}: {e}"
    report["seconds"] = time.monotonic() - start
    time.sleep(1.0)  # withdrawals and refusals are on their way
    stats = torch_hoplite.stats()
    report["withdrawn"], report["discarded"] = stats["messages_withdrawn"], stats["messages_discarded"]
    report["held"] = stats["messages_deferred_bytes"]
    if rank != 2:
        watcher.join()
    report["peak_held"] = peak_held[0]
    dist.barrier()
    conn.send(report)
    dist.destroy_process_group()
    torch_hoplite.shutdown()


def run_shape_mismatch(rank: int, world: int, port: int, conn) -> None:
    """Ranks allreduce tensors of different shapes; reports how it ended
    (the test runs it with TORCH_DISTRIBUTED_DEBUG=DETAIL)."""
    dist.init_process_group(
        "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=20),
    )
    outcome = "completed"
    try:
        dist.all_reduce(torch.ones(10 + 2 * rank))
    except Exception as e:  # noqa: BLE001  (reported to the test)
        outcome = f"{type(e).__name__}: {e}"
    conn.send(outcome)
    torch_hoplite.shutdown()
    os._exit(0)  # the ranks disagree on what ran: no clean teardown


def _cuda_collectives(rank: int, world: int) -> None:
    """Every collective with CUDA tensors next to the same one with CPU tensors
    (whose answers test_matches_gloo checks against gloo): results on the GPU,
    equal bit for bit."""
    n = LARGE

    def both(fn):
        """fn(device) on cuda then cpu: the first's tensors, brought to the cpu, equal the second's."""
        got, want = fn("cuda"), fn("cpu")
        _check([t.cpu() for t in got], want, fn.__name__)
        assert all(t.is_cuda for t in got), fn.__name__

    def all_reduce(device):
        out = []
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
            t = _values(rank, n).to(device)
            dist.all_reduce(t, op=op)
            out.append(t)
        return out

    def broadcast(device):
        t = _values(rank, n).to(device)
        dist.broadcast(t, src=world - 1)
        return [t]

    def reduce(device):
        t = _values(rank, n).to(device)
        dist.reduce(t, dst=0)
        return [t] if rank == 0 else []

    def gathers(device):
        x = _values(rank, n).to(device)
        listed = [torch.empty(n, device=device) for _ in range(world)]
        dist.all_gather(listed, x)
        flat = torch.empty(n * world, device=device)
        dist.all_gather_into_tensor(flat, x)
        at_root = [torch.empty(n, device=device) for _ in range(world)] if rank == 0 else None
        dist.gather(x, at_root, dst=0)
        return listed + [flat] + (at_root or [])

    def scatters(device):
        x = _values(rank, n * world).to(device)
        mine = torch.empty(n, device=device)
        dist.reduce_scatter_tensor(mine, x)
        listed = torch.empty(n, device=device)
        dist.reduce_scatter(listed, list(x.chunk(world)))
        got = torch.empty(n, device=device)
        dist.scatter(got, list(x.chunk(world)) if rank == 0 else None, src=0)
        return [mine, listed, got]

    def all_to_all(device):
        x = _values(rank, n * world).to(device)
        single = torch.empty_like(x)
        dist.all_to_all_single(single, x)
        listed = [torch.empty(n, device=device) for _ in range(world)]
        dist.all_to_all(listed, list(x.chunk(world)))
        return [single] + listed

    def send_recv(device):
        got = torch.empty(n, device=device)
        right, left = (rank + 1) % world, (rank - 1) % world
        sent = dist.isend(_values(rank, n).to(device), right)
        dist.recv(got, left)
        sent.wait()
        return [got]

    for fn in (all_reduce, broadcast, reduce, gathers, scatters, all_to_all, send_recv):
        both(fn)

    # The input is written on a side stream, which is current when the
    # collective is issued: the collective reads it after that kernel.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.zeros(n, device="cuda")
        torch.cuda._sleep(100_000_000)
        t.fill_(rank + 1.0)
        dist.all_reduce(t)
        total = t.sum()  # on the same stream, after the work
    assert total.item() == n * world * (world + 1) / 2, total.item()

    # An async collective's future, as with NCCL: a then() callback sees the
    # result on the device, ordered after the work on the current stream.
    t = torch.full((n,), rank + 1.0, device="cuda")
    work = dist.all_reduce(t, async_op=True)
    doubled = work.get_future().then(lambda fut: fut.value()[0] * 2).wait()
    assert doubled.is_cuda and doubled.sum().item() == n * world * (world + 1), doubled.sum().item()


def run_cuda_collectives(rank: int, world: int, port: int, conn) -> None:
    """Spawned rank of tests/test_c10d_backend.py's GPU test: None or the failure."""
    try:
        torch.cuda.set_device(0)  # one GPU shared by the ranks
        dist.init_process_group(
            "hoplite", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=TIMEOUT
        )
        _cuda_collectives(rank, world)
        dist.barrier()
        dist.destroy_process_group()
        torch_hoplite.shutdown()
        conn.send(None)
    except BaseException:
        conn.send(traceback.format_exc())


def run_late_messages(rank: int, world: int, port: int, conn) -> None:
    """Rank 0's allreduce gives up after 1 s, before rank 1 has begun it; rank
    1's pieces for it reach rank 0 late, and must be dropped rather than kept
    in rank 0's mailbox for good. The next allreduce is exact. Then the group is
    destroyed and made again over the same store: rank 0's messages for the new
    group arrive before rank 1 has made it, and must wait for it, not be taken
    for the old group's. Reports what rank 0's mailbox held and the sums."""
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=TIMEOUT)

    def group_of_store() -> None:
        dist.init_process_group("hoplite", store=store, rank=rank, world_size=world, timeout=TIMEOUT)

    group_of_store()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    report: dict = {}
    t = torch.full((1 << 20,), float(rank + 1))  # 4 MiB: a ring, whose 2 MiB pieces are sent unasked
    if rank == 1:
        time.sleep(2.5)
    opts = dist.AllreduceOptions()
    opts.timeout = datetime.timedelta(seconds=1 if rank == 0 else 3)
    try:
        backend.allreduce([t], opts).wait()
        report["first"] = "completed"
    except Exception as e:  # noqa: BLE001  (reported to the test)
        report["first"] = f"{type(e).__name__}: {e}"
    dist.barrier()
    if rank == 0:
        # A late piece may still be arriving under load: it must be dropped
        # within a few seconds, not kept for good.
        deadline = time.monotonic() + 5
        stats = torch_hoplite.stats()
        while stats["mailbox_bytes"] and time.monotonic() < deadline:
            time.sleep(0.05)
            stats = torch_hoplite.stats()
        report["mailbox_bytes"], report["discarded"] = stats["mailbox_bytes"], stats["messages_discarded"]
        store.set("late_messages/stats_read", "1")
    else:
        # Rank 1's first piece of the next allreduce would rightly wait in rank
        # 0's mailbox: it starts that allreduce only once rank 0 has looked.
        store.wait(["late_messages/stats_read"])
    t = torch.full((1 << 20,), float(rank + 1))
    dist.all_reduce(t)
    report["sum"] = sorted(set(t.tolist()))
    dist.destroy_process_group()
    if rank == 1:
        time.sleep(1.0)  # rank 0's allreduce of the new group is sent before this rank has the group
    group_of_store()
    t = torch.full((1 << 20,), float(rank + 1))
    dist.all_reduce(t)
    report["sum_again"] = sorted(set(t.tolist()))
    conn.send(report)
    dist.destroy_process_group()
    torch_hoplite.shutdown()


def run_recv_pending_at_destroy(rank: int, world: int, port: int, conn) -> None:
    """Rank 0 waits to receive from rank 1, which sends nothing, and destroys
    the group: the receive fails then, not at the group's 60 s timeout."""
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=TIMEOUT)
    dist.init_process_group("hoplite", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    dist.barrier()
    report: dict = {}
    work = dist.irecv(torch.zeros(10), src=1, tag=5) if rank == 0 else None
    time.sleep(0.5)
    dist.destroy_process_group()
    if work is not None:
        start = time.monotonic()
        try:
            work.wait()
            report["outcome"] = "completed"
        except Exception as e:  # noqa: BLE001  (reported to the test)
            report["outcome"] = f"{type(e).__name__}: {e}"
        report["seconds"] = time.monotonic() - start
        store.set("recv_pending/done", "1")
        store.wait(["recv_pending/seen"])  # this rank hosts the store
    else:
        # Shutting down closes its connections, which would fail rank 0's
        # receive for that reason if it came before rank 0's destroy.
        store.wait(["recv_pending/done"])
        store.set("recv_pending/seen", "1")
    conn.send(report)
    torch_hoplite.shutdown()
