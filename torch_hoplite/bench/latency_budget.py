"""Latency budgets (issue #30): where one trial's time went, phase by phase,
from the steps every rank traced (`python -m torch_hoplite.bench --trace`).

A budget follows the critical path: the participant that finished last
(broadcast: the last receiver; reduce: rank 0, which calls reduce and gets the
result) and the steps on other ranks that it waited for (the directory shard
that answered its lookup, the holder that served its pull, the reduce tasks).
Its milestones are taken in order, each clipped to the trial's end; a phase is
the time from the latest milestone so far to the next one (0 when that one
came earlier, as when the put registered before the get asked), and a last
phase runs to the end of the trial (the slowest rank's return), so the phases
sum exactly to the trial's time as the harness measures it. All ranks share
one monotonic clock: one host's kernel, or network namespaces of it.
"""

from __future__ import annotations

import statistics
from typing import Optional

# One trial of one rank: its start and end (time.monotonic) and its traced steps
# as [time, step, id, peer, nbytes].
Trial = tuple[float, float, list]

LAST_PHASE = "other ranks still running"

BROADCAST_PHASES = [
    "start skew (barrier exit)",
    "Python call into the extension",
    "hand-off to the event loop",
    "lookup reaches the directory shard",
    "waiting at the shard (for the put, or a free sender)",
    "shard's answer reaches the getter",
    "pull request reaches the sender",
    "first bytes (sender's own copy filling: pipeline fill)",
    "remaining bytes",
    "completion on the event loop",
    "hand-off to the thread completing the future",
    "hand-off back to Python",
    LAST_PHASE,
]

REDUCE_PHASES = [
    "start skew (barrier exit)",
    "put of rank 0's input (copy, registration)",
    "put returns, reduce called",
    "inputs located (waiting for the others' puts)",
    "link estimate (probes when stale)",
    "tree set up: tasks sent",
    "tasks started (outputs registered)",
    "first bytes of the result (tree fill)",
    "remaining bytes of the result",
    "get of the result completes",
    "hand-off to the thread completing the future",
    "hand-off back to Python",
    LAST_PHASE,
]


def _steps(trial: Trial, step: str, id: Optional[str] = None, peer: Optional[int] = None) -> list[float]:
    return sorted(t for t, s, i, p, _ in trial[2] if s == step and (id is None or i == id) and (peer is None or p == peer))


def _first(times: list[float], after: Optional[float] = None) -> Optional[float]:
    times = [t for t in times if after is None or t >= after]
    return times[0] if times else None


def _last(times: list[float], before: Optional[float] = None) -> Optional[float]:
    times = [t for t in times if before is None or t <= before]
    return times[-1] if times else None


def _phases(names: list[str], start: float, end: float, milestones: list[Optional[float]]) -> dict[str, float]:
    """Seconds per phase: one per milestone, then the rest up to `end`. A
    milestone not traced (None) adds its time to the next phase."""
    if len(names) != len(milestones) + 1:
        raise ValueError("one milestone per phase but the last")
    out, reached = {}, start
    for name, t in zip(names, milestones + [end]):
        if t is None:
            out[name] = 0.0
            continue
        t = min(t, end)
        out[name] = max(0.0, t - reached)
        reached = max(reached, t)
    return out


def broadcast_budget(runs: list[Trial], tag: str, start: float, end: float) -> dict[str, float]:
    """Rank 0 put `tag`; every other rank got it (N = 2: a lone get)."""
    last = max(range(1, len(runs)), key=lambda r: runs[r][1])
    me = runs[last]
    # The lookup that led to the pull (a get may look an object up again).
    located = _last(_steps(me, "get.located", tag), before=_first(_steps(me, "pull.sent", tag)))

    def about_me(step: str) -> list[float]:  # on any rank, with the last receiver as the peer
        return sorted(t for run in runs for t in _steps(run, step, tag, last))

    return _phases(BROADCAST_PHASES, start, end, [
        me[0], _first(_steps(me, "get.call", tag)), _last(_steps(me, "get.lookup", tag), before=located),
        _last(about_me("shard.lookup"), before=located), _last(about_me("shard.answer"), before=located), located,
        _first(about_me("serve.pull"), after=located), _first(_steps(me, "pull.first_bytes", tag)),
        _last(_steps(me, "pull.done", tag)), _last(_steps(me, "get.done", tag)),
        _last(_steps(me, "get.delivered", tag)), me[1],
    ])


