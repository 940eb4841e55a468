"""torch.distributed.rpc with torch_hoplite: one rendezvous, ObjectRefs in RPC
and RRef code, and large RPC tensors offloaded to the store.

The test process is rank w0; ranks w1 and w2 are spawned helpers that serve
RPCs. (The other order of init is tested under torchrun in test_bootstrap.)"""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch
import torch.distributed.rpc as rpc

import rpc_workers as rw
import torch_hoplite as hop
import torch_hoplite.rpc as hop_rpc
from torch_hoplite.ports import free_port
from workers import pattern

WORLD = 3


@pytest.fixture(scope="module")
def world():
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    ctx = mp.get_context("spawn")
    port = free_port()
    helpers = [ctx.Process(target=rw.serve, args=(r, WORLD, port)) for r in range(1, WORLD)]
    for p in helpers:
        p.start()
    try:
        rw.start(0, WORLD, port)
        yield
        rpc.shutdown()
        hop_rpc.disable(timeout=10)
        hop.shutdown()
    finally:
        for p in helpers:
            p.join(30)
            if p.is_alive():
                p.kill()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert [p.exitcode for p in helpers] == [0] * (WORLD - 1)


def expected_sum(n: int, seed: int) -> int:
    return n * seed + n * (n - 1) // 2


# ------------------------------------------------------------------ ObjectRefs through RPC


def test_ref_as_rpc_sync_argument(world):
    ref = hop.put(pattern(300_000, 5), "arg-sync")
    assert rpc.rpc_sync("w1", rw.checksum, args=(ref,)) == expected_sum(300_000, 5)


def test_ref_as_rpc_sync_result(world):
    ref = rpc.rpc_sync("w2", rw.make_object, args=(300_000, 6, "result-sync"))
    assert isinstance(ref, hop.ObjectRef) and ref.id == "result-sync"
    assert torch.equal(hop.get(ref, timeout=30).wait(), pattern(300_000, 6))


def test_ref_through_rpc_async(world):
    ref = rpc.rpc_async("w1", rw.make_object, args=(200_000, 7, "result-async")).wait()
    fut = rpc.rpc_async("w2", rw.checksum, args=(ref,))
    assert fut.wait() == expected_sum(200_000, 7)


def test_ref_held_by_remote_and_to_here(world):
    rref = rpc.remote("w1", rw.make_object, args=(100_000, 8, "result-remote"))
    ref = rref.to_here()
    assert torch.equal(hop.get(ref, timeout=30).wait(), pattern(100_000, 8))
    # The RRef itself travels too: w2 reads the ref out of it and pulls the object.
    assert rpc.rpc_sync("w2", rw.checksum, args=(ref,)) == expected_sum(100_000, 8)


def test_rref_method_returns_and_takes_refs(world):
    holder = rpc.remote("w2", rw.Holder, args=(250_000, 9))
    ref = holder.rpc_async().publish().wait()
    assert torch.equal(hop.get(ref, timeout=30).wait(), pattern(250_000, 9))
    mine = hop.put(pattern(250_000, 10))
    assert holder.rpc_sync().checksum_of(mine) == expected_sum(250_000, 10)


def test_async_execution_returns_the_get_future_without_holding_rpc_threads(world):
    """Eight fetches of objects that do not exist yet wait on w1 while w1 has
    four RPC threads: an RPC thread that waited would leave none for the ping."""
    ids = [f"later-{i}" for i in range(8)]
    futs = [rpc.rpc_async("w1", rw.fetch, args=(obj_id,)) for obj_id in ids[:4]]
    futs += [rpc.rpc_async("w1", rw.fetch_doubled, args=(obj_id,)) for obj_id in ids[4:]]
    assert rpc.rpc_sync("w1", rw.ping, timeout=10) == "pong"
    assert not any(f.done() for f in futs)
    for i, obj_id in enumerate(ids):
        hop.put(pattern(70_000, i), obj_id)
    for i, fut in enumerate(futs):
        factor = 1 if i < 4 else 2
        assert torch.equal(fut.wait(), pattern(70_000, i) * factor)


# ------------------------------------------------------------------ offloaded tensors


def test_large_argument_goes_through_the_store_and_is_deleted(world):
    hop_rpc.disable(timeout=10)
    hop_rpc.enable(rw.THRESHOLD, keep_s=600)  # only the tensor's end can delete it within the test
    try:
        before = hop_rpc.offload_stats()
        result = rpc.rpc_sync("w1", rw.sum_and_size, args=(pattern(1 << 20, 11),))
        assert result == (expected_sum(1 << 20, 11), (1 << 20,), torch.int32)
        after = rw.wait_for_stat("objects_deleted", before["objects_deleted"] + 1)
        assert after["objects_put"] == before["objects_put"] + 1
        assert after["objects_deleted"] == before["objects_deleted"] + 1  # the tensor was a temporary
        assert after["objects_alive"] == 0 and after["leases_outstanding"] == 0
    finally:
        hop_rpc.disable(timeout=10)
        hop_rpc.enable(rw.THRESHOLD, keep_s=rw.KEEP_S)


def test_parameters_are_seen_to_change(world):
    """A module's parameters travel through detach(), whose version counter an
    optimizer's in-place step bumps: the second send carries the new values."""
    lin = torch.nn.Linear(1024, 512)
    with torch.no_grad():
        lin.weight.copy_(pattern(512 * 1024, 1).view(512, 1024).float())
        lin.bias.zero_()
    before = hop_rpc.offload_stats()
    first = rpc.rpc_sync("w1", rw.module_checksum, args=(lin,))
    assert first == expected_sum(512 * 1024, 1)
    with torch.no_grad():
        lin.weight.add_(1)
    assert rpc.rpc_sync("w1", rw.module_checksum, args=(lin,)) == first + 512 * 1024
    assert hop_rpc.offload_stats()["objects_put"] == before["objects_put"] + 2


