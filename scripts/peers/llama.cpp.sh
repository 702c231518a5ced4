#!/usr/bin/env bash
# llama.cpp, the peer moetier is measured against (docs/peers.md).
#
# Its source ships inside the npm package node-llama-cpp@3.22.1 as
# llama/gitRelease.bundle (a git bundle); nothing of it is kept in this repository.
# Bulky things (the package, the clone, builds) live under $PEERS_DIR (default
# /work/peers), outside the repository.
#
#   llama.cpp.sh fetch                        npm pack + clone the bundle -> $PEERS_DIR/llama.cpp
#   llama.cpp.sh build-cpu  [--src DIR] [--build DIR] [-j N]
#   llama.cpp.sh build-cuda [--src DIR] [--build DIR] [-j N] [--arch 90]
#   llama.cpp.sh pack-src OUT.tar.xz          the subset a CUDA build needs (no network there)
#   llama.cpp.sh convert MODEL_DIR OUT.gguf   moetier / HF qwen3_moe checkpoint -> GGUF
#   llama.cpp.sh bench GGUF [llama-bench args...]   llama-bench, JSON on stdout
#   llama.cpp.sh bench-json GGUF OUT.json [--like MOETIER.json] [--name ARM] [-- llama-bench args...]
#                                             llama-bench, converted to moetier-bench/1
#                                             (the raw output beside it: X.raw.json for X.json)
#   llama.cpp.sh version                      print the recorded version
#   llama.cpp.sh harness-moetier [BUILD]      moetier + moetier_logits in the repo's build/
#   llama.cpp.sh validate MODEL_DIR [OUT_DIR] [PROMPT...]
#                                             values, greedy tokens, logits: moetier vs llama.cpp
#   llama.cpp.sh bin NAME                     path of a built llama.cpp binary
#   llama.cpp.sh side-by-side MODEL_DIR OUT_DIR [...]   moetier vs llama-server (side_by_side.sh)
#
# Environment: PEERS_DIR, LLAMA_SRC (default $PEERS_DIR/llama.cpp), LLAMA_BUILD
# (build dir used by convert/bench; default: build-cuda if it has llama-bench, else
# build-cpu), JOBS (default: nproc), NICE (default 19).
set -euo pipefail

PKG=node-llama-cpp
PKG_VERSION=3.22.1
PEERS_DIR=${PEERS_DIR:-/work/peers}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Run from an unpacked pack-src archive, the source is the script's own folder.
if [ -z "${LLAMA_SRC:-}" ] && [ -f "$HERE/LLAMA_SOURCE_VERSION" ]; then LLAMA_SRC=$HERE; fi
LLAMA_SRC=${LLAMA_SRC:-$PEERS_DIR/llama.cpp}
NICE=${NICE:-19}

# Targets: the benchmark, the server, generation (completion is the classic
# prompt -> tokens tool; cli is the chat front end), and two small examples used
# for the value check (simple: greedy generation; eval-callback: tensor dumps).
TARGETS_TOOLS=(llama-bench llama-server llama-cli llama-completion llama-tokenize)
TARGETS_EXAMPLES=(llama-simple llama-eval-callback)

die() { echo "llama.cpp.sh: $*" >&2; exit 1; }
log() { echo "[llama.cpp.sh] $*" >&2; }

