# Quick start: `make demo` runs the 4-process demo, `make test` runs every test.
# Both install what they need first (torch 2.13.0 CPU if no torch is present,
# build tools, the extension itself).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
SOURCES := $(shell find csrc cuda -name '*.cpp' -o -name '*.h' -o -name '*.inc' -o -name '*.cu' -o -name '*.cuh' 2>/dev/null) setup.py pyproject.toml

.PHONY: setup demo test examples bench bench-p2p bench-collectives bench-recovery bench-gpu fuzz clean

.stamp-deps: Makefile
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -q ninja pytest pytest-timeout "setuptools>=64" wheel
	touch $@

# UCX's headers, so that the UCX transport (torch_hoplite/_transport_ucx*.so) is
# built: Debian's libucx-dev (UCX 1.13 with verbs for RDMA; see docs/architecture.md).
.stamp-ucx-deps: Makefile
	test -f /usr/include/ucp/api/ucp.h || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libucx-dev)
	touch $@

.stamp-build: .stamp-deps .stamp-ucx-deps $(SOURCES)
	HOPLITE_BUILD_UCX=1 MAX_JOBS=2 $(PIP) install -q --no-build-isolation -e .
	touch $@

# nft: the emulated cluster's partitions and loss (the soak, tests/test_partition.py);
# iptables and libnetfilter_queue: its delayed links (bench/link_delay.c).
.stamp-bench-deps: .stamp-deps Makefile
	$(PIP) install -q matplotlib tqdm gymnasium
	command -v mpicc >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev)
	command -v nft >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables)
	command -v iptables >/dev/null && test -f /usr/include/libnetfilter_queue/libnetfilter_queue.h || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables libnetfilter-queue-dev)
	touch $@

# clang with libFuzzer, for make fuzz and the fuzz smoke test of make test.
.stamp-fuzz-deps: Makefile
	command -v clang++ >/dev/null || command -v clang++-14 >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-14)
	touch $@

setup: .stamp-build

demo: setup
	$(PYTHON) examples/demo.py

# The harness's tests (tests/test_bench_cli.py) run it, so its peers are installed too.
test: setup .stamp-bench-deps .stamp-fuzz-deps
	$(PYTHON) -m pytest tests -q -p no:cacheprovider --durations=15

# Every example at a quick size; plots and JSON go to examples/results/.
examples: setup .stamp-bench-deps
	$(PYTHON) examples/demo.py --nodes 3 --size 4MB
	$(PYTHON) examples/parameter_server.py --workers 3 --steps 4 --size 256KB
	$(PYTHON) examples/rl_actor_learner.py
	$(PYTHON) examples/async_ps.py
	$(PYTHON) examples/serving_ensemble.py
	$(PYTHON) examples/dlrm_push_pull.py --check
	$(PYTHON) examples/dlrm_push_pull.py

bench: bench-p2p bench-collectives bench-recovery

bench-p2p: setup .stamp-bench-deps
	$(PYTHON) benchmarks/p2p.py

bench-collectives: setup .stamp-bench-deps
	$(PYTHON) -m torch_hoplite.bench
	$(PYTHON) benchmarks/reduce_kernels.py

bench-recovery: setup .stamp-bench-deps
	$(PYTHON) benchmarks/recovery.py --nodes 8 --size 256MB --trials 9

# CUDA vs CPU transfers and the CUDA reduce kernels (only the cpu rows without a GPU).
bench-gpu: setup .stamp-bench-deps
	$(PYTHON) benchmarks/gpu.py

# libFuzzer on the wire decoder under ASan + UBSan for FUZZ_SECONDS (installs clang if needed),
# from and into the corpus kept in tests/fuzz/corpus/ (make test runs it for 15 s).
FUZZ_SECONDS ?= 60
fuzz: .stamp-fuzz-deps
	tests/fuzz/run.sh $(FUZZ_SECONDS)

clean:
	rm -rf build *.egg-info torch_hoplite/*.so .stamp-*
