#!/usr/bin/env bash
# Runs the GPU test suite on a machine with a CUDA device: configures a CUDA build, builds the
# kernels and their tests, and runs every test labelled `gpu` (they skip where no GPU exists).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPW_CUDA=ON -DPW_BUILD_BENCH=OFF
cmake --build "$BUILD" -j "$(nproc)" --target dense_cuda_test op_backend_cuda_test
cd "$BUILD" && ctest --output-on-failure -L gpu
