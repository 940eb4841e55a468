"""Large tensors of ``torch.distributed.rpc`` calls through the object store.

    import torch_hoplite as hop
    hop.init(); rpc.init_rpc(name, rank=rank, world_size=world_size)   # one rendezvous (same order on every rank)
    hop.rpc.enable(threshold="1MiB")

From then on, a CPU tensor of at least `threshold` bytes in the arguments or
the result of a Python-function RPC (``rpc_sync``, ``rpc_async``, ``remote``,
``RRef.to_here()``) is not copied into the RPC message: the sender puts it
into the store and the message carries its :class:`~torch_hoplite.ObjectRef`;
the receiver pulls it, pipelined, from the sender or from any receiver that
already has it (a relay). A tensor sent again unchanged is put only once, so a
server that answers N trainers with its weights serves one relay broadcast,
not N copies.

Lifetime of an offloaded object:

- *Identity and version.* The sender keys the object by the tensor's memory
  (storage, offset, shape, strides, dtype) and checks its version counter
  (bumped by every in-place change through autograd's view of the tensor):
  the same memory at the same version is the same object. Writes that bypass
  the counter (``.data``, ``numpy()``, shared memory) are not seen; for
  programs that change tensors so, ``enable(reuse=False)`` puts every send.
  The put copies the tensor (blocking), so the caller may change it as soon
  as the call returns. Parameters (and so modules) are pickled through
  ``detach()``, which shares their version counter, rather than ``.data``,
  which does not: an optimizer's step is seen.
- *Leases.* Every message that carries the ref holds a lease; the receiver
  releases it with a small RPC once its pull is over (also when the pull
  failed). A lease whose release never comes (the receiver died) expires after
  ``lease_s`` (default: torch_hoplite's timeout).
- *Who deletes.* The sender, once no lease is left and the object cannot be
  sent again: the tensor changed, the sender holds its memory no more, or it
  was not sent for ``keep_s`` seconds. The delete removes the receivers'
  copies too. :func:`disable` deletes everything once its leases are
  released (or its timeout passed).
- *When the sender dies.* Its node is gone, and with it the objects it put: a
  pull in progress fails with :class:`~torch_hoplite.PeerFailedError` naming
  it, and the RPC that carried the ref fails with an error that says so, on
  whichever side was receiving. Nothing waits forever.

Builtin operators and TorchScript functions are serialized by RPC's C++ code,
not by its Python pickler, and are left as they are. So are tensors that
require grad (distributed autograd records the tensors of the message), CUDA
tensors (RPC's device maps move them), sparse and quantized tensors,
inference tensors (they have no version counter) and conjugate or negative
views. Sends of different tensors wait for each other's copy into the store.
Deserializing a message whose ref is still being pulled occupies the RPC
thread that deserializes it until the bytes are there; to keep RPC threads
free, pass ObjectRefs yourself and return ``hop.get(ref)`` futures from
``@rpc.functions.async_execution`` functions.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed.rpc as dist_rpc
from torch import nn
from torch.distributed.rpc import internal as rpc_internal

from torch_hoplite import api
from torch_hoplite._tensors import _DTYPES
from torch_hoplite.config import parse_size
from torch_hoplite.errors import HopliteError, NotInitializedError
from torch_hoplite.object_ref import ObjectRef

__all__ = ["enable", "disable", "is_enabled", "offload_stats"]

_SWEEP_INTERVAL_S = 0.5


def enable(
    threshold: Union[int, str] = "1MiB",
    *,
    keep_s: float = 10.0,
    lease_s: Optional[float] = None,
    reuse: bool = True,
) -> None:
    """Sends tensors of at least `threshold` bytes in Python-function RPCs
    through the object store (see the module's documentation).

    Call it, after :func:`torch_hoplite.init`, in the processes whose sends
    should be offloaded; every process that receives offloaded tensors needs
    :func:`torch_hoplite.init` (it pulls them through its own node).

    Args:
        threshold: the smallest tensor offloaded, in bytes (``"1MiB"``, ``65536``).
        keep_s: how long an object stays after its last send while its tensor
            is alive and unchanged, so that the next send reuses it.
        lease_s: how long a sender waits for a receiver to release an object
            before it deletes it anyway (default: torch_hoplite's timeout).
        reuse: send an unchanged tensor as the object already put for it.
            Changes are seen through the tensor's version counter, which
            writes through ``.data``, ``numpy()`` or another process's shared
            memory do not bump: pass ``reuse=False`` if the program changes
            its tensors that way (every send is then a put of its own).
    """
    global _offloader
    if not api.is_initialized():
        raise NotInitializedError("torch_hoplite.rpc.enable: call torch_hoplite.init() first")
    nbytes = parse_size(threshold, "threshold")
    if nbytes < 1:
        raise ValueError(f"torch_hoplite.rpc.enable: threshold must be at least 1 byte, got {threshold!r}")
    if not keep_s >= 0:
        raise ValueError(f"torch_hoplite.rpc.enable: keep_s must be >= 0, got {keep_s!r}")
    if lease_s is None:
        lease_s = api._rt().config.timeout
    if not lease_s > 0:
        raise ValueError(f"torch_hoplite.rpc.enable: lease_s must be > 0, got {lease_s!r}")
    with _lock:
        if _offloader is not None:
            raise RuntimeError("torch_hoplite.rpc offload is already enabled; call disable() first")
        _offloader = _Offloader(nbytes, keep_s, lease_s, reuse)


def disable(timeout: Optional[float] = None) -> None:
    """Stops offloading (new messages carry their tensors again) and deletes
    every offloaded object once its receivers released it, waiting up to
    `timeout` seconds (default: torch_hoplite's timeout) before deleting the
    rest anyway."""
    global _offloader
    offloader = _offloader
    if offloader is None:
        return
    offloader.close(timeout)  # releases still reach it while it waits for them
    with _lock:
        _offloader = None


def is_enabled() -> bool:
    return _offloader is not None


def offload_stats() -> dict[str, int]:
    """Counters of this process's offload: objects put, sends that reused an
    object, pulls done and failed, objects deleted, objects alive, leases
    outstanding and leases that expired."""
    offloader = _offloader
    return offloader.cache.stats() if offloader is not None else {}


# ---------------------------------------------------------------------- receiving


def _receive(owner: str, ref: ObjectRef, lease: int) -> torch.Tensor:
    """Unpickles an offloaded tensor: pulls it, then releases the lease (also
    when the pull failed, so the sender need not wait for the lease to expire)."""
    try:
        if not api.is_initialized():
            raise NotInitializedError(
                f"an RPC message from {owner!r} carries tensor {ref} through torch_hoplite, but this process has not "
                "called torch_hoplite.init(); every process that receives offloaded tensors needs it"
            )
        try:
            tensor = api.get(ref).wait()
        except HopliteError as e:
            _count_pull(failed=True)
            raise type(e)(f"RPC tensor from {owner!r}: {e}") from e
        _count_pull(failed=False)
        return tensor
    finally:
        _release_remotely(owner, ref.id, lease)


def _count_pull(failed: bool) -> None:
    offloader = _offloader
    if offloader is not None:
        offloader.cache.count_pull(failed)


def _release_remotely(owner: str, obj_id: Any, lease: int) -> None:
    try:
        fut = dist_rpc.rpc_async(owner, _release, args=(obj_id, lease))
    except RuntimeError:
        return  # RPC is shutting down; the lease expires instead
    fut.add_done_callback(_consume)


def _consume(fut: torch.futures.Future) -> None:
    try:
        fut.value()
    except Exception:  # the owner died or left: its objects went with it
        pass


def _release(obj_id: Any, lease: int) -> None:
    """Runs on the sender: the receiver that held `lease` on `obj_id` is done with it."""
    offloader = _offloader
    if offloader is not None:
        offloader.cache.release(obj_id, lease)


# ---------------------------------------------------------------------- sending


@dataclasses.dataclass
class _Entry:
    ref: ObjectRef
    key: tuple  # _memory_key of the tensor it was put for
    #: Keeps the tensor's memory, so no other tensor can take its key while the
    #: entry lives; shares the version counter of the tensor it was sent from.
    view: torch.Tensor
    version: int
    last_sent: float
    #: Expiry time of each lease not yet released, by the lease's number.
    leases: dict[int, float] = dataclasses.field(default_factory=dict)
    #: No longer sendable (changed or dropped); deleted once its leases are gone.
    retired: bool = False


class _OffloadCache:
    """Objects put for outgoing tensors, keyed by the tensor's memory."""

    def __init__(self, keep_s: float, lease_s: float, reuse: bool):
        self._reuse = reuse
        self._keep_s = keep_s
        self._lease_s = lease_s
        self._lock = threading.Lock()
        self._by_key: dict[tuple, _Entry] = {}
        self._by_id: dict[Any, _Entry] = {}
        self._leases = itertools.count()
        self._closed = False
        self._counters = dict.fromkeys(
            ("objects_put", "sends_reused", "pulls", "pulls_failed", "objects_deleted", "leases_expired"), 0
        )

    def publish(self, tensor: torch.Tensor) -> Optional[tuple[ObjectRef, int]]:
        """The ref of an object with `tensor`'s bytes and the number of a lease
        taken on it; None once the cache is closed."""
        key = _memory_key(tensor)
        now = time.monotonic()
        # Under the lock: concurrent sends of one tensor put it once (and sends
        # of different tensors wait for each other's copy).
        with self._lock:
            if self._closed:
                return None
            entry = self._by_key.get(key)
            if entry is not None and entry.version == tensor._version and not entry.retired:
                self._counters["sends_reused"] += 1
            else:
                if entry is not None:
                    entry.retired = True
                    del self._by_key[key]
                version = tensor._version  # before the copy: a change during it makes the next send put again
                ref = api.put(tensor, blocking=True)
                entry = _Entry(ref, key, tensor.detach(), version, now, retired=not self._reuse)
                if self._reuse:
                    self._by_key[key] = entry
                self._by_id[ref.id] = entry
                self._counters["objects_put"] += 1
            entry.last_sent = now
            lease = next(self._leases)
            entry.leases[lease] = now + self._lease_s
            return entry.ref, lease

    def release(self, obj_id: Any, lease: int) -> None:
        with self._lock:
            entry = self._by_id.get(obj_id)
            if entry is not None:
                entry.leases.pop(lease, None)

    def count_pull(self, failed: bool) -> None:
        with self._lock:
            self._counters["pulls_failed" if failed else "pulls"] += 1

    def close(self) -> None:
        """No more publishing: sends from now on carry their tensors."""
        with self._lock:
            self._closed = True

    def collect(self, now: float, everything: bool = False) -> list[ObjectRef]:
        """Takes out the entries that are done with: no lease left (expired ones
        dropped) and either retired, dropped by the program, changed or idle
        for keep_s; with `everything`, all of them."""
        done = []
        with self._lock:
            for obj_id, entry in list(self._by_id.items()):
                self._expire(entry, now)
                if entry.leases and not everything:
                    continue
                if (
                    everything
                    or entry.retired
                    or entry.view._version != entry.version
                    or _only_holder(entry.view)
                    or now - entry.last_sent >= self._keep_s
                ):
                    del self._by_id[obj_id]
                    if self._by_key.get(entry.key) is entry:
                        del self._by_key[entry.key]
                    done.append(entry.ref)
        return done

    def _expire(self, entry: _Entry, now: float) -> None:
        for lease, expiry in list(entry.leases.items()):
            if expiry <= now:
                del entry.leases[lease]
                self._counters["leases_expired"] += 1

    def count_deleted(self, n: int) -> None:
        with self._lock:
            self._counters["objects_deleted"] += n

    def pending_leases(self, now: float) -> int:
        """Leases neither released nor expired."""
        with self._lock:
            return sum(1 for e in self._by_id.values() for expiry in e.leases.values() if expiry > now)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(
                self._counters,
                objects_alive=len(self._by_id),
                leases_outstanding=sum(len(e.leases) for e in self._by_id.values()),
            )


def _memory_key(tensor: torch.Tensor) -> tuple:
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def _only_holder(view: torch.Tensor) -> bool:
    """Whether nothing but `view` (and the temporary storage object made here)
    holds its memory, so the program can never send it again."""
    return torch._C._storage_Use_Count(view.untyped_storage()._cdata) <= 2


def _reduce_parameter(param: nn.Parameter):
    """A Parameter pickled as torch does, but through ``detach()`` rather than
    ``.data``: the detached tensor shares the parameter's version counter, so
    an optimizer's in-place step is seen as a change."""
    state = torch._utils._get_obj_state(param)
    if state:
        return torch._utils._rebuild_parameter_with_state, (param.detach(), param.requires_grad, OrderedDict(), state)
    return torch._utils._rebuild_parameter, (param.detach(), param.requires_grad, OrderedDict())


_STORABLE_DTYPES = frozenset(_DTYPES.values())


class _Offloader:
    """Installs the tensor reducer into RPC's pickler and deletes objects that
    are done with on a thread of its own."""

    def __init__(self, threshold: int, keep_s: float, lease_s: float, reuse: bool):
        self.threshold = threshold
        self.cache = _OffloadCache(keep_s, lease_s, reuse)
        self._runtime = api._rt()  # objects belong to this node; after a re-init, sends go plain
        self._owner: Optional[str] = None
        self._stop = threading.Event()
        table = rpc_internal._internal_rpc_pickler._dispatch_table
        self._plain: Callable = table[torch.Tensor]
        self._plain_parameter: Optional[Callable] = table.get(nn.Parameter)
        table[torch.Tensor] = self._reduce
        table[nn.Parameter] = _reduce_parameter
        self._sweeper = threading.Thread(target=self._sweep, name="hoplite-rpc-offload", daemon=True)
        self._sweeper.start()

    def _reduce(self, tensor: torch.Tensor):
        published = self.cache.publish(tensor) if self._offloads(tensor) else None
        if published is None:
            return self._plain(tensor)
        if self._owner is None:
            self._owner = dist_rpc.get_worker_info().name
        ref, lease = published
        return (_receive, (self._owner, ref, lease))

    def _offloads(self, tensor: torch.Tensor) -> bool:
        return (  # the size first: most tensors of most messages are small
            tensor.nbytes >= self.threshold
            and tensor.device.type == "cpu"
            and tensor.layout == torch.strided
            and tensor.dtype in _STORABLE_DTYPES
            and not tensor.requires_grad
            and not tensor.is_inference()  # no version counter
            and not tensor.is_conj()
            and not tensor.is_neg()
            and api._runtime is self._runtime
        )

    def _sweep(self) -> None:
        while not self._stop.wait(_SWEEP_INTERVAL_S):
            self._delete(self.cache.collect(time.monotonic()))

    def _delete(self, refs: list[ObjectRef]) -> None:
        deleted = 0
        for ref in refs:
            if api._runtime is not self._runtime:
                break  # shut down: the node and its objects are gone
            try:
                api.delete(ref)
                deleted += 1
            except (HopliteError, ValueError):
                pass  # already gone: the object's holders shut down
        self.cache.count_deleted(deleted)

    def close(self, timeout: Optional[float]) -> None:
        table = rpc_internal._internal_rpc_pickler._dispatch_table
        if table.get(torch.Tensor) == self._reduce:
            table[torch.Tensor] = self._plain
        if self._plain_parameter is None:
            table.pop(nn.Parameter, None)
        else:
            table[nn.Parameter] = self._plain_parameter
        self.cache.close()
        self._stop.set()
        self._sweeper.join()
        if api._runtime is self._runtime:
            limit = self._runtime.config.timeout if timeout is None else timeout
            deadline = time.monotonic() + limit
            while self.cache.pending_leases(time.monotonic()) and time.monotonic() < deadline:
                time.sleep(0.01)
        self._delete(self.cache.collect(time.monotonic(), everything=True))


_lock = threading.Lock()
_offloader: Optional[_Offloader] = None
