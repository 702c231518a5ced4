#!/usr/bin/env bash
# Packs this tree's moetier (./build, configured with -DMOETIER_CUDA=ON) as
# .carry/ab/NAME.xz for `scripts/device_cuda.sh abxz` (binaries side by side on
# the GPU machine). CMake re-reads the commit first, so the bench JSON names
# the commit the binary was built from (with -dirty for uncommitted changes).
# Usage: scripts/pack_ab.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] && [[ $1 =~ ^[A-Za-z0-9_-]+$ ]] || { echo "usage: scripts/pack_ab.sh NAME (letters, digits, _ -)" >&2; exit 2; }
cmake build >/dev/null  # re-reads the commit (git describe --always --dirty: src/bench/CMakeLists.txt)
commit=$(git describe --always --dirty)
ninja -C build moetier >/dev/null
mkdir -p .carry/ab
xz -T2 -c build/src/tools/moetier >".carry/ab/$1.xz.tmp" && mv ".carry/ab/$1.xz.tmp" ".carry/ab/$1.xz"
echo ".carry/ab/$1.xz: $commit, $(wc -c <".carry/ab/$1.xz") bytes"
