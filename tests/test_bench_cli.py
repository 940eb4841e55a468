"""The benchmark harness's command line, `python -m torch_hoplite.bench`: one
small point on loopback and, where network namespaces exist, on the emulated
cluster; the JSON holds every field the harness promises."""

import json
import os
import shutil
import statistics
import subprocess
import sys

import pytest

from torch_hoplite.bench import collectives

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from torch_hoplite.bench.emulated_cluster import available

FIELDS = {"system", "op", "nodes", "size_bytes", "median_s", "min_s", "max_s", "algbw_gbps", "busbw_gbps",
          "ratio_to_ideal", "cpu_cores", "trials", "times_s", "start_skew_s", "after_last_start_s"}


def run_bench(tmp_path, size, *extra):
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "torch_hoplite.bench", "--nodes", "2", "--sizes", size, "--ops", "allreduce,broadcast",
           "--systems", "hoplite-c10d,gloo", "--trials", "2", "--warmup", "1", "--json", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "out.png").stat().st_size > 0  # without --plot the plot goes next to the JSON
    return json.loads(out.read_text()), proc.stdout


def test_loopback_point(tmp_path):
    result, stdout = run_bench(tmp_path, "256KB")
    records = result["records"]
    assert {(r["system"], r["op"]) for r in records} == {
        (s, o) for s in ("hoplite-c10d", "gloo") for o in ("allreduce", "broadcast")}
    for r in records:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["nodes"] == 2 and r["size_bytes"] == 256 << 10 and r["trials"] == 2
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["ratio_to_ideal"] is None  # no link to be ideal against on loopback
    assert result["machine"]["cores"] >= 1
    assert "x ideal" in stdout  # the table
    for r in records:
        assert len(r["times_s"]) == 2
        assert ("paired_vs_gloo" in r) == (r["system"] != "gloo")
    assert "trial by trial against gloo" in stdout


def test_summary_splits_each_trial_into_start_skew_and_time_after_the_last_start():
    # Two ranks, three trials of (start, end, cores, moved); times in seconds.
    per_rank = {
        0: {("allreduce", "gloo", 8): [(10.0, 11.0, 0.5, (0, 0)), (20.0, 21.5, 0.5, (0, 0)), (30.0, 31.0, 0.5, (0, 0))]},
        1: {("allreduce", "gloo", 8): [(10.25, 11.5, 0.25, (0, 0)), (20.5, 21.0, 0.5, (0, 0)), (30.0, 31.0, 0.5, (0, 0))]},
    }
    (r,) = collectives.summarize(per_rank, 2, "loopback TCP", 0.0)
    assert r["times_s"] == [1.5, 1.5, 1.0]  # from the first start to the last end
    assert r["median_s"] == 1.5 and r["min_s"] == 1.0 and r["max_s"] == 1.5
    assert r["start_skew_s"] == 0.25  # median of 0.25, 0.5, 0
    assert r["after_last_start_s"] == 1.0  # median of 1.25, 1.0, 1.0
    assert r["cpu_cores"] == 1.0
    # Staggered arrivals (rank r starts r * 0.25 s late on purpose): the skew leaves the plan out.
    (r,) = collectives.summarize(per_rank, 2, "loopback TCP", 0.0, arrival=0.25)
    assert r["start_skew_s"] == 0.25  # median of 0, 0.25, 0.25


def test_paired_comparison_with_gloo_is_trial_by_trial():
    p = collectives.paired([1.0, 2.0, 4.0, 3.0], [2.0, 2.0, 2.0, 2.0])
    assert p["trials"] == 4 and p["faster_trials"] == 1
    assert p["median_ratio"] == 1.25  # of 0.5, 1, 2, 1.5
    assert p["mean_diff_ms"] == 500.0
    lo, hi = p["ci95_diff_ms"]
    half = 3.182 * statistics.stdev([-1000.0, 0.0, 2000.0, 1000.0]) / 2  # t, 3 degrees of freedom
    assert lo == pytest.approx(500.0 - half) and hi == pytest.approx(500.0 + half)
    assert collectives.paired([1.0], [2.0])["ci95_diff_ms"] is None  # one trial: no interval
    with pytest.raises(ValueError):
        collectives.paired([1.0, 2.0], [1.0])


@pytest.mark.skipif(not available(), reason="needs root and iproute2 for network namespaces")
def test_emulated_point_checks_the_link_first(tmp_path):
    # 8 MB: well above tbf's 128 KB burst, which lets small transfers beat the "ideal".
    result, stdout = run_bench(tmp_path, "8MB", "--rate", "1gbit")
    assert "link check: one TCP flow gets" in stdout
    achieved = result["settings"]["link_check_bps"]["2"]
    assert 0.85e9 < achieved < 1.0e9  # tbf counts Ethernet bytes: ~95.5% of the rate
    for r in result["records"]:
        assert r["ratio_to_ideal"] > 0.95, r


