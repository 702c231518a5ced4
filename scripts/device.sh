#!/usr/bin/env bash
# The one script run on the GPU machine (see docs/device.md). Steps, any subset:
#   fixtures   regenerate tests/data/fixtures with transformers (golden references)
#   tokrefs    HF tokenizers reference ids for the test corpus (tests/data/tokenizer_refs)
#   build      configure + build with CUDA, run every test (the `cuda` label included)
#   head       the same on the last commit only: `git archive HEAD` unpacked into
#              .carry/head here (scripts/device_head.sh), carried, built there
#   train      train the embedded model (scripts/device_train.sh)
# Results are copied into $OUT (at most 8 files come back).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
for step in "$@"; do
  echo "=== $step ($(date +%T))"
  case $step in
    fixtures)
      python3 scripts/gen_fixtures.py --out tests/data/fixtures 2>&1
      tar czf "$OUT/fixtures.tgz" tests/data/fixtures ;;
    tokrefs)
      python3 scripts/tokenizer_refs.py --out tests/data/tokenizer_refs \
        tests/data/fixtures/qwen3moe-bf16/tokenizer.json \
        tests/data/external/qwen3/tokenizer.json tests/data/external/deepseek_v3/tokenizer.json \
        2>&1 | tail -20
      tar czf "$OUT/tokrefs.tgz" tests/data/tokenizer_refs ;;
    build)
      # The GPU image lacks PCRE2 and utf8proc headers: unpack the carried
      # Debian packages (.carry/debs, fetched by scripts/fetch_device_debs.sh).
      for f in .carry/debs/libpcre2-dev_*.deb .carry/debs/libutf8proc*.deb; do
        [ -f "$f" ] && dpkg -x "$f" /
      done
      ldconfig
      cmake -S . -B build-gpu -G Ninja -DMOETIER_CUDA=ON -DMOETIER_WERROR=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 >/tmp/build.log 2>&1 &&
        ninja -C build-gpu >>/tmp/build.log 2>&1 || { tail -40 /tmp/build.log; continue; }
      (cd build-gpu && ctest --output-on-failure -j8 >/tmp/ctest.log 2>&1; grep -E "tests passed|Failed|\*\*\*|Total Test" /tmp/ctest.log | tail -25) ;;
    head)
      for f in .carry/debs/libpcre2-dev_*.deb .carry/debs/libutf8proc*.deb; do
        [ -f "$f" ] && dpkg -x "$f" /
      done
      ldconfig
      ln -sfn "$PWD/models" .carry/head/models
      ln -sfn "$PWD/tests/data" .carry/head/tests/data
      (cd .carry/head && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOETIER_CUDA=ON \
        -DMOETIER_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/tmp/build.log 2>&1 &&
        ninja -C build-gpu >>/tmp/build.log 2>&1) || { grep -B2 -A6 "error" /tmp/build.log | head -60; continue; }
      (cd .carry/head/build-gpu && ctest --output-on-failure -j8 >/tmp/ctest.log 2>&1
       grep -E "tests passed|Failed|\*\*\*|Total Test" /tmp/ctest.log | tail -25
       ctest -L cuda --output-on-failure -V 2>&1 | grep -E "DeviceQuery|OK|SKIP|PASS|FAIL" | head) ;;
    train)
      bash scripts/device_train.sh 2>&1 | tail -40 ;;
    train-smoke)
      bash scripts/device_train.sh --smoke 2>&1 | tail -40 ;;
    *) echo "unknown step $step" ;;
  esac
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
