#!/usr/bin/env bash
# Configures and builds moetier in ./build (Release, warnings as errors).
# The CUDA backend is built when nvcc is found (PATH or /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOETIER_WERROR=ON "$@" >/dev/null
ninja -C build -j"$(nproc)"
