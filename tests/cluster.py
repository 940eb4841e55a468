"""The tests' cluster of real local processes (shared with the benchmarks)."""

import itertools
import subprocess
from typing import Callable

from torch_hoplite.bench.local_cluster import Cluster, in_thread, shard_of

__all__ = ["Cluster", "in_thread", "shard_of", "ids_with_shard", "communicate_all"]


def ids_with_shard(prefix: str, count: int, world: int, wanted: Callable[[int], bool]) -> list[str]:
    """The first `count` ids ``<prefix>-<i>`` whose directory shard's rank is `wanted`."""
    ids = (f"{prefix}-{i}" for i in itertools.count())
    return list(itertools.islice((x for x in ids if wanted(shard_of(x, world))), count))


def communicate_all(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Waits for every process (all killed if one overruns the timeout) and
    asserts that each exited 0; gives their outputs."""
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(outputs)
    return outputs
