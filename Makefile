# The two commands: `make run` (the main job) and `make test` (every test). Each works alone on a
# fresh Debian 12 machine: it installs what it needs first.
BUILD ?= build
BUILD_ASAN ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: run test deps build build-asan test-release test-asan clean

deps:
	scripts/install-deps cpp

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DROTARY_SANITIZE=ON \
	  -DROTARY_BUILD_TOOLS=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)

run: build
	$(BUILD)/rotary demo
	$(BUILD)/rotary bench --cases prefill_q,decode --pairings half

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-asan: build-asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(BUILD_ASAN) --output-on-failure -j $(JOBS) -LE no-sanitizer

test: test-release test-asan

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)
