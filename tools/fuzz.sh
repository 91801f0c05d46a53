#!/usr/bin/env bash
# Builds the libFuzzer targets in build-fuzz (clang, ASan + UBSan, libraries instrumented for
# coverage) and runs each for a bounded time: the long run. `make fuzz` calls it. (CI runs every
# target for a few seconds without libFuzzer instead: the `fuzz_smoke_*` tests, fuzz/CMakeLists.txt.)
#
#   tools/fuzz.sh [seconds-per-target (default 60)] [target ...]
#
# Seeds come from small generated files and the repository's fixtures; the growing corpus is
# kept in build-fuzz/corpus/<target>/ between runs, crash reproducers in build-fuzz/artifacts/.
# fuzz/lsan.supp: blocks allocated inside UCX (the worker targets) are not reported as leaks.
# Exit status: non-zero if any target found a crash, leak or timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
shift || true
BUILD=${FUZZ_BUILD:-build-fuzz}
ALL=(safetensors_header_fuzz config_fuzz tokenizer_encode_fuzz tokenizer_json_fuzz
     apw_store_fuzz control_frame_fuzz openai_request_fuzz http_request_fuzz
     router_cluster_backend_fuzz decode_worker_handlers_fuzz prefill_worker_handlers_fuzz)
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then TARGETS=("${ALL[@]}"); fi

CXX_BIN=$(command -v clang++ || command -v clang++-14 || true)
C_BIN=$(command -v clang || command -v clang-14 || true)
if [ -z "$CXX_BIN" ] || [ -z "$C_BIN" ]; then
  echo "fuzz.sh: clang is not installed (apt-get install clang)" >&2
  exit 2
fi
if [ ! -f models/tiny-moe/tokenizer.json ]; then
  echo "fuzz.sh: models/tiny-moe missing; skipping the tokenizer and worker targets" >&2
  TARGETS=($(printf '%s\n' "${TARGETS[@]}" | grep -v -e '^tokenizer' -e '_worker_handlers_fuzz$' || true))
fi

SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ ! -f "$BUILD/build.ninja" ]; then
  CC="$C_BIN" CXX="$CXX_BIN" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPW_FUZZ=ON -DPW_CUDA=OFF -DPW_BUILD_BENCH=OFF \
    -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
fi
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}" \
  $(printf '%s_smoke ' "${TARGETS[@]}")

# Seeds.
SEEDS="$BUILD/seeds"
mkdir -p "$SEEDS"/{safetensors_header_fuzz,config_fuzz,tokenizer_encode_fuzz,tokenizer_json_fuzz}
# The seeds a target builds itself (a valid .apw store, well-formed frames and requests).
for t in "${TARGETS[@]}"; do
  "$BUILD/bin/${t}_smoke" --write-seeds "$SEEDS/$t" > /dev/null
  # Inputs that once failed (fuzz/corpus/<target>/, also replayed by the smoke tests).
  if [ -d "fuzz/corpus/$t" ]; then cp fuzz/corpus/"$t"/* "$SEEDS/$t/"; fi
done
/usr/bin/python3 - "$SEEDS" <<'PY'
import json, os, struct, sys, glob
out = sys.argv[1]
def st(name, header, data):
    h = json.dumps(header).encode()
    open(os.path.join(out, "safetensors_header_fuzz", name), "wb").write(
        struct.pack("<Q", len(h)) + h + data)
st("one", {"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}, bytes(12))
st("two", {"__metadata__": {"format": "pt"},
           "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "I64", "shape": [], "data_offsets": [8, 16]}}, bytes(16))
st("empty", {}, b"")
for i, p in enumerate(sorted(glob.glob("tests/fixtures/models/*/config.json"))):
    open(os.path.join(out, "config_fuzz", f"cfg{i}"), "wb").write(b"\x01" + open(p, "rb").read())
open(os.path.join(out, "config_fuzz", "yaml"), "wb").write(
    b"\x00router:\n  port: 8000\nworkers:\n  - {kind: decode, port: 9001, ratio: 0.25}\n"
    b"bits: {a: 3}\nnested: [[x, y], [z]]\n")
for i, s in enumerate(["Hello, world!", "  spaces\tand\ttabs\n\n", "caf\u00e9 \U0001F600 \u4e2d\u6587",
                       "def f(x):\n    return x + 1\n", "<|endoftext|>", ""]):
    open(os.path.join(out, "tokenizer_encode_fuzz", f"s{i}"), "wb").write(s.encode())
mini = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3}, "merges": ["a b"]}}
open(os.path.join(out, "tokenizer_json_fuzz", "mini"), "w").write(json.dumps(mini))
PY

mkdir -p "$BUILD/artifacts"
failed=()
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$t"
  mkdir -p "$corpus"
  extra=()
  if [ "$t" = safetensors_header_fuzz ]; then extra+=(-dict=fuzz/safetensors.dict); fi
  if [ "$t" = tokenizer_json_fuzz ]; then extra+=(-max_len=65536); fi
  echo "== $t for ${SECS}s"
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
      LSAN_OPTIONS=suppressions=fuzz/lsan.supp \
      "$BUILD/bin/$t" "$corpus" "$SEEDS/$t" -max_total_time="$SECS" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" \
      "${extra[@]}" 2>"$BUILD/$t.log"; then
    failed+=("$t")
    tail -40 "$BUILD/$t.log" >&2
  else
    grep -E "stat::number_of_executed_units|cov:" "$BUILD/$t.log" | tail -2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (reproducers in $BUILD/artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: all targets ran ${SECS}s without a crash"
