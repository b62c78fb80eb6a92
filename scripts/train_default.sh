#!/usr/bin/env bash
# The main job from scratch: installs what is needed, builds, and runs the built-in default
# training run (a small Llama on Debian's fortunes corpus, CPU when there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec ./build/shardtrain train "$@"
