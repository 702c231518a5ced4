#!/usr/bin/env bash
# moetier and llama.cpp's llama-server side by side, one command (docs/peers.md,
# "Side by side"):
#
#   side_by_side.sh MODEL_DIR OUT_DIR [--threads N] [--ctx N]
#       [--workload W,... | --prompt-tokens N --gen N] [--rounds R] [--runs K]
#       [--gpu none|all|experts-cpu] [--mem-cap BYTES [--require-cap]] [--port P]
#       [--moetier-flags "..."] [--llama-flags "..."]
#
# Builds what is missing (moetier's build/, llama.cpp from the pinned npm bundle
# through llama.cpp.sh fetch + build-cpu or build-cuda), converts MODEL_DIR to
# GGUF (llama.cpp.sh convert; kept under $PEERS_DIR/gguf), starts llama-server on
# 127.0.0.1 with the same threads and context (one slot, prompt cache off, so
# every request prefills its whole prompt as moetier's fresh sessions do), waits
# until /health answers, then runs R rounds, alternating which engine goes first:
# `moetier bench MODEL_DIR` and `moetier bench --endpoint http://127.0.0.1:P`,
# each K runs of the same workload (the first of each round is its cold run).
# The server is stopped on exit, whatever happens (trap). Writes OUT_DIR/rounds/,
# OUT_DIR/side-by-side.json (moetier-bench/1, two arms, the peer's version and
# flags, the memory cap, ratios) and OUT_DIR/side-by-side.html (moetier report).
#
# --gpu: none (CPU: -ngl 0, moetier --backend cpu), all (-ngl 99, every layer on
# the GPU; moetier --backend cuda), experts-cpu (-ngl 99 -ot exps=CPU: experts in
# host RAM; moetier --backend cuda; add the matching arena flags with
# --moetier-flags). --mem-cap: each engine's process runs in its own systemd scope
# with MemoryMax=BYTES (and no swap) when systemd is PID 1; otherwise no cap is
# applied and the JSON says so and why (--require-cap makes that an error).
#
# Environment: PEERS_DIR (default /work/peers), MOETIER_BIN (default
# build/src/tools/moetier), JOBS, NICE (llama.cpp.sh's).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LLAMA_SH=$HERE/llama.cpp.sh
PEERS_DIR=${PEERS_DIR:-/work/peers}
export PEERS_DIR

die() { echo "side_by_side.sh: $*" >&2; exit 1; }
log() { echo "[side_by_side.sh] $*" >&2; }

parse_args() {
  [ $# -ge 2 ] || { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
  MODEL=$1 OUT=$2; shift 2
  THREADS=$(nproc) CTX=1024 WORKLOAD=code,prose PROMPT_TOKENS="" GEN="" ROUNDS=3 RUNS=3
  GPU=none CAP="" REQUIRE_CAP=0 PORT="" MOETIER_FLAGS="" LLAMA_FLAGS=""
  while [ $# -gt 0 ]; do
    case $1 in
      --threads) THREADS=$2; shift 2;;
      --ctx) CTX=$2; shift 2;;
      --workload) WORKLOAD=$2; shift 2;;
      --prompt-tokens) PROMPT_TOKENS=$2; shift 2;;
      --gen) GEN=$2; shift 2;;
      --rounds) ROUNDS=$2; shift 2;;
      --runs) RUNS=$2; shift 2;;
      --gpu) GPU=$2; shift 2;;
      --mem-cap) CAP=$2; shift 2;;
      --require-cap) REQUIRE_CAP=1; shift;;
      --port) PORT=$2; shift 2;;
      --moetier-flags) MOETIER_FLAGS=$2; shift 2;;
      --llama-flags) LLAMA_FLAGS=$2; shift 2;;
      *) die "unknown option $1";;
    esac
  done
  [ -f "$MODEL/config.json" ] || die "$MODEL: no config.json (a checkpoint directory is needed)"
  case $GPU in none|all|experts-cpu) ;; *) die "--gpu: '$GPU' is not none, all or experts-cpu";; esac
  for v in THREADS CTX ROUNDS RUNS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v,,}: '${!v}' is not a positive integer"
  done
  [ -z "$CAP" ] || [[ $CAP =~ ^[1-9][0-9]*$ ]] || die "--mem-cap: '$CAP' is not a byte count"
  if [ -n "$PROMPT_TOKENS$GEN" ]; then
    WL_ARGS=(--prompt-tokens "${PROMPT_TOKENS:-0}" --gen "${GEN:-0}")
  else
    WL_ARGS=(--workload "$WORKLOAD")
  fi
}

# The pieces, built or converted when missing.
ensure_moetier() {
  MOETIER=${MOETIER_BIN:-$ROOT/build/src/tools/moetier}
  [ -x "$MOETIER" ] || { log "building moetier"; bash "$ROOT/scripts/build.sh" >&2; }
  [ -x "$MOETIER" ] || die "no moetier binary at $MOETIER"
}

