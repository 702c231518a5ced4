#!/usr/bin/env bash
# Interleaved A/B of two moetier binaries on moetier-tiny: prompt and decode
# tok/s at 1 and 2 threads, idle and with HOGS busy loops running (a machine
# shared with other work). Prints one JSON object (medians of ROUNDS runs).
#   bench/scripts/threads_ab.sh OLD_BIN NEW_BIN [ROUNDS] [HOGS]
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-5} HOGS=${4:-2}
cd "$(dirname "$0")/../.."
PROMPT="$(head -c 700 tests/data/moetier-tiny/eval_code.txt)"
one() {  # bin threads -> "prompt_tps decode_tps"
  "$1" run models/moetier-tiny --prompt "$PROMPT" -n 64 --temp 0 --ignore-eos --mapped \
    --threads "$2" 2>&1 >/dev/null | sed -n 's/.*prompt [0-9]* tokens, \([0-9.]*\) tok\/s | generated [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1 \2/p'
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
declare -A P D
for load in idle busy; do
  pids=()
  if [ $load = busy ]; then for i in $(seq "$HOGS"); do (while :; do :; done) & pids+=($!); done; fi
  for r in $(seq "$ROUNDS"); do
    for t in 1 2; do
      for b in old new; do
        bin=$OLD; [ $b = new ] && bin=$NEW
        read -r p d < <(one "$bin" $t) || { echo "threads_ab: $bin failed" >&2; exit 1; }
        P[$load,$t,$b]+="$p "; D[$load,$t,$b]+="$d "
      done
    done
  done
  for p in "${pids[@]}"; do kill "$p"; done
done
echo "{"
echo "  \"command\": \"bench/scripts/threads_ab.sh $OLD $NEW $ROUNDS $HOGS\","
echo "  \"machine\": \"$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)\","
echo "  \"model\": \"models/moetier-tiny, 700-byte code prompt (~420 tokens), 64 decoded tokens, --mapped\","
echo "  \"medians\": ["
first=1
for load in idle busy; do for t in 1 2; do for b in old new; do
  [ $first = 1 ] || echo ","; first=0
  pm=$(echo ${P[$load,$t,$b]} | tr ' ' '\n' | median); dm=$(echo ${D[$load,$t,$b]} | tr ' ' '\n' | median)
  printf '    {"load": "%s", "threads": %s, "binary": "%s", "prompt_tps": %s, "decode_tps": %s}' $load $t $b "$pm" "$dm"
done; done; done
echo; echo "  ]"; echo "}"
