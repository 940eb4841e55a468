"""Collectives built on the object store: streaming reduce, allreduce for a
dynamic group, and gather. Broadcast needs no call of its own: many gets of one
object relay through each other."""

from __future__ import annotations

import dataclasses
import enum
import logging
import uuid
from typing import Iterable, Optional, Sequence, Union

import torch
import torch.distributed as dist

from torch_hoplite import api
from torch_hoplite._tensors import _DTYPES, dtype_name, prepare_for_put
from torch_hoplite.errors import ObjectNotFoundError, error_from_status
from torch_hoplite.object_ref import ObjectId, ObjectRef, id_bytes, id_of

_log = logging.getLogger(__name__)


class ReduceOp(enum.IntEnum):
    """Element-wise reductions. ``torch.distributed.ReduceOp`` values and their
    names (``"sum"``) are accepted wherever one is expected.

    bool tensors: SUM and MAX are logical or, PROD and MIN logical and. AVG
    needs a floating-point or complex dtype; MIN and MAX are not defined for
    complex ones; BAND, BOR and BXOR need an integer or bool dtype."""

    SUM = 0
    PROD = 1
    PRODUCT = 1  # torch.distributed's name
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


def _op_code(op: Union[ReduceOp, str, "dist.ReduceOp.RedOpType"]) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    name = op if isinstance(op, str) else getattr(op, "name", None)
    if isinstance(op, (str, dist.ReduceOp.RedOpType)) and isinstance(name, str):
        try:
            return ReduceOp[name.upper()]
        except KeyError:
            raise ValueError(f"reduce op {op} is not supported; use one of {', '.join(ReduceOp.__members__)}") from None
    raise TypeError(f"reduce op must be a torch_hoplite.ReduceOp, a torch.distributed.ReduceOp or a name, got {op!r}")


@dataclasses.dataclass(frozen=True)
class ReducePlan:
    """What a reduce did: which inputs it used and the tree it built.

    Positions are filled in the order the inputs become ready, except that an
    input held by the calling process takes the root position (the result is
    then computed where it is wanted). ``parents[j]`` is the position that
    position ``j`` streamed its partial result to (-1 for the root).

    If a participant dies before the result is complete, its positions are
    redone with other inputs: :func:`wait_reduce` gives the plan the result was
    finally computed with (``recoveries > 0``, the dead inputs in ``lost``)."""

    inputs: tuple  # the refs (or ids) used, by tree position
    holders: tuple[int, ...]  # rank that computed each position
    lost: tuple  # refs (or ids) dropped because their holder died while in use
    recoveries: int  # times positions were redone after a participant died
    degree: int  # tree degree d (1 = chain)
    depth: int
    root: int
    parents: tuple[int, ...]
    latency_s: float  # link latency the degree was chosen from
    bandwidth_Bps: float  # link bandwidth the degree was chosen from
    link_measured: bool  # False: defaults, no peer could be probed
    plan_s: float  # from the call until every position had started


