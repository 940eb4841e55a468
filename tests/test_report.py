"""The README's performance figures are the committed results'."""

import os
import subprocess
import sys

from torch_hoplite.bench import report


def test_the_readme_figures_are_generated_from_the_committed_results():
    with open(report.README) as f:
        block = report.readme_block(f.read())
    assert block is not None, "README.md lost its report markers"
    assert block == report.render(), "README.md differs from the results: python -m torch_hoplite.bench.report --write"


def test_the_check_fails_when_the_readme_drifts(tmp_path, monkeypatch):
    with open(report.README) as f:
        text = f.read()
    drifted = tmp_path / "README.md"
    drifted.write_text(text.replace(report.END, "| a figure someone typed in |\n" + report.END))
    monkeypatch.setattr(report, "README", str(drifted))
    assert report.main(["--check"]) == 1
    assert report.main(["--write"]) == 0
    assert report.main(["--check"]) == 0
    assert drifted.read_text() == text


def test_every_result_file_it_reads_is_in_the_repository():
    named = [report.PEERS, report.SAME_HOST, report.P2P, report.RPC, report.WORKLOADS, report.DLRM_SERVING]
    missing = [n for n in named if not os.path.exists(os.path.join(report.RESULTS, n))]
    assert not missing, f"not in benchmarks/results: {missing}"


def test_the_command_prints_the_block():
    out = subprocess.run([sys.executable, "-m", "torch_hoplite.bench.report"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out == report.render()
