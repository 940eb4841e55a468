"""The README's figures and benchmarks/README.md's tables are the committed results'."""

import os
import shutil
import subprocess
import sys

import pytest

from torch_hoplite.bench import report


@pytest.mark.parametrize("attr,name,make", report.BLOCKS, ids=[f"{a}:{n}" for a, n, _ in report.BLOCKS])
def test_every_block_is_generated_from_the_committed_results(attr, name, make):
    path = getattr(report, attr)
    with open(path) as f:
        block = report.file_block(f.read(), name)
    assert block is not None, f"{path} lost the markers of block {name!r}"
    assert block == report.block_text(make), f"{path}'s block {name!r} differs: python -m torch_hoplite.bench.report --write"


def test_the_check_fails_when_a_file_drifts(tmp_path, monkeypatch):
    copies = {}
    for attr in {a for a, _, _ in report.BLOCKS}:
        copies[attr] = tmp_path / attr
        shutil.copy(getattr(report, attr), copies[attr])
        monkeypatch.setattr(report, attr, str(copies[attr]))
    original = copies["BENCH_README"].read_text()
    # A figure typed into the last block of benchmarks/README.md.
    end = report.end_marker(report.BLOCKS[-1][1])
    copies["BENCH_README"].write_text(original.replace(end, "| a figure someone typed in |\n" + end))
    assert report.main(["--check"]) == 1
    assert report.main(["--write"]) == 0
    assert report.main(["--check"]) == 0
    assert copies["BENCH_README"].read_text() == original


def test_a_lost_marker_is_named(tmp_path, monkeypatch, capsys):
    copy = tmp_path / "README.md"
    copy.write_text(open(report.README).read().replace(report.end_marker("how-fast"), ""))
    monkeypatch.setattr(report, "README", str(copy))
    assert report.main(["--check"]) == 1
    assert "how-fast" in capsys.readouterr().err


def test_every_result_file_it_reads_is_in_the_repository():
    """Committed, not just on this disk (a file missing here fails every block's test already)."""
    if not os.path.exists(os.path.join(report.ROOT, ".git")):
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=report.RESULTS, capture_output=True, text=True, check=True)
    tracked = set(listed.stdout.split("\0"))
    untracked = [n for n in report.result_files() if n not in tracked]
    assert not untracked, f"not committed under benchmarks/results: {untracked}"


def test_the_command_prints_every_block():
    out = subprocess.run([sys.executable, "-m", "torch_hoplite.bench.report"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out == report.render()
    for attr, name, _ in report.BLOCKS:
        assert f"== {os.path.basename(getattr(report, attr))}: {name} ==" in out


def test_milliseconds_are_rounded_to_three_digits_without_an_exponent():
    assert [report._ms3(ms / 1000) for ms in (0.5404, 26.0, 147.6, 1011.55, 1271.66)] == \
        ["0.54 ms", "26 ms", "148 ms", "1012 ms", "1272 ms"]
