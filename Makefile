# Thin wrapper over CMake + ctest. `make run` and `make test` install missing
# Debian packages first (scripts/install-deps.sh), so a fresh machine needs nothing else.
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)

.PHONY: all deps build asan tsan test test-full mutate run bench fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j$(JOBS) -- --no-print-directory

# Unit tests once more under AddressSanitizer + UndefinedBehaviorSanitizer.
asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTRILL_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS) -- --no-print-directory

# The threaded code (async executors, the weight channel, the run handle's cancel, trill serve's
# HTTP threads and workers) under ThreadSanitizer: only what those tests need is built.
tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTRILL_TSAN=ON >/dev/null
	@cmake --build $(TSAN_BUILD) -j$(JOBS) --target trill test_channel test_run_handle svc_ref -- --no-print-directory

# Two tests at a time on 2 cores (the suite's tests wait on events, never on wall time).
# scripts/test.sh times each stage and prints the stages and the 10 slowest tests at the end.
# make test: the builds and the tests but those labelled "full", the parity sweeps sampled
# (budget: 10 minutes on an idle 2-core machine); make test-full: everything, the sweeps whole.
test:
	@BUILD=$(BUILD) ASAN_BUILD=$(ASAN_BUILD) TSAN_BUILD=$(TSAN_BUILD) JOBS=$(JOBS) bash scripts/test.sh default

test-full:
	@BUILD=$(BUILD) ASAN_BUILD=$(ASAN_BUILD) TSAN_BUILD=$(TSAN_BUILD) JOBS=$(JOBS) bash scripts/test.sh full

# The tests' own check (scripts/mutate.sh): plants each bug of its list, one at a time, and runs the
# tests named for it; every one must be caught (about 25 minutes on 2 cores; in neither test target).
mutate: build
	@bash scripts/mutate.sh $(BUILD)

run: build
	@bash scripts/run-demo.sh $(BUILD)/trill

bench: build
	@bash bench/run.sh $(BUILD)

fuzz: deps
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTRILL_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j$(JOBS) --target fuzz_safetensors fuzz_config fuzz_tokenizer_json fuzz_tokenizer_encode \
		fuzz_service_request fuzz_tiktoken_pattern
	@echo "fuzzers in $(FUZZ_BUILD)/tests/fuzz; run e.g. $(FUZZ_BUILD)/tests/fuzz/fuzz_safetensors -max_total_time=60 tests/fuzz/corpus/safetensors"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(TSAN_BUILD)
