"""put / get / delete across real processes (4 ranks on localhost)."""

import gc
import pickle
import threading
import time
import weakref

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import shard_of

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
]


def sample(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_round_trip_every_dtype_small_and_large(cluster4, dtype):
    for size, tag in [((3, 5), "inline"), ((300_000,), "streamed")]:
        t = sample(dtype, size, seed=7)
        ref = hop.put(t, f"dtype-{dtype}-{tag}")
        assert ref.dtype == dtype and ref.shape == tuple(size)
        got = cluster4.call(1, workers.get, ref, 30)
        assert same_bits(got, t), (dtype, tag)
        # and the other way round: a worker puts, this process gets
        ref2 = cluster4.call(2, workers.put, t, f"dtype-{dtype}-{tag}-back")
        assert same_bits(hop.get(ref2, timeout=30).wait(), t)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.tensor(3.5),  # 0-d
        lambda: torch.empty(0),  # empty
        lambda: torch.empty(4, 0, 3, dtype=torch.int16),  # empty, several dims
        lambda: torch.arange(17, dtype=torch.float64),  # 1-d
        lambda: torch.arange(2 * 3 * 4 * 5, dtype=torch.int32).reshape(2, 3, 4, 5),  # 4-d
        lambda: torch.arange(100_000.0).reshape(400, 250).t(),  # non-contiguous, streamed
        lambda: torch.arange(64.0).reshape(8, 8)[::2, 1::3],  # strided slice
        lambda: torch.arange(6.0).expand(4, 6),  # stride 0
        lambda: torch.randn(4, 4, dtype=torch.complex64).conj(),  # lazy conjugate
    ],
    ids=["0d", "empty", "empty-4x0x3", "1d", "4d", "transposed", "sliced", "expanded", "conj"],
)
def test_round_trip_shapes(cluster4, make):
    t = make()
    ref = hop.put(t)
    got = cluster4.call(3, workers.get, ref, 30)
    assert got.shape == t.shape and got.dtype == t.dtype
    assert got.is_contiguous()
    assert torch.equal(got, t.resolve_conj())


def test_small_object_is_served_inline_by_the_directory(cluster4):
    before = cluster4.call(1, workers.stats)
    ref = hop.put(torch.arange(1000, dtype=torch.int64), "inline-1000")  # 8000 bytes < 64 KiB
    got = cluster4.call(1, workers.get, ref, 30)
    after = cluster4.call(1, workers.stats)
    assert torch.equal(got, torch.arange(1000, dtype=torch.int64))
    assert after["inline_gets"] == before["inline_gets"] + 1
    assert after["bytes_received"] == before["bytes_received"]  # no pull happened


def test_get_started_before_a_256_MiB_put_finished_returns_exact_bytes(cluster4):
    n = (256 << 20) // 4
    relays_before = hop.stats()["relays_served"]
    pending = cluster4.submit(2, workers.get_matches_pattern, "big-early", n, 11, 120)
    time.sleep(0.5)  # the worker's get is now waiting for the object
    ref = hop.put(workers.pattern(n, 11), "big-early")  # returns before its copy is done
    assert ref.nbytes == 256 << 20
    assert pending.result() is True
    # This node served the pull while its own copy was still being written.
    assert hop.stats()["relays_served"] > relays_before
    # another receiver that arrives while the first copy is fresh gets the same bytes
    assert cluster4.call(3, workers.get_matches_pattern, "big-early", n, 11, 120) is True
    hop.delete(ref)


def test_delete_removes_every_copy(cluster4):
    ref = hop.put(torch.arange(200_000, dtype=torch.float32), "to-delete")
    for rank in (1, 2):  # make cached copies elsewhere
        assert cluster4.call(rank, workers.get, ref, 30).shape == (200_000,)
    hop.delete(ref)
    for rank in (0, 1, 2, 3):
        name, message, _ = cluster4.call(rank, workers.get_error, ref, 5)
        assert name == "ObjectDeletedError", (rank, name, message)
        assert "'to-delete'" in message
    with pytest.raises(hop.ObjectDeletedError, match="already deleted"):
        hop.delete(ref)
    with pytest.raises(hop.ObjectNotFoundError, match="'never-existed'"):
        hop.delete("never-existed")


