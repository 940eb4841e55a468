"""Streaming reduce, allreduce and gather across 4 real processes. Inputs hold
integer values, so every result is exact whatever the tree's order."""

import functools
import random
import threading
import time
import uuid

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import in_thread
from torch_hoplite import ReduceOp


def uid(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


def ints(seed, n, dtype=torch.float32, low=-50, high=50):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n,), generator=g).to(dtype)


EXPECT = {
    ReduceOp.SUM: lambda a, b: a | b if a.dtype == torch.bool else a + b,
    ReduceOp.PROD: lambda a, b: a & b if a.dtype == torch.bool else a * b,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
    ReduceOp.BAND: torch.bitwise_and,
    ReduceOp.BOR: torch.bitwise_or,
    ReduceOp.BXOR: torch.bitwise_xor,
}


def expected(op, tensors):
    if op == ReduceOp.AVG:
        return functools.reduce(torch.add, tensors) / len(tensors)
    return functools.reduce(EXPECT[op], tensors)


def put_on(cluster, rank, tensor, obj_id):
    return cluster.call(rank, workers.put, tensor, obj_id)


def check_exact(result, inputs_by_id, op=ReduceOp.SUM):
    used = [hop.object_ref.id_of(ref) for ref in result.reduce_plan.inputs]
    out = hop.get(result).wait()
    want = expected(op, [inputs_by_id[i] for i in used])
    assert out.dtype == want.dtype and out.shape == want.shape
    assert torch.equal(out, want), (out, want)
    return used


@pytest.mark.parametrize("count", [8, 4])
def test_reduce_first_k_of_8_puts_in_random_order_with_delays(cluster4, count):
    rng = random.Random(count)
    tag = uid(f"rnd{count}")
    n = (3 << 20) // 4 + 5  # 3 MiB and a bit: many chunks, an odd tail
    inputs = {f"{tag}/{i}": ints(i, n) for i in range(8)}
    ids = list(inputs)
    order = ids[:]
    rng.shuffle(order)
    pending, timers = [], []
    for j, obj_id in enumerate(order):
        rank, delay = j % 4, 0.15 * j + rng.random() * 0.1
        if rank == 0:
            t = threading.Timer(delay, hop.put, (inputs[obj_id], obj_id))
            t.start()
            timers.append(t)
        else:
            pending.append(cluster4.submit(rank, workers.put_after, delay, inputs[obj_id], obj_id))
    result, unused = hop.reduce(ids, num_objects=count, id=tag, timeout=60)
    used = check_exact(result, inputs)
    assert len(used) == count and len(set(used)) == count
    assert sorted(used + [r for r in unused]) == sorted(ids)
    if count == 4:
        # The first four to be put are the ones reduced (puts are 150 ms apart).
        assert set(used) == set(order[:4])
    # The caller (rank 0) holds a used input, which took the root position.
    plan = result.reduce_plan
    assert 0 in plan.holders and plan.holders[plan.root] == 0
    for p in pending:
        p.result()
    for t in timers:
        t.join()
    for obj_id in ids + [tag]:
        hop.delete(obj_id)


DTYPES = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.bool, torch.complex64, torch.complex128,
]


def values_for(dtype, op, seed, n):
    if dtype == torch.bool:
        return ints(seed, n, torch.int64, 0, 2).bool()
    if op == ReduceOp.PROD:  # stays exact (and in range) for three inputs
        low, high = (1, 4) if dtype == torch.uint8 else (-3, 4)
    else:
        low, high = (0, 60) if dtype == torch.uint8 else (-40, 40)
    t = ints(seed, n, torch.int64, low, high)
    if dtype.is_complex:
        return torch.complex(t.double(), t.flip(0).double()).to(dtype)
    return t.to(dtype)


def supported(op, dtype):
    if op == ReduceOp.AVG:
        return dtype.is_floating_point or dtype.is_complex
    if op in (ReduceOp.MIN, ReduceOp.MAX):
        return not dtype.is_complex
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        return not (dtype.is_floating_point or dtype.is_complex)
    return True


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_every_op_and_dtype_is_exact(cluster4, dtype):
    tag = uid(str(dtype).removeprefix("torch."))
    for op in ReduceOp:
        if not supported(op, dtype):
            continue
        for n in (1000, 300_001):  # inline objects, and streamed ones that end mid-chunk
            inputs = {}
            for rank in (1, 2, 3):
                obj_id = f"{tag}/{op.name}/{n}/{rank}"
                inputs[obj_id] = values_for(dtype, op, rank * 7 + n, n)
                put_on(cluster4, rank, inputs[obj_id], obj_id)
            result, unused = hop.reduce(list(inputs), op, id=f"{tag}/{op.name}/{n}")
            assert unused == []
            check_exact(result, inputs, op)
            for obj_id in [*inputs, result.id]:
                hop.delete(obj_id)


