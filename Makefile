# Thin wrapper over CMake. `make run` and `make test` work on a fresh machine: they install
# what is missing (Debian packages only), build, then serve or test.
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PY ?= /usr/bin/python3

# The container image (deploy/image/build.sh): its binaries and the embedded model's store.
IMAGE_TARGETS = pw-router pw-prefill pw-decode pw-broker pw-cluster pw-ctl pw-quantize pw-loadgen tiny_store
IMAGE ?=

.PHONY: all deps build test test-kube image test-unit test-asan test-tsan run demo eval-data bench fuzz soak venv format clean tiny-next venv-next

all: build

deps:
	@bash tools/install_deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Held-out evaluation text: the exact text of tests/fixtures/heldout.json, rebuilt from the
# manifest tests/fixtures/heldout_docs.json (pinned C/Python documents, the others extracted
# from Debian packages that point releases do not change, each checked by sha256).
eval-data: deps
	$(PY) tools/corpus.py heldout --out $(BUILD)/eval/heldout.txt

test: build eval-data
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900 -LE kube

# The Helm chart run by `podman kube play` on the image (tests/e2e/kube_play_test.py).
test-kube: image
	cd $(BUILD) && ctest --output-on-failure -L kube

# Unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (lean: no CUDA, no benchmarks;
# only the binaries labelled `unit`, the target unit-tests). Built by clang: its ASan+UBSan
# compiles a translation unit in about 0.6x of GCC's time at the same -O1 -g1 (docs/testing.md).
ASAN_CC ?= clang
ASAN_CXX ?= clang++
test-asan: eval-data
	@bash tools/install_deps.sh sanitize
	CC=$(ASAN_CC) CXX=$(ASAN_CXX) cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DPW_SANITIZE=address,undefined -DPW_CUDA=OFF -DPW_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target unit-tests
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -L unit --timeout 900

# The concurrent parts under ThreadSanitizer (thread pool, control plane, UCX progress thread,
# router I/O threads, multi-threaded engine: the binaries labelled `tsan`, the target
# tsan-tests). UCX's malloc/mmap hooks are turned off (they clash with TSan's interceptors);
# tools/tsan.supp lists what is suppressed and why.
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DPW_SANITIZE=thread -DPW_CUDA=OFF -DPW_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target tsan-tests
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tools/tsan.supp" \
	  UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no \
	  ctest --output-on-failure -j $(JOBS) -L tsan --timeout 900

# The container image from Debian packages (mmdebstrap + podman import): deploy/image/build.sh,
# docs/deploy.md. IMAGE=name:tag names it (default localhost/pagedweight:<git describe>).
image: deps $(BUILD)/build.ninja
	@bash tools/install_deps.sh image
	cmake --build $(BUILD) -j $(JOBS) --target $(IMAGE_TARGETS)
	bash deploy/image/build.sh $(BUILD) $(IMAGE)

run: build
	bash tools/run_local.sh $(BUILD)

# The local node, a real Prometheus on loopback and 60 s of bursty load; results in out/.
demo: build
	bash tools/demo.sh $(BUILD)

bench: build
	$(BUILD)/bin/pw-bench-engine

fuzz:
	bash tools/fuzz.sh

# Fault soak: a node under steady bursty load while a random process (router excepted) is
# SIGKILLed or SIGSTOPped every ~20 s; SOAK_SECONDS long (tests/e2e/soak_test.py).
SOAK_SECONDS ?= 240
soak: build
	$(PY) tests/e2e/soak_test.py $(BUILD) models/tiny-moe --seconds $(SOAK_SECONDS); \
	  rc=$$?; if [ $$rc -eq 77 ]; then echo "soak skipped (no weights)"; rc=0; fi; exit $$rc

venv:
	bash tools/setup_venv.sh

# tiny-next (docs/model-card.md): the qwen3_next-architecture model with 512 experts, trained
# from scratch on tiny-moe's corpus with tiny-moe's tokenizer, then scored on the held-out text
# by HF and by the engine (paired), then its any-precision store. Needs a Python with torch and
# transformers >= 5 (TINY_NEXT_PY; `make venv-next` makes one). Training saves its state every
# 50 steps and a second `make tiny-next` continues from it.
TINY_NEXT ?= $(BUILD)/tiny-next
TINY_NEXT_PY ?= .venv-next/bin/python
TINY_NEXT_STEPS ?= 900
TINY_NEXT_THREADS ?= 2
tiny-next: deps eval-data $(BUILD)/build.ninja
	$(PY) tools/corpus.py train --out corpus/train.txt
	$(TINY_NEXT_PY) tools/train_tiny_moe.py check-moe --arch qwen3_next
	$(TINY_NEXT_PY) tools/train_tiny_moe.py model --arch qwen3_next --tokenizer-from models/tiny-moe \
	  --corpus corpus/train.txt --out $(TINY_NEXT) --seed 1234 --steps $(TINY_NEXT_STEPS) --threads $(TINY_NEXT_THREADS) \
	  --log-every 5 --log $(TINY_NEXT)/loss.csv --resume
	$(TINY_NEXT_PY) tools/train_tiny_moe.py heldout --out $(TINY_NEXT) --heldout $(BUILD)/eval/heldout.txt \
	  --threads 1 --nll-out $(TINY_NEXT)/heldout-hf.nll
	cmake --build $(BUILD) -j $(JOBS) --target pw-eval pw-quantize
	$(BUILD)/bin/pw-eval ppl --model $(TINY_NEXT) --text $(BUILD)/eval/heldout.txt --ctx 256 \
	  --threads 2 --nll-out $(TINY_NEXT)/heldout-engine.nll
	$(PY) tools/compare_nll.py $(TINY_NEXT)/heldout-hf.nll $(TINY_NEXT)/heldout-engine.nll
	$(BUILD)/bin/pw-quantize --model $(TINY_NEXT) --calib-random-tokens 32768 --calib-seed 1 \
	  --threads 2 --quiet --out $(TINY_NEXT).apw

venv-next:
	python3 -m venv .venv-next
	.venv-next/bin/pip install -q -r tools/requirements-next.txt

format:
	find common kernels services tools tests bench loadgen -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
