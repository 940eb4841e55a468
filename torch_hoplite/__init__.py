"""torch_hoplite: a distributed object store of tensors with pipelined,
receiver-driven transfers for asynchronous PyTorch programs.

    import torch_hoplite as hop
    hop.init()                       # joins through torchrun's / the process group's store
    ref = hop.put(torch.ones(1024))  # ObjectRef: picklable, cheap to pass around
    t = hop.get(ref).wait()          # from any process
    total, _ = hop.reduce([ref, other])  # streaming reduce; the result is an object too
"""

import torch  # (loads libtorch before the extension)
import torch.distributed.rpc

from torch_hoplite.api import (
    barrier,
    delete,
    get,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    put,
    shutdown,
    stats,
    subscribe,
    transports,
)
from torch_hoplite.collectives import ReduceOp, ReducePlan, allreduce, gather, reduce, wait_reduce
from torch_hoplite.config import Config
from torch_hoplite.errors import (
    CapacityError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    NotInitializedError,
    ObjectDeletedError,
    ObjectExistsError,
    ObjectNotFoundError,
    PeerFailedError,
    ProtocolError,
    StoreLostError,
)
from torch_hoplite.locations import Locations, Subscription
from torch_hoplite.object_ref import ObjectRef
from torch_hoplite.tracing import TraceStep, enable_tracing, trace_events
from torch_hoplite import c10d_backend as _c10d_backend
if torch.distributed.rpc.is_available():
    from torch_hoplite import rpc  # hop.rpc.enable(): large torch.distributed.rpc tensors through the store

_c10d_backend.register()  # dist.init_process_group("hoplite")

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "put", "get", "delete", "barrier", "stats",
    "get_rank", "get_world_size", "transports", "ObjectRef", "Config", "subscribe", "Subscription", "Locations",
    "reduce", "wait_reduce", "allreduce", "gather", "ReduceOp", "ReducePlan", "InvalidArgumentError",
    "HopliteError", "HopliteTimeoutError", "ObjectExistsError", "ObjectNotFoundError",
    "ObjectDeletedError", "PeerFailedError", "CapacityError", "ProtocolError", "NotInitializedError",
    "StoreLostError", "enable_tracing", "trace_events", "TraceStep",
]
