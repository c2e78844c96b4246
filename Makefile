# The README's commands. Every target installs what is missing first (scripts/bootstrap).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all bootstrap configure build test demo bench gpu-check cuda-compile-check sanitize tsan fuzz format clean

all: build

bootstrap:
	@scripts/bootstrap

configure: bootstrap
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The slowest tests are printed at the end, failed run or not (scripts/slowest-tests). Builds what
# the tests run (the pipetrain_tests target), not the benchmarks: `make build` builds those.
test: configure
	@cmake --build $(BUILD) -j $(JOBS) --target pipetrain_tests
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS); status=$$?; \
	  cd $(CURDIR) && scripts/slowest-tests $(BUILD) 15; exit $$status

demo: build
	@scripts/demo $(BUILD)

bench: build
	@$(BUILD)/pipetrain bench --suite mlp

# On a machine with a GPU: a CUDA build of what it runs (configure fails without CUDA), the CUDA
# tests (tests/runtime/cuda_test.cpp: stages on one GPU and on CPU+GPU against sequential
# training, 2 ranks sharing a GPU over Gloo, NCCL refusing them by name, 2 GPUs over NCCL when
# there are two; tests/train: fp16 with loss scaling; tests/models: the Llama model's stages on
# one GPU against sequential training, fp32 and bf16), the GPU overhead bench (a small model,
# where launches dominate, and a compute-bound one), and tokens/s and MFU of a Llama-3.2-1B-shaped
# model for pipetrain and for transformers' own loop (scripts/gpu-mfu). A machine that reaches no package registry
# sets PIPETRAIN_DEPS (a folder made here by scripts/gpu-deps) and PIPETRAIN_PYTHON (its torch).
gpu-check:
	@nvidia-smi -L >/dev/null 2>&1 || { echo "gpu-check: no GPU visible (nvidia-smi -L failed); run it on a GPU machine" >&2; exit 2; }
	@$(MAKE) --no-print-directory configure CMAKE_FLAGS="-DPIPETRAIN_CUDA=ON $(CMAKE_FLAGS)"
	@cmake --build $(BUILD) -j $(JOBS) --target pipetrain tests_runtime tests_train tests_models pipetrain_rank_helper bench_pipe_overhead
	@cd $(BUILD) && ctest --output-on-failure -R '^Cuda' $(CTEST_FLAGS)
	@$(BUILD)/bench/bench_pipe_overhead 9 2 cuda:0
	@$(BUILD)/bench/bench_pipe_overhead 9 4 cuda:0 4096 4096
	@scripts/gpu-mfu $(BUILD)

# Where no GPU is visible the default build leaves the CUDA paths out (cmake/PinnedTorch.cmake):
# this compiles them anyway -- a CUDA configure of build-cuda, then only its *_cuda.cpp objects --
# so that CI sees them compile without a GPU. `make gpu-check` builds and runs them on one.
cuda-compile-check: bootstrap
	@cmake -S . -B build-cuda -G Ninja -DPIPETRAIN_CUDA=ON $(CMAKE_FLAGS) >/dev/null
	@objects=$$(cd build-cuda && ninja -t targets all | grep -o '^[^:]*_cuda\.cpp\.o' | sort -u); \
	  test -n "$$objects" || { echo "cuda-compile-check: no *_cuda.cpp objects in build-cuda" >&2; exit 1; }; \
	  cmake --build build-cuda -j $(JOBS) --target $$objects && echo "cuda-compile-check: compiled $$objects"

# ASan + UBSan build of everything, then the whole suite.
sanitize:
	@$(MAKE) --no-print-directory test BUILD=build-asan CMAKE_FLAGS="-DPIPETRAIN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"

# ThreadSanitizer build for the threaded runtime and the offload I/O engines. LibTorch is not
# instrumented: tests/tsan.supp says which of its internals are suppressed and why.
tsan:
	@TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)" $(MAKE) --no-print-directory test BUILD=build-tsan CMAKE_FLAGS="-DPIPETRAIN_TSAN=ON -DCMAKE_BUILD_TYPE=Debug" CTEST_FLAGS="-L 'runtime|stage|transport|offload'"

# libFuzzer over the readers of user files and peer messages (fuzz/), FUZZ_SECONDS (60) each.
fuzz:
	@scripts/fuzz

format:
	@git ls-files '*.h' '*.cpp' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) build-asan build-tsan build-fuzz build-fuzz-torch build-cuda
