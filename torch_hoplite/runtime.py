"""The per-process runtime: owns the C++ node, which completes get futures itself."""

from __future__ import annotations

import math
import uuid
from typing import Optional

import torch

from torch_hoplite import _C
from torch_hoplite._bootstrap import Rendezvous, advertise_address
from torch_hoplite._tensors import dtype_name, prepare_for_put
from torch_hoplite.config import MAX_TIMEOUT, Config
from torch_hoplite.errors import error_from_status
from torch_hoplite.locations import Subscription
from torch_hoplite.object_ref import ObjectId, ObjectRef, id_bytes


class _GetFuture(torch.futures.Future):
    """A get's future. Its wait() takes the outcome straight from the node's
    event loop on the waiting thread, a thread hop less than through the node's
    completion thread, which completes it otherwise; callbacks added before
    then run on the waiting thread, before wait() returns."""

    # The loop completes the get by its own timeout; this is only a bound.
    _WAIT_MARGIN_S = 5.0

    def wait(self):
        if not self.done():
            self._waiter.wait(self._token, self._timeout + self._WAIT_MARGIN_S)
        return super().wait()


class Runtime:
    """One node of the cluster, embedded in this process."""

    def __init__(self, rendezvous: Rendezvous, config: Config):
        self.config = config
        self.rank = rendezvous.rank
        self.world_size = rendezvous.world_size
        self._rendezvous = rendezvous
        host = advertise_address(config.host, config.ifname, rendezvous.store)
        self.node = _C.Node(
            {
                "rank": self.rank,
                "world_size": self.world_size,
                "host": host,
                "port": config.port,
                "transport": config.transport,
                "cluster_id": rendezvous.cluster_id(),
                "secret": rendezvous.secret(config.secret),
                "chunk_bytes": config.chunk_bytes,
                "capacity_bytes": config.capacity_bytes,
                "inline_threshold_bytes": config.inline_threshold_bytes,
                "pool_cache_bytes": config.pool_cache_bytes,
                "connect_timeout": config.connect_timeout,
                "heartbeat_interval": config.heartbeat_interval,
                "heartbeat_timeout": config.heartbeat_timeout,
                "copy_threads": config.copy_threads,
                "socket_buffer_bytes": config.socket_buffer_bytes,
                "tcp_congestion": config.tcp_congestion,
                "mailbox_bytes": config.mailbox_bytes,
                "same_host": config.same_host,
                "heap_trim_interval": config.heap_trim_interval,
            }
        )
        self._get_waiter = self.node.get_waiter()  # what get futures wait with, without holding the node
        self.address = (self.node.host, self.node.port)
        # Each rank's host identity as it joined (empty: same-host reads off).
        self.host_identities: list[str] = [""] * self.world_size
        try:
            peers = rendezvous.exchange_addresses(*self.address, self.node.host_identity)
            for r, (peer_host, peer_port, identity) in peers.items():
                self.node.add_peer(r, peer_host, peer_port)
                self.host_identities[r] = identity
            if config.rejoin:
                code, message = self.node.announce(config.connect_timeout)
                if code != 0:
                    raise error_from_status(code, message)
        except BaseException:
            self.node.shutdown()
            raise

    # ------------------------------------------------------------------ operations

    def put(
        self, tensor: torch.Tensor, obj_id: Optional[ObjectId], timeout: Optional[float], blocking: bool, copy: bool
    ) -> ObjectRef:
        tensor = prepare_for_put(tensor)
        if tensor.device.type == "cuda" and not copy:
            raise ValueError("put of a CUDA tensor needs copy=True: the store keeps its objects in host memory")
        if obj_id is None:
            obj_id = f"{self.rank}-{uuid.uuid4().hex}"
        key = id_bytes(obj_id)
        # The node keeps `tensor` alive until its bytes are copied into the store
        # (copy=False: until the object is deleted; its memory is the store's copy).
        code, message = self.node.put(key, dtype_name(tensor.dtype), tensor, self.timeout(timeout), blocking, copy)
        if code != 0:
            raise error_from_status(code, message)
        nbytes = tensor.numel() * tensor.element_size()
        return ObjectRef(obj_id, nbytes, tensor.dtype, tuple(tensor.shape), tensor.device)

    def get(self, obj_id: ObjectId, timeout: Optional[float], copy: bool,
            out: Optional[torch.Tensor] = None, device: Optional[torch.device] = None,
            source: Optional[int] = None) -> torch.futures.Future:
        cuda = device is not None and device.type == "cuda"
        # A CUDA future makes its consumers' streams wait for the copies (c10's
        # Future records an event when it completes and waits on it in wait()).
        fut = _GetFuture(devices=[device] if cuda else None)
        out_dtype = "" if out is None else dtype_name(out.dtype)
        cuda_device = device.index if cuda else -1
        fut._waiter, fut._timeout = self._get_waiter, self.timeout(timeout)
        fut._token = self.node.get(id_bytes(obj_id), fut._timeout, copy, fut, out, out_dtype, cuda_device,
                                   -1 if source is None else source)
        return fut

    def delete(self, obj_ids: list[ObjectId], timeout: Optional[float]) -> None:
        """Deletes them all, the requests at once; raises the first failure."""
        code, message = self.node.delete([id_bytes(i) for i in obj_ids], self.timeout(timeout))
        if code != 0:
            raise error_from_status(code, message)

    def subscribe(self, obj_id: ObjectId) -> Subscription:
        return Subscription(self.node, obj_id, id_bytes(obj_id), self.timeout)

    def barrier(self, timeout: Optional[float]) -> None:
        self._rendezvous.barrier(self.timeout(timeout))

    def stats(self) -> dict[str, int]:
        return dict(self.node.stats())

    def shutdown(self) -> None:
        self.node.shutdown()

    def on_one_host(self, ranks: list[int]) -> bool:
        """Whether `ranks` all read each other's memory (one host, same-host reads on)."""
        mine = self.host_identities[self.rank]
        return bool(mine) and all(self.host_identities[r] == mine for r in ranks)

    # ------------------------------------------------------------------ internals

    def timeout(self, timeout: Optional[float]) -> float:
        """`timeout` checked, or the configured default."""
        if timeout is None:
            return self.config.timeout
        if not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        return min(float(timeout), MAX_TIMEOUT)
