#!/usr/bin/env bash
# Installs what shardtrain needs on Debian 12 (idempotent): compilers, libraries, test tools,
# and the default training corpus (Debian's `fortunes` package, plain English text).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev libomp-dev
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libfmt-dev libpcre2-dev
  libgtest-dev libgmock-dev
  openmpi-bin libopenmpi-dev
  fortunes
  python3 python3-pip
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
