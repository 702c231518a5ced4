#!/usr/bin/env bash
# On the GPU machine: build with CUDA (sm_90), run the `cuda` tests and the
# golden test, the op benchmark, and moetier-tiny on the GPU; synthesize a
# Qwen3-30B-A3B-shaped checkpoint and benchmark moetier on it (all resident,
# 8K prefill, a 28% arena backed by the host tier and by storage); build
# llama.cpp (CUDA, from .carry/llama-src.tar.xz) in the background, convert the
# checkpoint to GGUF and run llama-bench all on the GPU and with experts in
# host RAM. Logs and JSON go to $OUT.
# Usage: scripts/device_cuda.sh STEP...  (each STEP a step_NAME below), e.g.
#   build test                                       the cuda tests
#   llama_build build test q30 bench30 llama30 ds4   the side by side (docs/cuda.md)
#   build base_build test ops q30 abdec30            this tree against .carry/base-src.tar.xz
#   build ops ncu_ops ncu_src                        op times, ncu stalls per kernel and SASS line
#   build test q30 mapped30                          the host-tier arm, mapped and not
#   build q30 policy30                               the mapped host-tier arm, lru and lfu
#   probe                                            the MoE kernels side by side (moe_probe)
#   chain                                            a layer's dense chain, persistent vs launched (chain_probe)
#   icache                                           what cold code costs a kernel (icache_probe)
#   bins test q30 bench30                            carried binaries (B=build), no build here
#   bins test q30 moeab30 moeabds4                   the fused MoE kernel against the q8 kernels
#   bins skip                                        each decode op's cost in the graph (ARMS=...)
#   bins llama_build q30 bench30 fuse30 ds4 llama30  the side by side with carried binaries
#   bins llama_build_cpu q30 cpu30                   the CPU engine beside llama.cpp's CPU build (issue 12)
#   bins llama_build_cpu q30 test wait_bg cpukern cputime30 cpu30
#   bins llama_build_cpu q30 wait_bg cpukern cpuab30  the CPU side by side, interleaved, 16/8/2/1 threads
#                                                    issue 12 on the machine's CPU: matmuls from DRAM,
#                                                    each op's time, beside llama.cpp (nothing in the background)
#   bins q30 pf30                                    the storage arm with next-layer prefetch and without
#   bins test q30 stage30                            the host-tier arm with next-layer staging and without
#   bins test q30 admit30                            the host-tier arm with admission windows
#   bins probe skipds4                               the MoE kernels alone; each op's cost, DeepSeek shapes
#   bins skipds4 ncu                                 each op's cost, DeepSeek shapes, and (NCU_MODEL=/tmp/ds4) its kernels under ncu
#   bins test skipds4 q30 ahead30                    decode steps launched ahead and not (ARMS="none env:MOETIER_DECODE_AHEAD=0")
#   bins probe ds4 q30 res30 test                    the MoE kernels alone, then both models all resident
#   bins probe sass                                  the MoE kernels alone, and their SASS
#   bins trace                                       the decode timeline (binaries of a build
#                                                    configured with -DMOETIER_CUDA_TRACE=ON)
#   bins abbin                                       decode against another binary (MB=path)
#   SWITCHES="VAR=V ..." ... bins test switches       opt-in kernels: tests with all on, then decode A/B
#   sassab abxz                                      the MoE kernels' instruction mix of .carry/ab/*.xz, then
#                                                    those binaries side by side
#                                                    (scripts/pack_ab.sh NAME packs this tree's)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
B=${B:-build-gpu}
step_build() {
  for f in .carry/debs/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
  ldconfig
  local t0=$SECONDS
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOETIER_CUDA=ON -DMOETIER_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build.log" 2>&1 &&
    ninja -C $B moetier test_cuda_ops_cuda test_cuda_fused_cuda test_cuda_model_cuda test_cuda_stage_cuda test_backend_cuda \
      test_golden_qwen3 cuda_ops_bench >>"$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" "$OUT/build.log" | head -30; return 1; }
  echo "build: $((SECONDS - t0)) s"
}
# Binaries built on the dev machine (scripts/pack_device_bins.sh) instead of
# a build here: .carry/bins.tar.xz unpacked into $B, the Debian runtime
# libraries in .carry/debs unpacked, and the source path the tests were built
# with (MOETIER_SOURCE_DIR) pointed at this tree.
step_bins() {
  for f in .carry/debs/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
  ldconfig
  local src; src=$(cat .carry/bins-source-dir 2>/dev/null)
  if [ -n "$src" ] && [ "$src" != "$PWD" ]; then mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; fi
  tar -xJf .carry/bins.tar.xz -C . || return 1
  ldd $B/src/tools/moetier | grep "not found" && return 1
  echo "bins: $(cat .carry/bins-commit 2>/dev/null)"
}
step_probe() {  # the MoE step's kernels side by side (bench/moe_probe.cu); carried or built here
  local p=.carry/probe/moe_probe
  if [ ! -x $p ]; then
    p=/tmp/moe_probe
    nvcc -O3 -std=c++20 -arch=sm_90 -Isrc -DMOETIER_CUDA_MIN_ARCH=90 bench/moe_probe.cu -o $p || return 1
  fi
  timeout ${PROBE_TIMEOUT:-240} $p 2>&1 | tee "$OUT/moe_probe.txt"
}
step_chain() {  # a decode layer's dense chain as one persistent launch (bench/chain_probe.cu)
  local p=.carry/probe/chain_probe
  [ -x $p ] || { p=/tmp/chain_probe; nvcc -O3 -std=c++20 -arch=sm_90 bench/chain_probe.cu -o $p || return 1; }
  timeout 120 $p 2>&1 | tee "$OUT/chain_probe.txt"
}
step_icache() {  # cold code fetch: a kernel's first run after other code, and after L2 is flushed
  local p=/tmp/icache_probe
  nvcc -O3 -std=c++20 -arch=sm_90 -I. bench/icache_probe.cu -o $p || return 1
  timeout 120 $p 2>&1 | tee "$OUT/icache_probe.txt"
}
step_sass() {  # SASS of the probe's MoE kernels (SASS_KERNELS: name fragments) and their instruction counts
  local p=.carry/probe/moe_probe
  [ -x $p ] || p=/tmp/moe_probe
  local all=/tmp/sass-all.txt  # the whole binary's SASS, once, for the counts
  cuobjdump -sass $p >$all 2>/dev/null || { echo "sass: cuobjdump -sass $p failed"; return 1; }
  for k in ${SASS_KERNELS:-moe_gate_up_q8_kernelILi8ELb0E moe_gate_up_q8_kernelILi8ELb1E split_kernelILi4ELi3 split_kernelILi4ELi2}; do
    local f; f=$(cuobjdump -symbols $p 2>/dev/null | grep -o "_Z[A-Za-z0-9_]*$k[A-Za-z0-9_]*" | head -1)
    [ -n "$f" ] || { echo "sass: no kernel $k"; continue; }
    cuobjdump -sass -fun "$f" $p >"$OUT/sass-$k.txt" 2>&1
    python3 scripts/sass_mix.py $all --funcs "^$f\$" --ops IMAD.U32
  done
}
ab_unpack() {  # .carry/ab/NAME.xz (ABS: the names, default all) -> /tmp/ab-NAME, always anew (a
  # warm machine may hold an earlier call's); prints the paths
  for f in ${ABS:-$(ls .carry/ab/*.xz | xargs -n1 basename | sed 's/\.xz$//')}; do
    xz -dc .carry/ab/$f.xz >/tmp/ab-$f && chmod +x /tmp/ab-$f && echo /tmp/ab-$f
  done
}
step_sassab() {  # the static instruction mix (scripts/sass_mix.py) of the MoE kernels in .carry/ab/*.xz (ABS)
  for b in $(ab_unpack); do
    echo "== sass ${b#/tmp/ab-}"
    cuobjdump -sass $b | python3 scripts/sass_mix.py \
      --funcs "${SASS_FUNCS:-moe_gate_up_q8_kernelILi8|moe_down_q8_pair_kernelILi4ELi4}"
  done
}
step_test() {  # TESTS: the binaries (default all); TEST_PAR=1: test_cuda_ops_cuda beside the others
  local all=(${TESTS:-test_backend_cuda test_cuda_ops_cuda test_cuda_fused_cuda test_cuda_model_cuda
    test_cuda_stage_cuda test_golden_qwen3})
  if [ "${TEST_PAR:-0}" = 1 ] && [ ${#all[@]} -gt 1 ] && [[ " ${all[*]} " == *" test_cuda_ops_cuda "* ]]; then
    TEST_PAR=0 TESTS=test_cuda_ops_cuda step_test >"$OUT/test_ops.txt" 2>&1 &
    local ops=$!
    TEST_PAR=0 TESTS="${all[*]/test_cuda_ops_cuda/}" step_test
    wait $ops; cat "$OUT/test_ops.txt"; rm -f "$OUT/test_ops.txt"
    return 0
  fi
  for t in "${all[@]}"; do
    MOETIER_CPU_ACT=f32 MOETIER_CUDA_ACT=f32 stdbuf -oL -eL ./$B/tests/$t >"$OUT/$t.log" 2>&1 &
    local pid=$! w=0
    while kill -0 $pid 2>/dev/null && [ $w -lt ${TEST_TIMEOUT:-300} ]; do sleep 1; w=$((w + 1)); done
    if kill -0 $pid 2>/dev/null; then  # a hang: every thread's stack, then the kill
      echo "$t: still running after $w s; its threads:"
      cuda-gdb -q -batch -p $pid -ex "thread apply all bt 8" 2>&1 | grep -E "^#|^Thread" | head -60
      kill -9 $pid
    fi
    wait $pid
    local rc=$?
    echo "$t: rc $rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "Failure|rror|Expected|Which is|\[cuda golden\]|^\[ RUN" "$OUT/$t.log" | tail -25
    if [ $rc -ge 128 ]; then  # a crash: where
      cuda-gdb -q -batch -ex run -ex bt --args ./$B/tests/$t 2>&1 | grep -E "^#|signal|SIG" | head -25
    fi
  done
  return 0
}
step_switches() {  # the model tests with all of $SWITCHES on, then decode A/B of none, each and
  # all on the DeepSeek-shaped model and the 8-layer Qwen3-shaped one (after bins; the ops and
  # fused tests set them themselves)
  local sw=(${SWITCHES:?SWITCHES: the opt-in variables, VAR=VALUE ...}) arms="none" all=""
  echo "=== test_cuda_model_cuda, test_golden_qwen3 with ${sw[*]}"
  (export "${sw[@]}"; TESTS="test_cuda_model_cuda test_golden_qwen3" step_test)
  for v in "${sw[@]}"; do arms+=" env:$v" all+="${all:+,}$v"; done
  ARMS="$arms env:$all" step_skipds4
  ARMS="$arms env:$all" step_skip
}
step_bench() {
  ./$B/bench/cuda_ops_bench >"$OUT/cuda_ops.json" 2>&1; tail -30 "$OUT/cuda_ops.json"
  P='func (s *Server) Serve(l net.Listener) error {'
  for be in cpu cuda; do
    ./$B/src/tools/moetier run models/moetier-tiny --backend $be --prompt "$P" -n 200 --temp 0 \
      --ignore-eos --ctx 512 2>&1 >/dev/null | tail -2
  done
}
# A/B against an earlier commit: .carry/base-src.tar.xz (git archive of src,
# bench, tests, cmake, scripts, CMakeLists.txt) built into $BB in the background.
BB=/tmp/base/build-gpu
step_base_build() {
  rm -rf /tmp/base && mkdir -p /tmp/base && tar -xJf .carry/base-src.tar.xz -C /tmp/base || return 1
  (cd /tmp/base && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOETIER_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/base-build.log" 2>&1 &&
   nice ninja -C build-gpu moetier cuda_ops_bench >>"$OUT/base-build.log" 2>&1
   echo "base build rc $?" >>"$OUT/base-build.log") &
  BASE_PID=$!
}
step_ops() {  # the op benchmark, this tree and (when built) the base
  ./$B/bench/cuda_ops_bench >"$OUT/cuda_ops.json" 2>&1
  MOETIER_CUDA_ACT=f32 ./$B/bench/cuda_ops_bench 2>&1 | grep '"op": "moe' | sed 's/^/f32 activations: /'
  wait ${BASE_PID:-} 2>/dev/null; tail -1 "$OUT/base-build.log" 2>/dev/null
  [ -x $BB/bench/cuda_ops_bench ] && $BB/bench/cuda_ops_bench >"$OUT/cuda_ops_base.json" 2>&1
  /usr/bin/python3 - "$OUT/cuda_ops.json" "$OUT/cuda_ops_base.json" <<'PY'
import json, sys
new = json.load(open(sys.argv[1]))
try: base = {o["op"]: o for o in json.load(open(sys.argv[2]))["ops"]}
except Exception: base = {}
print(f"copy bound {new['copy_bound_gb_s']:.0f} GB/s")
for o in new["ops"]:
    b = base.get(o["op"])
    print(f"{o['op']:48s} {o['us']:8.2f} us {o['gb_s']:7.0f} GB/s" +
          (f"   base {b['us']:8.2f} us {b['gb_s']:7.0f} GB/s" if b else ""))
PY
}
Q30=${Q30:-/tmp/q30}
M=./$B/src/tools/moetier
LB=/tmp/llama-build
LBC=/tmp/llama-build-cpu  # step_llama_build_cpu
step_llama_build() {  # in the background: llama.cpp's CUDA build (llama-bench only)
  rm -rf /tmp/llama.cpp && tar -xJf .carry/llama-src.tar.xz -C /tmp
  cp scripts/peers/moetier_to_gguf.py /tmp/llama.cpp/  # the repository's copy is newer
  (t0=$SECONDS; NICE=5 JOBS=${LLAMA_JOBS:-12} bash /tmp/llama.cpp/llama.cpp.sh build-cuda \
     --src /tmp/llama.cpp --build $LB --target llama-bench >"$OUT/llama-build.log" 2>&1
   echo "llama.cpp build rc $? in $((SECONDS - t0)) s" >>"$OUT/llama-build.log") &
}
step_llama_build_cpu() {  # in the background: llama.cpp's CPU-only build (llama-bench; cpu30 uses it)
  [ -f /tmp/llama.cpp/llama.cpp.sh ] || tar -xJf .carry/llama-src.tar.xz -C /tmp
  cp scripts/peers/moetier_to_gguf.py /tmp/llama.cpp/
  (t0=$SECONDS; NICE=5 JOBS=${LLAMA_JOBS:-16} bash /tmp/llama.cpp/llama.cpp.sh build-cpu \
     --src /tmp/llama.cpp --build $LBC --target llama-bench >"$OUT/llama-build-cpu.log" 2>&1
   echo "llama.cpp cpu build rc $? in $((SECONDS - t0)) s" >>"$OUT/llama-build-cpu.log") &
}
step_q30() {
  local t0=$SECONDS
  [ -f $Q30/config.json ] || $M synth --preset qwen3-30b-a3b --experts mxfp4 --layers ${Q30_LAYERS:-48} \
    --tokenizer tests/data/external/qwen3 -o $Q30 2>&1 | tail -2
  echo "synth: $((SECONDS - t0)) s"; du -sh $Q30
  (/usr/bin/python3 -c 'import numpy' 2>/dev/null || true
   bash /tmp/llama.cpp/llama.cpp.sh convert $Q30 /tmp/q30.gguf >"$OUT/convert.log" 2>&1
   echo "convert rc $?" >>"$OUT/convert.log") &
  CONVERT_PID=$!
}
bench_arm() {  # bench_arm NAME ARGS...  (MB=binary: another moetier)
  local name=$1; shift
  timeout ${ARM_TIMEOUT:-120} ${MB:-$M} bench $Q30 --backend ${BACKEND:-cuda} --name "$name" \
    --json "${JSON:-$OUT/q30.json}" \
    --append --ctx 8448 "$@" 2>&1 | grep -vE "^moetier: (warning|bench: meas)" | tail -6
}
step_bench30() {
  bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 3
  bench_arm "moetier cuda all resident, 8K prefill" --prompt-tokens 8192 --gen 2 --runs 2
  bench_arm "moetier cuda arena 28% + host tier" --prompt-tokens 256 --gen 128 --runs 2 \
    --arena 28% --host-cache 17GiB
  bench_arm "moetier cuda arena 28%, storage" --prompt-tokens 256 --gen 64 --runs 2 --arena 28%
}
step_ab30() {  # the decode kernels against the legacy ones, prefill at 256 and 8K
  bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 2
  MOETIER_CUDA_DECODE=legacy bench_arm "moetier cuda all resident, legacy decode kernels" \
    --prompt-tokens 256 --gen 128 --runs 2
  bench_arm "moetier cuda all resident, 8K prefill" --prompt-tokens 8192 --gen 2 --runs 1
}
step_abdec30() {  # all-resident decode, this tree and the base build, interleaved
  wait ${BASE_PID:-} 2>/dev/null
  for r in 1 2; do
    bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 2
    [ -x $BB/src/tools/moetier ] && MB=$BB/src/tools/moetier bench_arm \
      "moetier cuda all resident, base $(cat .carry/base-commit 2>/dev/null)" \
      --prompt-tokens 256 --gen 128 --runs 2
  done
}
step_abbase30() {  # step_abdec30, then 8K-context decode of both builds
  step_abdec30
  bench_arm "moetier cuda all resident, 8K context" --prompt-tokens 8192 --gen 64 --runs 1
  [ -x $BB/src/tools/moetier ] && MB=$BB/src/tools/moetier bench_arm \
    "moetier cuda all resident, 8K context, base" --prompt-tokens 8192 --gen 64 --runs 1
}
step_pdl30() {  # PDL on and off, and the base build, interleaved
  wait ${BASE_PID:-} 2>/dev/null
  for r in 1 2; do
    bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 2
    MOETIER_CUDA_PDL=0 bench_arm "moetier cuda all resident, no PDL" --prompt-tokens 256 --gen 128 --runs 2
    for br in ${GEMV_ROWS:-}; do
      MOETIER_CUDA_GEMV_BLOCK_ROWS=$br bench_arm "moetier cuda all resident, block GEMV rows $br" \
        --prompt-tokens 256 --gen 128 --runs 2
    done
    [ -x $BB/src/tools/moetier ] && MB=$BB/src/tools/moetier bench_arm \
      "moetier cuda all resident, base $(cat .carry/base-commit 2>/dev/null)" \
      --prompt-tokens 256 --gen 128 --runs 2
  done
}
step_ahead30() {  # all-resident decode with steps launched ahead (default) and one at a time, interleaved
  for r in 1 2; do
    bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 2
    MOETIER_DECODE_AHEAD=0 bench_arm "moetier cuda all resident, one step at a time" \
      --prompt-tokens 256 --gen 128 --runs 2
  done
}
step_res30() {  # all-resident decode alone, two runs of two (after step_q30)
  for r in 1 2; do bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 2; done
}
step_ds4() {  # DeepSeek-V4-Flash-shaped experts (hidden 4096, 256 x 2048, top-6), all resident
  local d=/tmp/ds4 n=${DS4_LAYERS:-6}
  [ -f $d/config.json ] || $M synth --preset deepseek-v4-flash-experts --experts mxfp4 --layers $n \
    --tokenizer models/moetier-tiny -o $d 2>&1 | tail -1
  Q30=$d JSON=$OUT/ds4.json bench_arm "moetier cuda all resident, DeepSeek-V4-Flash-shaped experts, $n layers" \
    --prompt-tokens 64 --gen ${DS4_GEN:-128} --runs ${DS4_RUNS:-2}
}
step_cpu30() {  # the CPU engine at real size beside llama.cpp's CPU path (16 threads, GPU hidden)
  BACKEND=cpu JSON=$OUT/cpu30.json ARM_TIMEOUT=150 bench_arm "moetier cpu all resident, 16 threads" \
    --prompt-tokens 64 --gen 32 --runs 2 --threads 16
  BACKEND=cpu JSON=$OUT/cpu30.json ARM_TIMEOUT=150 bench_arm \
    "moetier cpu arena 28% + host tier, 16 threads" --prompt-tokens 64 --gen 32 --runs 2 --threads 16 \
    --arena 28% --host-cache 17GiB
  wait ${CONVERT_PID:-} 2>/dev/null
  local lb=$LB t0=$SECONDS  # the CPU-only build when step_llama_build_cpu ran, else the CUDA one
  if [ -f "$OUT/llama-build-cpu.log" ]; then
    lb=$LBC
    while ! grep -q "build rc" "$OUT/llama-build-cpu.log" && [ $((SECONDS - t0)) -lt ${LLAMA_WAIT:-240} ]; do
      sleep 5
    done
  fi
  [ -x $lb/bin/llama-bench ] && [ -f /tmp/q30.gguf ] || return 0
  CUDA_VISIBLE_DEVICES= timeout 150 $lb/bin/llama-bench -m /tmp/q30.gguf -p 64 -n 32 -ngl 0 -t 16 -r 2 \
    -o json >"$OUT/llama-cpu.json" 2>"$OUT/llama-cpu.err"; grep -E '"(n_prompt|n_gen|avg_ts)"' "$OUT/llama-cpu.json"
}
step_wait_bg() {  # the background llama.cpp builds and GGUF conversion done (no CPU contention after)
  wait ${CONVERT_PID:-} 2>/dev/null; tail -1 "$OUT/convert.log" 2>/dev/null
  local t0=$SECONDS
  for log in "$OUT/llama-build-cpu.log" "$OUT/llama-build.log"; do
    [ -f "$log" ] || continue
    while ! grep -q "build rc" "$log" && [ $((SECONDS - t0)) -lt ${LLAMA_WAIT:-240} ]; do sleep 5; done
    tail -1 "$log"
  done
}
step_cpukern() {  # the CPU matmuls from DRAM (kernels_bench) at 1, 8 and 16 threads
  KERNELS_BENCH_THREADS=${KB_THREADS:-1,8,16} ./$B/bench/kernels_bench \
    --benchmark_filter="${KB_FILTER:-65536}" --benchmark_min_time=0.3 2>&1 |
    tee "$OUT/kernels_bench.txt" | grep -E "^BM_" | awk '{print $1, $4, $5, $NF, $(NF-1), $(NF-2)}'
}
step_cputime30() {  # each CPU op's wall time (MOETIER_CPU_TIMING) of warm prefill and decode, 16 threads
  MOETIER_CPU_TIMING=$OUT/cpu-timing.txt timeout 200 $M bench $Q30 --backend cpu --threads ${CPU_THREADS:-16} \
    --prompt-tokens 64 --gen 64 --runs 2 --no-drop-cache --no-probe --ctx 8448 2>&1 | grep -E "run 2/2"
  sort -rn "$OUT/cpu-timing.txt" | head -25
}
# peak_rss NAME PATTERN STDOUT STDERR CMD...: runs CMD (output to those files),
# polling the VmHWM (peak resident set) of the processes matching PATTERN
# each half second; prints the largest.
peak_rss() {
  local name=$1 pat=$2 o=$3 e=$4; shift 4
  "$@" >"$o" 2>"$e" &
  local pid=$! hwm=0 v p
  while kill -0 $pid 2>/dev/null; do
    for p in $(pgrep -f "$pat"); do
      v=$(awk '/VmHWM/ {print $2}' /proc/$p/status 2>/dev/null)
      [ -n "$v" ] && [ "$v" -gt "$hwm" ] && hwm=$v
    done
    sleep 0.5
  done
  wait $pid
  echo "$name peak rss $(awk -v k=$hwm 'BEGIN {printf "%.2f", k / 1048576}') GiB"
}
step_cpuab30() {  # the CPU engine and llama.cpp's CPU build interleaved: 16, 8, 2 and 1 threads,
  # then 16 threads with 4 cores kept busy by other work; llama.cpp's peak resident memory
  # (moetier's is in its JSON: peak_host_bytes)
  local lb=$LBC/bin/llama-bench j=$OUT/cpuab.json
  [ -x $lb ] && [ -f /tmp/q30.gguf ] || { echo "no llama-bench or gguf"; return 1; }
  # CPUAB_SPECS: THREADS[c]:ROUNDS:PROMPT:GEN each (c: with 4 cores busy)
  for spec in ${CPUAB_SPECS:-16:2:64:32 8:1:64:32 2:1:64:32 1:1:32:16 16c:1:64:32}; do
    IFS=: read -r t rounds p g <<<"$spec"
    local th=${t%c} burn=() what="" probe
    if [ "$t" != "$th" ]; then
      for i in 1 2 3 4; do (while :; do :; done) & burn+=($!); done
      what=", 4 cores busy"
    fi
    for r in $(seq $rounds); do
      probe=--no-probe; [ "$t" = 16 ] && [ $r = 1 ] && probe=
      BACKEND=cpu JSON=$j ARM_TIMEOUT=200 bench_arm "moetier cpu all resident, $th threads$what, round $r" \
        --prompt-tokens $p --gen $g --runs 2 --threads $th $probe | grep -E "^custom"
      peak_rss "llama t$t r$r" "llama-bench -m" "$OUT/llama-cpu-t$t-r$r.json" "$OUT/llama-cpu-t$t-r$r.err" \
        env CUDA_VISIBLE_DEVICES= $lb -m /tmp/q30.gguf -p $p -n $g -ngl 0 -t $th -r 2 -o json
      grep -E '"avg_ts"' "$OUT/llama-cpu-t$t-r$r.json" | tr -d ' \n'; echo
    done
    [ ${#burn[@]} -gt 0 ] && kill ${burn[@]} 2>/dev/null
  done
  [ "${CPUAB_HOST:-1}" = 1 ] || return 0
  BACKEND=cpu JSON=$j ARM_TIMEOUT=200 bench_arm "moetier cpu arena 28% + host tier, 16 threads" \
    --prompt-tokens 64 --gen 32 --runs 2 --threads 16 --arena 28% --host-cache 17GiB --no-probe |
    grep -E "^custom"
}
step_fuse30() {  # all-resident decode: norms and adds fused (default) and as separate ops, interleaved
  for r in $(seq ${AB_ROUNDS:-2}); do
    bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 2
    MOETIER_CUDA_FUSE=0 bench_arm "moetier cuda all resident, norms and adds as separate ops" \
      --prompt-tokens 256 --gen 128 --runs 2
  done
}
step_moeabds4() {  # the same on DeepSeek-V4-Flash-shaped experts (6 layers)
  local d=/tmp/ds4 n=${DS4_LAYERS:-6}
  [ -f $d/config.json ] || $M synth --preset deepseek-v4-flash-experts --experts mxfp4 --layers $n \
    --tokenizer models/moetier-tiny -o $d 2>&1 | tail -1
  for r in $(seq ${AB_ROUNDS:-2}); do
    Q30=$d JSON=$OUT/ds4.json bench_arm "moetier cuda all resident, DeepSeek-V4-Flash-shaped experts, $n layers" \
      --prompt-tokens 64 --gen ${DS4_GEN:-256} --runs 2
    MOETIER_CUDA_MOE=q8 Q30=$d JSON=$OUT/ds4.json bench_arm \
      "moetier cuda all resident, DeepSeek-V4-Flash-shaped experts, $n layers, q8 MoE kernels" \
      --prompt-tokens 64 --gen ${DS4_GEN:-256} --runs 2
  done
}
step_arena30() {  # a 28% arena backed by the host tier, and by storage only
  bench_arm "moetier cuda arena 28% + host tier" --prompt-tokens 256 --gen 128 --runs 2 \
    --arena 28% --host-cache 17GiB
  bench_arm "moetier cuda arena 28%, storage" --prompt-tokens 256 --gen 64 --runs 2 --arena 28%
}
step_pf30() {  # the storage arm with next-layer prefetch (--prefetch next-layer) and without, interleaved
  for r in 1 2; do
    bench_arm "moetier cuda arena 28%, storage" --prompt-tokens 256 --gen 64 --runs 2 --arena 28%
    bench_arm "moetier cuda arena 28%, storage, prefetch next-layer" --prompt-tokens 256 --gen 64 \
      --runs 2 --arena 28% --prefetch next-layer
  done
}
step_mapped30() {  # the host-tier arm with the mapped host tier and without, interleaved
  for r in 1 2; do
    bench_arm "moetier cuda arena 28% + host tier" --prompt-tokens 256 --gen 128 --runs 2 \
      --arena 28% --host-cache 17GiB
    MOETIER_MAPPED_HOST=0 bench_arm "moetier cuda arena 28% + host tier, not mapped" \
      --prompt-tokens 256 --gen 128 --runs 2 --arena 28% --host-cache 17GiB
  done
}
step_stage30() {  # the host-tier arm with next-layer staging and without, interleaved, and all resident
  bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 2
  local h=(--prompt-tokens 256 --gen 128 --runs 2 --arena 28% --host-cache 17GiB)
  for r in 1 2; do
    bench_arm "moetier cuda arena 28% + host tier" "${h[@]}"
    bench_arm "moetier cuda arena 28% + host tier, prefetch next-layer" "${h[@]}" --prefetch next-layer
    MOETIER_CUDA_STAGE=predict bench_arm \
      "moetier cuda arena 28% + host tier, prefetch next-layer, predicted only" "${h[@]}" --prefetch next-layer
    for b in ${STAGE_BLOCKS:-}; do
      MOETIER_CUDA_STAGE_BLOCKS=$b bench_arm \
        "moetier cuda arena 28% + host tier, prefetch next-layer, $b blocks per expert" "${h[@]}" \
        --prefetch next-layer
    done
  done
}
step_admit30() {  # the host-tier arm with admission windows (MOETIER_MAPPED_ADMIT), interleaved
  bench_arm "moetier cuda all resident" --prompt-tokens 256 --gen 128 --runs 2
  local h=(--prompt-tokens 256 --gen 128 --runs 2 --arena 28% --host-cache 17GiB)
  for r in 1 2; do
    for w in 0 ${ADMIT_WINDOWS:-4 16 64}; do
      MOETIER_MAPPED_ADMIT=$w bench_arm "moetier cuda arena 28% + host tier, admit window $w" "${h[@]}"
    done
  done
}
step_policy30() {  # the host-tier arm under each replacement policy
  for pol in lru lfu; do
    bench_arm "moetier cuda arena 28% + host tier, policy $pol" --prompt-tokens 256 --gen 128 \
      --runs 2 --arena 28% --host-cache 17GiB --policy $pol
  done
}
step_timing() {  # per-op GPU time (MOETIER_CUDA_TIMING, no graphs) on an 8-layer model
  local q=/tmp/q30-8
  [ -f $q/config.json ] || $M synth --preset qwen3-30b-a3b --experts mxfp4 --layers 8 \
    --tokenizer tests/data/external/qwen3 -o $q 2>&1 | tail -1
  for g in 1 0; do
    MOETIER_GRAPHS=$g $M bench $q --backend cuda --prompt-tokens 256 --gen 64 --runs 2 --no-probe \
      2>&1 | grep -E "run 2/2"
  done
  MOETIER_GRAPHS=0 MOETIER_CUDA_TIMING=/tmp/t-decode.txt $M bench $q --backend cuda \
    --prompt-tokens 1 --gen 65 --runs 1 --no-probe >/dev/null 2>&1
  echo "--- decode, 64 steps of 8 layers (no graphs)"; sort -rn /tmp/t-decode.txt | head -20
  MOETIER_CUDA_TIMING=/tmp/t-prefill.txt $M bench $q --backend cuda \
    --prompt-tokens 256 --gen 1 --runs 1 --no-probe >/dev/null 2>&1
  echo "--- prefill 256, 8 layers"; sort -rn /tmp/t-prefill.txt | head -20
}
step_skip() {  # decode A/B on an 8-layer model: $ARMS, each none, skip:OPS (MOETIER_CUDA_SKIP=OPS:
  # what those ops cost inside the graph) or env:VAR=VALUE[,VAR=VALUE...]; two rounds, interleaved
  local q=/tmp/q30-8
  [ -f $q/config.json ] || $M synth --preset qwen3-30b-a3b --experts mxfp4 --layers 8 \
    --tokenizer tests/data/external/qwen3 -o $q 2>&1 | tail -1
  skip_arms $q 256 256
}
step_skipds4() {  # step_skip on the DeepSeek-shaped model of step_ds4 (64 + 512 tokens)
  local d=/tmp/ds4
  [ -f $d/config.json ] || $M synth --preset deepseek-v4-flash-experts --experts mxfp4 \
    --layers ${DS4_LAYERS:-6} --tokenizer models/moetier-tiny -o $d 2>&1 | tail -1
  skip_arms $d 64 512
}
decode_tps() {  # DIR PROMPT GEN CMD...: "decode N tok/s" of CMD bench DIR, run 2 of 2 ($BENCH_FLAGS added)
  local dir=$1 p=$2 g=$3
  shift 3
  "$@" bench $dir --backend cuda --prompt-tokens $p --gen $g --runs 2 --no-probe --ctx 8448 \
    ${BENCH_FLAGS:-} 2>&1 | grep -oE "decode [0-9.]+ tok/s" | tail -1
}
skip_arms() {  # model dir, prompt tokens, generated tokens
  for r in 1 2; do
    for arm in ${ARMS:-none skip:qkv skip:attn skip:o skip:router skip:experts}; do
      local e=(env)
      case $arm in skip:*) e+=(MOETIER_CUDA_SKIP=${arm#skip:}) ;; env:*) local v=${arm#env:}; e+=(${v//,/ }) ;; esac
      rm -f /tmp/arm.json
      echo "$arm: $("${e[@]}" $M bench $1 --backend cuda --prompt-tokens $2 --gen $3 --runs 2 \
        --no-probe --ctx 8448 --json /tmp/arm.json 2>&1 | grep -oE "decode [0-9.]+ tok/s" | tail -1) \
        $(python3 scripts/find_key.py /tmp/arm.json expert_prediction 2>/dev/null | tail -1)"
    done
  done
}
synth_two() {  # the DeepSeek-shaped model of step ds4 in /tmp/ds4, an 8-layer Qwen3-shaped one in /tmp/q30-8
  [ -f /tmp/ds4/config.json ] || $M synth --preset deepseek-v4-flash-experts --experts mxfp4 \
    --layers ${DS4_LAYERS:-6} --tokenizer models/moetier-tiny -o /tmp/ds4 2>&1 | tail -1
  if [ ! -d tests/data/external/qwen3 ]; then  # (git-ignored: name it in the call's carry)
    echo "q30-8: not made: no tests/data/external/qwen3 here (carry it)"
  elif [ ! -f /tmp/q30-8/config.json ]; then
    $M synth --preset qwen3-30b-a3b --experts mxfp4 --layers 8 \
      --tokenizer tests/data/external/qwen3 -o /tmp/q30-8 2>&1 | tail -1
  fi
}
step_trace() {  # the decode timeline (MOETIER_CUDA_TRACE) of the DeepSeek-shaped model and an
  # 8-layer Qwen3-shaped one: per launch, its cost on the critical path (scripts/trace_summary.py);
  # decode tok/s with and without recording, interleaved; TRACE_ENV: more VAR=VALUE for every run.
  # Needs binaries of a build configured with -DMOETIER_CUDA_TRACE=ON (the default build refuses)
  local d=/tmp/ds4 q=/tmp/q30-8
  synth_two
  for m in ds4:$d q30-8:$q; do
    local name=${m%%:*} dir=${m#*:}
    for arm in plain trace plain trace; do
      local e=(env ${TRACE_ENV:-})
      [ $arm = trace ] && e+=(MOETIER_CUDA_TRACE=$OUT/trace-$name.csv)
      echo "$name $arm: $("${e[@]}" $M bench $dir --backend cuda --prompt-tokens 64 --gen 160 \
        --runs 1 --no-probe --ctx 8448 2>&1 | grep -oE "decode [0-9.]+ tok/s" | tail -1)"
    done
    python3 scripts/trace_summary.py $OUT/trace-$name.csv 96
  done
}
ab_rounds() {  # BIN...: decode of each, interleaved, two rounds, on the DeepSeek-shaped model
  # (64 + 512 tokens) and an 8-layer Qwen3-shaped one (256 + 256)
  synth_two
  for m in ds4:/tmp/ds4:64:512 q30-8:/tmp/q30-8:256:256; do
    IFS=: read -r name dir p g <<<"$m"
    [ -f $dir/config.json ] || continue
    for r in 1 2; do
      for b in "$@"; do echo "$name ${b#/tmp/ab-}: $(decode_tps $dir $p $g $b)"; done
    done
  done
}
step_abxz() {  # moetier binaries .carry/ab/*.xz (ABS: their names, default all) side by side
  local bins=()
  mapfile -t bins < <(ab_unpack)
  ab_rounds "${bins[@]}"
}
step_abbin() {  # this build's decode against another moetier binary ($MB), side by side
  ab_rounds $M ${MB:?MB: the other binary}
}
step_ncu() {  # GPU time of each kernel of a few decode steps (8-layer model or $NCU_MODEL, graphs on)
  local q=${NCU_MODEL:-/tmp/q30-8}
  if [ -n "${NCU_MODEL:-}" ] && [ ! -f $q/config.json ]; then echo "ncu: no model at $q (NCU_MODEL)"; return 1; fi
  [ -f $q/config.json ] || $M synth --preset qwen3-30b-a3b --experts mxfp4 --layers 8 \
    --tokenizer tests/data/external/qwen3 -o $q 2>&1 | tail -1
  timeout 300 /usr/local/cuda/bin/ncu --launch-skip ${NCU_SKIP:-3000} --launch-count ${NCU_COUNT:-90} \
    ${NCU_FLAGS:-} \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv $M bench $q --backend cuda \
    --prompt-tokens 16 --gen 48 --runs 1 --no-probe >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
  /usr/bin/python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("ncu: no rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); mi = h.index("Metric Name"); vi = h.index("Metric Value")
ui = h.index("Metric Unit"); ii = h.index("ID")
k = collections.OrderedDict()
for r in rows[1:]:
    d = k.setdefault(r[ii], {"name": r[ki][:70]})
    v = float(r[vi].replace(",", "")); u = r[ui]
    if r[mi].startswith("gpu__time"): d["us"] = v * {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1}.get(u, 1e3)
    else: d["mb"] = v / 1e6 if u == "byte" else (v / 1e3 if u == "Kbyte" else (v if u == "Mbyte" else v * 1e3))
agg = collections.OrderedDict()
for d in k.values():
    a = agg.setdefault(d["name"], [0, 0.0, 0.0]); a[0] += 1; a[1] += d.get("us", 0); a[2] += d.get("mb", 0)
tot = sum(a[1] for a in agg.values())
print(f"{len(k)} kernels, {tot:.1f} us")
for n, (c, us, mb) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{us/c:8.2f} us x {c:3d}  {mb/c:8.3f} MB  {mb/c/(us/c)*1e-3 if us else 0:6.2f} TB/s  {n}")
PY
}
step_ncu_detail() {  # ncu sections for the kernels matching $NCU_KERNELS (8-layer decode)
  local q=/tmp/q30-8
  [ -f $q/config.json ] || $M synth --preset qwen3-30b-a3b --experts mxfp4 --layers 8 \
    --tokenizer tests/data/external/qwen3 -o $q 2>&1 | tail -1
  timeout 300 /usr/local/cuda/bin/ncu --launch-skip ${NCU_SKIP:-1500} --launch-count ${NCU_COUNT:-6} \
    --kernel-name "regex:${NCU_KERNELS:-moe}" ${NCU_FLAGS:-} --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    $M bench $q --backend cuda --prompt-tokens 16 --gen 48 --runs 1 --no-probe 2>&1 |
    grep -vE "^ *-+ *$|^ *$" | grep -E "moe_|attn_|gemv_|Duration|Throughput|Achieved Occupancy|Registers|Theoretical Occ|Stall|Warp Cycles|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Issued|Eligible|Active Warps" | head -${NCU_LINES:-150}
}
step_ncu_ops() {  # op-bench kernels under ncu (caches flushed): time, DRAM, issue, stalls; per $NCU_OPS filter
  for f in ${NCU_OPS:-qwen3 deepseek}; do
    CUDA_OPS_FILTER=$f timeout ${NCU_TIMEOUT:-200} /usr/local/cuda/bin/ncu \
      --kernel-name "regex:${NCU_KERNELS:-moe_}" --launch-skip ${NCU_SKIP:-20} \
      --launch-count ${NCU_COUNT:-4} ${NCU_FLAGS:---clock-control none} --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --page raw --csv ${NCU_BIN:-./$B/bench/cuda_ops_bench} \
      >"$OUT/ncu_ops_$f.csv" 2>"$OUT/ncu_ops_$f.err"
    echo "=== ncu ops: $f"; tail -2 "$OUT/ncu_ops_$f.err"
    /usr/bin/python3 scripts/ncu_raw_summary.py "$OUT/ncu_ops_$f.csv"
  done
}
step_ncu_src() {  # where the warps of the kernels matching $NCU_KERNELS stall, by SASS line; the SASS
  local f=${NCU_OPS:-deepseek}
  CUDA_OPS_FILTER=$f timeout ${NCU_TIMEOUT:-200} /usr/local/cuda/bin/ncu -f -o /tmp/ncu_src \
    --kernel-name "regex:${NCU_KERNELS:-moe_}" --launch-skip ${NCU_SKIP:-20} \
    --launch-count ${NCU_COUNT:-2} --clock-control none --section SourceCounters \
    --section WarpStateStats ./$B/bench/cuda_ops_bench >/dev/null 2>"$OUT/ncu_src.err"
  /usr/local/cuda/bin/ncu -i /tmp/ncu_src.ncu-rep --page source --csv --print-source sass \
    >"$OUT/ncu_src.csv" 2>>"$OUT/ncu_src.err"
  tail -2 "$OUT/ncu_src.err"
  /usr/bin/python3 scripts/ncu_src_summary.py "$OUT/ncu_src.csv"
  /usr/local/cuda/bin/cuobjdump -sass $(find $B -name 'decode_q8.cu.o' | head -1) >"$OUT/decode_q8.sass" 2>&1
  grep -c "^ */\*[0-9a-f]*\*/" "$OUT/decode_q8.sass"
}
step_profile() {  # kernel time per decode step and per 256-token prefill (nsys)
  local nsys; nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  [ -n "$nsys" ] || { echo "no nsys"; return 0; }
  for w in "256 2" "16 65"; do
    set -- $w
    timeout 150 $nsys profile -o /tmp/prof-$1 --force-overwrite true -t cuda $M bench $Q30 \
      --backend cuda --prompt-tokens $1 --gen $2 --runs 1 --no-probe --ctx 8448 >/dev/null 2>&1
    $nsys stats -q -r cuda_gpu_kern_sum -f csv -o /tmp/k-$1 /tmp/prof-$1.nsys-rep >/dev/null 2>&1
    cp /tmp/k-$1*.csv "$OUT/" 2>/dev/null
    echo "--- prompt $1 gen $2: kernels by total time"
    cut -d, -f1-4,9 /tmp/k-$1*.csv 2>/dev/null | head -16
  done
}
step_llama30() {
  wait ${CONVERT_PID:-} 2>/dev/null; tail -3 "$OUT/convert.log"
  local t0=$SECONDS
  while [ ! -x $LB/bin/llama-bench ] && ! grep -q "build rc" "$OUT/llama-build.log" 2>/dev/null &&
    [ $((SECONDS - t0)) -lt ${LLAMA_WAIT:-240} ]; do sleep 5; done
  tail -2 "$OUT/llama-build.log"
  [ -x $LB/bin/llama-bench ] && [ -f /tmp/q30.gguf ] || return 0
  timeout 120 $LB/bin/llama-bench -m /tmp/q30.gguf -p 256,8192 -n 128 -ngl 99 -r 3 -o json \
    >"$OUT/llama-gpu.json" 2>"$OUT/llama-gpu.err"; grep -E '"(n_prompt|n_gen|avg_ts)"' "$OUT/llama-gpu.json"
  timeout 150 $LB/bin/llama-bench -m /tmp/q30.gguf -p 256 -n 64 -ngl 99 -ot exps=CPU -t 16 -r 2 -o json \
    >"$OUT/llama-cpumoe.json" 2>"$OUT/llama-cpumoe.err"; grep -E '"(n_prompt|n_gen|avg_ts)"' "$OUT/llama-cpumoe.json"
}
steps="${*:-all}"
[ "$steps" = all ] && steps="build test bench"
# Every step's output also goes to $OUT/steps.log as it comes, so a call cut off
# at its time limit still returns what ran (the device tool returns $OUT then too).
for s in $steps; do
  echo "=== $s ($(date +%T))"
  step_$s || break
done 2>&1 | tee -a "$OUT/steps.log"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
# The device tool returns at most 8 files: past 7, everything goes into one
# archive (results.tgz) so that no JSON is left behind.
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 7 ]; then
  (cd "$OUT" && tar -czf /tmp/results.tgz --exclude=results.tgz . && find . -maxdepth 1 -type f -delete &&
   mv /tmp/results.tgz results.tgz && echo "outputs packed into results.tgz")
fi