ensure_llama() {
  local kind=cpu
  [ "$GPU" = none ] || kind=cuda
  export LLAMA_BUILD=$PEERS_DIR/build-$kind
  if [ ! -x "$LLAMA_BUILD/bin/llama-server" ]; then
    log "building llama.cpp ($kind) from the pinned npm bundle"
    bash "$LLAMA_SH" fetch >&2
    bash "$LLAMA_SH" "build-$kind" --target llama-server >&2
  fi
  SERVER_BIN=$LLAMA_BUILD/bin/llama-server
  [ -x "$SERVER_BIN" ] || die "no llama-server at $SERVER_BIN"
  [ -f "$PEERS_DIR/llama.cpp.version" ] || die "no $PEERS_DIR/llama.cpp.version (llama.cpp.sh fetch)"
  GGUF=$PEERS_DIR/gguf/$(basename "$(cd "$MODEL" && pwd)").gguf
  local newest
  newest=$(find "$MODEL" -maxdepth 1 -name '*.safetensors' -newer "$GGUF" 2>/dev/null | head -1)
  if [ ! -s "$GGUF" ] || [ -n "$newest" ]; then
    mkdir -p "$(dirname "$GGUF")"
    log "converting $MODEL -> $GGUF"
    bash "$LLAMA_SH" convert "$MODEL" "$GGUF" >"$OUT/convert.json"
  fi
}

# The memory cap: CAP_MODE systemd (each engine in its own scope) or none, with
# CAP_WHY saying why not.
detect_cap() {
  CAP_MODE=none CAP_WHY=""
  if [ -z "$CAP" ]; then CAP_WHY="no cap requested (--mem-cap)"; return; fi
  local init
  init=$(ps -p 1 -o comm= 2>/dev/null || echo unknown)
  if [ "$init" != systemd ]; then
    CAP_WHY="PID 1 is '$init', not systemd: systemd-run cannot make a scope with MemoryMax"
  elif ! command -v systemd-run >/dev/null; then
    CAP_WHY="no systemd-run"
  elif ! systemd-run --scope --quiet -p MemoryMax="$CAP" true 2>/dev/null; then
    CAP_WHY="systemd-run --scope -p MemoryMax failed here"
  else
    CAP_MODE=systemd
  fi
  if [ $CAP_MODE = none ]; then
    [ $REQUIRE_CAP = 1 ] && die "--require-cap: $CAP_WHY"
    log "memory cap NOT applied: $CAP_WHY"
  fi
}

capped() {  # capped CMD...: CMD under the memory cap, when one is applied
  if [ "$CAP_MODE" = systemd ]; then
    systemd-run --scope --quiet -p MemoryMax="$CAP" -p MemorySwapMax=0 -- "$@"
  else
    "$@"
  fi
}
# The same, replacing the (sub)shell: `capped_exec CMD &` makes $! the command
# itself (systemd-run --scope execs it too), so the trap signals the server.
capped_exec() {
  if [ "$CAP_MODE" = systemd ]; then
    exec systemd-run --scope --quiet -p MemoryMax="$CAP" -p MemorySwapMax=0 -- "$@"
  fi
  exec "$@"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

SERVER_PID=""
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    local i
    for i in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$SERVER_PID" 2>/dev/null && kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  wait "$SERVER_PID" 2>/dev/null || true
  log "llama-server stopped"
  SERVER_PID=""
}

