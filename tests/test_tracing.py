"""Step tracing (torch_hoplite.trace_events) and the latency budgets built from it."""

import pytest
import torch

import torch_hoplite as hop
import workers
from torch_hoplite.bench import latency_budget
from torch_hoplite.tracing import STEPS

GET_STEPS = ["get.call", "get.lookup", "get.located", "pull.sent", "pull.first_bytes", "pull.done", "get.done",
             "get.delivered"]


@pytest.fixture(params=[True, False], ids=["same-host", "tcp"])
def pair(request):
    from cluster import Cluster

    c = Cluster(2, options={"same_host": request.param})
    yield c
    c.close()


def test_a_pulled_get_traces_its_steps_in_order_on_both_sides(pair):
    x = torch.arange(300_000, dtype=torch.float32)  # 1.2 MB: pulled, not inline
    ref = hop.put(x, "traced-get")
    hop.trace_events()
    hop.enable_tracing()
    try:
        got, steps = pair.call(1, workers.traced, "get", ref, 30)
    finally:
        hop.enable_tracing(False)
    here = hop.trace_events()
    assert torch.equal(got, x)
    assert {s[1] for s in steps} | {s.step for s in here} <= set(STEPS)
    mine = [s for s in steps if s[2] == "traced-get" and s[1] in GET_STEPS]
    assert [s[1] for s in mine] == GET_STEPS
    assert [s[0] for s in mine] == sorted(s[0] for s in mine)
    located = mine[2]
    assert located[3] == 0  # the holder the shard assigned: this rank
    assert mine[4][4] > 0  # first bytes: how many
    served = [s for s in here if s.step == "serve.pull" and s.id == "traced-get"]
    assert [s.peer for s in served] == [1]
    assert mine[3][0] <= served[0].time <= mine[4][0]  # one monotonic clock for both processes
    hop.delete(ref)


def test_a_reduce_traces_its_tasks_and_its_result_before_the_get_of_it(pair):
    n = 300_000
    refs = [hop.put(torch.full((n,), 1.0), "traced-in/0"), pair.call(1, workers.put, torch.full((n,), 2.0), "traced-in/1")]
    pair.call(1, workers.trace_events)  # clears rank 1's steps
    hop.trace_events()
    hop.enable_tracing()
    pair.call(1, hop.enable_tracing)
    try:
        result, _ = hop.reduce(refs, id="traced-sum")
        got = hop.get(result).wait()
        hop.wait_reduce(result, timeout=30)  # the coordinator's last step may come after the get's
    finally:
        hop.enable_tracing(False)
        pair.call(1, hop.enable_tracing, False)
    here, there = hop.trace_events(), pair.call(1, workers.trace_events)
    assert torch.equal(got, torch.full((n,), 3.0))
    names = [s.step for s in here]
    assert names.count("reduce.call") == 1 and names.count("reduce.link_known") == 1
    assert sorted(s.id for s in here if s.step == "reduce.located") == ["traced-in/0", "traced-in/1"]
    outputs = {s.id for s in here if s.step == "reduce.task_sent"}
    assert "traced-sum" in outputs and len(outputs) == 2
    every = list(here) + [hop.TraceStep(*s) for s in there]
    for step in ("task.start", "task.first_output", "task.done"):
        assert sorted(s.id for s in every if s.step == step) == sorted(outputs), step
    # A get that followed the result as it was computed ends after its last bytes
    # (a get of a result already complete here has no get.done).
    done = next(s.time for s in every if s.step == "task.done" and s.id == "traced-sum")
    assert all(done <= s.time for s in here if s.step == "get.done" and s.id == "traced-sum")
    assert [s.time > done for s in here if s.step == "get.delivered" and s.id == "traced-sum"] == [True]
    assert [s.step for s in here if s.id == "traced-sum"].count("reduce.done") == 1
    hop.delete(result)
    for ref in refs:
        hop.delete(ref)


def test_tracing_is_off_until_enabled_and_taking_clears(cluster4):
    ref = hop.put(torch.arange(300_000, dtype=torch.float32), "untraced-get")
    # Rank 3 never turned tracing on: its get leaves no steps.
    assert cluster4.call(3, workers.get_then_trace, ref) == []
    hop.enable_tracing()
    try:
        hop.get(ref).wait()  # served from this rank's own copy: only its delivery is a step
    finally:
        hop.enable_tracing(False)
    assert [s.step for s in hop.trace_events()] == ["get.delivered"]
    assert hop.trace_events() == []
    hop.delete(ref)