@pytest.mark.parametrize(
    "op,dtype,why",
    [
        (ReduceOp.AVG, torch.int32, "AVG needs a floating-point"),
        (ReduceOp.MIN, torch.complex64, "not ordered"),
        (ReduceOp.BXOR, torch.float32, "bitwise ops need an integer"),
        (ReduceOp.SUM, torch.float8_e4m3fn, "float8_e4m3fn"),
    ],
)
def test_op_not_defined_for_the_dtype_is_refused_naming_the_input(cluster4, op, dtype, why):
    a, b = uid("bad-op-a"), uid("bad-op-b")
    put_on(cluster4, 1, torch.zeros(8).to(dtype), a)
    put_on(cluster4, 2, torch.zeros(8).to(dtype), b)
    with pytest.raises(hop.InvalidArgumentError, match=why) as info:
        hop.reduce([a, b], op)
    assert a in str(info.value) or b in str(info.value)


@pytest.mark.parametrize(
    "other",
    [torch.zeros(1000, dtype=torch.int64), torch.zeros(999), torch.zeros(10, 100)],
    ids=["dtype", "size", "shape"],
)
def test_mismatched_inputs_raise_naming_both_objects(cluster4, other):
    a, b = uid("mis-a"), uid("mis-b")
    put_on(cluster4, 1, torch.zeros(1000), a)
    put_on(cluster4, 2, other, b)
    with pytest.raises(hop.InvalidArgumentError, match="inputs differ") as info:
        hop.reduce([a, b], timeout=30)
    assert a in str(info.value) and b in str(info.value)
    # Nothing half-done is left: the inputs are intact, the result id is free.
    assert torch.equal(hop.get(a).wait(), torch.zeros(1000))
    hop.put(torch.ones(1), f"{a}-retry")


def test_a_reduce_that_fails_so_fails_the_gets_of_its_result_until_it_is_put(cluster4):
    """Gets of a result whose reduce failed because its inputs differ fail at
    once with that reason, whether they waited before or came after, until
    the id is registered again: a reduce into it with matching inputs runs,
    and gets read it."""
    tag = uid("failed-result")
    a, b, c, out = f"{tag}/a", f"{tag}/b", f"{tag}/c", f"{tag}/out"
    waiting = cluster4.submit(3, workers.get, out, 60)
    put_on(cluster4, 1, torch.ones(100), a)
    put_on(cluster4, 2, torch.ones(99), b)
    start = time.monotonic()
    with pytest.raises(hop.InvalidArgumentError, match="inputs differ"):
        hop.reduce([a, b], id=out, timeout=60)
    with pytest.raises(hop.InvalidArgumentError,
                       match=rf"object '{out}' was not computed: reduce into '{out}': inputs differ"):
        waiting.result()
    assert time.monotonic() - start < 10
    with pytest.raises(hop.InvalidArgumentError, match=rf"object '{out}' was not computed"):
        cluster4.call(1, workers.get, out, 60)
    put_on(cluster4, 2, torch.full((100,), 2.0), c)
    result, _ = hop.reduce([a, c], id=out, timeout=60)  # returns once the result is registered
    assert torch.equal(hop.get(result, timeout=30).wait(), torch.full((100,), 3.0))
    assert torch.equal(cluster4.call(3, workers.get, out, 60), torch.full((100,), 3.0))


def _wait_for_stat(cluster, rank: int, name: str, failure: str, timeout: float = 30) -> None:
    """Waits until `rank`'s stats()[name] is at least 1."""
    deadline = time.monotonic() + timeout
    while cluster.call(rank, workers.stats)[name] < 1:
        assert time.monotonic() < deadline, failure
        time.sleep(0.05)


