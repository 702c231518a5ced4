#!/usr/bin/env bash
# Exports the last commit (not the working tree) into .carry/head for
# `scripts/device.sh head`, so a device build sees only committed code.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry/head && mkdir -p .carry/head
# Code only: models/ and tests/data/ are linked to the working tree's copies there.
git archive HEAD -- CMakeLists.txt cmake src tests/CMakeLists.txt tests/unit tests/golden \
  tests/kernels bench scripts .clang-format | tar -x -C .carry/head
echo "exported $(git rev-parse --short HEAD) to .carry/head"
