"""The tests' cluster of real local processes (shared with the benchmarks)."""

from torch_hoplite.bench.local_cluster import Cluster, in_thread, shard_of

__all__ = ["Cluster", "in_thread", "shard_of"]