def test_inference_and_conjugate_tensors(world):
    with torch.inference_mode():
        frozen = pattern(1 << 20, 15)
    assert rpc.rpc_sync("w2", rw.sum_and_size, args=(frozen,))[0] == expected_sum(1 << 20, 15)
    z = torch.complex(pattern(1 << 18, 16).float(), pattern(1 << 18, 17).float())  # 2 MiB
    a, b = rpc.rpc_sync("w2", rw.complex_sums, args=(z, z.conj()))
    assert a == complex(z.sum()) and b == complex(z.conj().sum()) and a != b


def test_small_tensors_builtins_and_grad_tensors_travel_as_before(world):
    before = hop_rpc.offload_stats()
    small = pattern((1 << 18) - 1, 12)  # one element under the threshold
    assert rpc.rpc_sync("w2", rw.sum_and_size, args=(small,))[0] == expected_sum((1 << 18) - 1, 12)
    big = pattern(1 << 20, 13)
    assert torch.equal(rpc.rpc_sync("w2", torch.add, args=(big, 1)), big + 1)  # a builtin operator
    grad = torch.ones(1 << 19, requires_grad=True)
    assert rpc.rpc_sync("w2", rw.sum_and_size, args=(grad.detach().requires_grad_(),))[0] == 1 << 19
    assert hop_rpc.offload_stats()["objects_put"] == before["objects_put"]


def test_unchanged_result_is_put_once_for_many_callers(world):
    before = rpc.rpc_sync("w1", rw.offload_stats)
    n = rw.WEIGHTS.numel()
    base = rpc.rpc_sync("w1", rw.weights_checksum_from, args=("w1",))  # w1 calling itself
    assert base == expected_sum(n, 7)
    for _ in range(3):
        assert int(rpc.rpc_sync("w1", rw.weights).sum(dtype=torch.int64)) == base
    assert rpc.rpc_sync("w2", rw.weights_checksum_from, args=("w1",)) == base
    middle = rpc.rpc_sync("w1", rw.offload_stats)
    assert middle["objects_put"] == before["objects_put"] + 1
    assert middle["sends_reused"] == before["sends_reused"] + 4
    # Changed in place: the next send is a new object, and the old one goes.
    rpc.rpc_sync("w1", rw.bump_weights)
    assert int(rpc.rpc_sync("w1", rw.weights).sum(dtype=torch.int64)) == base + n
    after = rpc.rpc_sync("w1", rw.wait_for_stat, args=("objects_deleted", before["objects_deleted"] + 1))
    assert after["objects_put"] == before["objects_put"] + 2
    assert after["objects_deleted"] == before["objects_deleted"] + 1  # the replaced version
    assert after["objects_alive"] == 1  # the current weights, kept for keep_s
    done = rpc.rpc_sync("w1", rw.wait_for_stat, args=("objects_deleted", before["objects_deleted"] + 2))
    assert done["objects_alive"] == 0  # then gone


def test_without_reuse_every_send_is_a_put_of_its_own(world):
    hop_rpc.disable(timeout=10)
    hop_rpc.enable(rw.THRESHOLD, keep_s=rw.KEEP_S, reuse=False)
    try:
        before = hop_rpc.offload_stats()
        big = pattern(1 << 20, 14)
        for _ in range(2):
            assert rpc.rpc_sync("w2", rw.sum_and_size, args=(big,))[0] == expected_sum(1 << 20, 14)
        after = rw.wait_for_stat("objects_deleted", before["objects_deleted"] + 2)  # once released: `big` lives on
        assert after["objects_put"] == before["objects_put"] + 2 and after["sends_reused"] == before["sends_reused"]
        assert after["objects_deleted"] == before["objects_deleted"] + 2
    finally:
        hop_rpc.disable(timeout=10)
        hop_rpc.enable(rw.THRESHOLD, keep_s=rw.KEEP_S)


def test_enable_checks_its_arguments(world):
    with pytest.raises(RuntimeError, match="already enabled"):
        hop_rpc.enable("1MiB")
    hop_rpc.disable(timeout=10)
    try:
        with pytest.raises(ValueError, match="threshold"):
            hop_rpc.enable(0)
        with pytest.raises(ValueError):
            hop_rpc.enable("lots")
        assert not hop_rpc.is_enabled()
    finally:
        hop_rpc.enable(rw.THRESHOLD, keep_s=rw.KEEP_S)


def test_caller_dying_mid_pull_fails_the_rpc_not_hangs(monkeypatch):
    """w1 sends 256 MiB and dies while w0 pulls it: w0's pull fails, is counted,
    and w0 goes on answering w2."""
    monkeypatch.setenv("HOPLITE_SAME_HOST", "0")  # a pull over TCP, so the sender's death cuts it
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=rw.survivor, args=(0, 3, port, queue)),
        ctx.Process(target=rw.sender_that_dies, args=(1, 3, port, queue)),
        ctx.Process(target=rw.bystander, args=(2, 3, port, queue)),
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive
    # Every process has exited: what they reported is in the pipe (a missing report fails, not hangs).
    reports = dict(queue.get() for _ in procs if not queue.empty())
    assert set(reports) == {"w0", "w1", "w2"}, reports
    assert reports["w1"] >= 1 << 20
    assert reports["w0"]["pulls_failed"] == 1
    assert reports["w2"] == (expected_sum(4 << 20, 3), (4 << 20,), torch.int32)
