#!/usr/bin/env bash
# The main job: installs what is missing, builds the moetier binary, and runs
# it on the embedded model (models/moetier-tiny) with a deliberately small
# expert arena (128 of its 512 experts, plus a 32-slot transient ring), once on
# a Go prompt and once on an English one, printing the expert hit rates after
# each. Extra arguments are passed to both runs (e.g. --policy lfu, --temp 0).
#
# Only the `moetier` target is built: when the full build of scripts/test.sh
# exists (build/), its binary is brought up to date; otherwise a lean build
# goes to build-quickstart/ (no tests, no benchmarks), CPU-only unless a GPU
# answers nvidia-smi: nothing `moetier run` computes uses CUDA yet, and nvcc
# would be the slowest part of the build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --build-only
if [ -f build/build.ninja ]; then
  BUILD=build
else
  BUILD=build-quickstart
  CUDA=OFF
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    CUDA=AUTO
    if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
      export PATH=/usr/local/cuda/bin:$PATH
    fi
  fi
  if [ ! -f $BUILD/build.ninja ]; then
    cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOETIER_WERROR=ON \
      -DMOETIER_TESTS=OFF -DMOETIER_BENCH=OFF -DMOETIER_CUDA=$CUDA >/dev/null
  fi
fi
ninja -C $BUILD moetier >/dev/null
MODEL=models/moetier-tiny
MOETIER=./$BUILD/src/tools/moetier
FLAGS=(-n 80 --temperature 0.6 --top-p 0.9 --seed 1 --arena-experts 128 --transient 32 --stats)
$MOETIER check $MODEL
echo "--- code"
$MOETIER run $MODEL "${FLAGS[@]}" "$@" --prompt '// Copy copies n bytes from src to dst.
func Copy(dst io.Writer, src io.Reader, n int64) (int64, error) {'
echo "--- prose"
$MOETIER run $MODEL "${FLAGS[@]}" "$@" --prompt 'It was a fine morning, and Elizabeth'
