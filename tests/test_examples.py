"""The examples run and check their own results."""

import os
import subprocess
import sys

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
    out = run_example("demo.py", "--nodes", "3", "--size", "4MB")
    assert "warm: buffers reused from the pool" in out and "broadcast" in out
    assert "read from the other processes' memory" in out
