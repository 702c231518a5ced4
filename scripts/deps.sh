#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages moetier needs, only those missing.
#   --with-npm    also npm (scripts/fetch_tokenizers.sh, for the tests)
#   --build-only  only what building the moetier binary needs (no test or
#                 benchmark libraries; scripts/quickstart.sh)
set -euo pipefail
PKGS=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev
      libpcre2-dev libutf8proc-dev liburing-dev)
[ "${1:-}" = "--build-only" ] || PKGS+=(libgtest-dev libgmock-dev libbenchmark-dev)
[ "${1:-}" = "--with-npm" ] && PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# npm may come from outside Debian (nodesource); accept any working npm.
if [ "${1:-}" = "--with-npm" ] && command -v npm >/dev/null; then
  missing=("${missing[@]/npm}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