def test_a_result_registered_before_its_reduce_failed_is_deleted_saying_why(cluster4):
    """The root task (b's, in the middle of a degree-2 tree of three) has
    registered the result when the last input turns out to differ: the
    coordinator deletes the result (or the root's retract takes it first),
    and gets of it say why either way."""
    tag = uid("failed-late")
    a, b, c, out = f"{tag}/a", f"{tag}/b", f"{tag}/c", f"{tag}/out"
    put_on(cluster4, 1, torch.ones(100), a)
    put_on(cluster4, 2, torch.ones(100), b)
    reducing = in_thread(hop.reduce, [a, b, c], id=out, degree=2, ordered=True, timeout=60)
    _wait_for_stat(cluster4, 2, "reduce_tasks", "the root task was not sent")  # sent once a and b are located
    time.sleep(0.5)  # ... and its registration answered
    put_on(cluster4, 3, torch.ones(99), c)
    with pytest.raises(hop.InvalidArgumentError, match="inputs differ"):
        reducing(30)
    start = time.monotonic()
    with pytest.raises((hop.ObjectDeletedError, hop.InvalidArgumentError),
                       match=rf"object '{out}' was (deleted|not computed): reduce into '{out}': inputs differ"):
        cluster4.call(3, workers.get, out, 60)
    assert time.monotonic() - start < 10


def test_a_get_reading_the_root_when_its_inputs_are_refused_says_why(cluster4):
    """A get of the result already pulling from the root's registered output
    when the last input turns out to differ fails at once, saying why."""
    tag = uid("failed-reading")
    a, b, c, out = f"{tag}/a", f"{tag}/b", f"{tag}/c", f"{tag}/out"
    put_on(cluster4, 1, torch.ones(100), a)
    put_on(cluster4, 2, torch.ones(100), b)
    reducing = in_thread(hop.reduce, [a, b, c], id=out, degree=2, ordered=True, timeout=60)
    _wait_for_stat(cluster4, 2, "reduce_tasks", "the root task was not sent")  # b's, in the middle
    time.sleep(0.5)  # ... and its registration answered
    getting = in_thread(cluster4.call, 3, workers.get, out, 60)
    _wait_for_stat(cluster4, 2, "pulls_served", "the get did not reach the root")  # rank 3 reads the root's output
    put_on(cluster4, 1, torch.ones(99), c)  # (rank 3 is busy with the get)
    with pytest.raises(hop.InvalidArgumentError, match="inputs differ"):
        reducing(30)
    # Not the bare "aborted" (a HopliteError) it was, nor "deleted" (the
    # coordinator's delete of the result could reach the reader first).
    with pytest.raises(hop.InvalidArgumentError, match=rf"reduce into '{out}': inputs differ"):
        getting(30)


def test_a_result_whose_registration_races_the_failure_still_fails_its_gets(cluster4):
    """Every input is put before the reduce: the root's task starts, and its
    registration of the result is on its way, when the coordinator finds the
    last input differs. Gets fail at once whichever reached the shard first."""
    for attempt in range(4):
        tag = uid(f"failed-race{attempt}")
        a, b, c, out = f"{tag}/a", f"{tag}/b", f"{tag}/c", f"{tag}/out"
        put_on(cluster4, 1, torch.ones(100), a)
        put_on(cluster4, 2, torch.ones(100), b)
        put_on(cluster4, 3, torch.ones(99), c)
        with pytest.raises(hop.InvalidArgumentError, match="inputs differ"):
            hop.reduce([a, b, c], id=out, degree=2, ordered=True, timeout=60)
        start = time.monotonic()
        with pytest.raises((hop.ObjectDeletedError, hop.InvalidArgumentError),
                           match=rf"object '{out}' was (deleted|not computed): reduce into '{out}': inputs differ"):
            cluster4.call(3, workers.get, out, 20)
        assert time.monotonic() - start < 10, attempt


def test_an_input_that_is_a_failed_result_is_left_out_like_a_deleted_one(cluster4):
    tag = uid("failed-input")
    a, b, failed = f"{tag}/a", f"{tag}/b", f"{tag}/failed"
    put_on(cluster4, 1, torch.ones(100), a)
    put_on(cluster4, 2, torch.ones(99), b)
    with pytest.raises(hop.InvalidArgumentError):
        hop.reduce([a, b], id=failed, timeout=60)
    c = f"{tag}/c"
    put_on(cluster4, 3, torch.full((100,), 2.0), c)
    start = time.monotonic()
    result, unused = hop.reduce([failed, a, c], id=f"{tag}/two", num_objects=2, timeout=60)
    assert [hop.object_ref.id_of(r) for r in unused] == [failed]
    assert torch.equal(hop.get(result, timeout=30).wait(), torch.full((100,), 3.0))
    with pytest.raises(hop.InvalidArgumentError,
                       match=rf"cannot get 3 inputs: object '{failed}': object '{failed}' was not computed"):
        hop.reduce([failed, a, c], id=f"{tag}/three", timeout=60)
    assert time.monotonic() - start < 10


