"""The per-process runtime: owns the C++ node and turns its completions into futures."""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Optional

import torch

from torch_hoplite import _C
from torch_hoplite._bootstrap import Rendezvous, advertise_address
from torch_hoplite._tensors import dtype_name, prepare_for_put, ref_from_meta, tensor_from_buffer
from torch_hoplite.config import Config
from torch_hoplite.errors import HopliteError, error_from_status
from torch_hoplite.object_ref import ObjectId, ObjectRef, id_bytes

_KIND_GET = 0
_KIND_PUT_COPIED = 1


class Runtime:
    """One node of the cluster, embedded in this process."""

    def __init__(self, rendezvous: Rendezvous, config: Config):
        self.config = config
        self.rank = rendezvous.rank
        self.world_size = rendezvous.world_size
        self._rendezvous = rendezvous
        host = advertise_address(config.host, config.ifname, rendezvous.store)
        self._node = _C.Node(
            {
                "rank": self.rank,
                "world_size": self.world_size,
                "host": host,
                "port": config.port,
                "cluster_id": rendezvous.cluster_id(),
                "chunk_bytes": config.chunk_bytes,
                "capacity_bytes": config.capacity_bytes,
                "inline_threshold_bytes": config.inline_threshold_bytes,
                "pool_cache_bytes": config.pool_cache_bytes,
                "connect_timeout": config.connect_timeout,
                "copy_threads": config.copy_threads,
                "socket_buffer_bytes": config.socket_buffer_bytes,
            }
        )
        self.address = (self._node.host, self._node.port)
        try:
            for r, (peer_host, peer_port) in rendezvous.exchange_addresses(*self.address).items():
                self._node.add_peer(r, peer_host, peer_port)
        except BaseException:
            self._node.shutdown()
            raise
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._gets: dict[int, tuple[torch.futures.Future, ObjectId]] = {}
        self._puts: dict[int, tuple[torch.Tensor, threading.Event]] = {}
        self._thread = threading.Thread(target=self._complete, name="hoplite-completions", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ operations

    def put(self, tensor: torch.Tensor, obj_id: Optional[ObjectId], timeout: Optional[float], blocking: bool) -> ObjectRef:
        tensor = prepare_for_put(tensor)
        if obj_id is None:
            obj_id = f"{self.rank}-{uuid.uuid4().hex}"
        key = id_bytes(obj_id)
        nbytes = tensor.numel() * tensor.element_size()
        token = next(self._tokens)
        done = threading.Event()
        with self._lock:
            self._puts[token] = (tensor, done)  # keeps the source alive while it is copied
        code, message = self._node.put(
            key,
            dtype_name(tensor.dtype),
            tensor.element_size(),
            list(tensor.shape),
            "cpu",
            tensor.data_ptr() if nbytes else 0,
            nbytes,
            token,
            self._timeout(timeout),
        )
        if code != 0:
            with self._lock:
                self._puts.pop(token, None)
            raise error_from_status(code, message)
        if blocking and not done.wait(self._timeout(timeout)):
            raise error_from_status(5, f"put of object {obj_id!r}: local copy did not finish in time")
        return ObjectRef(obj_id, nbytes, tensor.dtype, tuple(tensor.shape), torch.device("cpu"))

    def get(self, obj_id: ObjectId, timeout: Optional[float], copy: bool) -> torch.futures.Future:
        key = id_bytes(obj_id)
        fut: torch.futures.Future = torch.futures.Future()
        token = next(self._tokens)
        with self._lock:
            self._gets[token] = (fut, obj_id)
        served = self._node.get(key, self._timeout(timeout), copy, token)
        if served is not None:  # a local copy, served at once
            self._handle(*served)
        return fut

    def delete(self, obj_id: ObjectId, timeout: Optional[float]) -> None:
        code, message = self._node.delete(id_bytes(obj_id), self._timeout(timeout))
        if code != 0:
            raise error_from_status(code, message)

    def barrier(self, timeout: Optional[float]) -> None:
        self._rendezvous.barrier(self._timeout(timeout))

    def stats(self) -> dict[str, int]:
        return dict(self._node.stats())

    def shutdown(self) -> None:
        self._node.shutdown()
        self._thread.join()

    # ------------------------------------------------------------------ internals

    def _timeout(self, timeout: Optional[float]) -> float:
        if timeout is None:
            return self.config.timeout
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        return float(timeout)

    def _complete(self) -> None:
        while True:
            batch = self._node.wait_completions(3600.0)
            if batch is None:
                return
            for completion in batch:
                self._handle(*completion)

    def _handle(self, token: int, kind: int, status: tuple[int, str], buffer, meta) -> None:
        code, message = status
        if kind == _KIND_PUT_COPIED:
            with self._lock:
                entry = self._puts.pop(token, None)
            if entry is not None:
                entry[1].set()
            return
        with self._lock:
            fut, obj_id = self._gets.pop(token)
        if code != 0:
            fut.set_exception(error_from_status(code, message))
            return
        try:
            ref = ref_from_meta(obj_id, meta)
            fut.set_result(tensor_from_buffer(buffer, ref.dtype, ref.shape))
        except Exception as e:  # a future must always complete
            fut.set_exception(HopliteError(f"get of object {obj_id!r}: {e}"))
