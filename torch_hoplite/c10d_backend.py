"""The ``torch.distributed`` backend ``"hoplite"``.

Importing :mod:`torch_hoplite` registers it for CPU and CUDA devices::

    import torch_hoplite  # noqa: F401
    dist.init_process_group("hoplite")      # or "cpu:hoplite,cuda:nccl"
    dist.all_reduce(t)

The default group starts this process's node (as :func:`torch_hoplite.init`
would, through the group's store) unless it is already running; subgroups
(``dist.new_group``) share it. The node stays up until
:func:`torch_hoplite.shutdown` or the end of the process, so objects put through
the object-store API and collectives of the backend can be mixed freely.

The algorithms are static and bandwidth-optimal (pipelined ring reduce-scatter
+ allgather for large allreduces, recursive doubling for small ones, pipelined
chains for broadcast and reduce, a ring for allgather); see
``docs/architecture.md``. CUDA tensors go through page-locked host copies,
made on the stream that is current when the collective is issued; the work
completes once the results are back on the device.
"""

from __future__ import annotations

import secrets
from typing import Any

import torch.distributed as dist

from torch_hoplite import _C, api

BACKEND_NAME = "hoplite"


def _node_for(opts: Any) -> Any:
    """The running node, started through the group's store for the default group."""
    global_ranks = list(opts.global_ranks_in_group)
    if not api.is_initialized():
        if global_ranks:
            raise RuntimeError(
                "hoplite backend: a subgroup was created before this process joined the cluster; "
                "initialize the default group with backend 'hoplite' or call torch_hoplite.init() first"
            )
        api.init(store=opts.store, rank=opts.group_rank, world_size=opts.group_size)
    runtime = api._rt()
    if not global_ranks and (runtime.rank != opts.group_rank or runtime.world_size != opts.group_size):
        raise RuntimeError(
            f"hoplite backend: the default group has rank {opts.group_rank} of {opts.group_size}, but this "
            f"process's node joined as rank {runtime.rank} of {runtime.world_size}"
        )
    if any(not 0 <= r < runtime.world_size for r in global_ranks):
        raise RuntimeError(f"hoplite backend: group ranks {global_ranks} exceed the cluster of {runtime.world_size}")
    return runtime.node


def _instance_name(opts: Any) -> str:
    """The group's name and a token its members share and no earlier group of
    that name had: a group's messages are its own even when one of the same
    name was destroyed before (its late messages are dropped, see
    TaggedMessenger::discard). Group rank 0 draws the token. Each member
    counts the instances it made with this store (which may be reused), so
    the k-th instance of every member reads the k-th token, however the
    members' creations interleave."""
    store = opts.store
    if store is None:  # torch gives every group one
        return str(opts.group_id)
    generation = store.add(f"hoplite/instances/{opts.group_rank}", 1)
    key = f"hoplite/instance/{generation}"
    if opts.group_rank == 0:
        store.set(key, secrets.token_hex(8))
    return f"{opts.group_id}#{store.get(key).decode()}"


def _create_backend(opts: Any, backend_options: Any = None) -> dist.Backend:
    node = _node_for(opts)
    global_ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    return _C.create_backend(node, _instance_name(opts), opts.group_rank, global_ranks, opts.timeout.total_seconds())


def register() -> None:
    """Registers ``"hoplite"`` with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])
