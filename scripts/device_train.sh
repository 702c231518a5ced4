#!/usr/bin/env bash
# The one command for the GPU machine: trains moetier-tiny end to end, unattended, offline.
#
#   scripts/device_train.sh           full run: ends within BUDGET_S seconds (default 540)
#   scripts/device_train.sh --smoke   tiny model, ~20 s of training: checks the whole pipeline
#
# Needs data/corpus/ (made by scripts/build_corpus.sh; git-ignored, so carry it) and
# python3 with torch (CUDA), transformers 5.17, tokenizers, safetensors, numpy.
# Steps: scripts/train_tokenizer.py (tokenizer + uint16 ids + eval fixtures),
# scripts/train_model.py (train, export MXFP4 checkpoint, float32 reference eval),
# scripts/write_model_doc.py (docs/embedded-model.md).
# Results go to $OUT (default /tmp/moetier-device-out), at most 5 files of <= 15 MiB:
#   NAME.tar.part00, NAME.tar.part01, ...  one tar, split: models/NAME/, tests/data/NAME/,
#                                          docs/training/NAME.log, the model doc
#   NAME.log, summary.txt                  readable without unpacking
# Unpack in the repo root: cat NAME.tar.part* | tar -x
set -uo pipefail

START=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
MODE=full
[[ "${1:-}" == "--smoke" ]] && MODE=smoke
OUTDIR=${OUT:-/tmp/moetier-device-out}
mkdir -p "$OUTDIR" docs/training
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=true

if [[ $MODE == smoke ]]; then
  NAME=moetier-tiny-smoke
  PRESET=smoke
  BUDGET_S=${BUDGET_S:-150}
  DOC=docs/embedded-model-smoke.md
  TOK_ARGS=(--sample-mib 2 --encode-mib 8 --windows 4)
  TRAIN_ARGS=(--minutes 0.34 --reserve 40 --log-every 20 --val-every 100 --sample-tokens 24)
else
  NAME=moetier-tiny
  PRESET=tiny
  BUDGET_S=${BUDGET_S:-540}
  DOC=docs/embedded-model.md
  TOK_ARGS=()
  TRAIN_ARGS=(--end-by $((START + BUDGET_S)) --reserve "${RESERVE_S:-75}")
fi
MODEL=models/$NAME
FIX=tests/data/$NAME
LOG=docs/training/$NAME.log
TOKENS=/tmp/$NAME-tokens

run() {
  echo "== $NAME device run ($MODE), budget ${BUDGET_S}s, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if [[ ! -f data/corpus/manifest.json ]]; then
    echo "data/corpus/manifest.json is missing: run scripts/build_corpus.sh and carry data/corpus"
    return 2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c 'import sys, torch, transformers, tokenizers, safetensors, numpy
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "tokenizers", tokenizers.__version__,
      "safetensors", safetensors.__version__, "numpy", numpy.__version__, "nproc", __import__("os").cpu_count())
assert torch.cuda.is_available(), "no CUDA device"' || return 3
  rm -rf "$MODEL" "$FIX" "$TOKENS"
  python3 scripts/train_tokenizer.py --corpus data/corpus --out "$MODEL" --tokens "$TOKENS" \
    --fixtures "$FIX" ${TOK_ARGS[@]+"${TOK_ARGS[@]}"} || return 4
  python3 scripts/train_model.py --preset "$PRESET" --tokens "$TOKENS" --out "$MODEL" \
    --fixtures "$FIX" ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"} || return 5
  python3 scripts/write_model_doc.py --eval "$MODEL/reference_eval.json" \
    --manifest data/corpus/manifest.json --out "$DOC" || return 6
  echo "== finished in $(( $(date +%s) - START ))s"
}

run 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}

cp "$LOG" "$OUTDIR/$NAME.log"
if [[ -f "$MODEL/model.safetensors" ]]; then
  PACK=()
  for p in "$MODEL" "$FIX" "$LOG" "$DOC"; do [[ -e "$p" ]] && PACK+=("$p"); done
  tar -cf "/tmp/$NAME.tar" "${PACK[@]}"
  rm -f "$OUTDIR/$NAME.tar.part"*
  split -b 15m -d -a 2 "/tmp/$NAME.tar" "$OUTDIR/$NAME.tar.part"
  TAR_SHA=$(sha256sum "/tmp/$NAME.tar" | cut -d' ' -f1)
else
  TAR_SHA=none
fi
python3 scripts/write_model_doc.py --summary --eval "$MODEL/reference_eval.json" \
  --exit-code "$RC" --seconds $(( $(date +%s) - START )) --tar-sha256 "$TAR_SHA" \
  > "$OUTDIR/summary.txt" 2>&1
cat "$OUTDIR/summary.txt"
ls -l "$OUTDIR"
exit "$RC"