def reduce(
    refs: Sequence[Union[ObjectRef, ObjectId]],
    op: Union[ReduceOp, str, "dist.ReduceOp.RedOpType"] = ReduceOp.SUM,
    num_objects: Optional[int] = None,
    id: Optional[ObjectId] = None,
    *,
    degree: Optional[int] = None,
    timeout: Optional[float] = None,
    ordered: bool = False,
) -> tuple[ObjectRef, list[Union[ObjectRef, ObjectId]]]:
    """Reduces the first `num_objects` of `refs` to become ready (default: all).

    Inputs may not exist yet: each is placed into a d-ary reduce tree as soon as
    it is put, and every tree node streams its partial result chunk by chunk.
    Returns once the inputs are chosen and the tree is running; the result is
    an object like any other, which others may ``get`` (or reduce further)
    while it is still being computed.

    Args:
        refs: the inputs; all must have the same dtype, shape and device.
        op: the reduction (see :class:`ReduceOp`).
        num_objects: how many inputs to reduce, in [1, len(refs)].
        id: the result's id (default: a fresh unique one).
        degree: tree degree (1 = chain); default chosen by the cost model from
            the measured link latency and bandwidth and the object size.
        timeout: seconds to wait for enough inputs (default ``HOPLITE_TIMEOUT``).
        ordered: ``refs[i]`` takes tree position ``i`` (leaf first: with
            ``degree=1`` the chain runs from ``refs[0]`` to the root ``refs[-1]``)
            instead of the inputs taking positions as they become ready; every
            input is used (`num_objects` must be ``len(refs)``).

    Returns:
        ``(result, unused)``: the result's ref, whose ``reduce_plan`` lists the
        inputs used, and the refs that were left out.

    Raises:
        InvalidArgumentError (a ValueError): the inputs differ in dtype, shape
            or device, or the op is not defined for their dtype; names the objects.
            Gets of the result, on any rank, then fail at once saying why.
        HopliteTimeoutError: fewer than `num_objects` inputs appeared in time.
        ObjectExistsError: `id` names an existing object.
    """
    rt = api._rt()
    refs = list(refs)
    if not refs:
        raise ValueError("reduce needs at least one input")
    count = len(refs) if num_objects is None else num_objects
    if not isinstance(count, int) or not 1 <= count <= len(refs):
        raise ValueError(f"num_objects must be an int in [1, {len(refs)}], got {num_objects!r}")
    if degree is not None and (not isinstance(degree, int) or degree < 1):
        raise ValueError(f"degree must be a positive int, got {degree!r}")
    code = _op_code(op)
    if id is None:
        id = f"reduce-{rt.rank}-{uuid.uuid4().hex}"
    status, message, plan = rt.node.reduce(
        id_bytes(id), [id_bytes(id_of(r)) for r in refs], count, int(code), degree or 0, rt.timeout(timeout), ordered
    )
    if status != 0:
        raise error_from_status(status, message)
    used = set(plan["used"])
    _reduce_inputs[id_bytes(id)] = refs
    while len(_reduce_inputs) > _REDUCE_HISTORY:
        del _reduce_inputs[next(iter(_reduce_inputs))]
    result = ObjectRef(
        id,
        plan["nbytes"],
        _DTYPES[plan["dtype"]],
        tuple(plan["shape"]),
        torch.device("cpu"),
        reduce_plan=_reduce_plan(plan, refs),
    )
    return result, [r for i, r in enumerate(refs) if i not in used]


# The inputs of recent reduces called here, so wait_reduce can name them as given.
_REDUCE_HISTORY = 1024
_reduce_inputs: dict[bytes, list] = {}


def _reduce_plan(plan: dict, refs: Sequence) -> ReducePlan:
    return ReducePlan(
        inputs=tuple(refs[i] for i in plan["used"]),
        holders=tuple(plan["holders"]),
        lost=tuple(refs[i] for i in plan["lost"]),
        recoveries=plan["recoveries"],
        degree=plan["degree"],
        depth=plan["depth"],
        root=plan["root"],
        parents=tuple(plan["parent"]),
        latency_s=plan["latency_s"],
        bandwidth_Bps=plan["bandwidth_Bps"],
        link_measured=plan["link_measured"],
        plan_s=plan["plan_s"],
    )


def wait_reduce(result: Union[ObjectRef, ObjectId], timeout: Optional[float] = None) -> ReducePlan:
    """Waits until the reduce into `result`, called on this process, has
    finished computing it, and returns the plan it ended with.

    That plan differs from ``result.reduce_plan`` when a participant died
    mid-reduce: its positions were then redone with the next ready inputs
    (the result is exactly the reduction of ``inputs``), and readers of the
    result waited for the recomputed bytes. Remembers the last 1024 reduces.

    Raises:
        ObjectNotFoundError: no reduce into `result` was called on this process.
        HopliteTimeoutError: it did not finish within `timeout` seconds.
        The reduce's own error if it failed (e.g. too few inputs survived).
    """
    rt = api._rt()
    key = id_bytes(id_of(result))
    if key not in _reduce_inputs:
        raise ObjectNotFoundError(f"no reduce into {id_of(result)!r} was called on rank {rt.rank} (or too long ago)")
    status, message, plan = rt.node.reduce_outcome(key, rt.timeout(timeout))
    if status != 0:
        raise error_from_status(status, message)
    return _reduce_plan(plan, _reduce_inputs[key])


