"""The examples run and check their own results."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *args],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_parameter_server_applies_every_gradient_exactly():
    out = run_example("parameter_server.py", "--workers", "3", "--steps", "4", "--size", "256KB")
    assert "applied 12 gradients" in out and "weights exact" in out


def test_demo_runs():
    """The demo checks every tensor it moves; here its figures: each broadcast
    receiver pulled once, and rank 0 read bytes from the others' memory."""
    out = run_example("demo.py", "--nodes", "3", "--size", "4MB")
    served = re.findall(r"transfers served: (.*)\)", out)
    assert len(served) == 2  # the cold and the warm round
    for line in served:
        counts = [int(x) for x in re.findall(r"rank \d+: (\d+)", line)]
        assert len(counts) == 3 and sum(counts) == 2
    assert len(re.findall(r"in +\d+\.\d ms +\d+\.\d\d GB/s", out)) == 6  # p2p, broadcast, exchange, twice
    same_host = re.search(r"received ([\d.]+) (\w+) \(([\d.]+) (\w+) of it read from the other processes' memory", out)
    assert same_host and float(same_host.group(3)) > 0


def test_rl_actor_learner_learns_cartpole(tmp_path):
    """With no arguments (1 learner, 3 actors): the mean reward of the last 50
    episodes reaches 475 of 500, and the curve is written."""
    run_example("rl_actor_learner.py", "--out-dir", str(tmp_path))
    with open(tmp_path / "rl_actor_learner_hoplite.json") as f:
        result = json.load(f)
    assert result["solved"] and result["mean_last_50"] >= 475
    assert result["episodes"] == len(result["rewards"]) >= 50
    assert (tmp_path / "rl_actor_learner_hoplite.png").stat().st_size > 10_000


@pytest.mark.parametrize("transport", ["hoplite", "rpc", "offload"])
def test_rl_actor_learner_moves_large_policies(tmp_path, transport):
    """A 4 MB policy (ballast checked by every actor) for a few iterations, both ways."""
    run_example("rl_actor_learner.py", "--transport", transport, "--policy-bytes", "4MB", "--iterations", "6",
                "--target", "0", "--out-dir", str(tmp_path))
    with open(tmp_path / f"rl_actor_learner_{transport}.json") as f:
        result = json.load(f)
    assert result["iterations"] == 6 and result["policy_bytes"] == 4 << 20
    assert result["episodes"] == 6 * 2 * 4  # k = 2 trajectories of 4 episodes per iteration
    # Every actor checked that the ballast it received holds the version it was sent.
    if transport == "offload":  # one object per published version, sent to several actors
        assert 7 <= result["offload"]["objects_put"] < result["offload"]["objects_put"] + result["offload"]["sends_reused"]
    else:
        assert result["offload"] == {}


def test_async_ps_every_mode_reaches_the_target(tmp_path):
    """hoplite first-k, DDP over gloo and over hoplite, the RPC batch-update
    PS, each with and without a straggler: every run reaches the target."""
    run_example("async_ps.py", "--out-dir", str(tmp_path))
    with open(tmp_path / "async_ps.json") as f:
        result = json.load(f)
    runs = {(r["mode"], r["straggler"]): r for r in result["runs"]}
    assert set(runs) == {(m, s) for m in ("hoplite", "ddp-gloo", "ddp-hoplite", "rpc") for s in (False, True)}
    for r in runs.values():
        assert r["reached"] and r["final_loss"] <= result["target"] and r["samples"] > 0
        assert r["curve"][0][1] > 10 * result["target"]  # it learned: from far above the target
    assert (tmp_path / "async_ps.png").stat().st_size > 10_000


def test_serving_ensemble_survives_a_killed_replica(tmp_path):
    """Replica 2 is killed after 30% of the queries and replaced; every query is
    answered (every 10th checked exactly inside the run)."""
    run_example("serving_ensemble.py", "--queries", "120", "--kill-at", "0.3", "--out-dir", str(tmp_path))
    with open(tmp_path / "serving_ensemble_q4of4.json") as f:
        result = json.load(f)
    assert len(result["latency_s"]) == 120
    assert result["before_kill"]["queries"] + result["around_kill"]["queries"] + \
        result["after_replacement"]["queries"] == 120
    assert result["kill_s"] < result["replacement_ready_s"]
    assert result["after_replacement"]["queries"] > 0


def test_dlrm_every_system_equals_the_single_process_reference():
    out = run_example("dlrm_push_pull.py", "--check")
    assert "every system's tables equal the single-process reference bit for bit (rpc, all_to_all, hoplite)" in out


def test_dlrm_push_pull_measures_every_system(tmp_path):
    run_example("dlrm_push_pull.py", "--rows", "20000", "--batch", "256", "--steps", "5", "--out-dir", str(tmp_path))
    with open(tmp_path / "dlrm_push_pull.json") as f:
        result = json.load(f)
    records = {r["system"]: r for r in result["records"]}
    assert set(records) == {"rpc", "all_to_all", "hoplite"}
    for r in records.values():
        assert r["steps"] == 5 and r["rows_per_s"] > 0 and 0 < r["pull_p50_ms"] <= r["pull_p99_ms"]
        assert r["bytes_per_step"] > 0 and len(r["losses"]) == 5
    # The same batches in every system: the same unique rows, the same first loss.
    assert len({round(r["loss_first"], 6) for r in records.values()}) == 1
