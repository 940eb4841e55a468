"""Short soaks (torch_hoplite.bench.soak): 4 ranks for 2 minutes of kills,
leaves, restarts, pauses and strangers, over loopback and, adding partitions,
packet loss and delay, on the emulated cluster; nothing wrong is delivered and
nothing hangs."""

import json
import subprocess
import sys

import pytest

from torch_hoplite.bench.emulated_cluster import links_can_be_delayed

EMULATED = pytest.param("emulated", marks=pytest.mark.skipif(
    not links_can_be_delayed(), reason="needs root, iproute2, nft, iptables, cc and libnetfilter_queue for network namespaces and link faults"))


@pytest.mark.parametrize("cluster", ["loopback", EMULATED])
def test_two_minute_soak_delivers_nothing_wrong_and_never_hangs(tmp_path, cluster):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, "-m", "torch_hoplite.bench.soak", "--nodes", "4", "--minutes", "2", "--seed", "7",
         "--fault-interval", "6", "--cluster", cluster, "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.exists(), run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["wrong_bytes"] == 0, report["operations"]
    assert report["hangs"] == 0, report["hang_records"]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    faults = report["faults_by_kind"]
    assert faults.get("kill", 0) + faults.get("leave", 0) + faults.get("pause", 0) >= 3, faults
    if cluster == "emulated":
        assert all(faults.get(kind, 0) >= 1 for kind in ("partition", "loss", "delay")), faults
    assert all(op["ok"] > 0 for op in report["operations"].values()), report["operations"]
    assert not [f for f in report["faults"] if f["kind"] == "not-exited"], report["faults"]
    assert (out.with_suffix(".png")).exists()
