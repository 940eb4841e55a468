"""Builds and runs a C++ unit test binary under AddressSanitizer and UBSan."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_and_run(tmp_path, name: str, sources: list[str]) -> None:
    binary = tmp_path / name
    cmd = [
        "g++", "-std=c++20", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
        "-I", os.path.join(ROOT, "csrc"), *[os.path.join(ROOT, s) for s in sources], "-o", str(binary),
    ]
    subprocess.run(cmd, check=True, timeout=300)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, env=env)
    sys.stdout.write(run.stdout)
    assert run.returncode == 0, run.stderr
    assert "all checks passed" in run.stdout
