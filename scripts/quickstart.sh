#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs moetier on the
# embedded model (models/moetier-tiny) with a deliberately small expert arena
# (128 of its 512 experts, plus a 32-slot transient ring), once on a Go prompt
# and once on an English one, printing the expert hit rates after each.
# Extra arguments are passed to both runs (e.g. --policy lfu, --arena-experts 64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh >/dev/null
MODEL=models/moetier-tiny
MOETIER=./build/src/tools/moetier
FLAGS=(-n 80 --temperature 0.6 --top-p 0.9 --seed 1 --arena-experts 128 --transient 32 --stats)
$MOETIER check $MODEL
echo "--- code"
$MOETIER run $MODEL "${FLAGS[@]}" "$@" --prompt '// Copy copies n bytes from src to dst.
func Copy(dst io.Writer, src io.Reader, n int64) (int64, error) {'
echo "--- prose"
$MOETIER run $MODEL "${FLAGS[@]}" "$@" --prompt 'It was a fine morning, and Elizabeth'