def reduce_budget(runs: list[Trial], tag: str, start: float, end: float) -> dict[str, float]:
    """Every rank put `tag/r`; rank 0 reduced them into `tag` and got it."""
    root = runs[0]
    outputs = {i for _, s, i, _, _ in root[2] if s == "reduce.task_sent"}
    every = [step for run in runs for step in run[2]]
    return _phases(REDUCE_PHASES, start, end, [
        root[0], _first(_steps(root, "put.registered", f"{tag}/0")), _first(_steps(root, "reduce.call", tag)),
        _last(_steps(root, "reduce.located")), _first(_steps(root, "reduce.link_known", tag)),
        _last(_steps(root, "reduce.task_sent")),
        max((t for t, s, i, _, _ in every if s == "task.start" and i in outputs), default=None),
        _first([t for t, s, i, _, _ in every if s == "task.first_output" and i == tag]),
        _first([t for t, s, i, _, _ in every if s == "task.done" and i == tag]),
        _last(_steps(root, "get.done", tag)), _last(_steps(root, "get.delivered", tag)), root[1],
    ])


BUDGETS = {"broadcast": (BROADCAST_PHASES, broadcast_budget), "reduce": (REDUCE_PHASES, reduce_budget)}


def summarize(op: str, trials: list[list[Trial]], tags: list[str], bounds: list[tuple[float, float]]) -> Optional[dict]:
    """Mean and median of each phase over the trials (the means sum to the mean
    trial time), with every trial's phases; None for an op without a budget.
    bounds: each trial's start and end, as the harness times it."""
    if op not in BUDGETS:
        return None
    names, budget = BUDGETS[op]
    per_trial = [budget(runs, tag, start, end) for runs, tag, (start, end) in zip(trials, tags, bounds)]
    return {
        "phases": names,
        "mean_ms": {n: statistics.fmean(b[n] for b in per_trial) * 1e3 for n in names},
        "median_ms": {n: statistics.median(b[n] for b in per_trial) * 1e3 for n in names},
        "trials_ms": [{n: b[n] * 1e3 for n in names} for b in per_trial],
    }


def plot(records: list[dict], path: str) -> None:
    """A horizontal bar per traced point: its mean phases stacked, in units of
    its ideal time where it has one (so sizes share an axis), else in ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traced = [r for r in records if r.get("budget")]
    names = list(dict.fromkeys(n for r in traced for n in r["budget"]["phases"]))
    palette = list(plt.get_cmap("tab20").colors) + list(plt.get_cmap("tab20b").colors)
    colors = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    ideal = all(r.get("ideal_s") for r in traced)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.7 * len(traced) + 0.22 * len(names)))
    labeled: set[str] = set()
    for y, r in enumerate(traced):
        left, unit = 0.0, r["ideal_s"] * 1e3 if ideal else 1.0
        for n in r["budget"]["phases"]:
            w = r["budget"]["mean_ms"][n] / unit
            ax.barh(y, w, left=left, color=colors[n], label=None if n in labeled else n, edgecolor="white", linewidth=0.5)
            labeled.add(n)
            left += w
    if ideal:
        ax.axvline(1.0, color="black", linewidth=1.2)
    ax.set_yticks(range(len(traced)))
    ax.set_yticklabels([f"{r['system']}, {r['op']} N={r['nodes']}\n{r['size_bytes'] / 2**20:g} MiB" for r in traced],
                       fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("mean time per trial / ideal (size / link rate; black line)" if ideal else "mean time per trial (ms)")
    ax.set_title(f"Latency budget, {traced[0].get('path', '')}" if traced else "Latency budget", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