@pytest.mark.skipif(shutil.which("mpicc") is None, reason="Open MPI is not installed (make bench installs it)")
def test_mpi_peer_on_loopback(tmp_path):
    out = tmp_path / "mpi.json"
    cmd = [sys.executable, "-m", "torch_hoplite.bench", "--nodes", "3", "--sizes", "256KB", "--ops",
           "broadcast,reduce,allreduce,gather", "--systems", "gloo,mpi,mpi-yield", "--trials", "2", "--warmup", "1",
           "--settle", "0.3", "--json", str(out), "--plot", str(tmp_path / "mpi.png")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(out.read_text())["records"]
    for system in ("mpi", "mpi-yield"):  # busy-polling, and yielding when idle
        ops = {r["op"] for r in records if r["system"] == system}
        assert ops == {"broadcast", "reduce", "allreduce"}, system  # no gather here; its results were checked
    assert all(0 < r["median_s"] < 0.15 and r["nodes"] == 3 for r in records)  # the settling is not timed


def test_staggered_arrivals_time_from_the_last_arrival(tmp_path):
    result, _ = run_bench(tmp_path, "256KB", "--arrival-interval", "0.2")
    assert result["settings"]["arrival_interval_s"] == 0.2
    for r in result["records"]:
        assert r["arrival_interval_s"] == 0.2 and r["ratio_to_ideal"] is None
        # From the last arrival, not from the start: well under the 0.2 s the second rank slept.
        assert 0 < r["median_s"] < 0.15, r


def test_settling_after_the_barrier_is_recorded_and_not_timed(tmp_path):
    result, _ = run_bench(tmp_path, "256KB", "--settle", "0.3")
    assert result["settings"]["settle_s"] == 0.3
    for r in result["records"]:
        assert 0 < r["median_s"] < 0.15, r  # every rank slept 0.3 s before its call, outside the timing


def test_a_traced_run_with_a_common_start_budgets_each_object_store_point(tmp_path):
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "torch_hoplite.bench", "--nodes", "2", "--sizes", "256KB", "--ops",
           "broadcast,reduce,allreduce", "--systems", "hoplite,gloo", "--trials", "2", "--warmup", "1", "--trace",
           "--common-start", "0.3", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["common_start_s"] == 0.3 and result["settings"]["trace"] is True
    for r in result["records"]:
        assert 0 < r["median_s"] < 0.15, r  # the 0.3 s before the common start is not timed
        if r["system"] != "hoplite" or r["op"] == "allreduce":
            assert "budget" not in r
            continue
        trials = r["budget"]["trials_ms"]
        assert len(trials) == 2 and list(trials[0]) == r["budget"]["phases"]
        for phases, seconds in zip(trials, r["times_s"]):
            assert sum(phases.values()) == pytest.approx(seconds * 1e3)  # the phases make up the trial
    assert (tmp_path / "out-budget.png").stat().st_size > 0
    both = subprocess.run(cmd + ["--settle", "0.1"], capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "--common-start" in both.stderr


def test_a_point_too_big_for_the_machine_is_refused_before_anything_starts():
    cmd = [sys.executable, "-m", "torch_hoplite.bench", "--nodes", "64", "--sizes", "1MB,1GB", "--ops", "allgather"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "allgather of 1073741824 bytes on 64 nodes needs about 8192.0 GiB" in proc.stderr


def test_rpc_benchmark_on_loopback(tmp_path):
    """benchmarks/rpc.py at a small size: every case and system has a record
    (each trial's result is checked inside the run), and the plot is written."""
    out = tmp_path / "rpc"
    cmd = [sys.executable, "benchmarks/rpc.py", "--loopback", "--nodes", "3", "--sizes", "2MB", "--trials", "1",
           "--warmup", "0", "--rl-iterations", "2", "--rl-policy-bytes", "2MB", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads((tmp_path / "rpc.json").read_text())["records"]
    assert {(r["case"], r["system"]) for r in records} == {
        ("fanout", "rpc"), ("fanout", "offload"), ("fanout", "refs"), ("fanin", "rpc"), ("fanin", "offload"),
        ("fanin", "reduce"), ("small", "rpc"), ("small", "offload"), ("rl", "rpc"), ("rl", "offload"),
        ("rl", "hoplite")}
    for r in records:
        assert r["nodes"] == 3 and r["median_s"] > 0 and r["time_vs_rpc"] > 0
        assert r["trials"] == {"small": 10 * 190, "rl": 2}.get(r["case"], 1)
    assert (tmp_path / "rpc.png").stat().st_size > 10_000


def test_p2p_benchmark_runs_every_system(tmp_path):
    """benchmarks/p2p.py at a small size: every system has a record, and the
    run succeeds, which it does only if every trial's echo equals what was sent
    (a patterned tensor; p2p.py compares them outside the timed region)."""
    out = tmp_path / "p2p"
    systems = "hoplite,gloo,torch-rpc,hoplite-kept,gloo-fresh,gloo-kept,hoplite-completer-wait"
    cmd = [sys.executable, "benchmarks/p2p.py", "--sizes", "1MB", "--systems", systems, "--trials", "2", "--warmup", "1",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads((tmp_path / "p2p.json").read_text())["records"]
    assert {r["system"] for r in records} == set(systems.split(","))


def test_pool_benchmark_maps_nothing_once_the_new_size_settled(tmp_path):
    """benchmarks/pool.py with an 8 MiB cache filled by 1 MiB buffers, then
    4 MiB gets: the pool makes room for the new size (the buffers freed longest
    ago go), so once settled a get maps no fresh memory; with the old policy
    every get mapped 4 MiB."""
    out = tmp_path / "pool"
    cmd = [sys.executable, "benchmarks/pool.py", "--cache", "8MiB", "--small", "1MiB", "--large", "4MiB",
           "--trials", "10", "--warmup", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "pool.json").read_text())
    assert result["settings"]["cached_small_bytes_before_change"] == 8 << 20
    records = {(r["system"], r["phase"]): r for r in result["records"]}
    assert records[("hoplite get", "after the change, settled")]["mapped_per_op_bytes"] == 0
    first = records[("hoplite get", "first 10 after the change")]
    assert first["mapped_per_op_bytes"] * 10 == 4 << 20  # the first of its 10 gets mapped one buffer
    assert (tmp_path / "pool.png").stat().st_size > 0
