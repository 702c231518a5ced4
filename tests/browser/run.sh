#!/usr/bin/env bash
# CTest `report_browser` (label browser): what a person does, end to end.
#   1. moetier bench on the embedded model (a small custom workload, 2 runs),
#   2. moetier report of that file, a committed llama.cpp result and a simulate
#      study -> BUILD/report.html,
#   3. headless Chromium over the page (report_test.js) -> BUILD/report-screenshot.png.
# Needs /usr/bin/chromium and tests/browser/node_modules (scripts/deps.sh
# --with-browser installs both). Either missing fails the test; it is skipped
# (exit 77) only when MOETIER_NO_BROWSER=1 is set.
#   run.sh MOETIER_BIN BUILD_DIR
set -euo pipefail
moetier=${1:?usage: run.sh MOETIER_BIN BUILD_DIR}
build=${2:?usage: run.sh MOETIER_BIN BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ "${MOETIER_NO_BROWSER:-}" = 1 ]; then
  echo "report_browser: skipped (MOETIER_NO_BROWSER=1)"
  exit 77
fi
chromium=${MOETIER_CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "report_browser: no Chromium at $chromium (bash scripts/deps.sh --with-browser)" >&2; exit 1; }
[ -d "$here/node_modules/playwright-core" ] || {
  echo "report_browser: no $here/node_modules/playwright-core (bash scripts/deps.sh --with-browser)" >&2
  exit 1
}
command -v node >/dev/null || { echo "report_browser: no node" >&2; exit 1; }

out=$build/browser
mkdir -p "$out"
"$moetier" bench "$root/models/moetier-tiny" --prompt-tokens 48 --gen 12 --runs 2 --threads 2 \
  --name "moetier cpu (browser test)" --monitor-period 0.05 --json "$out/bench.json"
"$moetier" report "$out/bench.json" "$root/bench/results/peers-llama.cpp-bench-moetier-tiny.json" \
  "$root/bench/results/study-miniature-simulate.json" -o "$build/report.html" \
  --title "moetier report (browser test)"
node "$here/report_test.js" "$build/report.html" "$out/bench.json" "$build/report-screenshot.png"
