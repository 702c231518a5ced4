#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages moetier needs, only those missing.
#   --with-npm      also npm (scripts/fetch_tokenizers.sh, for the tests)
#   --with-browser  also Debian's chromium and the browser test's Node driver
#                   (tests/browser: `npm ci` of its pinned package-lock.json;
#                   it never downloads a browser of its own)
#   --build-only    only what building the moetier binary needs (no test or
#                   benchmark libraries; scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
with_npm=0 with_browser=0 build_only=0
for a in "$@"; do
  case $a in
    --with-npm) with_npm=1;;
    --with-browser) with_browser=1 with_npm=1;;
    --build-only) build_only=1;;
    *) echo "deps.sh: unknown option $a" >&2; exit 2;;
  esac
done
PKGS=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev
      libpcre2-dev libutf8proc-dev liburing-dev)
[ $build_only = 1 ] || PKGS+=(libgtest-dev libgmock-dev libbenchmark-dev python3)
[ $with_browser = 1 ] && PKGS+=(chromium)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# npm may come from outside Debian (nodesource); accept any working npm.
if [ $with_npm = 1 ] && ! command -v npm >/dev/null; then missing+=(npm); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The browser test's driver: playwright-core at the version package-lock.json
# pins, into tests/browser/node_modules (again only when the lock changed).
if [ $with_browser = 1 ]; then
  b=tests/browser
  if ! cmp -s "$b/package-lock.json" "$b/node_modules/.package-lock.json.installed" 2>/dev/null; then
    echo "npm ci in $b (playwright-core, no browser download)"
    (cd "$b" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --ignore-scripts --no-audit --no-fund \
      --loglevel=error)
    cp "$b/package-lock.json" "$b/node_modules/.package-lock.json.installed"
  fi
fi
