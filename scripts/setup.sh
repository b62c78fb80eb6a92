#!/usr/bin/env bash
# Installs what shardtrain needs on Debian 12 (idempotent): compilers, libraries, test tools,
# and the default training corpus (Debian's `fortunes` package, plain English text).
# With --tests it also makes .venv/ with the PyPI packages that cross-check tests use.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev libopenblas-openmp-dev libomp-dev
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
  libzstd-dev zlib1g-dev
  libgtest-dev libgmock-dev clang libclang-rt-14-dev clang-format
  openmpi-bin libopenmpi-dev
  fortunes
  python3 python3-venv
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "shardtrain setup: installing ${missing[*]}"
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "shardtrain setup: all Debian packages present"
fi

here="$(cd "$(dirname "$0")/.." && pwd)"

# The CUDA backend's attention uses cuDNN's graph API through the header-only cudnn-frontend,
# which Debian does not package: take its headers from the PyPI wheel that carries them.
frontend_version=1.32.0
frontend_dir="$here/.deps/cudnn-frontend-$frontend_version"
if { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } && [ ! -f "$frontend_dir/include/cudnn_frontend.h" ]; then
  echo "shardtrain setup: fetching cudnn-frontend $frontend_version headers from PyPI"
  if [ ! -x "$here/.deps/venv/bin/pip" ]; then python3 -m venv "$here/.deps/venv"; fi
  rm -rf "$here/.deps/wheels" && mkdir -p "$here/.deps/wheels"
  "$here/.deps/venv/bin/pip" download -q --disable-pip-version-check --no-deps \
    -d "$here/.deps/wheels" "nvidia-cudnn-frontend==$frontend_version"
  rm -rf "$frontend_dir.tmp" && mkdir -p "$frontend_dir.tmp"
  "$here/.deps/venv/bin/python3" - "$here/.deps/wheels" "$frontend_dir.tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
  rm -rf "$frontend_dir" && mv "$frontend_dir.tmp" "$frontend_dir"
fi

if [ "${1:-}" = "--tests" ]; then
  if [ ! -x "$here/.venv/bin/python3" ]; then
    python3 -m venv "$here/.venv"
  fi
  # numpy + safetensors read files we write; tokenizers is the reference BPE implementation, jinja2
  # the reference for chat templates, pyarrow the reference reader and writer of Parquet files,
  # polars and DuckDB two more writers of their own, tensorboard the reader of the event files we write
  "$here/.venv/bin/python3" -m pip install -q --disable-pip-version-check numpy safetensors tokenizers jinja2 pyarrow polars duckdb \
    tensorboard
  # Llama 2's tokenizer as Hugging Face's tokenizer.json, built from the vocabulary in llama.cpp's
  # sources (PyPI sdist of llama-cpp-python) and checked with tokenizers; tests skip without it
  if [ ! -f "$here/.deps/llama2-tokenizer/tokenizer.json" ]; then
    status=0
    "$here/.venv/bin/python3" "$here/scripts/llama2_tokenizer.py" "$here/.deps/llama2-tokenizer" \
      --verify || status=$?
    if [ "$status" -eq 3 ]; then
      echo "shardtrain setup: no Llama 2 tokenizer (download failed); the tests that need it skip"
    elif [ "$status" -ne 0 ]; then
      exit "$status"
    fi
  fi
fi