def test_deleted_id_can_be_put_again(cluster4):
    hop.put(torch.ones(3), "reused")
    hop.delete("reused")
    hop.put(torch.zeros(3), "reused")
    assert torch.equal(cluster4.call(1, workers.get, "reused", 10), torch.zeros(3))


def test_put_of_an_existing_id_raises_on_any_rank(cluster4):
    hop.put(torch.ones(4), "taken")
    with pytest.raises(hop.ObjectExistsError, match="'taken'"):
        hop.put(torch.ones(4), "taken")
    name, message = cluster4.call(2, workers.put_error, torch.ones(100_000), "taken")
    assert name == "ObjectExistsError" and "'taken'" in message


def test_get_of_unknown_id_times_out_naming_it_and_its_shard(cluster4):
    shard = shard_of("no-such-object", 4)
    with pytest.raises(TimeoutError, match=f"'no-such-object' timed out after 0.5 s \\(waiting for the object to be "
                                           f"put; directory shard on rank {shard}\\b"):
        hop.get("no-such-object", timeout=0.5).wait()
    name, message, elapsed = cluster4.call(1, workers.get_error, "no-such-object-either", 1.0)
    assert name == "HopliteTimeoutError" and "'no-such-object-either'" in message
    assert 0.9 < elapsed < 5


@pytest.mark.parametrize("read", ["wait", "value", "wait_all", "wait_while_handling_another_error"])
def test_a_failed_get_lets_go_of_its_callers_locals(cluster4, read):
    """The future keeps only the failure's status, and each raise makes a new
    exception: a Python exception kept in the future would, once raised, hold
    the frames of its traceback (and of the error being handled then), and the
    caller's tensors with them, in a cycle the garbage collector cannot see."""
    class Local:
        pass

    def raise_failure(fut: torch.futures.Future) -> None:
        if read == "wait":
            fut.wait()
        elif read == "value":
            deadline = time.monotonic() + 10
            while not fut.done() and time.monotonic() < deadline:
                time.sleep(0.01)
            fut.value()
        elif read == "wait_all":
            torch.futures.wait_all([fut])
        else:
            try:
                raise ValueError("an earlier failure")
            except ValueError:
                fut.wait()

    def failed_get(i: int) -> weakref.ref:
        local = Local()
        with pytest.raises(hop.HopliteTimeoutError, match=f"'never-put-{read}-{i}' timed out"):
            raise_failure(hop.get(f"never-put-{read}-{i}", timeout=0.05))
        return weakref.ref(local)

    locals_ = [failed_get(i) for i in range(5)]
    gc.collect()
    assert [r() for r in locals_] == [None] * 5


def test_get_waits_for_a_later_put(cluster4):
    pending = cluster4.submit(3, workers.get, "later", 30)
    time.sleep(0.3)
    hop.put(torch.full((10,), 4.0), "later")
    assert torch.equal(pending.result(), torch.full((10,), 4.0))


