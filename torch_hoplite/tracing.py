"""Timestamps of the steps of puts, gets, pulls, reduces and UCX frames in this process,
for latency budgets (``python -m torch_hoplite.bench --trace``).

    hop.enable_tracing()
    hop.get(ref).wait()
    for step in hop.trace_events():
        print(step.time, step.step, step.id, step.peer)

Times are ``time.monotonic()`` seconds: on Linux every process of one kernel
shares that clock, so steps of processes on one host (or in network
namespaces of one host, as on the emulated cluster) can be compared.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

from torch_hoplite import _C
from torch_hoplite.object_ref import ObjectId

#: What each step name means (the C++ side records them; see csrc/common/step_trace.h).
STEPS = {
    "put.call": "put, on the caller's thread",
    "put.registered": "put: the directory shard's answer arrived (on the event loop)",
    "get.call": "get handed to the node's event loop (no complete local copy)",
    "get.lookup": "get: lookup sent, on the event loop",
    "get.located": "get: the shard's answer arrived (peer: the sender it assigned)",
    "get.done": "get: completion handed back to the caller",
    "get.delivered": "get: its future completed (on the thread waiting for it, else the node's completion thread)",
    "shard.lookup": "shard: a lookup arrived (peer: the asker)",
    "shard.answer": "shard: its answer leaves (peer: the asker)",
    "pull.sent": "pull request sent (peer: the holder)",
    "serve.pull": "holder: a pull request arrived (peer: the puller)",
    "pull.first_bytes": "pull: its first bytes arrived (nbytes: how many)",
    "pull.done": "pull: its last bytes arrived (before they wake the get)",
    "reduce.call": "reduce, on the caller's thread (id: the result)",
    "reduce.link_known": "reduce: the link estimate is there",
    "reduce.located": "reduce: an input located (peer: its holder)",
    "reduce.task_sent": "reduce: a tree position's task sent (id: its output; peer: its node)",
    "task.start": "reduce task: its output registered, its inputs start (id: its output)",
    "task.first_output": "reduce task: its first output bytes (nbytes: how many)",
    "task.done": "reduce task: its output complete (before it wakes the output's readers)",
    "reduce.done": "reduce: the coordinator saw the result complete",
    "link.probe": "the reduce cost model's link probes begin (peer: the probed node)",
    # UCX data frames: id "request/offset", nbytes the frame's size, peer the other rank
    "frame.send": "UCX sender: a data frame handed to UCX",
    "frame.sent": "UCX sender: UCX says the frame is sent",
    "frame.arrived": "UCX receiver: a data frame's header arrived (by rendezvous: its request to send)",
    "frame.receive": "UCX receiver: the frame's receive into its destination posted (rendezvous frames only)",
    "frame.landed": "UCX receiver: the frame's bytes landed",
    "ucx.progress": "a turn of progressing the UCX worker begins",
}


class TraceStep(NamedTuple):
    time: float  #: time.monotonic() seconds
    step: str  #: a key of STEPS
    id: ObjectId  #: the object (str when its id is UTF-8); "" when none
    peer: int  #: the other rank involved; -1 when none
    nbytes: int  #: bytes, for steps that count them; else 0


def enable_tracing(on: bool = True) -> None:
    """Record (or stop recording) the steps of this process's operations.
    Off by default; when off, a step costs one atomic load."""
    _C.set_tracing(bool(on))


def trace_events() -> list[TraceStep]:
    """The steps recorded since the last call, oldest first. At most 2**20 are
    kept between calls; a warning says how many were dropped beyond that."""
    records, dropped = _C.take_trace()
    if dropped:
        warnings.warn(f"torch_hoplite tracing dropped {dropped} steps: call trace_events() more often", RuntimeWarning)
    return [TraceStep(t, step, _decode(raw), peer, nbytes) for t, step, raw, peer, nbytes in records]


def _decode(raw: bytes) -> ObjectId:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
