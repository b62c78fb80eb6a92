#!/usr/bin/env bash
# Packs built programs for a GPU machine that lacks this machine's Debian libraries:
# copies the given binaries into .device-build/bin and every shared library they need that
# is not part of the base system (libc, libstdc++, the CUDA driver and toolkit) into
# .device-build/lib.
# On the GPU machine: LD_LIBRARY_PATH=.device-build/lib .device-build/bin/<program>
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .device-build && mkdir -p .device-build/bin .device-build/lib
for b in "$@"; do
  cp "$b" .device-build/bin/
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libdl.so*|libpthread.so*|librt.so*|libcuda.so*) ;;
      libcudart.so*|libcublas*.so*|libcudnn*.so*|libnccl.so*|libnvrtc*.so*) ;;  # the GPU machine has CUDA 13 itself
      *) cp -L -n "$lib" .device-build/lib/ ;;
    esac
  done
done
du -sh .device-build
# One compressed file to carry to the GPU machine: tar -xJf .device-pack/bundle.tar.xz there.
mkdir -p .device-pack && tar -cJf .device-pack/bundle.tar.xz .device-build
du -sh .device-pack/bundle.tar.xz
