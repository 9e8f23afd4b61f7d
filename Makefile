# The two commands: `make run` (the main job) and `make test` (every test). Each works alone on a
# fresh Debian 12 machine: it installs what it needs first.
BUILD ?= build
BUILD_ASAN ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

FUZZ_SECONDS ?= 60
BUILD_FUZZ ?= build-fuzz

.PHONY: run test bench deps build build-asan test-release test-asan test-python python-install fuzz clean

PYTHON := /usr/bin/python3
# The Python environment of `make test` and `make run`: Debian's CPython with every package from
# PyPI at the versions pinned in python/requirements-test.txt (torch brings its CUDA libraries:
# about 3 GB to download, 6 GB installed, once per build tree).
VENV := $(BUILD)/venv
VENV_PYTHON := $(VENV)/bin/python
PY_REQUIREMENTS := python/requirements-test.txt
PIP := $(VENV_PYTHON) -m pip --disable-pip-version-check

# nvcc, where CMake's ROTARY_CUDA=AUTO finds it (PATH, or the toolkit's standard place).
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

# What building and testing need (the fuzzing toolchain comes with `make fuzz`); with nvcc, also
# cuobjdump and nvdisasm for the SASS check of the CUDA kernels (pinned, from PyPI, into
# $(BUILD)/cuda-tools, where CMake finds them).
deps:
	scripts/install-deps cpp python
ifneq ($(NVCC),)
	scripts/get-cuobjdump $(BUILD)/cuda-tools
endif

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DROTARY_SANITIZE=ON \
	  -DROTARY_BUILD_TOOLS=ON -DROTARY_BUILD_PYTHON=OFF -DROTARY_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)

run: build python-install
	mkdir -p out
	$(BUILD)/rotary-dev demo
	$(BUILD)/rotary-dev bench --cases prefill_q,decode --pairings half | tee out/bench.txt
	$(VENV_PYTHON) bench/compare_torch.py | tee out/compare_torch.txt
	$(VENV_PYTHON) -m rotary.report --cli $(BUILD)/rotary-dev --out out \
	  --extra out/bench.txt out/compare_torch.txt

# The speed figures of record: every bench row (ratios to memcpy, floors, targets) and the peers
# (transformers' eager formula, torch.compile of it, ONNX Runtime's RotaryEmbedding operators).
bench: build python-install
	mkdir -p out
	$(BUILD)/rotary-dev bench --json --threads 1,2 --reps 15 | tee out/bench.json
	$(BUILD)/rotary-dev bench --json --threads 1,2 --reps 15 --cases rerotate,switch | tee out/bench-keys.json
	$(VENV_PYTHON) bench/compare_peers.py | tee out/compare_peers.txt

# The venv, filled once per change of the requirements file (quick when nothing changed).
$(VENV)/requirements.stamp: $(PY_REQUIREMENTS) | deps
	test -x $(VENV_PYTHON) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --progress-bar off -r $(PY_REQUIREMENTS)
	touch $@

# `pip install .` into the venv, with the pinned build backend already there (no build isolation);
# CMake's tree is kept in $(BUILD)/wheel, so a rerun rebuilds only what changed.
python-install: $(VENV)/requirements.stamp
	CMAKE_ARGS="$(CMAKE_FLAGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	  $(PIP) install --no-build-isolation --no-deps --config-settings=build-dir=$(BUILD)/wheel .

# pytest against the installed package (tests/test_package.py checks that rotary is the venv's).
test-python: python-install
	ROTARY_EXPECT_INSTALLED=1 $(VENV)/bin/pytest -q -p no:cacheprovider python/tests tests/conformance

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-asan: build-asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(BUILD_ASAN) --output-on-failure -j $(JOBS) -LE no-sanitizer

test: test-release test-python test-asan

# libFuzzer runs of the config, .npy and .safetensors readers from the committed seed corpus.
fuzz:
	scripts/install-deps fuzz
	cmake -S tests/fuzz -B $(BUILD_FUZZ) -G Ninja -DCMAKE_CXX_COMPILER=clang++
	cmake --build $(BUILD_FUZZ) -j $(JOBS)
	for target in config npy safetensors; do \
	  mkdir -p $(BUILD_FUZZ)/corpus-$$target && \
	  $(BUILD_FUZZ)/fuzz_$$target -max_total_time=$(FUZZ_SECONDS) -max_len=1048576 -timeout=10 \
	    -print_final_stats=1 $(BUILD_FUZZ)/corpus-$$target tests/fuzz/corpus/$$target || exit 1; \
	done

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
