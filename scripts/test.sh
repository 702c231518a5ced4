#!/usr/bin/env bash
# Builds moetier and runs every test (CUDA tests skip without a GPU), three
# times: with the default thread count and kernel path, with one thread, and
# with two threads on the portable kernel path (MOETIER_CPU_KERNELS), so the
# suite holds on any x86-64 machine whatever its vector units and core count;
# on a CPU with AVX-512 VNNI (where the default is the avx512 path) a fourth
# time on the avx2 path.
# The browser test of the report (label `browser`, tests/browser) runs in the
# first pass only: it does not depend on the kernels or the thread count.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --with-npm --with-browser
bash scripts/fetch_tokenizers.sh
bash scripts/build.sh
cd build
run() {
  local args=()
  [ "$1" = --no-browser ] && { args=(-LE browser); shift; }
  echo "=== ctest with $* ${args[*]}"
  env "$@" ctest --output-on-failure -j"$(nproc)" --timeout 900 "${args[@]}"
}
run MOETIER_CPU_KERNELS=auto
run --no-browser MOETIER_THREADS=1 MOETIER_CPU_KERNELS=auto
run --no-browser MOETIER_THREADS=2 MOETIER_CPU_KERNELS=portable
if grep -qw avx512_vnni /proc/cpuinfo 2>/dev/null; then  # the avx512 path's condition
  run --no-browser MOETIER_CPU_KERNELS=avx2
fi
