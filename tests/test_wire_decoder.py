"""Runs the C++ unit tests of the wire decoder, built with ASan and UBSan."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [
    "tests/cpp/test_wire.cpp",
    "csrc/wire/frame.cpp",
    "csrc/wire/messages.cpp",
    "csrc/common/object_meta.cpp",
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_wire_decoder_rejects_truncated_oversized_and_garbage_frames(tmp_path):
    binary = tmp_path / "test_wire"
    cmd = [
        "g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
        "-I", os.path.join(ROOT, "csrc"), *[os.path.join(ROOT, s) for s in SOURCES], "-o", str(binary),
    ]
    subprocess.run(cmd, check=True, timeout=240)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, env=env)
    sys.stdout.write(run.stdout)
    assert run.returncode == 0, run.stderr
    assert "all checks passed" in run.stdout
