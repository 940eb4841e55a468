"""The node gives back the pages glibc's malloc keeps after frees
(store/heap_trimmer.h): a process that frees many large blocks stays flat."""

import ctypes
import os
import platform
import time

import pytest
import torch.distributed as dist

import torch_hoplite as hop
from torch_hoplite import api

# The blocks below come from glibc's heap only under its default settings.
pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc"
    or "LD_PRELOAD" in os.environ
    or any(k.startswith("MALLOC_") for k in os.environ)
    or "malloc" in os.environ.get("GLIBC_TUNABLES", ""),
    reason="needs glibc's malloc with its default settings",
)

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

BLOCK = 100 << 10  # below glibc's mmap threshold: served from the heap
BLOCKS = 2000


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def strand_freed_memory() -> tuple[list[int], float]:
    """Touches 2 * BLOCKS heap blocks and frees every other one: ~200 MiB that
    malloc keeps (each freed block lies between two in use, so it neither
    merges with the heap's top nor is trimmed by free()). Returns the blocks
    still in use, for the caller to free, and the RSS before the frees (a
    trim may come during them)."""
    kept = []
    freed = []
    for _ in range(BLOCKS):
        for blocks in (freed, kept):
            block = libc.malloc(BLOCK)
            libc.memset(block, 1, BLOCK)
            blocks.append(block)
    touched = resident_mib()
    for block in freed:
        libc.free(block)
    return kept, touched


def trimmer_threads() -> int:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return names.count("hoplite-trim")


def trimmed_within(before: float, seconds: float) -> float:
    """How far RSS fell below `before` within `seconds` (polled)."""
    deadline = time.monotonic() + seconds
    fell = 0.0
    while time.monotonic() < deadline and fell < 150:
        time.sleep(0.1)
        fell = before - resident_mib()
    return fell


@pytest.mark.parametrize("interval", [0.2, 0])
def test_memory_freed_by_the_program_is_given_back(interval):
    hop.init(dist.HashStore(), rank=0, world_size=1, timeout=60, heap_trim_interval=interval)
    kept = []
    try:
        kept, touched = strand_freed_memory()
        fell = trimmed_within(touched, 3.0)
        trims = hop.stats()["heap_trims"]
        if interval:
            assert fell >= 150, f"RSS fell {fell:.0f} MiB from {touched:.0f} MiB"
            assert trims >= 1
        else:
            assert fell < 50, f"RSS fell {fell:.0f} MiB from {touched:.0f} MiB without trimming"
            assert trims == 0
    finally:
        for block in kept:
            libc.free(block)
        hop.shutdown()


def test_the_trimmer_stops_at_shutdown_though_the_node_lives_on():
    hop.init(dist.HashStore(), rank=0, world_size=1, timeout=60, heap_trim_interval=0.2)
    node = api._rt().node  # as a c10d backend holds it
    try:
        # The thread names itself once it runs, which on busy cores may be
        # after init returned.
        deadline = time.monotonic() + 10
        while trimmer_threads() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert trimmer_threads() == 1
    finally:  # (left initialized, every later test of this process would fail)
        hop.shutdown()
    assert trimmer_threads() == 0
    del node


@pytest.mark.parametrize("interval", [-1, 0.01])
def test_a_bad_interval_is_refused(interval):
    with pytest.raises(ValueError, match="heap_trim_interval must be 0 .never. or between 0.1 and"):
        hop.init(dist.HashStore(), rank=0, world_size=1, heap_trim_interval=interval)
    assert not hop.is_initialized()
