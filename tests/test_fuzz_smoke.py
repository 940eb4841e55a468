"""A short libFuzzer run of the wire decoder (ASan + UBSan) from the corpus
kept in tests/fuzz/corpus/: `make fuzz` runs longer and adds what it finds
there. `make test` installs clang for it; without clang++ it is skipped."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLANG = shutil.which("clang++") or shutil.which("clang++-14")
SMOKE_SECONDS = 15


@pytest.mark.skipif(CLANG is None, reason="clang++ with libFuzzer is not installed (make test and make fuzz install it)")
def test_the_wire_decoder_survives_a_short_fuzz_run_from_the_corpus(tmp_path):
    corpus = tmp_path / "corpus"  # a copy: the repository's corpus changes only under `make fuzz`
    shutil.copytree(os.path.join(ROOT, "tests", "fuzz", "corpus"), corpus)
    assert len(os.listdir(corpus)) > 0, "tests/fuzz/corpus is empty"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run(["sh", "tests/fuzz/run.sh", str(SMOKE_SECONDS), str(corpus)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Done" in proc.stderr and "stat::number_of_executed_units" in proc.stderr, proc.stderr[-2000:]
