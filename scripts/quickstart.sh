#!/usr/bin/env bash
# Installs what is missing, builds, and runs moetier on the embedded model with
# a deliberately small expert arena, printing the hit rates.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
MODEL=models/moetier-tiny
[ -f $MODEL/config.json ] || MODEL=tests/data/fixtures/qwen3moe-mxfp4
exec ./build/src/tools/moetier run $MODEL --prompt "${1:-func main() {}" -n "${2:-64}" "${@:3}"
