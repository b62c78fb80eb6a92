#!/usr/bin/env bash
# Configures and builds shardtrain into build/ (Release; CUDA backend when nvcc is found).
# Extra arguments go to cmake's configure step, e.g. -DSHARDTRAIN_CUDA=OFF.
# SHARDTRAIN_BUILD_TARGETS="shardtrain ..." builds only those targets (and what they need).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > build.log 2>&1 || { cat build.log; exit 1; }
targets=()
for t in ${SHARDTRAIN_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build build --parallel "$(nproc)" "${targets[@]}"