start_server() {
  [ -n "$PORT" ] || PORT=$(free_port)
  URL=http://127.0.0.1:$PORT
  local ngl=(-ngl 0)
  [ "$GPU" = all ] && ngl=(-ngl 99)
  [ "$GPU" = experts-cpu ] && ngl=(-ngl 99 -ot exps=CPU)
  # shellcheck disable=SC2206
  SERVER_FLAGS=(-t "$THREADS" -tb "$THREADS" -c "$CTX" -np 1 --no-cache-prompt "${ngl[@]}" $LLAMA_FLAGS)
  log "$SERVER_BIN -m $GGUF --host 127.0.0.1 --port $PORT ${SERVER_FLAGS[*]}"
  capped_exec "$SERVER_BIN" -m "$GGUF" --host 127.0.0.1 --port "$PORT" "${SERVER_FLAGS[@]}" \
    >"$OUT/llama-server.log" 2>&1 &
  SERVER_PID=$!
  trap stop_server EXIT
  trap 'stop_server; exit 130' INT TERM
  local i
  for i in $(seq 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$OUT/llama-server.log" >&2; die "llama-server exited"; }
    if curl -sf "$URL/health" >/dev/null 2>&1; then
      log "llama-server (pid $SERVER_PID, $(ps -p "$SERVER_PID" -o comm=)) ready at $URL"
      return 0
    fi
    sleep 0.2
  done
  die "llama-server not ready after 120 s (log: $OUT/llama-server.log)"
}

run_moetier() {  # run_moetier ROUND
  local probe=(--no-probe) backend=(--backend cpu)
  [ "$1" = 1 ] && probe=()
  [ "$GPU" = none ] || backend=(--backend cuda)
  # shellcheck disable=SC2206
  capped "$MOETIER" bench "$MODEL" "${WL_ARGS[@]}" --runs "$RUNS" --threads "$THREADS" \
    --ctx "$CTX" "${backend[@]}" $MOETIER_FLAGS "${probe[@]}" --name "moetier t$THREADS" \
    --json "$OUT/rounds/moetier-$1.json" 2>>"$OUT/moetier.log" ||
    { tail -3 "$OUT/moetier.log" >&2; die "round $1: moetier bench failed (log: $OUT/moetier.log)"; }
}

run_peer() {  # run_peer ROUND
  "$MOETIER" bench "$MODEL" --endpoint "$URL" "${WL_ARGS[@]}" --runs "$RUNS" \
    --name "llama.cpp llama-server t$THREADS" --json "$OUT/rounds/llama-$1.json" 2>>"$OUT/peer.log" ||
    { tail -3 "$OUT/peer.log" >&2; die "round $1: moetier bench --endpoint failed (log: $OUT/peer.log)"; }
}

rounds() {
  mkdir -p "$OUT/rounds"
  : >"$OUT/moetier.log"; : >"$OUT/peer.log"
  ORDER=()
  local r
  for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then
      log "round $r/$ROUNDS: moetier, then llama.cpp"
      run_moetier "$r"; run_peer "$r"; ORDER+=("moetier,llama.cpp")
    else
      log "round $r/$ROUNDS: llama.cpp, then moetier"
      run_peer "$r"; run_moetier "$r"; ORDER+=("llama.cpp,moetier")
    fi
  done
}

write_meta() {  # the side_by_side object of the combined file (values through the environment)
  local hwm
  hwm=$(awk '/^VmHWM:/ {print $2 * 1024}' "/proc/$SERVER_PID/status" 2>/dev/null || true)
  S_COMMAND=$COMMAND S_MODEL=$MODEL S_THREADS=$THREADS S_CTX=$CTX S_ROUNDS=$ROUNDS S_RUNS=$RUNS \
    S_GPU=$GPU S_ORDER="${ORDER[*]}" S_CAP=$CAP S_CAP_MODE=$CAP_MODE S_CAP_WHY=$CAP_WHY \
    S_URL=$URL S_GGUF=$GGUF S_HWM=$hwm S_FLAGS="${SERVER_FLAGS[*]}" \
    S_SERVER="$SERVER_BIN -m $GGUF --host 127.0.0.1 --port $PORT ${SERVER_FLAGS[*]}" \
    python3 - "$OUT/meta.json" "$PEERS_DIR/llama.cpp.version" <<'EOF'
import json, os, sys
e = os.environ
version = dict(l.rstrip("\n").split("=", 1) for l in open(sys.argv[2]) if "=" in l)
meta = {
    "script": "scripts/peers/side_by_side.sh", "command": e["S_COMMAND"], "model": e["S_MODEL"],
    "threads": int(e["S_THREADS"]), "ctx": int(e["S_CTX"]), "rounds": int(e["S_ROUNDS"]),
    "runs_per_round": int(e["S_RUNS"]), "gpu": e["S_GPU"], "order": e["S_ORDER"].split(),
    "memory_cap": {"requested_bytes": int(e["S_CAP"]) if e["S_CAP"] else None,
                   "applied": e["S_CAP_MODE"] != "none", "how": e["S_CAP_MODE"],
                   "why_not": e["S_CAP_WHY"]},
    "peer": {"version": version, "url": e["S_URL"], "gguf": e["S_GGUF"],
             "server_command": e["S_SERVER"], "flags": e["S_FLAGS"]},
}
if e["S_HWM"]:
    meta["peer"]["peak_rss_bytes"] = int(float(e["S_HWM"]))
with open(sys.argv[1], "w") as f:
    json.dump(meta, f, indent=2)
EOF
}

main() {
  COMMAND="scripts/peers/side_by_side.sh $*"
  parse_args "$@"
  mkdir -p "$OUT"
  ensure_moetier
  ensure_llama
  detect_cap
  start_server
  rounds
  write_meta
  stop_server
  local m=() p=() r
  for r in $(seq "$ROUNDS"); do m+=("$OUT/rounds/moetier-$r.json"); p+=("$OUT/rounds/llama-$r.json"); done
  python3 "$HERE/side_by_side_combine.py" --moetier "${m[@]}" --peer "${p[@]}" \
    --meta "$OUT/meta.json" -o "$OUT/side-by-side.json"
  "$MOETIER" report "$OUT/side-by-side.json" -o "$OUT/side-by-side.html" \
    --title "moetier vs llama.cpp: $(basename "$MODEL"), $THREADS threads"
  log "wrote $OUT/side-by-side.json and $OUT/side-by-side.html"
}

main "$@"
