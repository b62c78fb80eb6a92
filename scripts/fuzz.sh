#!/usr/bin/env bash
# Runs the safetensors libFuzzer target (clang, ASan + UBSan) for SECONDS (default 30),
# seeded with the shared sample files when present. Exits non-zero when the fuzzer finds
# a crash, a sanitizer error or an unexpected exception (the input is saved under build-fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
mkdir -p build-fuzz/corpus
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc \
  tests/io/fuzz/safetensors_fuzz.cpp src/io/safetensors.cpp src/core/error.cpp src/core/dtype.cpp \
  src/core/tensor.cpp src/core/allocator.cpp -o build-fuzz/safetensors_fuzz
if [ -d ../shared/data/safetensors_samples ]; then cp ../shared/data/safetensors_samples/*.safetensors build-fuzz/corpus/; fi
cd build-fuzz
./safetensors_fuzz -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 corpus 2>&1 | tail -12