need_debs() {  # install only the missing Debian packages (scripts/deps.sh style)
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get"
  log "installing: ${missing[*]}"
  local SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

need_tools() {  # build tools: only ask apt for what is really absent (git: fetch only)
  local want=()
  command -v cmake >/dev/null || want+=(cmake)
  command -v g++ >/dev/null || want+=(g++)
  [ "${1:-}" = git ] && ! command -v git >/dev/null && want+=(git)
  [ ${#want[@]} -gt 0 ] && need_debs "${want[@]}"
  # ninja is preferred, not required (an offline machine may lack it)
  command -v ninja >/dev/null || ( need_debs ninja-build ) >/dev/null 2>&1 || true
  return 0
}

cmd_fetch() {
  mkdir -p "$PEERS_DIR"
  local tgz="$PEERS_DIR/$PKG-$PKG_VERSION.tgz"
  if [ ! -s "$tgz" ]; then
    command -v npm >/dev/null || need_debs npm
    log "npm pack $PKG@$PKG_VERSION -> $PEERS_DIR"
    (cd "$PEERS_DIR" && npm pack --silent "$PKG@$PKG_VERSION" >/dev/null)
    [ -s "$tgz" ] || die "npm pack did not produce $tgz"
  else
    log "have $tgz"
  fi
  local x="$PEERS_DIR/$PKG-$PKG_VERSION"
  if [ ! -s "$x/package/llama/gitRelease.bundle" ]; then
    mkdir -p "$x"
    tar -xzf "$tgz" -C "$x" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  fi
  if [ ! -d "$LLAMA_SRC/.git" ]; then
    need_tools git
    log "git clone bundle -> $LLAMA_SRC"
    git -c advice.detachedHead=false clone -q "$x/package/llama/gitRelease.bundle" "$LLAMA_SRC"
  else
    log "have $LLAMA_SRC"
  fi
  write_version "$LLAMA_SRC" "$x/package/llama/llama.cpp.info.json"
  cat "$PEERS_DIR/llama.cpp.version"
}

# llama.cpp's own version (CMakeLists.txt LLAMA_VERSION_*), the bundle's commit and
# commit count (what llama.cpp's build-info uses as the build number: the bundle is
# one squashed commit, so it is 1), and the package's release tag.
write_version() {
  local src=$1 info=${2:-}
  local maj min pat commit count date subject tag=""
  maj=$(sed -n 's/^set(LLAMA_VERSION_MAJOR \([0-9]*\))/\1/p' "$src/CMakeLists.txt")
  min=$(sed -n 's/^set(LLAMA_VERSION_MINOR \([0-9]*\))/\1/p' "$src/CMakeLists.txt")
  pat=$(sed -n 's/^set(LLAMA_VERSION_PATCH \([0-9]*\))/\1/p' "$src/CMakeLists.txt")
  commit=$(git -C "$src" rev-parse HEAD)
  count=$(git -C "$src" rev-list --count HEAD)
  date=$(git -C "$src" log -1 --format=%cI)
  subject=$(git -C "$src" log -1 --format=%B | grep -v '^## SQUASHED ##' | grep -v '^$' | head -1)
  [ -n "$info" ] && [ -f "$info" ] && tag=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$info")
  {
    echo "package=$PKG@$PKG_VERSION"
    echo "llama_cpp_version=$maj.$min.$pat"
    echo "release_tag=$tag"
    echo "commit=$commit"
    echo "build_number=$count"
    echo "commit_date=$date"
    echo "last_upstream_change=$subject"
  } > "$PEERS_DIR/llama.cpp.version.tmp"
  mv "$PEERS_DIR/llama.cpp.version.tmp" "$PEERS_DIR/llama.cpp.version"
}

# Options common to both builds: static binaries, no tests, no network at
# configure or build time (no prebuilt web UI download, no npm UI build, no curl,
# no OpenSSL), no llguidance.
common_cmake_args() {
  local src=$1
  local gen=Ninja
  command -v ninja >/dev/null || gen="Unix Makefiles"
  CMAKE_ARGS=(-G "$gen" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF
    -DLLAMA_TOOLS_INSTALL=OFF -DGGML_CCACHE=OFF -Wno-dev)
  TARGETS=("${TARGETS_TOOLS[@]}")
  if [ -f "$src/examples/CMakeLists.txt" ]; then
    CMAKE_ARGS+=(-DLLAMA_BUILD_EXAMPLES=ON)
    TARGETS+=("${TARGETS_EXAMPLES[@]}")
  else
    CMAKE_ARGS+=(-DLLAMA_BUILD_EXAMPLES=OFF)
  fi
  # A source archive has no .git: give the build info what fetch recorded.
  if [ ! -e "$src/.git" ] && [ -f "$src/LLAMA_SOURCE_VERSION" ]; then
    local c n
    c=$(sed -n 's/^commit=//p' "$src/LLAMA_SOURCE_VERSION" | cut -c1-7)
    n=$(sed -n 's/^build_number=//p' "$src/LLAMA_SOURCE_VERSION")
    [ -n "$c" ] && CMAKE_ARGS+=(-DLLAMA_BUILD_COMMIT="$c")
    [ -n "$n" ] && CMAKE_ARGS+=(-DLLAMA_BUILD_NUMBER="$n")
  fi
}

cmd_build() {  # build-cpu | build-cuda
  local kind=$1; shift
  local src=$LLAMA_SRC build="" jobs=${JOBS:-$(nproc)} arch=90 configure_only=0
  local extra=()
  while [ $# -gt 0 ]; do
    case $1 in
      --src) src=$2; shift 2;;
      --build) build=$2; shift 2;;
      -j) jobs=$2; shift 2;;
      -j*) jobs=${1#-j}; shift;;
      --arch) arch=$2; shift 2;;
      --configure-only) configure_only=1; shift;;
      --target) extra+=("$2"); shift 2;;
      *) die "build: unknown option $1";;
    esac
  done
  [ -f "$src/CMakeLists.txt" ] || die "no llama.cpp source at $src (run fetch, or pass --src)"
  src=$(cd "$src" && pwd)
  need_tools
  common_cmake_args "$src"
  if [ "$kind" = cuda ]; then
    local nvcc
    nvcc=$(command -v nvcc || true)
    [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
    [ -n "$nvcc" ] || die "build-cuda: nvcc not found (PATH or /usr/local/cuda/bin)"
    CMAKE_ARGS+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
      -DCMAKE_CUDA_COMPILER="$nvcc")
    build=${build:-$PEERS_DIR/build-cuda}
  else
    CMAKE_ARGS+=(-DGGML_CUDA=OFF)
    build=${build:-$PEERS_DIR/build-cpu}
  fi
  # the value-check harness (our code, linked to llama.cpp's library)
  if [ -f "$HERE/llama_harness.cmake" ] && [ -f "$HERE/llama_logits.cpp" ] && [ -f "$HERE/ggml_dequant.cpp" ]; then
    CMAKE_ARGS+=(-DCMAKE_PROJECT_llama.cpp_INCLUDE="$HERE/llama_harness.cmake")
    TARGETS+=(llama_logits ggml_dequant)
  fi
  [ ${#extra[@]} -gt 0 ] && TARGETS=("${extra[@]}")
  log "configure $src -> $build"
  log "cmake -S $src -B $build ${CMAKE_ARGS[*]}"
  nice -n "$NICE" cmake -S "$src" -B "$build" "${CMAKE_ARGS[@]}" >"$build.configure.log" 2>&1 \
    || { tail -40 "$build.configure.log" >&2; die "configure failed (log: $build.configure.log)"; }
  grep -E "llama.cpp version|CUDA Toolkit found|Using CUDA architectures|CMAKE_BUILD_TYPE" \
    "$build.configure.log" >&2 || true
  [ $configure_only = 1 ] && { log "configured (--configure-only)"; return 0; }
  log "build -j$jobs: ${TARGETS[*]}"
  nice -n "$NICE" cmake --build "$build" -j "$jobs" --target "${TARGETS[@]}"
  log "binaries in $build/bin:"
  ls "$build/bin" >&2 2>/dev/null || true
}

# What a CUDA build from source needs, nothing else: the library, ggml (without
# the backends the GPU machine does not use), common, vendor, cmake, the tools'
# CMake tree with the sources of the tools we build, the two examples, gguf-py
# and the HF converter. The web UI's sources (8 MB) are left out: with
# LLAMA_BUILD_UI=OFF and LLAMA_USE_PREBUILT_UI=OFF only its CMake and templates
# are read.
cmd_pack_src() {
  local out=${1:-}
  [ -n "$out" ] || die "usage: pack-src OUT.tar.xz"
  [ -f "$LLAMA_SRC/CMakeLists.txt" ] || die "no llama.cpp source at $LLAMA_SRC (run fetch)"
  [ -f "$PEERS_DIR/llama.cpp.version" ] || write_version "$LLAMA_SRC"
  mkdir -p "$(dirname "$out")"
  out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
  local stage
  stage=$(mktemp -d "${TMPDIR:-/tmp}/llama-src.XXXXXX")
  trap 'rm -rf "$stage"' RETURN
  local d=$stage/llama.cpp
  mkdir -p "$d"
  (cd "$LLAMA_SRC" && git ls-files -z) >"$stage/all.lst"
  # keep-list (prefixes), then drop-list
  python3 - "$stage/all.lst" "$stage/keep.lst" <<'EOF'
import sys
names = open(sys.argv[1], 'rb').read().split(b'\0')
names = [n.decode() for n in names if n]
keep_prefix = ['CMakeLists.txt', 'LICENSE', 'cmake/', 'include/', 'src/', 'common/',
               'vendor/', 'ggml/', 'gguf-py/', 'convert_hf_to_gguf.py', 'conversion/',
               'licenses/', 'scripts/ui-assets.cmake', 'tools/CMakeLists.txt',
               'examples/CMakeLists.txt', 'pocs/CMakeLists.txt']
tools_dirs = ['batched-bench', 'gguf-split', 'imatrix', 'llama-bench', 'completion',
              'perplexity', 'quantize', 'cli', 'server', 'tokenize', 'tts', 'mtmd',
              'cvector-generator', 'export-lora', 'fit-params', 'results', 'rpc']
keep_prefix += ['tools/%s/' % t for t in tools_dirs]
keep_prefix += ['tools/ui/CMakeLists.txt', 'tools/ui/ui.cpp.in', 'tools/ui/ui.h.in']
# examples/ and pocs/ CMakeLists add every example directory; they are small
# apart from platform apps, which are never built here.
keep_prefix += ['examples/', 'pocs/']
drop_prefix = ['ggml/src/ggml-vulkan/', 'ggml/src/ggml-sycl/', 'ggml/src/ggml-metal/',
               'ggml/src/ggml-cann/', 'ggml/src/ggml-opencl/', 'ggml/src/ggml-musa/',
               'ggml/src/ggml-hexagon/', 'ggml/src/ggml-webgpu/', 'ggml/src/ggml-zdnn/',
               'ggml/src/ggml-zendnn/', 'ggml/src/ggml-virtgpu/', 'ggml/src/ggml-openvino/',
               'ggml/src/ggml-kompute/', 'ggml/src/ggml-blas/', 'ggml/src/ggml-rpc/',
               'ggml/src/ggml-et/', 'ggml/src/ggml-hip/',
               'examples/llama.android/', 'examples/llama.swiftui/', 'examples/sycl/',
               'examples/batched.swift/', 'examples/llama.vim', 'examples/model-conversion/',
               'tools/server/tests/', 'tools/server/public', 'tools/server/themes/',
               'tools/mtmd/legacy-models/', 'tools/mtmd/tests', 'gguf-py/tests/']
def keep(n):
    if not any(n == p or n.startswith(p) for p in keep_prefix):
        return False
    if any(n.startswith(p) for p in drop_prefix):
        # a backend's CMakeLists must not be referenced; ggml/src/CMakeLists only
        # adds the ones that are enabled, so dropping the directories is safe
        return False
    return True
with open(sys.argv[2], 'w') as f:
    for n in names:
        if keep(n):
            f.write(n + '\n')
EOF
  (cd "$LLAMA_SRC" && tar -cf - -T "$stage/keep.lst") | tar -xf - -C "$d"
  cp "$PEERS_DIR/llama.cpp.version" "$d/LLAMA_SOURCE_VERSION"
  cp "$HERE/llama.cpp.sh" "$d/llama.cpp.sh"
  local f
  for f in moetier_to_gguf.py check_gguf_values.py compare_logits.py llama_logits.cpp ggml_dequant.cpp \
           llama_bench_to_moetier.py \
           llama_harness.cmake; do
    [ -f "$HERE/$f" ] && cp "$HERE/$f" "$d/$f"
  done
  tar -C "$stage" --sort=name --owner=0 --group=0 --mtime='2026-01-01' \
    -cf - llama.cpp | nice -n "$NICE" xz -T2 -9 >"$out.tmp"
  mv "$out.tmp" "$out"
  log "wrote $out ($(du -h "$out" | cut -f1), $(wc -l <"$stage/keep.lst") files)"
  log "on the target: tar -xJf $(basename "$out") && bash llama.cpp/llama.cpp.sh build-cuda --src llama.cpp"
}

find_gguf_py() {  # llama.cpp's gguf-py: next to this script in an archive, or the clone
  local c
  for c in "${LLAMA_GGUF_PY:-}" "$LLAMA_SRC/gguf-py" "$HERE/gguf-py"; do
    [ -n "$c" ] && [ -f "$c/gguf/__init__.py" ] && { echo "$c"; return 0; }
  done
  die "no gguf-py found (set LLAMA_SRC or LLAMA_GGUF_PY)"
}

pick_python() {  # Debian's python3 sees Debian's numpy; a pyenv/venv one may not
  local p
  for p in "${PYTHON:-}" /usr/bin/python3 python3; do
    [ -n "$p" ] && command -v "$p" >/dev/null && "$p" -c 'import numpy, yaml' 2>/dev/null \
      && { echo "$p"; return 0; }
  done
  need_debs python3-numpy python3-yaml
  echo /usr/bin/python3
}

cmd_convert() {
  [ $# -ge 2 ] || die "usage: convert MODEL_DIR OUT.gguf [moetier_to_gguf.py options]"
  local conv=$HERE/moetier_to_gguf.py py
  [ -f "$conv" ] || die "missing $conv"
  py=$(pick_python)
  LLAMA_GGUF_PY=$(find_gguf_py) "$py" "$conv" "$@"
}

find_bin() {  # find_bin NAME
  local b
  for b in "${LLAMA_BUILD:-}" "$PEERS_DIR/build-cuda" "$PEERS_DIR/build-cpu"; do
    [ -n "$b" ] && [ -x "$b/bin/$1" ] && { echo "$b/bin/$1"; return 0; }
  done
  die "no $1 built (build-cpu / build-cuda, or set LLAMA_BUILD)"
}

# moetier's side of the value check: moetier and moetier_logits, built in the
# repository's build/ (harness.cmake is injected after moetier's project()).
cmd_harness_moetier() {
  local root build
  root=$(cd "$HERE/../.." && pwd)
  build=${1:-$root/build}
  [ -f "$root/src/runtime/model.h" ] || die "harness-moetier: run from the moetier repository"
  nice -n "$NICE" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMOETIER_CUDA=OFF -DMOETIER_BENCH=OFF -DMOETIER_TESTS=OFF \
    -DCMAKE_PROJECT_moetier_INCLUDE="$HERE/harness.cmake" >/dev/null
  nice -n "$NICE" ninja -C "$build" -j "${JOBS:-$(nproc)}" moetier moetier_logits >&2
}

# validate MODEL_DIR [OUT_DIR] [PROMPT...]: convert (as is, and --all-f32), check
# both GGUFs' values against the checkpoint, then greedy tokens and logits of
# moetier vs llama.cpp (both harnesses, both GGUFs), and moetier run vs
# llama-simple (the shipped tools, greedy). Writes
# OUT_DIR/validate.json (default OUT_DIR: $PEERS_DIR/validate/<model name>).
cmd_validate() {
  [ $# -ge 1 ] || die "usage: validate MODEL_DIR [OUT_DIR] [PROMPT...]"
  local model=$1 out=${2:-}; shift; [ $# -gt 0 ] && shift
  local name root mbuild py
  name=$(basename "$(cd "$model" && pwd)")
  out=${out:-$PEERS_DIR/validate/$name}
  root=$(cd "$HERE/../.." && pwd)
  mbuild=${MOETIER_BUILD:-$root/build}
  py=$(pick_python)
  mkdir -p "$out"
  LLAMA_GGUF_PY=$(find_gguf_py); export LLAMA_GGUF_PY
  local prompts=("$@")
  [ ${#prompts[@]} -eq 0 ] && prompts=("The quick brown fox" "def fibonacci(n):"
    "Once upon a time, in a small village," "#include <stdio.h>
int main(void) {" "The capital of France is")
  local n=${VALIDATE_N:-32}
  [ -x "$mbuild/src/tools/moetier" ] && [ -x "$mbuild/moetier_logits" ] || cmd_harness_moetier "$mbuild"
  local ll lsimple
  ll=$(find_bin llama_logits); lsimple=$(find_bin llama-simple)
  cmd_convert "$model" "$out/$name.gguf" >"$out/convert.json"
  cmd_convert "$model" "$out/$name.all-f32.gguf" --all-f32 >"$out/convert-all-f32.json"
  "$py" "$HERE/check_gguf_values.py" "$model" "$out/$name.gguf" \
    --ggml-dequant "$(find_bin ggml_dequant)" >"$out/values.json" || true
  "$py" "$HERE/check_gguf_values.py" "$model" "$out/$name.all-f32.gguf" >"$out/values-all-f32.json" || true
  local i=0 p results=()
  for p in "${prompts[@]}"; do
    "$mbuild/moetier_logits" "$model" --prompt "$p" -n "$n" --dump "$out/p$i.moetier.f32" \
      >"$out/p$i.moetier.json"
    "$ll" "$out/$name.gguf" --prompt "$p" -n "$n" --dump "$out/p$i.llama.f32" >"$out/p$i.llama.json"
    "$ll" "$out/$name.all-f32.gguf" --prompt "$p" -n "$n" --dump "$out/p$i.llama-f32.f32" \
      >"$out/p$i.llama-f32.json"
    "$py" "$HERE/compare_logits.py" "$out/p$i.moetier.json" "$out/p$i.moetier.f32" \
      "$out/p$i.llama.json" "$out/p$i.llama.f32" >"$out/p$i.compare.json" || true
    "$py" "$HERE/compare_logits.py" "$out/p$i.moetier.json" "$out/p$i.moetier.f32" \
      "$out/p$i.llama-f32.json" "$out/p$i.llama-f32.f32" >"$out/p$i.compare-f32.json" || true
    # the shipped tools, greedy: moetier run --temperature 0, llama-simple (greedy sampler)
    "$mbuild/src/tools/moetier" run "$model" --prompt "$p" -n "$n" --temperature 0 \
      >"$out/p$i.moetier-run.txt" 2>"$out/p$i.moetier-run.err"
    "$lsimple" -m "$out/$name.gguf" -n "$n" "$p" >"$out/p$i.llama-simple.txt" \
      2>"$out/p$i.llama-simple.err"
    i=$((i + 1))
  done
  "$py" "$HERE/summarize_validate.py" "$out" "${prompts[@]}" >"$out/validate.json.tmp"
  mv "$out/validate.json.tmp" "$out/validate.json"
  cat "$out/validate.json"
}

cmd_bench() {
  [ $# -ge 1 ] || die "usage: bench GGUF [llama-bench args...]"
  local gguf=$1; shift
  [ -f "$gguf" ] || die "no such file $gguf"
  local bin
  bin=$(find_bin llama-bench)
  log "$bin -m $gguf -o json $*"
  "$bin" -m "$gguf" -o json "$@"
}

# bench-json GGUF OUT.json [--like FILE] [--name ARM] [-- llama-bench args...]:
# llama-bench -o json, kept as X.raw.json for OUT = X.json, then llama_bench_to_moetier.py into
# OUT.json (moetier-bench/1) with the exact command and the recorded version.
cmd_bench_json() {
  [ $# -ge 2 ] || die "usage: bench-json GGUF OUT.json [--like FILE] [--name ARM] [-- llama-bench args...]"
  local gguf=$1 out=$2; shift 2
  local conv=(--version-file "$PEERS_DIR/llama.cpp.version")
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case $1 in
      --like|--name) conv+=("$1" "$2"); shift 2;;
      *) die "bench-json: unknown option $1 (llama-bench options go after --)";;
    esac
  done
  [ "${1:-}" = -- ] && shift
  [ -f "$gguf" ] || die "no such file $gguf"
  local bin
  bin=$(find_bin llama-bench)
  log "$bin -m $gguf -o json $*"
  local raw=${out%.json}.raw.json
  "$bin" -m "$gguf" -o json "$@" >"$raw.tmp"
  mv "$raw.tmp" "$raw"
  /usr/bin/python3 "$HERE/llama_bench_to_moetier.py" "$raw" -o "$out" "${conv[@]}" \
    --command "llama-bench -m $gguf -o json $*"
}

case ${1:-} in
  fetch) shift; cmd_fetch "$@";;
  build-cpu) shift; cmd_build cpu "$@";;
  build-cuda) shift; cmd_build cuda "$@";;
  pack-src) shift; cmd_pack_src "$@";;
  convert) shift; cmd_convert "$@";;
  bench) shift; cmd_bench "$@";;
  bench-json) shift; cmd_bench_json "$@";;
  harness-moetier) shift; cmd_harness_moetier "$@";;
  validate) shift; cmd_validate "$@";;
  version) cat "$PEERS_DIR/llama.cpp.version";;
  bin) shift; find_bin "$@";;
  side-by-side) shift; exec bash "$HERE/side_by_side.sh" "$@";;
  *) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ] && exit 2; exit 0;;
esac
