#!/usr/bin/env bash
# Rebuilds data/corpus/ (the moetier-tiny training and held-out text) from Debian packages.
#
#   scripts/build_corpus.sh            # download (once), extract (once), select, split, write
#   scripts/build_corpus.sh --force    # rewrite data/corpus/ even if it is up to date
#
# Packages are fetched with `apt-get download` into data/raw/debs/ and unpacked with
# `dpkg -x` into data/raw/pkgs/<package>/ (both git-ignored). The pinned versions below
# are the ones data/README.md records; if the archive has moved on (security updates
# replace old versions), the current candidate is used instead, with a warning, and the
# version actually used is what data/corpus/manifest.json records.
# Needs: apt-get, dpkg, tar, xz, python3 (standard library only). Re-runs are fast:
# downloads, extractions and the corpus itself are skipped when already up to date.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
RAW=$ROOT/data/raw
DEBS=$RAW/debs
PKGS=$RAW/pkgs
OUT=$ROOT/data/corpus
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

# package=version pins (see data/README.md)
PINS=(
  "linux-source-6.1=6.1.192-3"
  "python3.11-doc=3.11.2-6+deb12u9"
  "r-cran-janeaustenr=1.0.0-1"
  "perl-doc=5.36.0-7+deb12u4"
  "git-doc=1:2.39.5-0+deb12u3"
  "golang-1.19-src=1.19.8-2"
  "libpython3.11-stdlib=3.11.2-6+deb12u9"
  "libpython3.11-minimal=3.11.2-6+deb12u9"
)
# Kernel subtrees taken out of linux-source-6.1's tarball (Documentation: prose; the rest: C).
KERNEL_DIRS=(Documentation kernel mm lib block ipc init fs net/core net/ipv4 include/linux drivers/base)

mkdir -p "$DEBS" "$PKGS"
declare -A VERSION DEBFILE

have_lists() { apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [^(]'; }

for pin in "${PINS[@]}"; do
  pkg=${pin%%=*}
  ver=${pin#*=}
  # A .deb already downloaded for this package is reused (idempotent, no network).
  existing=$(ls "$DEBS/${pkg}_"*.deb 2>/dev/null | head -n1 || true)
  if [[ -z "$existing" ]]; then
    have_lists "$pkg" || apt-get update -qq
    if ! (cd "$DEBS" && apt-get download -qq "$pkg=$ver" 2>/dev/null); then
      cand=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
      echo "WARNING: $pkg=$ver is no longer in the archive; using $cand" >&2
      (cd "$DEBS" && apt-get download -qq "$pkg=$cand")
    fi
    existing=$(ls "$DEBS/${pkg}_"*.deb | head -n1)
  fi
  DEBFILE[$pkg]=$existing
  VERSION[$pkg]=$(dpkg-deb -f "$existing" Version)
  [[ "${VERSION[$pkg]}" == "$ver" ]] || echo "WARNING: $pkg is ${VERSION[$pkg]}, not the pinned $ver" >&2
done

# Extract each package once (a stamp names the .deb it came from).
for pkg in "${!DEBFILE[@]}"; do
  deb=${DEBFILE[$pkg]}
  stamp=$PKGS/$pkg.stamp
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$(basename "$deb")" ]]; then continue; fi
  echo "extracting $(basename "$deb")"
  rm -rf "${PKGS:?}/$pkg"
  mkdir -p "$PKGS/$pkg"
  dpkg -x "$deb" "$PKGS/$pkg"
  if [[ "$pkg" == linux-source-6.1 ]]; then
    tarball=$PKGS/$pkg/usr/src/linux-source-6.1.tar.xz
    mkdir -p "$PKGS/$pkg/src"
    members=()
    for d in "${KERNEL_DIRS[@]}"; do members+=("linux-source-6.1/$d"); done
    tar -xJf "$tarball" -C "$PKGS/$pkg/src" "${members[@]}"
    rm -f "$tarball"
  fi
  basename "$deb" > "$stamp"
done

# Versions and .deb checksums for the manifest.
VERSIONS_JSON=$RAW/versions.json
DEBS_JSON=$RAW/debs.json
{
  echo "{"
  first=1
  for pkg in $(printf '%s\n' "${!VERSION[@]}" | sort); do
    [[ $first == 1 ]] || echo ","
    first=0
    printf '  "%s": "%s"' "$pkg" "${VERSION[$pkg]}"
  done
  echo
  echo "}"
} > "$VERSIONS_JSON"
{
  echo "{"
  first=1
  for pkg in $(printf '%s\n' "${!DEBFILE[@]}" | sort); do
    [[ $first == 1 ]] || echo ","
    first=0
    sum=$(sha256sum "${DEBFILE[$pkg]}" | cut -d' ' -f1)
    printf '  "%s": {"deb": "%s", "deb_sha256": "%s"}' "$pkg" "$(basename "${DEBFILE[$pkg]}")" "$sum"
  done
  echo
  echo "}"
} > "$DEBS_JSON"

# The corpus is up to date when the selection code and the packages are unchanged.
FINGERPRINT=$(cat "$ROOT/scripts/corpus_tool.py" "$ROOT/scripts/build_corpus.sh" "$DEBS_JSON" | sha256sum | cut -d' ' -f1)
if [[ $FORCE == 0 && -f "$OUT/manifest.json" ]] && grep -q "\"fingerprint\": \"$FINGERPRINT\"" "$OUT/manifest.json"; then
  echo "data/corpus is up to date (fingerprint $FINGERPRINT)"
  exit 0
fi

python3 "$ROOT/scripts/corpus_tool.py" --raw "$PKGS" --out "$OUT" \
  --versions "$VERSIONS_JSON" --debs "$DEBS_JSON" --fingerprint "$FINGERPRINT"
du -sh "$OUT"
