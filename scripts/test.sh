#!/usr/bin/env bash
# Builds moetier and runs every test (CUDA tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --with-npm
bash scripts/fetch_tokenizers.sh
bash scripts/build.sh
cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900
