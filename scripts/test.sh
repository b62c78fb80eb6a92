#!/usr/bin/env bash
# Installs what the tests need, builds with warnings as errors, and runs every test.
# CUDA tests (label `cuda`) report SKIPPED without a GPU; run them on a GPU machine with
#   ctest --test-dir build -L cuda --output-on-failure
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
export PATH="$PWD/.venv/bin:$PATH"
bash scripts/build.sh -DSHARDTRAIN_WERROR=ON
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader
# tests run two at a time, each with its own OpenMP threads: idle threads that spin in wait take
# the cores the other test needs (the FP8 CPU-twin training test ran 3.6x slower beside a build);
# threads that sleep in wait leave them
export OMP_WAIT_POLICY=PASSIVE
# the safetensors parser under libFuzzer with ASan + UBSan, briefly
bash scripts/fuzz.sh 30
ctest --test-dir build --output-on-failure --timeout 900 -j "$(nproc)"
