#!/usr/bin/env bash
# Packs the CUDA binaries of ./build (configured with -DMOETIER_CUDA=ON, sm_90)
# for the GPU machine, so a call there skips its own build:
# .carry/bins.tar.xz (paths under build/), the commit and source dir they were
# built from, and the Debian runtime libraries the GPU image may lack.
# There: B=build bash scripts/device_cuda.sh bins test ...
set -euo pipefail
cd "$(dirname "$0")/.."
# BINS: the paths under build/ to pack instead of all (e.g. src/tools/moetier
# alone, when the tests would take the carry past the device's 64 MiB).
T=(src/tools/moetier tests/test_backend_cuda tests/test_cuda_ops_cuda tests/test_cuda_fused_cuda
   tests/test_cuda_model_cuda tests/test_cuda_stage_cuda
   tests/test_golden_qwen3 bench/cuda_ops_bench bench/kernels_bench)
[ -n "${BINS:-}" ] && read -ra T <<<"$BINS"
cmake build >/dev/null  # re-read the commit the binaries name (bench/CMakeLists.txt)
ninja -C build "${T[@]##*/}"
mkdir -p .carry/debs
# One xz stream with a 64 MiB dictionary: the binaries (about 48 MB each) share
# most of their code, so all of them pack to about 14 MB (each alone: 11.5).
tar -cf - "${T[@]/#/build/}" | xz -9 -T1 >.carry/bins.tar.xz
git rev-parse --short HEAD >.carry/bins-commit
git diff --quiet HEAD -- src tests bench || echo "$(cat .carry/bins-commit)-dirty" >.carry/bins-commit
echo "$PWD" >.carry/bins-source-dir
(cd .carry/debs && apt-get download liburing2 libfmt9 libutf8proc2 libbenchmark1debian >/dev/null 2>&1 || true)
ls -la .carry/bins.tar.xz; cat .carry/bins-commit
