"""One rank of the soak run (see soak.py): a seeded random mix of puts, gets,
deletes and first-k reduces, each result checked against the bytes its id
determines, and beside it rounds of c10d collectives among all ranks, checked
exactly; every outcome is written as one JSON line to this rank's log."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import datetime
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
from typing import Any, Callable, Optional

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

import torch_hoplite as hop
import torch_hoplite.api as api
from torch_hoplite import _C

# Element counts of the objects a rank puts (int32: 4 KB to 4 MB); the i-th put
# of a rank has SIZES[i % len(SIZES)] elements, so any reader knows its shape.
SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20)
KEEP = 24  # a rank's deletes take its objects down to its last this many
RECENT = 12  # readers choose among a rank's last puts
WEIGHTS = {"put": 3, "get": 5, "delete": 1, "reduce": 1}
ROUND_SECONDS = 5.0  # c10d rounds begin every this many seconds, at the same times on every rank
ROUND_SHARE = 0.8  # of a round, for its collectives: every rank is done before the next round
ROUND_ELEMENTS = 1 << 18  # float32 per rank: 1 MiB
SLOW_SHARE = 0.9  # an operation that takes this share of its timeout or more logs the node's steps meanwhile
MAX_SLOW_STEPS = 400  # its first and last halves
OWN_STEPS = ("put.", "get.", "reduce.")


def object_id(rank: int, incarnation: int, index: int) -> str:
    return f"soak.{rank}.{incarnation}.{index}"


def contents(obj_id: str, numel: int) -> torch.Tensor:
    """The bytes an id stands for: any reader can check them without asking."""
    seed = sum(obj_id.encode()) * 31 % 997
    return (torch.arange(numel, dtype=torch.int32) * 7 + seed) % 1000


def wrong_bytes(got: torch.Tensor, expected: torch.Tensor) -> int:
    """Bytes of `got` that differ from `expected` (all of them if the shape or dtype differs)."""
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return max(got.numel() * got.element_size(), expected.numel() * expected.element_size())
    return int((got != expected).sum()) * expected.element_size()


class Log:
    """Append-only JSON lines, flushed per line: what was written survives a SIGKILL."""

    def __init__(self, path: str, rank: int, incarnation: int):
        self._file = open(path, "a", buffering=1)
        self._base = {"rank": rank, "inc": incarnation}
        self._lock = threading.Lock()

    def write(self, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), **self._base, **fields})
        with self._lock:
            self._file.write(line + "\n")


class Watchdog:
    """Logs a blocking call that has run past its timeout plus a grace without
    returning (a hang), once, while it is still running; an operation makes
    one or more such calls (begin() before each)."""

    def __init__(self, log: Log, limit: float):
        self._log, self._limit = log, limit
        self._current: Optional[tuple[str, float]] = None
        self._step_start = 0.0
        self._reported = False
        self._lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def step(self, start: float) -> None:
        """A new operation, started at `start` (wall clock: it names the operation in the log)."""
        self._step_start = start

    def begin(self, op: str) -> None:
        with self._lock:
            self._current, self._reported = (op, time.monotonic()), False

    def end(self) -> None:
        with self._lock:
            self._current = None

    def _run(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                if self._current and not self._reported and time.monotonic() - self._current[1] > self._limit:
                    self._reported = True
                    self._log.write(event="hang", op=self._current[0], start=self._step_start,
                                    running_s=time.monotonic() - self._current[1])


_libc = ctypes.CDLL(None, use_errno=True)
_libc.open_memstream.restype = ctypes.c_void_p
_libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
_libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
_libc.fclose.argtypes = [ctypes.c_void_p]
_libc.free.argtypes = [ctypes.c_void_p]


# Freed chunks at least this large are buffers the size of tensors and messages,
# kept in malloc's heaps rather than given back to the kernel.
LARGE_CHUNK = 256 << 10


def malloc_totals() -> tuple[int, int, int]:
    """(bytes in use, bytes freed but kept, of those the bytes in chunks of
    LARGE_CHUNK or more, heaps' tops included) over all of glibc malloc's
    arenas, from malloc_info: what separates a leak from fragmentation, and
    large buffers kept from small holes."""
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    stream = _libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        raise OSError(ctypes.get_errno(), "open_memstream failed")
    _libc.malloc_info(0, stream)
    _libc.fclose(stream)
    xml = ctypes.string_at(buf, size.value).decode()
    _libc.free(buf)

    def total(pattern: str) -> int:  # the last match: the totals over all arenas follow the arenas
        return int(re.findall(pattern, xml)[-1])

    free = total(r'<total type="fast" count="\d+" size="(\d+)"') + total(r'<total type="rest" count="\d+" size="(\d+)"')
    held = total(r'<system type="current" size="(\d+)"') + total(r'<total type="mmap" count="\d+" size="(\d+)"')
    # Each heap's top chunk counts as free but is not listed by size: it is in the large part.
    small = sum(int(t) for start, t in re.findall(r'<(?:size|unsorted) from="(\d+)" to="\d+" total="(\d+)"', xml)
                if int(start) < LARGE_CHUNK)
    return held - free, free, free - small


def sample_resources(log: Log, period: float, breakdown_every: int = 10) -> None:
    """RSS, open fds, what the store holds and has evicted, and how many
    shares of the directory this rank takes for moved, every `period`
    seconds; every `breakdown_every` samples also malloc's totals (glibc's;
    left out where it fails) and Python's allocated blocks. RSS less `shared`
    (file-backed pages) less `pool` (what the store's pool holds now) is the
    anonymous memory outside the pool; `malloc_used` includes the pool's
    buffers below 256 KiB."""
    def run():
        count = 0
        # With another allocator preloaded (jemalloc, tcmalloc), glibc's arenas hold nothing worth reporting.
        glibc_totals = "malloc" not in os.environ.get("LD_PRELOAD", "")
        while hop.is_initialized():
            with open("/proc/self/statm") as f:
                pages = [int(x) * os.sysconf("SC_PAGE_SIZE") for x in f.read().split()]
            stats = hop.stats()
            extra = {}
            if count % breakdown_every == 0:
                if glibc_totals:
                    try:
                        extra["malloc_used"], extra["malloc_free"], extra["malloc_free_large"] = malloc_totals()
                    except (OSError, IndexError, ValueError) as e:
                        glibc_totals = False
                        log.write(event="note", text=f"no malloc totals: {e!r}")
                extra["py_blocks"] = sys.getallocatedblocks()
            log.write(event="sample", rss=pages[1], shared=pages[2], fds=len(os.listdir("/proc/self/fd")),
                      store=stats["store_used_bytes"], objects=stats["store_objects"],
                      mapped=stats["pool_mapped_bytes"], pool=stats["pool_held_bytes"], evictions=stats["evictions"],
                      heap_trims=stats["heap_trims"], heap_trim_us=stats["heap_trim_us"],
                      shards_moved=stats["shards_moved"],
                      directory=[stats[k] for k in ("directory_entries", "directory_inline_bytes", "directory_gone",
                                                    "directory_standby", "directory_watches")], **extra)
            count += 1
            time.sleep(period)

    threading.Thread(target=run, daemon=True).start()


class Workload:
    def __init__(self, rank: int, incarnation: int, world: int, store: dist.Store, rng: random.Random,
                 log: Log, timeout: float, grace: float):
        self.rank, self.incarnation, self.world = rank, incarnation, world
        self.store, self.rng, self.log = store, rng, log
        self.timeout, self.grace = timeout, grace
        self.puts = 0
        self.reduces = 0
        self.mine: collections.deque[str] = collections.deque()
        self.failed_puts: collections.deque[int] = collections.deque(maxlen=RECENT)
        self.objects: list[str] = []  # what the current operation touches, for the report
        self.result = ""  # the current reduce's result
        self.calls: list[tuple[str, float]] = []  # the current operation's blocking calls: (what, began)
        self.watchdog = Watchdog(log, timeout + grace)
        hop.enable_tracing()  # an operation that runs slow logs the node's steps meanwhile

    # ---- what other ranks have put: "incarnation.index" of their last put,
    # then ":" and the indices among the recent ones whose put failed
    def publish(self) -> None:
        failed = ",".join(str(i) for i in self.failed_puts if i > self.puts - RECENT)
        self.store.set(f"soak/last/{self.rank}", f"{self.incarnation}.{self.puts}:{failed}")

    def last_of(self, rank: int) -> Optional[tuple[int, int, set[int]]]:
        key = f"soak/last/{rank}"
        if not self.store.check([key]):
            return None
        last, failed = self.store.get(key).decode().split(":")
        incarnation, index = last.split(".")
        return int(incarnation), int(index), {int(i) for i in failed.split(",") if i}

    def recent_id(self, rank: int, size_class: Optional[int] = None) -> Optional[tuple[str, int]]:
        last = self.last_of(rank)
        if last is None or last[1] < 1:
            return None
        incarnation, top, failed = last
        candidates = [i for i in range(max(1, top - RECENT + 1), top + 1)
                      if (size_class is None or i % len(SIZES) == size_class) and i not in failed]
        if not candidates:
            return None
        index = self.rng.choice(candidates)
        return object_id(rank, incarnation, index), SIZES[index % len(SIZES)]

    # ---- operations: each returns the wrong bytes it saw, and sets self.objects
    def op_put(self) -> int:
        self.puts += 1
        obj = object_id(self.rank, self.incarnation, self.puts)
        self.objects = [obj]
        self.call("put")
        try:
            hop.put(contents(obj, SIZES[self.puts % len(SIZES)]), obj, timeout=self.timeout)
        except Exception:
            self.failed_puts.append(self.puts)  # readers skip it (published with the next put)
            raise
        self.mine.append(obj)
        self.publish()
        return 0

    def op_get(self) -> int:
        found = self.recent_id(self.rng.randrange(self.world))
        if found is None:
            return 0
        obj, numel = found
        self.objects = [obj]
        self.call("get")
        got = hop.get(obj, timeout=self.timeout).wait()
        return wrong_bytes(got, contents(obj, numel))

    def op_delete(self) -> int:
        while len(self.mine) > KEEP:
            self.objects.append(self.mine[0])
            self.call("delete")
            hop.delete(self.mine.popleft(), timeout=self.timeout)
        return 0

    def delete_predecessors_objects(self) -> None:
        """A restarted rank deletes what its previous process left undeleted
        (its last puts, copied by readers), as a restarted worker cleans up
        after a crash; else those copies fill the stores for good."""
        last = self.last_of(self.rank)
        if last is None:
            return
        incarnation, top, _ = last
        deleted = 0
        for index in range(max(1, top - 2 * KEEP), top + 1):
            try:
                hop.delete(object_id(self.rank, incarnation, index), timeout=2.0)
                deleted += 1
            except hop.HopliteError:
                pass  # never put, lost with its only holder, deleted already, or a fault under way
        self.log.write(event="cleanup", incarnation=incarnation, deleted=deleted)

    def op_reduce(self) -> int:
        size_class = self.rng.randrange(len(SIZES))
        inputs = []
        for rank in self.rng.sample(range(self.world), min(self.world, 4)):
            found = self.recent_id(rank, size_class)
            if found:
                inputs.append(found[0])
        if len(inputs) < 2:
            return 0
        self.reduces += 1
        self.objects = inputs
        result_id = self.result = f"soak-reduce.{self.rank}.{self.incarnation}.{self.reduces}"
        self.call("reduce")
        ref, _ = hop.reduce(inputs, num_objects=len(inputs) - 1, id=result_id, timeout=self.timeout)
        try:
            self.call("wait_reduce")
            plan = hop.wait_reduce(ref, timeout=self.timeout)
            self.call("get of the reduce's result")
            got = hop.get(ref, timeout=self.timeout).wait()
        except Exception:
            self.call("delete of the failed reduce's result")  # a call of its own, with its own timeout
            with contextlib.suppress(Exception):  # the reduce's own error is the one to report
                hop.delete(ref, timeout=self.timeout)
            raise
        self.call("delete of the reduce's result")
        hop.delete(ref, timeout=self.timeout)
        expected = sum(contents(hop_id(r), SIZES[size_class]) for r in plan.inputs)
        return wrong_bytes(got, expected)

    def call(self, what: str) -> None:
        """A blocking call of the current operation begins (each has the timeout)."""
        self.calls.append((what, time.monotonic()))
        self.watchdog.begin(what)

    def step(self) -> None:
        op = self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        self.objects, self.result = [], ""
        self.calls = []
        began = time.monotonic()
        run_checked(self.log, self.watchdog, op, getattr(self, f"op_{op}"),
                    allowed=lambda: len(self.calls) * self.timeout + self.grace, objects=lambda: self.objects)
        ended = time.monotonic()
        steps = hop.trace_events()  # drained after every operation, so that they stay few
        if ended - began >= SLOW_SHARE * self.timeout:
            # Its own steps (this thread alone puts, gets and reduces), and what this node did for its objects.
            ids = set(self.objects) | ({self.result} if self.result else set())
            steps = [s for s in steps if s.time >= began and (s.step.startswith(OWN_STEPS) or s.id in ids)]
            kept = steps if len(steps) <= MAX_SLOW_STEPS else steps[:MAX_SLOW_STEPS // 2] + steps[-MAX_SLOW_STEPS // 2:]
            self.log.write(event="slow", op=op, dur=ended - began,
                           calls=[(what, round(t - began, 4)) for what, t in self.calls],
                           steps=[(round(s.time - began, 4), s.step, str(s.id), s.peer) for s in kept],
                           steps_left_out=len(steps) - len(kept))


def run_checked(log: Log, watchdog: Watchdog, op: str, body: Callable[[], int], allowed: Callable[[], float],
                objects: Callable[[], list[str]] = list) -> Optional[str]:
    """Runs one checked operation (`body` returns the wrong bytes it saw) and
    logs its outcome as one "op" line: its error or wrong bytes, its
    duration, the objects it touched, and whether it ran past `allowed()`
    seconds. Returns the error, if any."""
    start = time.time()
    watchdog.step(start)
    error, wrong = None, 0
    try:
        wrong = body()
    except Exception as e:  # every failure is an outcome to count, by type
        error = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        watchdog.end()
    duration = time.time() - start
    log.write(event="op", op=op, start=start, dur=duration, error=error, wrong=wrong, objects=objects(),
              late=duration > allowed())
    return error


def round_values(round_no: int, rank: int, numel: int) -> torch.Tensor:
    """Integer-valued floats: sums over ranks are exact."""
    return ((torch.arange(numel) * 3 + round_no * 7 + rank * 11) % 101).float()


class CollectiveRounds:
    """c10d collectives of the "hoplite" backend among all ranks, in rounds at
    fixed wall-clock times. Each round has a group of its own, made when it
    begins, so a rank restarted since the last round takes part; its
    allreduce, broadcast, allgather and reduce-scatter are checked exactly. A
    round's calls end before the next round begins, so ranks whose round
    failed (a member dead, paused or cut off) meet again in the next."""

    def __init__(self, rank: int, world: int, log: Log, grace: float, origin: float):
        self.rank, self.world, self.log, self.grace = rank, world, log, grace
        self.origin = origin  # round k begins at origin + k * ROUND_SECONDS
        self.watchdog = Watchdog(log, ROUND_SECONDS * ROUND_SHARE + grace)

    def run(self, stop_at: float, leaving: threading.Event) -> None:
        while True:
            round_no = math.floor((time.time() - self.origin) / ROUND_SECONDS) + 1
            begins = self.origin + round_no * ROUND_SECONDS
            if begins > stop_at or leaving.wait(max(0.0, begins - time.time())):
                return
            self.run_round(round_no, begins + ROUND_SECONDS * ROUND_SHARE)

    def run_round(self, round_no: int, deadline: float) -> None:
        backend = _C.create_backend(api._rt().node, f"soak-round.{round_no}", self.rank, list(range(self.world)),
                                    ROUND_SECONDS)
        for name in ("allreduce", "broadcast", "allgather", "reduce_scatter"):
            timeout = max(0.05, deadline - time.time())

            def collective(name: str = name, timeout: float = timeout) -> int:
                self.watchdog.begin(f"c10d {name}")
                return getattr(self, name)(backend, round_no, datetime.timedelta(seconds=timeout))

            if run_checked(self.log, self.watchdog, f"c10d {name}", collective,
                           allowed=lambda: timeout + self.grace):
                return  # the round's group is broken: the next round has a new one

    # ---- each returns the wrong bytes it saw
    def allreduce(self, backend: Any, round_no: int, timeout: datetime.timedelta) -> int:
        t = round_values(round_no, self.rank, ROUND_ELEMENTS)
        opts = c10d.AllreduceOptions()
        opts.timeout = timeout
        backend.allreduce([t], opts).wait()
        return wrong_bytes(t, sum(round_values(round_no, r, ROUND_ELEMENTS) for r in range(self.world)))

    def broadcast(self, backend: Any, round_no: int, timeout: datetime.timedelta) -> int:
        root = round_no % self.world
        t = round_values(round_no, root, ROUND_ELEMENTS) if self.rank == root else torch.zeros(ROUND_ELEMENTS)
        opts = c10d.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = root, 0, timeout
        backend.broadcast([t], opts).wait()
        return wrong_bytes(t, round_values(round_no, root, ROUND_ELEMENTS))

    def allgather(self, backend: Any, round_no: int, timeout: datetime.timedelta) -> int:
        n = ROUND_ELEMENTS // self.world
        out = [torch.zeros(n) for _ in range(self.world)]
        opts = c10d.AllgatherOptions()
        opts.timeout = timeout
        backend.allgather([out], [round_values(round_no, self.rank, n)], opts).wait()
        return sum(wrong_bytes(got, round_values(round_no, r, n)) for r, got in enumerate(out))

    def reduce_scatter(self, backend: Any, round_no: int, timeout: datetime.timedelta) -> int:
        n = ROUND_ELEMENTS // self.world

        def block(rank: int, to: int) -> torch.Tensor:  # what `rank` gives for `to`'s share
            return round_values(round_no * self.world + to, rank, n)

        out = torch.zeros(n)
        opts = c10d.ReduceScatterOptions()
        opts.timeout = timeout
        backend.reduce_scatter([out], [[block(self.rank, to) for to in range(self.world)]], opts).wait()
        return wrong_bytes(out, sum(block(r, self.rank) for r in range(self.world)))


def hop_id(ref: Any) -> str:
    return ref if isinstance(ref, str) else ref.id


def run(rank: int, world: int, store_host: str, port: int, seed: int, incarnation: int, stop_at: float,
        log_path: str, options: dict, timeout: float, grace: float) -> None:
    """A rank's process: joins (rejoins, after the first incarnation), runs the
    workload until `stop_at` (wall clock), lets the others' last operations
    finish, and leaves; or, on SIGTERM, ends its operation and leaves at once."""
    log = Log(log_path, rank, incarnation)
    store = dist.TCPStore(store_host, port, world, is_master=False, timeout=datetime.timedelta(seconds=60))
    hop.init(store, rank=rank, world_size=world, rejoin=incarnation > 0, **options)
    leaving = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: leaving.set())  # before "up": the driver's cue that it may stop us
    log.write(event="up", pid=os.getpid(), address=list(api._rt().address))
    sample_resources(log, 1.0)
    workload = Workload(rank, incarnation, world, store, random.Random(seed * 1000 + rank * 100 + incarnation),
                        log, timeout, grace)
    rounds = CollectiveRounds(rank, world, log, grace, origin=stop_at)
    round_thread = threading.Thread(target=rounds.run, args=(stop_at, leaving), daemon=True)
    round_thread.start()
    if incarnation > 0:
        workload.delete_predecessors_objects()
    workload.publish()
    while time.time() < stop_at and not leaving.is_set():
        workload.step()
    round_thread.join(ROUND_SECONDS)  # its current round
    if leaving.is_set():
        log.write(event="left")
        hop.shutdown()
        return
    time.sleep(max(0.0, stop_at + timeout + grace - time.time()))  # others may still pull from us
    log.write(event="down")
    hop.shutdown()