def _step(t, step, id="", peer=-1, nbytes=0):
    return [t, step, id, peer, nbytes]


def test_broadcast_budget_follows_the_last_receiver_and_sums_to_the_trial():
    tag = "b"
    sender = (0.0, 0.004, [_step(0.0005, "put.call", tag), _step(0.001, "put.registered", tag),
                           _step(0.0020, "serve.pull", tag, 2)])
    early = (0.0, 0.010, [_step(0.001, "get.call", tag)])
    last = (0.0001, 0.0200, [
        _step(0.0002, "get.call", tag), _step(0.0003, "get.lookup", tag), _step(0.0005, "get.located", tag, -1),
        _step(0.0004, "get.lookup", tag), _step(0.0011, "get.located", tag, 0),  # looked up again
        _step(0.0012, "pull.sent", tag, 0), _step(0.0030, "pull.first_bytes", tag, 0, 65536),
        _step(0.0180, "pull.done", tag, 0), _step(0.0190, "get.done", tag), _step(0.0194, "get.delivered", tag)])
    shard = (0.0, 0.003, [_step(0.0006, "shard.lookup", tag, 2), _step(0.0010, "shard.answer", tag, 2)])
    # ranks: 0 sender, 1 early receiver, 2 last receiver, 3 the shard (and an early receiver)
    b = latency_budget.broadcast_budget([sender, early, last, shard], tag, 0.0, 0.0210)
    assert list(b) == latency_budget.BROADCAST_PHASES
    assert sum(b.values()) == pytest.approx(0.0210)  # from the first start to the last end
    ms = {k: round(v * 1e4) for k, v in b.items()}  # in 0.1 ms
    assert ms == {
        "start skew (barrier exit)": 1,
        "Python call into the extension": 1,
        "hand-off to the event loop": 2,
        "lookup reaches the directory shard": 2,
        "waiting at the shard (for the put, or a free sender)": 4,
        "shard's answer reaches the getter": 1,
        "pull request reaches the sender": 9,
        "first bytes (sender's own copy filling: pipeline fill)": 10,
        "remaining bytes": 150,
        "completion on the event loop": 10,
        "hand-off to the thread completing the future": 4,
        "hand-off back to Python": 6,
        latency_budget.LAST_PHASE: 10,
    }


def test_a_milestone_that_came_early_costs_nothing_a_missing_one_moves_its_time_on_a_late_one_is_clipped():
    names = ["a", "b", "c", "d", "rest"]
    phases = latency_budget._phases(names, 1.0, 2.0, [1.5, 1.2, None, 2.5])
    assert phases == {"a": 0.5, "b": 0.0, "c": 0.0, "d": 0.5, "rest": 0.0}
    assert sum(latency_budget._phases(names, 1.0, 3.0, [1.5, 1.2, None, 2.5]).values()) == 2.0


def test_reduce_budget_ends_at_the_callers_get():
    tag = "r"
    root = (0.0, 0.030, [
        _step(0.001, "put.registered", f"{tag}/0"), _step(0.002, "reduce.call", tag),
        _step(0.003, "reduce.located", f"{tag}/0", 0), _step(0.004, "reduce.located", f"{tag}/1", 1),
        _step(0.0035, "reduce.link_known", tag), _step(0.005, "reduce.task_sent", "p0", 1),
        _step(0.006, "reduce.task_sent", tag, 0), _step(0.007, "task.start", tag),
        _step(0.012, "task.first_output", tag, -1, 65536), _step(0.025, "task.done", tag),
        _step(0.026, "get.done", tag), _step(0.027, "reduce.done", tag), _step(0.028, "get.delivered", tag)])
    leaf = (0.0, 0.002, [_step(0.0065, "task.start", "p0"), _step(0.008, "task.start", "elsewhere")])
    b = latency_budget.reduce_budget([root, leaf], tag, 0.0, 0.030)
    assert list(b) == latency_budget.REDUCE_PHASES
    assert sum(b.values()) == pytest.approx(0.030)
    assert b["tasks started (outputs registered)"] == pytest.approx(0.001)  # the later of p0's and the root's
    assert b["first bytes of the result (tree fill)"] == pytest.approx(0.005)
    assert b["remaining bytes of the result"] == pytest.approx(0.013)
    assert b["get of the result completes"] == pytest.approx(0.001)
    assert b["hand-off to the thread completing the future"] == pytest.approx(0.002)
    assert b["link estimate (probes when stale)"] == 0.0
