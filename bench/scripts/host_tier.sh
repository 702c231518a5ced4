#!/usr/bin/env bash
# The host tier against all-resident, interleaved: arena_bench with every
# expert in the host tier (--host-cache all, warmed), the old synchronous
# copies (--ab) and 4 KiB pages (--ab-huge) beside the mapped and 100% rows.
# Writes one JSON object to OUT: the exact command, the machine, arena_bench's
# rows (median of ROUNDS interleaved runs, every sample kept).
#   bench/scripts/host_tier.sh MODEL_DIR OUT [ROUNDS] [-- extra arena_bench flags]
# e.g. bench/scripts/host_tier.sh models/moetier-tiny bench/results/host-tier-moetier-tiny.json 5
set -euo pipefail
MODEL=$1 OUT=$2 ROUNDS=${3:-3}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
cd "$(dirname "$0")/../.."
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
args=(--sizes 100,28 --host-cache all --warm --ab --ab-huge --repeat "$ROUNDS" --threads 2 "$@")
build/bench/arena_bench "$MODEL" "${args[@]}" --json "$tmp" >&2
/usr/bin/python3 - "$MODEL" "$OUT" "$tmp" "$(git rev-parse --short HEAD)" "${args[@]}" <<'EOF'
import json, os, platform, sys
model, out, rows, commit, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
mem = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal"))
doc = {
    "command": " ".join(["build/bench/arena_bench", model] + args),
    "commit": commit,
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "ram_bytes": mem,
                "kernel": platform.release(), "note": "shared with other builds"},
    "rows": json.load(open(rows)),
}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())
os.rename(tmp, out)
EOF
echo "host_tier: wrote $OUT" >&2
