"""The tests' cluster of real local processes (shared with the benchmarks)."""

import itertools
from typing import Callable

from torch_hoplite.bench.local_cluster import Cluster, in_thread, shard_of

__all__ = ["Cluster", "in_thread", "shard_of", "ids_with_shard"]


def ids_with_shard(prefix: str, count: int, world: int, wanted: Callable[[int], bool]) -> list[str]:
    """The first `count` ids ``<prefix>-<i>`` whose directory shard's rank is `wanted`."""
    ids = (f"{prefix}-{i}" for i in itertools.count())
    return list(itertools.islice((x for x in ids if wanted(shard_of(x, world))), count))
