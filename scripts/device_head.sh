#!/usr/bin/env bash
# Exports the last commit (not the working tree) into .carry/head for
# `scripts/device.sh head`, so a device build sees only committed code.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry/head && mkdir -p .carry/head
git archive HEAD | tar -x -C .carry/head
echo "exported $(git rev-parse --short HEAD) to .carry/head"
