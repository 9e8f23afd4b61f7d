# The two commands: `make run` (the main job) and `make test` (every test). Each works alone on a
# fresh Debian 12 machine: it installs what it needs first.
BUILD ?= build
BUILD_ASAN ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

FUZZ_SECONDS ?= 60
BUILD_FUZZ ?= build-fuzz

.PHONY: run test deps build build-asan test-release test-asan fuzz clean

PYTHON := /usr/bin/python3

# What building and testing need (the fuzzing toolchain comes with `make fuzz`).
deps:
	scripts/install-deps cpp python

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DROTARY_SANITIZE=ON \
	  -DROTARY_BUILD_TOOLS=ON -DROTARY_BUILD_PYTHON=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)

run: build
	mkdir -p out
	$(BUILD)/rotary demo
	$(BUILD)/rotary bench --cases prefill_q,decode --pairings half | tee out/bench.txt
	PYTHONPATH=$(BUILD)/python $(PYTHON) bench/compare_torch.py | tee out/compare_torch.txt
	PYTHONPATH=$(BUILD)/python $(PYTHON) -m rotary.report --cli $(BUILD)/rotary --out out \
	  --extra out/bench.txt out/compare_torch.txt

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	PYTHONPATH=$(BUILD)/python $(PYTHON) -m pytest -q python/tests

test-asan: build-asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(BUILD_ASAN) --output-on-failure -j $(JOBS) -LE no-sanitizer

test: test-release test-asan

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
