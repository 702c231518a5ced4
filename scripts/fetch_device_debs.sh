#!/usr/bin/env bash
# Debian packages the GPU machine's image lacks, carried there as .carry/debs.
set -euo pipefail
mkdir -p "$(dirname "$0")/../.carry/debs"
cd "$(dirname "$0")/../.carry/debs"
apt-get download libpcre2-dev libutf8proc-dev libutf8proc2
