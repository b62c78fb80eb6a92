#!/usr/bin/env bash
# The main job from scratch: installs what is needed, builds the `shardtrain` program (not the
# tests or benchmarks), and runs the built-in default training run (a small Llama on Debian's
# fortunes corpus, CPU when there is no GPU) in runs/default, starting it over when an earlier
# default run is there. Arguments go to `shardtrain train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SHARDTRAIN_BUILD_TARGETS=shardtrain bash scripts/build.sh
exec ./build/shardtrain train --run.overwrite=true "$@"
