"""Functions the tests run inside worker ranks (importable by spawned processes)."""

from __future__ import annotations

import os
import time

import torch

import torch_hoplite as hop


def put(tensor, obj_id=None, **kwargs):
    return hop.put(tensor, obj_id, **kwargs)


def get(ref, timeout=None, **kwargs):
    return hop.get(ref, timeout=timeout, **kwargs).wait()


def get_keeping_copy(ref, timeout=None):
    """A get after which this node holds a copy: with copy=False the store keeps
    it (a copy=True get that read a holder on its own host takes it instead)."""
    return hop.get(ref, timeout=timeout, copy=False).wait().clone()


def get_from(ref, source, timeout=None):
    """A get that asks to pull from `source`; keeps its copy, as get_keeping_copy."""
    return hop.get(ref, timeout=timeout, copy=False, source=source).wait().clone()


def get_to(ref, device, timeout=None):
    """A get onto `device`: the tensor brought back to the CPU, and the device it arrived on."""
    t = hop.get(ref, device=device, timeout=timeout).wait()
    return t.cpu(), str(t.device)


def put_from_cuda(tensor, obj_id):
    """Puts `tensor` (sent here on the CPU) from this rank's GPU."""
    return hop.put(tensor.cuda(), obj_id)


def allreduce_on_cuda(tensor, obj_id, kwargs):
    """allreduce of `tensor` moved to this rank's GPU: the result on the CPU and its device."""
    result = hop.allreduce(tensor.cuda(), obj_id, **kwargs)
    return result.cpu(), str(result.device)


def get_error(ref, timeout=None):
    """Returns (exception type name, message, elapsed seconds) of a failing get."""
    start = time.monotonic()
    try:
        hop.get(ref, timeout=timeout).wait()
    except Exception as e:
        return type(e).__name__, str(e), time.monotonic() - start
    return None, None, time.monotonic() - start


def get_outcome(obj_id, n, seed, timeout=None):
    """"exact" when the get returns pattern(n, seed), "other bytes" when it
    returns anything else, else the name of the exception it raised."""
    try:
        got = hop.get(obj_id, timeout=timeout).wait()
    except Exception as e:
        return type(e).__name__
    return "exact" if torch.equal(got, pattern(n, seed)) else "other bytes"


def put_error(tensor, obj_id):
    try:
        hop.put(tensor, obj_id)
    except Exception as e:
        return type(e).__name__, str(e)
    return None, None


def node_port():
    """The TCP port this rank's node listens on."""
    from torch_hoplite import api

    return api._runtime.address[1]


def stats():
    return hop.stats()


def delete(ref, timeout=None):
    hop.delete(ref, timeout=timeout)


def pattern(n: int, seed: int) -> torch.Tensor:
    """n distinct int32 values; cheap to make twice and to compare exactly."""
    return torch.arange(seed, seed + n, dtype=torch.int32)


def get_matches_pattern(obj_id, n, seed, timeout=None):
    got = hop.get(obj_id, timeout=timeout).wait()
    return got.dtype == torch.int32 and got.shape == (n,) and bool(torch.equal(got, pattern(n, seed)))


def exchange(rank, world_size, n):
    """Every rank puts a tensor of its rank and gets everyone else's."""
    hop.put(torch.full((n,), float(rank)), f"exchange-{rank}")
    futs = [hop.get(f"exchange-{r}", timeout=60) for r in range(world_size) if r != rank]
    torch.futures.wait_all(futs)
    return [float(f.value()[0]) for f in futs] == [float(r) for r in range(world_size) if r != rank] and all(
        bool((f.value() == f.value()[0]).all()) for f in futs
    )



def put_and_hold(obj_id, n, seed):
    """Puts a pattern and waits until the local copy is complete."""
    return hop.put(pattern(n, seed), obj_id, blocking=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get_after(delay, obj_id, n, seed, timeout=120):
    """Sleeps, then gets a pattern object; returns whether it matched exactly."""
    time.sleep(delay)
    return get_matches_pattern(obj_id, n, seed, timeout)


def put_after(delay, tensor, obj_id):
    time.sleep(delay)
    return hop.put(tensor, obj_id)


def allreduce(tensor, obj_id, kwargs):
    return hop.allreduce(tensor, obj_id, **kwargs)


def allreduce_after(delay, tensor, obj_id, kwargs):
    time.sleep(delay)
    return hop.allreduce(tensor, obj_id, **kwargs)



def put_zero_copy(tensor, obj_id):
    return hop.put(tensor, obj_id, copy=False)


def put_pattern(obj_id, numel, seed):
    """Puts pattern(numel, seed) without sending it through the pipe."""
    return hop.put(pattern(numel, seed), obj_id, copy=False)


def pattern_sum(numel: int, seeds) -> torch.Tensor:
    """The SUM of pattern(numel, s) over `seeds`, exactly (int32)."""
    return len(seeds) * torch.arange(numel, dtype=torch.int32) + sum(seeds)


def digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes: equal only for equal elements in equal places."""
    import hashlib

    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def get_digest(obj_id, timeout=None):
    return digest(hop.get(obj_id, timeout=timeout).wait())


def get_equals_pattern_sum(obj_id, numel, seeds, timeout=None):
    """Whether the object is, element by element, the sum of those patterns."""
    return bool(torch.equal(hop.get(obj_id, timeout=timeout).wait(), pattern_sum(numel, seeds)))


def put_filled(obj_id, numel, value):
    """Puts a float32 tensor of `numel` copies of `value` without sending it through the pipe."""
    return hop.put(torch.full((numel,), float(value)), obj_id, copy=False)


def wait_for_holders(obj_id, complete, timeout):
    """Subscribes on this rank and waits until exactly `complete` hold whole copies."""
    with hop.subscribe(obj_id) as sub:
        return sub.wait_for(lambda loc: loc.complete == tuple(complete), timeout).complete


_open_subscriptions = []


def subscribe_forever(obj_id):
    """Leaves a subscription open (for a rank that is killed next)."""
    _open_subscriptions.append(hop.subscribe(obj_id))
    return hop.stats()["subscriptions"]



def shutdown():
    hop.shutdown()


def traced(fn_name, *args):
    """Runs workers.<fn_name>(*args) with tracing on: its result and the steps
    this rank traced meanwhile (as plain tuples)."""
    hop.trace_events()
    hop.enable_tracing()
    try:
        result = globals()[fn_name](*args)
    finally:
        hop.enable_tracing(False)
    return result, trace_events()


def trace_events():
    """This rank's traced steps (as plain tuples), taken."""
    return [tuple(s) for s in hop.trace_events()]


def get_then_trace(ref, timeout=30):
    """A get, then what this rank traced meanwhile (tracing left as it was)."""
    hop.get(ref, timeout=timeout).wait()
    return trace_events()


def reduce_and_get(ids, num_objects, result_id, timeout):
    """A sum of the first `num_objects` of `ids` into `result_id`, and a get of
    it: the result, or the error's text; and the seconds it all took."""
    start = time.monotonic()
    try:
        ref, _ = hop.reduce(ids, num_objects=num_objects, id=result_id, timeout=timeout)
        hop.wait_reduce(ref, timeout=timeout)
        out = hop.get(ref, timeout=timeout).wait()
    except hop.HopliteError as e:
        out = f"{type(e).__name__}: {e}"
    return out, time.monotonic() - start