def test_composed_reduces_stream_into_each_other(cluster4):
    tag = uid("composed")
    n = (8 << 20) // 8
    inputs = {f"{tag}/{i}": ints(100 + i, n, torch.float64) for i in range(6)}
    for i, (obj_id, t) in enumerate(inputs.items()):
        put_on(cluster4, i % 4, t, obj_id)
    ids = list(inputs)
    left, _ = hop.reduce(ids[0:2], id=f"{tag}/left")
    right, _ = hop.reduce(ids[2:5], id=f"{tag}/right")
    # The outer reduce starts while the inner ones may still be computing.
    total, _ = hop.reduce([left, right, ids[5]], id=f"{tag}/total")
    assert torch.equal(hop.get(total).wait(), functools.reduce(torch.add, inputs.values()))
    assert torch.equal(cluster4.call(3, workers.get, total.id), functools.reduce(torch.add, inputs.values()))


def test_result_can_be_awaited_before_the_reduce_and_its_inputs_exist(cluster4):
    tag = uid("early")
    n = (4 << 20) // 4
    getter = cluster4.submit(2, workers.get, f"{tag}/sum", 60)
    inputs = {f"{tag}/{r}": ints(r, n) for r in (0, 1, 3)}
    timer = threading.Timer(0.5, hop.put, (inputs[f"{tag}/0"], f"{tag}/0"))
    timer.start()
    pending = [cluster4.submit(r, workers.put_after, 0.2 * r, inputs[f"{tag}/{r}"], f"{tag}/{r}") for r in (1, 3)]
    result, _ = hop.reduce(list(inputs), id=f"{tag}/sum")
    want = functools.reduce(torch.add, inputs.values())
    assert torch.equal(getter.result(), want)
    assert torch.equal(hop.get(result).wait(), want)
    for p in pending:
        p.result()
    timer.join()


@pytest.mark.parametrize("degree", [1, 2, 3, 7])
def test_forced_degree_builds_that_tree(cluster4, degree):
    tag = uid(f"deg{degree}")
    n = (1 << 20) // 4
    inputs = {f"{tag}/{i}": ints(i, n) for i in range(8)}
    for i, (obj_id, t) in enumerate(inputs.items()):
        put_on(cluster4, i % 4, t, obj_id)
    result, _ = hop.reduce(list(inputs), degree=degree)
    plan = result.reduce_plan
    assert plan.degree == degree
    assert plan.parents.count(-1) == 1 and plan.parents[plan.root] == -1
    children = [plan.parents.count(p) for p in range(8)]
    assert max(children) == degree
    if degree == 1:
        assert list(plan.parents) == [1, 2, 3, 4, 5, 6, 7, -1]
    check_exact(result, inputs)
    # Each input was reduced where it lives.
    assert list(plan.holders) == [int(obj_id.rsplit("/", 1)[1]) % 4 for obj_id in plan.inputs]


def test_ordered_reduce_places_each_input_at_its_position_whatever_the_arrival(cluster4):
    tag = uid("ordered")
    n = (1 << 20) // 4
    ids = [f"{tag}/{i}" for i in range(6)]
    inputs = {obj_id: ints(i, n) for i, obj_id in enumerate(ids)}
    # The last inputs are put first, the first ones only after the reduce started.
    holder = lambda i: 1 + i % 3  # noqa: E731  (ranks 1-3, which can put while this one reduces)
    for i in (5, 4, 3):
        put_on(cluster4, holder(i), inputs[ids[i]], ids[i])
    late = [cluster4.submit(holder(i), workers.put_after, 0.3, inputs[ids[i]], ids[i]) for i in (2, 1, 0)]
    result, unused = hop.reduce(ids, degree=1, ordered=True)
    for p in late:
        p.result()
    plan = result.reduce_plan
    assert unused == [] and list(plan.inputs) == ids
    assert list(plan.parents) == [1, 2, 3, 4, 5, -1] and list(plan.holders) == [holder(i) for i in range(6)]
    check_exact(result, inputs)
    with pytest.raises(ValueError, match="every input"):
        hop.reduce(ids, num_objects=5, ordered=True)