def test_a_waited_get_completes_on_the_waiting_thread_and_every_waiter_gets_it(cluster4):
    # The put comes a second later: every waiting thread is in wait() by then.
    pending = cluster4.submit(2, workers.put_after, 1.0, torch.full((300_000,), 5.0), "waited")
    fut = hop.get("waited", timeout=30)
    completed_on = []
    fut.then(lambda f: completed_on.append(threading.get_ident()))
    others = [None, None]

    def wait_too(i):
        others[i] = fut.wait()

    threads = [threading.Thread(target=wait_too, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    got = fut.wait()
    for t in threads:
        t.join(timeout=30)
    pending.result()
    want = torch.full((300_000,), 5.0)
    assert torch.equal(got, want) and all(torch.equal(o, want) for o in others)
    # The loop handed the outcome to one of the waiting threads, which ran the callback
    # (through the completion thread it would have run there, on a thread Python never started).
    assert len(completed_on) == 1 and completed_on[0] in {threading.get_ident()} | {t.ident for t in threads}
    hop.delete("waited")


def test_four_processes_exchange_with_each_other(cluster4):
    n = 100_000
    pendings = [cluster4.submit(r, workers.exchange, r, 4, n) for r in (1, 2, 3)]
    assert workers.exchange(0, 4, n) is True
    assert [p.result() for p in pendings] == [True, True, True]


def test_futures_compose_with_torch_futures(cluster4):
    inputs = [workers.pattern(50_000, 1000 * i) for i in range(3)]
    refs = [cluster4.call(1, workers.put, t) for t in inputs]
    futs = [hop.get(r, timeout=30) for r in refs]
    doubled = futs[1].then(lambda f: f.value() * 2)
    torch.futures.wait_all(futs)
    assert all(torch.equal(f.value(), t) for f, t in zip(futs, inputs))
    assert torch.equal(doubled.wait(), inputs[1] * 2)
    assert torch.equal(torch.futures.collect_all(futs).wait()[2].value(), inputs[2])


def test_zero_copy_get_returns_the_store_copy(cluster4):
    t = torch.arange(100_000, dtype=torch.int64)
    ref = cluster4.call(2, workers.put, t, "zero-copy")
    a = hop.get(ref, copy=False).wait()
    b = hop.get(ref, copy=False).wait()
    assert torch.equal(a, t)
    assert a.data_ptr() == b.data_ptr()  # both alias the local store copy
    c = hop.get(ref).wait()
    assert c.data_ptr() != a.data_ptr()  # a default get owns its memory


def test_object_ref_is_small_picklable_hashable_printable(cluster4):
    ref = hop.put(torch.zeros(2, 3, dtype=torch.float16), "ref-props")
    clone = pickle.loads(pickle.dumps(ref))
    assert clone == ref and hash(clone) == hash(ref) and {ref: 1}[clone] == 1
    assert len(pickle.dumps(ref)) < 400
    assert "ref-props" in repr(ref) and "float16[2x3]" in repr(ref)
    assert (ref.nbytes, ref.dtype, ref.shape, ref.device) == (12, torch.float16, (2, 3), torch.device("cpu"))
    # refs travel to other processes and resolve there
    assert torch.equal(cluster4.call(1, workers.get, ref, 10), torch.zeros(2, 3, dtype=torch.float16))


def test_bytes_ids_work(cluster4):
    ref = hop.put(torch.ones(5), b"\x00binary\xffid")
    assert torch.equal(cluster4.call(1, workers.get, b"\x00binary\xffid", 10), torch.ones(5))
    hop.delete(ref)


def test_bad_input_raises_clear_errors(cluster4):
    with pytest.raises(TypeError, match="torch.Tensor"):
        hop.put([1, 2, 3])
    with pytest.raises(TypeError, match="dense"):
        hop.put(torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match="empty"):
        hop.put(torch.ones(1), "")
    with pytest.raises(ValueError, match="1024"):
        hop.put(torch.ones(1), "x" * 2000)
    with pytest.raises(TypeError, match="str or bytes"):
        hop.get(123)
    with pytest.raises(ValueError, match="positive"):
        hop.get("x", timeout=0)
    with pytest.raises(ValueError, match="positive"):
        hop.get("x", timeout=float("inf"))
    with pytest.raises(ValueError, match="positive"):
        hop.put(torch.ones(1), "x", timeout=float("nan"))
    with pytest.raises(NotImplementedError, match="CPU"):
        hop.get("x", device="meta")
    with pytest.raises(RuntimeError, match="already initialized"):
        hop.init(rank=0, world_size=1)


def test_zero_copy_put_shares_the_tensor_memory(cluster4):
    t = torch.arange(300_000, dtype=torch.float32)
    ref = hop.put(t, "zero-copy-put", copy=False)
    local = hop.get(ref, copy=False).wait()
    assert local.data_ptr() == t.data_ptr()  # the store's copy is the tensor itself
    assert torch.equal(cluster4.call(2, workers.get, ref, 30), t)
    small = torch.arange(10, dtype=torch.int16)  # inline objects work the same way
    ref_small = hop.put(small, "zero-copy-put-small", copy=False)
    assert torch.equal(cluster4.call(1, workers.get, ref_small, 30), small)
    uses = torch._C._storage_Use_Count(t.untyped_storage()._cdata)
    objects = hop.stats()["store_objects"]
    hop.delete(ref)
    hop.delete(ref_small)
    del local
    assert hop.stats()["store_objects"] == objects - 2
    # The store let go of the tensor's memory.
    assert torch._C._storage_Use_Count(t.untyped_storage()._cdata) < uses


@pytest.mark.parametrize("numel", [256, 64 << 10, 1 << 20], ids=["inline", "copied-in-the-call", "copied-after"])
def test_a_put_lets_go_of_its_source_once_copied(cluster4, numel):
    """Small and mid-sized puts copy in the call and let go of the tensor's
    memory when they return; large ones when their background copy ends."""
    source = torch.full((numel,), 7.0)

    def uses() -> int:
        return torch._C._storage_Use_Count(source.untyped_storage()._cdata)

    before = uses()
    ref = hop.put(source, f"let-go-{numel}")
    if numel * 4 > 1 << 20:  # copied in the background
        deadline = time.monotonic() + 5
        while uses() > before and time.monotonic() < deadline:
            time.sleep(0.01)
    assert uses() == before
    assert torch.equal(cluster4.call(1, workers.get, ref, 10), torch.full((numel,), 7.0))


def test_get_into_out_fills_the_callers_tensor(cluster4):
    t = torch.arange(300_000, dtype=torch.float32)
    remote = cluster4.call(2, workers.put, t, "out-remote")
    buf = torch.full((600, 500), -1.0)  # same elements, another shape: kept
    got = hop.get(remote, out=buf).wait()
    assert got is buf and got.shape == (600, 500)
    assert torch.equal(buf.view(-1), t)
    local = hop.put(t * 2, "out-local")  # a complete local copy: served at once
    assert torch.equal(hop.get(local, out=buf).wait().view(-1), t * 2)
    small = cluster4.call(1, workers.put, torch.arange(6, dtype=torch.int16), "out-inline")
    into = torch.zeros(2, 3, dtype=torch.int16)
    assert torch.equal(hop.get(small, out=into).wait(), torch.arange(6, dtype=torch.int16).view(2, 3))
    # started before the put: filled as the bytes arrive
    later = torch.empty(300_000)
    fut = hop.get("out-later", timeout=30, out=later)
    cluster4.call(3, workers.put, t + 1, "out-later")
    assert fut.wait() is later and torch.equal(later, t + 1)
    empty = cluster4.call(1, workers.put, torch.empty(0, 4), "out-empty")
    assert hop.get(empty, out=torch.empty(0)).wait().numel() == 0


def test_get_into_a_tensor_that_does_not_fit_raises_and_leaves_it_alone(cluster4):
    t = torch.arange(300_000, dtype=torch.float32)
    remote = cluster4.call(2, workers.put, t, "out-misfit")
    local = hop.put(t, "out-misfit-local")
    for ref in (remote, local):
        for wrong in (torch.full((300_000,), 7, dtype=torch.int32),  # same bytes, other dtype
                      torch.full((299_999,), 7.0)):  # fewer elements
            with pytest.raises(hop.InvalidArgumentError, match=f"{ref.id}.*out=.*float32"):
                hop.get(ref, timeout=30, out=wrong).wait()
            assert bool((wrong == 7).all())
    untouched = torch.full((10,), 7.0)
    with pytest.raises(TimeoutError, match="out-never"):
        hop.get("out-never", timeout=0.3, out=untouched).wait()
    assert bool((untouched == 7).all())
    with pytest.raises(TypeError, match="out-misfit.*torch.Tensor"):
        hop.get(remote, out=[0.0])
    with pytest.raises(ValueError, match="contiguous"):
        hop.get(remote, out=torch.empty(600, 1000)[:, ::2])
    with pytest.raises(ValueError, match="copy=False"):
        hop.get(remote, copy=False, out=torch.empty(300_000))
    with pytest.raises(ValueError, match="requires grad"):
        hop.get(remote, out=torch.empty(300_000, requires_grad=True))
