#!/usr/bin/python3
"""Medians and moetier / llama.cpp ratios of a peers_ab.sh JSON (stdin -> stdout).

Each round's ratio is taken from the same round (interleaved runs), and the
median of those ratios is reported beside the ratio of the medians."""
import json
import statistics as st
import sys

d = json.load(sys.stdin)
out = {}
for t in sorted({r["threads"] for r in d["runs"]}):
    rs = [r for r in d["runs"] if r["threads"] == t]
    s = {}
    for phase in ("prompt", "decode"):
        m = [r[f"moetier_{phase}_tps"] for r in rs]
        ll = [r[f"llama_{phase}_tps"] for r in rs]
        s[phase] = {
            "moetier_median_tps": round(st.median(m), 1),
            "llama_median_tps": round(st.median(ll), 1),
            "ratio_of_medians": round(st.median(m) / st.median(ll), 3),
            "median_of_round_ratios": round(st.median(a / b for a, b in zip(m, ll)), 3),
            "round_ratios": [round(a / b, 3) for a, b in zip(m, ll)],
        }
    s["moetier_rss_kib_max"] = max(r["moetier_rss_kib"] for r in rs)
    out[str(t)] = s
d["summary"] = out
json.dump(d, sys.stdout, indent=1)
print()
