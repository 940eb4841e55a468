#!/bin/sh
# Builds the wire-decoder fuzz target with libFuzzer + ASan + UBSan and runs it
# for a bounded time over the corpus kept in the repository (tests/fuzz/corpus/,
# where what it finds is added, so each run starts from the earlier ones').
# Usage: tests/fuzz/run.sh [seconds] [corpus dir]   (defaults: 60, tests/fuzz/corpus)
set -eu
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
corpus="${2:-tests/fuzz/corpus}"
CXX="$(command -v clang++ || command -v clang++-14 || true)"
if [ -z "$CXX" ]; then
  echo "no clang++ with libFuzzer: make fuzz installs it" >&2
  exit 1
fi
out="${TMPDIR:-/tmp}/hoplite-fuzz"
mkdir -p "$out" "$corpus"
"$CXX" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Icsrc \
  tests/fuzz/fuzz_wire.cpp csrc/wire/frame.cpp csrc/wire/messages.cpp csrc/common/object_meta.cpp \
  -o "$out/fuzz_wire"
"$out/fuzz_wire" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$corpus"