def test_automatic_degree_follows_the_measured_link_and_the_size(cluster4):
    tag = uid("auto")
    plans = {}
    for size in (4 << 10, 32 << 20):
        inputs = {f"{tag}/{size}/{i}": ints(i, size // 4) for i in range(8)}
        for i, (obj_id, t) in enumerate(inputs.items()):
            put_on(cluster4, i % 4, t, obj_id)
        result, _ = hop.reduce(list(inputs))
        check_exact(result, inputs)
        plans[size] = result.reduce_plan
    small, large = plans[4 << 10], plans[32 << 20]
    assert small.link_measured and small.latency_s > 0 and small.bandwidth_Bps > 0
    assert large.degree == 1  # bandwidth-bound: a chain, each node receives one stream
    assert small.degree > 1  # latency-bound: a shallow tree


def test_reduce_of_a_single_input_and_of_empty_tensors(cluster4):
    a = uid("single")
    put_on(cluster4, 3, torch.arange(10.0), a)
    result, _ = hop.reduce([a], ReduceOp.AVG)
    assert torch.equal(hop.get(result).wait(), torch.arange(10.0))
    e1, e2 = uid("empty1"), uid("empty2")
    put_on(cluster4, 1, torch.zeros(0, 3), e1)
    put_on(cluster4, 2, torch.zeros(0, 3), e2)
    result, _ = hop.reduce([e1, e2])
    assert hop.get(result).wait().shape == (0, 3)


def test_timeout_names_the_missing_inputs(cluster4):
    a, missing = uid("present"), uid("missing")
    put_on(cluster4, 1, torch.ones(4), a)
    with pytest.raises(hop.HopliteTimeoutError, match="still missing") as info:
        hop.reduce([a, missing], timeout=1.0)
    assert missing in str(info.value) and a not in str(info.value)
    # 1 of 2 is available at once.
    result, unused = hop.reduce([a, missing], num_objects=1, timeout=5)
    assert [str(u) for u in unused] == [missing]
    assert torch.equal(hop.get(result).wait(), torch.ones(4))


def test_deleted_inputs_make_the_reduce_fail_fast(cluster4):
    a, b = uid("del-a"), uid("del-b")
    put_on(cluster4, 1, torch.ones(4), a)
    put_on(cluster4, 2, torch.ones(4), b)
    hop.delete(b)
    with pytest.raises(hop.ObjectDeletedError, match=b):
        hop.reduce([a, b], timeout=30)


def test_existing_result_id_is_refused_and_can_be_retried(cluster4):
    a, b, taken = uid("ex-a"), uid("ex-b"), uid("taken")
    put_on(cluster4, 1, torch.ones(1 << 16), a)
    put_on(cluster4, 2, torch.ones(1 << 16), b)
    put_on(cluster4, 3, torch.zeros(1), taken)
    with pytest.raises(hop.ObjectExistsError, match=taken):
        hop.reduce([a, b], id=taken)
    result, _ = hop.reduce([a, b], id=f"{taken}-2")
    assert torch.equal(hop.get(result).wait(), torch.full((1 << 16,), 2.0))


@pytest.mark.parametrize(
    "kwargs,error",
    [
        (dict(num_objects=0), ValueError),
        (dict(num_objects=3), ValueError),
        (dict(degree=0), ValueError),
        (dict(op="xor"), ValueError),
        (dict(op=3.5), TypeError),
        (dict(op=torch.distributed.ReduceOp.PREMUL_SUM), ValueError),
    ],
)
def test_bad_arguments(cluster4, kwargs, error):
    with pytest.raises(error):
        hop.reduce(["a", "b"], **kwargs)


def test_reduce_accepts_torch_distributed_ops(cluster4):
    a, b = uid("dist-a"), uid("dist-b")
    put_on(cluster4, 1, torch.tensor([1.0, 5.0]), a)
    put_on(cluster4, 2, torch.tensor([3.0, 2.0]), b)
    result, _ = hop.reduce([a, b], torch.distributed.ReduceOp.MAX)
    assert torch.equal(hop.get(result).wait(), torch.tensor([3.0, 5.0]))


def allreduce_everywhere(cluster, ranks, make, obj_id, **kwargs):
    pending = {r: cluster.submit(r, workers.allreduce, make(r), obj_id, kwargs) for r in ranks if r != 0}
    out = {0: hop.allreduce(make(0), obj_id, **kwargs)} if 0 in ranks else {}
    out.update({r: p.result() for r, p in pending.items()})
    return out


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG])
def test_allreduce_all_ranks(cluster4, op):
    tag = uid("allreduce")
    n = (2 << 20) // 4 + 3
    make = lambda r: ints(r, n, torch.float64)  # noqa: E731
    out = allreduce_everywhere(cluster4, range(4), make, tag, op=op, shards=1 if op == ReduceOp.MAX else 4)
    want = expected(op, [make(r) for r in range(4)])
    for r in range(4):
        assert torch.equal(out[r], want), r
    # Inputs are deleted when it returns; the reduced pieces once everyone has them.
    with pytest.raises(hop.ObjectDeletedError):
        hop.get(f"{tag}/in/0/0", timeout=5).wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            hop.get(f"{tag}/out/0", timeout=1).wait()
        except hop.ObjectDeletedError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the reduced pieces were not deleted")


