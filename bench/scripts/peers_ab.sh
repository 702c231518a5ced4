#!/usr/bin/env bash
# Interleaved A/B of moetier and llama.cpp on the same machine, model and
# threads: prompt processing (421-token prompt) and decode (64 tokens after
# that prompt), at 1 and 2 threads, ROUNDS rounds of (moetier, llama.cpp) for
# each thread count. Prints one JSON object: per-run figures, medians, the
# ratios moetier / llama.cpp of the medians, and peak RSS.
#   bench/scripts/peers_ab.sh [ROUNDS] [MOETIER_BIN] [GGUF]
# moetier: `run --mapped --temp 0 --ignore-eos` (its stderr line gives prompt and
# decode tok/s); llama.cpp: llama-bench -p 421 -n 0 (prompt) and -p 0 -n 64 -d 421
# (decode at the same depth), its defaults otherwise (f16 KV cache, flash
# attention auto). MOETIER_CPU_ACT passes through (q8 default).
set -euo pipefail
ROUNDS=${1:-5}
cd "$(dirname "$0")/../.."
BIN=${2:-build/src/tools/moetier}
GGUF=${3:-/work/peers/gguf/moetier-tiny.gguf}
LB=$(scripts/peers/llama.cpp.sh bin llama-bench)
PROMPT="$(head -c 700 tests/data/moetier-tiny/eval_code.txt)"
TIME=/usr/bin/time
moetier_one() {  # threads -> "prompt_tps decode_tps rss_kib"
  local out
  out=$($TIME -f 'RSS %M' "$BIN" run models/moetier-tiny --prompt "$PROMPT" -n 64 --temp 0 \
    --ignore-eos --mapped --threads "$1" 2>&1 >/dev/null)
  echo "$(echo "$out" | sed -n 's/.*prompt [0-9]* tokens, \([0-9.]*\) tok\/s | generated [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1 \2/p') $(echo "$out" | sed -n 's/^RSS //p')"
}
llama_tps() {  # threads args... -> avg_ts of the one test
  "$LB" -m "$GGUF" -t "$1" -r 1 -o csv "${@:2}" 2>/dev/null | /usr/bin/python3 -c '
import csv, sys
rows = list(csv.DictReader(sys.stdin))
print(rows[-1]["avg_ts"])'
}
llama_rss() {  # threads -> peak RSS KiB of a pp+tg run
  $TIME -f 'RSS %M' "$LB" -m "$GGUF" -t "$1" -r 1 -p 421 -n 64 -o csv 2>&1 >/dev/null | sed -n 's/^RSS //p'
}
echo "{\"runs\": ["
first=1
for r in $(seq "$ROUNDS"); do
  for t in 1 2; do
    read -r mp md mrss < <(moetier_one "$t")
    lp=$(llama_tps "$t" -p 421 -n 0)
    ld=$(llama_tps "$t" -p 0 -n 64 -d 421)
    [ $first = 1 ] || echo ","; first=0
    printf '  {"round": %s, "threads": %s, "moetier_prompt_tps": %s, "moetier_decode_tps": %s, "moetier_rss_kib": %s, "llama_prompt_tps": %s, "llama_decode_tps": %s}' \
      "$r" "$t" "$mp" "$md" "$mrss" "$lp" "$ld"
  done
done
echo
echo "], \"llama_rss_kib\": {\"1\": $(llama_rss 1), \"2\": $(llama_rss 2)},"
echo "\"load_after\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