def allreduce(
    tensor: torch.Tensor,
    id: ObjectId,
    *,
    group: Optional[Iterable[int]] = None,
    op: Union[ReduceOp, str, "dist.ReduceOp.RedOpType"] = ReduceOp.SUM,
    shards: Optional[int] = None,
    degree: Optional[int] = None,
    timeout: Optional[float] = None,
) -> torch.Tensor:
    """Reduces `tensor` over the ranks of `group` (default: all) and returns the
    result, a new tensor, on each of them; every member calls it with the same
    `id`, `group`, tensor size, dtype, `op`, `shards` and `degree`.

    The group is chosen per call, not set up in advance. Members on different
    hosts (or with same-host reads off) run the static algorithms of the
    ``"hoplite"`` c10d backend over the node's messages, in a context of the
    call's own (named by `id`, so calls with different ids never mix): a
    pipelined ring (reduce-scatter, then allgather; 2(N-1)/N of the tensor on
    each link) from 128 KiB, recursive doubling below. A member that calls
    early sends its first pieces at once; the others' nodes keep them until
    they call. A member whose call fails tells the others, which then fail
    soon too instead of at their timeout.

    Members all on one host, or a call with `shards` or `degree`, compose the
    object store instead, whose gets read each other's memory there: the
    tensor is put as `shards` objects (default: one per member, fewer so that
    each has at least 1 MiB), member ``j % len(group)`` reduces piece ``j`` of
    every member with a streaming reduce rooted at itself, and every member
    gets every reduced piece while it is computed. With `degree` 1 (the
    default) each piece's reduce is a chain around the ring of members that
    ends at its root, and its result travels on around the ring; another
    `degree` places reduce trees as inputs become ready and gets through the
    directory's broadcast trees. Its objects (ids starting with `id`) are
    deleted once every member has the result. benchmarks/README.md compares
    the two.

    Raises:
        ValueError: this rank is not in `group`, or an argument is invalid.
        HopliteTimeoutError: a member did not take part within `timeout`
            (default ``HOPLITE_TIMEOUT``); names the member waited for.
        PeerFailedError: a member failed; names it.
        HopliteError: the members disagree on the group or the tensor's size,
            dtype or op (between hosts; on one host they time out).
            After a failure, call again with a new `id`: the failed call's
            messages still on their way are dropped.
    """
    rt = api._rt()
    members = sorted(set(range(rt.world_size) if group is None else group))
    if rt.rank not in members:
        raise ValueError(f"rank {rt.rank} called allreduce {id!r} but is not in its group {members}")
    if members[0] < 0 or members[-1] >= rt.world_size:
        raise ValueError(f"allreduce group {members} has ranks outside [0, {rt.world_size})")
    if shards is not None and (not isinstance(shards, int) or isinstance(shards, bool) or shards < 1):
        raise ValueError(f"shards must be a positive int, got {shards!r}")
    n, me = len(members), members.index(rt.rank)
    flat = prepare_for_put(tensor, "allreduce").view(-1)
    code = _op_code(op)
    if shards is None and degree is None and not rt.on_one_host(members):
        host = flat if flat.device.type == "cpu" else flat.cpu()
        status, message, result = rt.node.allreduce(id_bytes(id), members, host, int(code), rt.timeout(timeout))
        if status != 0:
            raise error_from_status(status, message)
        return result.view(tensor.shape).to(tensor.device)
    if shards is None:  # each member's link then carries 2(N-1)/N of the tensor, not twice it
        shards = max(1, min(n, flat.numel() * flat.element_size() // _MIN_SHARD_BYTES))
    pieces = flat.tensor_split(max(1, min(shards, flat.numel())))
    key = id_bytes(id)
    inputs = [[key + b"/in/%d/%d" % (m, j) for m in range(n)] for j in range(len(pieces))]
    outputs = [key + b"/out/%d" % j for j in range(len(pieces))]
    # No copies of CPU tensors: `tensor` cannot change before this call returns,
    # and by then every piece is consumed and deleted. CUDA pieces are staged
    # into host memory (the reduce runs on the stores' host copies).
    on_cpu = flat.device.type == "cpu"
    for j, piece in enumerate(pieces):
        api.put(piece, inputs[j][me], timeout=timeout, copy=not on_cpu)
    ring = degree in (None, 1)
    for j in range(me, len(pieces), n):
        if ring:  # the chain starts after the root (member j % n == me) and ends at it
            chain = [inputs[j][(me + 1 + i) % n] for i in range(n)]
            reduce(chain, op, id=outputs[j], degree=1, timeout=timeout, ordered=True)
        else:
            reduce(inputs[j], op, id=outputs[j], degree=degree, timeout=timeout)
    # Around the ring, each piece comes from the member before this one (the
    # pieces this member roots are here).
    before = members[(me - 1) % n] if ring else None
    sources = [None if j % n == me else before for j in range(len(pieces))]
    # Each piece lands in the result while it arrives (a copy after the end
    # cost ~15% of the time of an 8-node 256 MB allreduce), in a buffer of the
    # node's pool: a fresh tensor's first-touch page faults cost another ~8%
    # there (benchmarks/README.md).
    if len(pieces) == 1:
        result = api.get(outputs[0], device=flat.device, timeout=timeout, source=sources[0]).wait()
    else:
        result = rt.node.empty(flat.numel(), dtype_name(flat.dtype)) if on_cpu else torch.empty_like(flat)
        futures = [api.get(out, timeout=timeout, out=piece, source=source)
                   for out, piece, source in zip(outputs, result.tensor_split(len(pieces)), sources)]
        torch.futures.wait_all(futures)
    # Every piece is reduced, so every input was consumed.
    rt.delete([inputs[j][me] for j in range(len(pieces))], timeout)
    _release_when_all_done(key, members, me, [outputs[j] for j in range(me, len(pieces), n)], timeout)
    return result.view(tensor.shape)


# Smaller pieces cost more in per-piece round trips than they save in bytes.
_MIN_SHARD_BYTES = 1 << 20


def _release_when_all_done(key: bytes, members: list[int], me: int, owned: list[bytes],
                           timeout: Optional[float]) -> None:
    """Deletes the reduced pieces this member computed once every member has
    them, without waiting here: each member leaves a marker, and deletes its
    own after seeing everyone else's (a marker already deleted counts as seen)."""
    markers = [key + b"/done/%d" % m for m in range(len(members))]
    api.put(torch.zeros((), dtype=torch.uint8), markers[me], timeout=timeout)
    others = [api.get(m, timeout=timeout) for i, m in enumerate(markers) if i != me]
    torch.futures.collect_all(others).then(lambda _: _delete_all([*owned, markers[me]]))


def _delete_all(ids: list[bytes]) -> None:
    """Runs where the last marker's future completes (the node's completion
    thread); a failure only means something was not left to free."""
    try:
        api._rt().delete(ids, None)
    except Exception as e:  # noqa: BLE001
        _log.debug("allreduce cleanup of %r: %s", ids, e)


def gather(refs: Sequence[Union[ObjectRef, ObjectId]], timeout: Optional[float] = None) -> list[torch.Tensor]:
    """Fetches all `refs` concurrently and returns their tensors in order."""
    futures = [api.get(r, timeout=timeout) for r in refs]
    return [f.wait() for f in futures]
