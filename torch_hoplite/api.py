"""The public functions of torch_hoplite (re-exported by the package)."""

from __future__ import annotations

import atexit
from typing import Optional, Union

import torch
import torch.distributed as dist

from torch_hoplite import _C
from torch_hoplite._bootstrap import Rendezvous, resolve_store
from torch_hoplite._tensors import require_cuda
from torch_hoplite.config import Config
from torch_hoplite.errors import NotInitializedError
from torch_hoplite.locations import Subscription
from torch_hoplite.object_ref import ObjectId, ObjectRef, id_of
from torch_hoplite.runtime import Runtime

_runtime: Optional[Runtime] = None


def init(
    store: Optional[dist.Store] = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    **options,
) -> None:
    """Starts this process's node and joins the cluster.

    Args:
        store: rendezvous store. Default: the default process group's store when
            torch.distributed is initialized, else torch's ``env://`` store from
            MASTER_ADDR, MASTER_PORT, as torchrun sets them: the multi-tenant
            TCPStore that rank 0 hosts (or torchrun's agent store), shared with
            ``rpc.init_rpc`` and ``init_process_group`` whichever comes first.
            With none of these, a one-process cluster (rank 0 of 1), as
            ``ray.init()`` starts one.
        rank, world_size: default to the process group's, or RANK / WORLD_SIZE.
        **options: see :mod:`torch_hoplite.config` (e.g. ``timeout=60``,
            ``capacity_bytes="8GiB"``, ``host="10.0.0.1"``); they override the
            ``HOPLITE_*`` environment variables.

    Returns once every rank has published its address. If the store's host
    goes away meanwhile, raises StoreLostError (a PeerFailedError). With ``rejoin=True``
    (``HOPLITE_REJOIN=1``) the process takes the place of a rank that failed in
    the running cluster: it publishes its new address, introduces itself to
    every peer and returns; objects the failed process held are gone, and it
    may put them again (a reduce waiting for one then uses it).
    """
    global _runtime
    if _runtime is not None:
        raise RuntimeError("torch_hoplite is already initialized in this process; call shutdown() first")
    config = Config.resolve(options)
    store, rank, world_size = resolve_store(store, rank, world_size, config.timeout)
    _runtime = Runtime(Rendezvous(store, rank, world_size, config.timeout, config.rejoin), config)
    atexit.register(shutdown)  # stop the node's threads before the interpreter goes away


def shutdown() -> None:
    """Stops this node. Pending gets fail; objects only this node held become
    unreachable, so call :func:`barrier` first when others may still need them.
    What the node already sent (e.g. its part of a collective that completed
    here) still reaches the peers: it waits up to 2 s for them to take it."""
    global _runtime
    if _runtime is None:
        return
    runtime, _runtime = _runtime, None
    atexit.unregister(shutdown)
    runtime.shutdown()


def is_initialized() -> bool:
    return _runtime is not None


def _rt() -> Runtime:
    if _runtime is None:
        raise NotInitializedError("torch_hoplite is not initialized: call torch_hoplite.init() first")
    return _runtime


def put(
    tensor: torch.Tensor,
    id: Optional[ObjectId] = None,
    *,
    timeout: Optional[float] = None,
    blocking: bool = False,
    copy: bool = True,
) -> ObjectRef:
    """Stores an immutable copy of `tensor` and returns its reference.

    Returns as soon as the object is registered in the directory; its bytes are
    copied into the store in the background and receivers may already stream
    them. As with ``isend``, do not modify `tensor` until the copy is done, or
    pass ``blocking=True`` to return only then.

    ``copy=False`` copies nothing: the store keeps a reference to the tensor's
    memory as the object's primary copy until :func:`delete`. The tensor must
    then not be modified while the object exists (objects are immutable).

    A CUDA tensor is copied chunk by chunk into page-locked store memory on a
    copy stream that first waits for the work queued on the current stream (no
    device-wide synchronization); receivers stream each chunk as soon as it is
    on the host. It needs ``copy=True`` and a build with CUDA.

    Raises:
        ObjectExistsError: `id` already names an object.
        CapacityError: the store has no room.
        TypeError, ValueError, NotImplementedError: the tensor cannot be stored.
    """
    return _rt().put(tensor, id, timeout, blocking, copy)


