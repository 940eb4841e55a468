"""How the examples start their ranks: under torchrun (RANK is set) this
process is one rank; otherwise `world` local processes are spawned on a free
port with torchrun's environment (MASTER_ADDR/PORT, RANK, WORLD_SIZE)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

from torch_hoplite.ports import free_port

RankMain = Callable[[int, int, Any], None]


def launch(rank_main: RankMain, world: int, args: Any) -> None:
    """Runs rank_main(rank, world, args) on every rank; raises if a spawned rank fails."""
    if "RANK" in os.environ:
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    port = free_port()
    mp.spawn(_spawned, args=(rank_main, world, port, args), nprocs=world)


def add_tensorpipe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rpc-transports", nargs="+", default=None,
                        help="TensorPipe transports, e.g. uv between network namespaces (default: TensorPipe's)")
    parser.add_argument("--rpc-channels", nargs="+", default=None,
                        help="TensorPipe channels, e.g. basic so that tensors cross the network (default: TensorPipe's)")


def tensorpipe_options(args: argparse.Namespace, timeout: float) -> rpc.TensorPipeRpcBackendOptions:
    return rpc.TensorPipeRpcBackendOptions(rpc_timeout=timeout, _transports=args.rpc_transports,
                                           _channels=args.rpc_channels)


def _spawned(rank: int, rank_main: RankMain, world: int, port: int, args: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    rank_main(rank, world, args)
