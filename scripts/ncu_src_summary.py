#!/usr/bin/env python3
"""Summarize `ncu --page source --csv --print-source sass`: per kernel, the
SASS lines with the most warp stall samples and the instruction mix.
Usage: ncu_src_summary.py CSV [TOP]"""
import csv
import sys
from collections import Counter


def main(path, top):
    lines = open(path, errors="replace").read().splitlines()
    # The export holds one table per kernel, each led by a header row.
    tables, cur = [], None
    for row in csv.reader(lines):
        if not row:
            continue
        if any("Source" == c.strip() for c in row) and any("Stall" in c for c in row):
            cur = {"head": row, "rows": []}
            tables.append(cur)
        elif cur is not None and len(row) == len(cur["head"]):
            cur["rows"].append(row)
        elif row and not cur:
            print("  ", ",".join(row)[:160])
    for t in tables:
        h = t["head"]
        src = h.index("Source") if "Source" in h else 1
        st = next((i for i, c in enumerate(h) if "Stall Sampling (All" in c), None)
        ex = next((i for i, c in enumerate(h) if c.strip() == "Instructions Executed"), None)
        if st is None:
            print("no stall column:", h[:12])
            continue
        def num(v):
            try:
                return float(v.replace(",", ""))
            except ValueError:
                return 0.0
        total = sum(num(r[st]) for r in t["rows"]) or 1.0
        print(f"=== kernel table: {len(t['rows'])} SASS lines, {total:.0f} stall samples")
        ops = Counter()
        for r in t["rows"]:
            op = r[src].split()[0] if r[src].split() else "?"
            if op.startswith("@"):
                op = r[src].split()[1] if len(r[src].split()) > 1 else op
            ops[op.split(".")[0]] += num(r[ex]) if ex is not None else 0
        print("  executed by opcode:", ", ".join(f"{k} {v:.0f}" for k, v in ops.most_common(14)))
        for r in sorted(t["rows"], key=lambda r: -num(r[st]))[:top]:
            print(f"  {100 * num(r[st]) / total:5.1f}%  {r[src][:90]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