def get(
    ref: Union[ObjectRef, ObjectId],
    device: Optional[Union[str, torch.device]] = None,
    timeout: Optional[float] = None,
    *,
    copy: bool = True,
    out: Optional[torch.Tensor] = None,
    source: Optional[int] = None,
) -> torch.futures.Future:
    """Fetches an object; the future's ``wait()`` gives the tensor with its
    original dtype and shape, on `device` (default: CPU, wherever it was put from).

    Waits for the object to be put if it does not exist yet, up to `timeout`
    seconds (default ``HOPLITE_TIMEOUT``). ``copy=False`` returns the store's own
    copy without copying it: the tensor must then be treated as read-only.
    ``out=`` receives into the caller's tensor instead (as ``dist.recv`` does):
    a contiguous tensor with the object's dtype and number of elements, which
    keeps its own shape and is what ``wait()`` gives. It is written while the
    bytes arrive and not touched after the future completes, also when it fails.

    ``device="cuda:N"`` (or a CUDA `out`) copies each chunk to the GPU as it
    arrives, on a copy stream of its own that first waits for the work queued
    on the current stream. The future follows CUDA stream semantics: ``wait()``
    makes the waiting thread's current stream wait for the copies, without a
    host-side synchronization, like the futures of ``torch.distributed.rpc``.

    ``source=rank`` asks to pull from that rank, which holds a copy or is
    fetching one (a neighbour in a ring, so that each link carries one flow),
    instead of the holder the directory would choose; it is a hint: a rank
    that gets no copy within 5 s, or fails, is replaced by the directory's choice.

    The future is completed by the thread blocked in its ``wait()`` if there is
    one (the node hands it the outcome; callbacks added with ``then()`` before
    then run there, before ``wait()`` returns), else by the node's completion
    thread, where callbacks must not block on other gets.

    The future fails with HopliteTimeoutError (a TimeoutError),
    ObjectDeletedError, PeerFailedError, CapacityError or InvalidArgumentError
    (`out` does not fit the object); messages name the object and the peer involved.
    """
    target = _target_device(ref, device, out)
    if out is not None:
        _check_out(out, ref, copy)
    if target.type == "cuda" and not copy:
        raise ValueError(f"get of object {id_of(ref)!r} to {target}: copy=False hands out the store's host copy")
    rt = _rt()
    if source is not None and (isinstance(source, bool) or not isinstance(source, int)
                               or not 0 <= source < rt.world_size):
        raise ValueError(f"get of object {id_of(ref)!r}: source must be a rank in [0, {rt.world_size}), got {source!r}")
    return rt.get(id_of(ref), timeout, copy, out, target, source)


def _target_device(
    ref: Union[ObjectRef, ObjectId], device: Optional[Union[str, torch.device]], out: Optional[torch.Tensor]
) -> torch.device:
    """The device a get delivers to: `device`, else `out`'s, else the CPU."""
    what = f"get of object {id_of(ref)!r}"
    target = torch.device(device) if device is not None else None
    if isinstance(out, torch.Tensor):
        if target is not None and target.type == "cuda" and target.index is None and out.device.type == "cuda":
            target = out.device
        if target is not None and target != out.device:
            raise ValueError(f"{what}: out is on {out.device}, not on device={target}")
        target = out.device
    if target is None or target.type == "cpu":
        return torch.device("cpu")
    if target.type != "cuda":
        raise NotImplementedError(f"{what} to {target}: torch_hoplite delivers to CPU and CUDA devices")
    require_cuda(f"{what} to {target}")
    index = torch.cuda.current_device() if target.index is None else target.index
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"{what}: there is no device {target} (this process sees {torch.cuda.device_count()})")
    return torch.device("cuda", index)


def _check_out(out: torch.Tensor, ref: Union[ObjectRef, ObjectId], copy: bool) -> None:
    what = f"get of object {id_of(ref)!r}: out"
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(out).__name__}")
    if not copy:
        raise ValueError(f"{what} and copy=False exclude each other (copy=False hands out the store's copy)")
    if not out.is_contiguous():
        raise ValueError(f"{what} must be contiguous")
    if out.requires_grad:
        raise ValueError(f"{what} requires grad; pass out.detach()")


def delete(ref: Union[ObjectRef, ObjectId], timeout: Optional[float] = None) -> None:
    """Deletes the object and every copy of it; returns once all are gone.

    Raises ObjectNotFoundError for an unknown id, ObjectDeletedError if it was
    deleted already.
    """
    _rt().delete([id_of(ref)], timeout)


def subscribe(ref: Union[ObjectRef, ObjectId]) -> Subscription:
    """Subscribes to where an object is: which ranks hold it, partly or
    completely, and whether it exists, was deleted or was lost. Works before
    the object is put. The directory pushes each change; read them with
    ``sub.next()`` or ``sub.wait_for(predicate)``::

        with hop.subscribe(ref) as sub:
            sub.wait_for(lambda loc: len(loc.complete) >= 4)  # copies on 4 ranks
    """
    return _rt().subscribe(id_of(ref))


def barrier(timeout: Optional[float] = None) -> None:
    """Waits until every rank has called barrier() (through the rendezvous store).

    Rank 0 returns last, once every rank is done with the store, so a store that
    rank 0 hosts may be shut down right after."""
    _rt().barrier(timeout)


def get_rank() -> int:
    return _rt().rank


def get_world_size() -> int:
    return _rt().world_size


def transports() -> list[str]:
    """Names of the transports this build has, for ``init(transport=...)``
    (``HOPLITE_TRANSPORT``); ``"tcp"`` is the default."""
    return list(_C.transports())


def stats() -> dict[str, int]:
    """Counters of this node: bytes moved, pulls served, store usage, ..."""
    return _rt().stats()
