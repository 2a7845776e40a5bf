# Strata: `make run` installs what is missing, builds, runs the default suite on this machine and writes
# HDF5 results and plots; `make test` installs, builds and runs every test. See README.md.
BUILD      ?= build
SAN_BUILD  ?= build-sanitize
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
PYTHON     ?= python3
PREFIX     ?= /usr/local

.PHONY: all deps build install run test test-unit test-integration test-sanitize bench micro gpu-check gpu-bundle clean

all: build

deps:
	@scripts/install-deps.sh

# Quiet: no per-file or per-target lines and no directory chatter; compiler warnings and errors still show.
QUIET_CMAKE = -DCMAKE_RULE_MESSAGES=OFF -DCMAKE_TARGET_MESSAGES=OFF

build: deps
	@echo "[build] $(BUILD) (Release, $(JOBS) jobs)"
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(QUIET_CMAKE) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

# Programs and commands in PREFIX/bin, what they read and the sbatch templates in PREFIX/share/strata.
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX) >/dev/null && echo "[install] $(PREFIX)"

run: build
	@STRATA_BUILD_DIR=$(BUILD) scripts/run-local.sh

test: build
	@$(MAKE) --no-print-directory test-unit test-integration test-sanitize

test-unit:
	@cd $(BUILD) && ctest --output-on-failure

test-integration:
	@STRATA_BUILD_DIR=$(abspath $(BUILD)) $(PYTHON) -m pytest -q tests/integration

# The same tests against an AddressSanitizer + UndefinedBehaviorSanitizer build (CPU code; the CUDA
# sources are compiled in the main build). It is also the portable build (no -march=native), so the code paths
# a binary built for another CPU takes are compiled and tested too.
test-sanitize:
	@echo "[build] $(SAN_BUILD) (AddressSanitizer + UndefinedBehaviorSanitizer, portable: STRATA_NATIVE=OFF)"
	@cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=address,undefined -DSTRATA_CUDA=OFF -DSTRATA_NATIVE=OFF \
	  $(QUIET_CMAKE) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(SAN_BUILD) -j $(JOBS) -- --no-print-directory
	@cd $(SAN_BUILD) && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure

# Benchmarks print their figures against their targets; each exits 3 when one misses. All run, then the
# target fails if any missed.
bench: build
	@scripts/install-deps.sh --pytorch
	@missed=0; \
	$(BUILD)/strata-bench-cpu-gemm || missed=1; \
	$(BUILD)/strata-bench-gemm-overhead || missed=1; \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
	  $(BUILD)/strata-bench-collectives || missed=1; \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 4 \
	  $(BUILD)/strata-bench-collectives || missed=1; \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
	  $(BUILD)/strata-bench-shm || missed=1; \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 4 \
	  $(BUILD)/strata-bench-horing || missed=1; \
	$(BUILD)/strata-bench-attention || missed=1; \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
	  $(BUILD)/strata-bench-attention || missed=1; \
	$(BUILD)/strata-bench-step || missed=1; \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
	  $(BUILD)/strata-bench-step || missed=1; \
	python3 scripts/bench/step_vs_pytorch.py --build $(BUILD) || missed=1; \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
	  $(BUILD)/strata-bench-pipeline || missed=1; \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 4 \
	  $(BUILD)/strata-bench-pipeline || missed=1; \
	$(BUILD)/strata-project search --system project/systems/a100-80gb-sxm-hdr200.json --bench || missed=1; \
	$(BUILD)/strata-project speed || missed=1; \
	$(BUILD)/strata-project validate --published project/published/steps.json --part held-out --bench -q \
	  -O $(BUILD)/published-validation.h5 || missed=1; \
	exit $$missed

# On a GPU node: every GPU test, GEMM, attention, collective and step measured beside PyTorch, one summary
# (scripts/gpu/check.sh; GPU_CHECK_ARGS e.g. --budget 900 --out DIR). gpu-bundle packs the programs and the
# libraries a GPU machine without MPI or HDF5 needs (scripts/gpu/bundle.sh).
gpu-check: build
	@scripts/gpu/check.sh --build $(BUILD) $(GPU_CHECK_ARGS)

gpu-bundle:
	@scripts/gpu/bundle.sh

micro: build
	@$(BUILD)/strata-micro

clean:
	rm -rf $(BUILD) $(SAN_BUILD)
