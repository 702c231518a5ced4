#!/usr/bin/env bash
# On the GPU machine: build with CUDA (sm_90), run the `cuda` tests and the
# golden test, the op benchmark, and moetier-tiny on the GPU. Logs and JSON go
# to $OUT. Usage: scripts/device_cuda.sh [build|test|bench|all]...
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
B=build-gpu
step_build() {
  for f in .carry/debs/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
  ldconfig
  local t0=$SECONDS
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOETIER_CUDA=ON -DMOETIER_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build.log" 2>&1 &&
    ninja -C $B moetier test_cuda_ops_cuda test_cuda_model_cuda test_backend_cuda \
      test_golden_qwen3 cuda_ops_bench >>"$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" "$OUT/build.log" | head -30; return 1; }
  echo "build: $((SECONDS - t0)) s"
}
step_test() {
  for t in test_backend_cuda test_cuda_ops_cuda test_cuda_model_cuda test_golden_qwen3; do
    stdbuf -oL -eL ./$B/tests/$t >"$OUT/$t.log" 2>&1
    local rc=$?
    echo "$t: rc $rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "Failure|rror|Expected|Which is|\[cuda golden\]|^\[ RUN" "$OUT/$t.log" | tail -25
    if [ $rc -ge 128 ]; then  # a crash: where
      cuda-gdb -q -batch -ex run -ex bt --args ./$B/tests/$t 2>&1 | grep -E "^#|signal|SIG" | head -25
    fi
  done
  return 0
}
step_bench() {
  ./$B/bench/cuda_ops_bench >"$OUT/cuda_ops.json" 2>&1; tail -30 "$OUT/cuda_ops.json"
  P='func (s *Server) Serve(l net.Listener) error {'
  for be in cpu cuda; do
    ./$B/src/tools/moetier run models/moetier-tiny --backend $be --prompt "$P" -n 200 --temp 0 \
      --ignore-eos --ctx 512 2>&1 >/dev/null | tail -2
  done
}
steps="${*:-all}"
[ "$steps" = all ] && steps="build test bench"
for s in $steps; do
  echo "=== $s ($(date +%T))"
  step_$s || break
done
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