@pytest.mark.parametrize("shards", [1, 3, 9])
def test_allreduce_shapes_and_shard_counts(cluster4, shards):
    tag = uid(f"shards{shards}")
    make = lambda r: ints(r, 5 * 7, torch.int64).reshape(5, 7).t()  # noqa: E731  (non-contiguous)
    out = allreduce_everywhere(cluster4, range(4), make, tag, shards=shards)
    want = sum(make(r) for r in range(4))
    for r in range(4):
        assert out[r].shape == (7, 5) and torch.equal(out[r], want)
    tiny = allreduce_everywhere(cluster4, range(4), lambda r: torch.tensor([r + 1.0]), f"{tag}-tiny", shards=shards)
    assert all(torch.equal(t, torch.tensor([10.0])) for t in tiny.values())


def test_allreduce_in_a_dynamic_subgroup_while_others_do_something_else(cluster4):
    tag = uid("sub")
    make = lambda r: torch.full((1000,), float(r + 1))  # noqa: E731
    out = allreduce_everywhere(cluster4, [1, 3], make, tag, group=[3, 1])
    assert torch.equal(out[1], torch.full((1000,), 6.0)) and torch.equal(out[3], out[1])
    with pytest.raises(ValueError, match="not in its group"):
        hop.allreduce(torch.ones(1), uid("notmine"), group=[1, 2])


def test_allreduce_on_one_host_composes_the_object_store(cluster4):
    """Processes of one host read each other's memory, so the default takes the
    composition there (test_allreduce.py covers the ring between hosts)."""
    tag = uid("one-host")
    n = (4 << 20) // 8
    before = hop.stats()
    out = allreduce_everywhere(cluster4, range(4), lambda r: ints(r, n, torch.float64), tag)
    after = hop.stats()
    want = expected(ReduceOp.SUM, [ints(r, n, torch.float64) for r in range(4)])
    assert all(torch.equal(out[r], want) for r in range(4))
    assert after["bytes_received_same_host"] > before["bytes_received_same_host"]
    assert after["messages_sent"] == before["messages_sent"]


def test_allreduce_on_one_host_fails_at_once_everywhere_when_a_member_differs(cluster4):
    """The composition's reduce fails on the member that coordinates it, and
    the others' gets of its result hear why instead of waiting out the timeout."""
    tag = uid("one-host-differs")
    pending = {r: cluster4.submit(r, workers.allreduce, torch.ones(100 if r == 2 else 200), tag, {"timeout": 60})
               for r in (1, 2, 3)}
    start = time.monotonic()
    errors = {}
    with pytest.raises(hop.InvalidArgumentError) as info:
        hop.allreduce(torch.ones(200), tag, timeout=60)
    errors[0] = str(info.value)
    for r, p in pending.items():
        with pytest.raises(hop.InvalidArgumentError) as info:
            p.result()
        errors[r] = str(info.value)
    assert time.monotonic() - start < 10, errors
    assert all("inputs differ" in e and "float32[100]" in e and "float32[200]" in e for e in errors.values()), errors


def test_gather_returns_every_tensor_in_order(cluster4):
    tag = uid("gather")
    refs = [put_on(cluster4, r, torch.full((r + 1, 1000), float(r)), f"{tag}/{r}") for r in range(4)]
    out = hop.gather(refs)
    assert [t.shape[0] for t in out] == [1, 2, 3, 4]
    for r, t in enumerate(out):
        assert torch.equal(t, torch.full((r + 1, 1000), float(r)))

