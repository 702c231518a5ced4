#!/usr/bin/env python3
"""Compare a `moetier eval` report with the PyTorch reference figures (stdlib only).

  moetier eval --arm moetier=models/moetier-tiny \\
      --corpus code=tests/data/moetier-tiny/eval_code.txt \\
      --corpus prose=tests/data/moetier-tiny/eval_prose.txt \\
      --max-tokens 512 --windows 64 -o /tmp/tiny_eval.json
  scripts/compare_eval_reference.py --eval /tmp/tiny_eval.json \\
      --reference models/moetier-tiny/reference_eval.json --arm moetier

Prints a Markdown table (docs/embedded-model.md, "moetier versus the PyTorch reference"):
per corpus, the mean NLL and top-1 of both, and per window the worst relative NLL
difference and the top-1 count differences. Exits 1 when the windows do not line up
(different window length or count) or a corpus is missing.
"""

import argparse
import json
import math
import sys


def compare(ev, ref, arm):
    seq = ref["eval_windows"]["seq_len"]
    if ev["max_tokens"] != seq:
        sys.exit("window length %s in the report, %s in the reference" % (ev["max_tokens"], seq))
    rows = []
    for c in ev["corpora"]:
        r = ref["heldout"].get(c["name"])
        if r is None:
            sys.exit("corpus %s is not in the reference" % c["name"])
        s = c["scores"][arm]
        got_nll, want_nll = s["per_window_nll_sum"], r["per_window_nll_sum"]
        got_c, want_c = s["per_window_top1_correct"], r["per_window_top1_correct"]
        if len(got_nll) != len(want_nll):
            sys.exit("corpus %s: %d windows in the report, %d in the reference" % (
                c["name"], len(got_nll), len(want_nll)))
        rel = [abs(a - b) / b for a, b in zip(got_nll, want_nll)]
        dc = [a - b for a, b in zip(got_c, want_c)]
        n = s["predicted_tokens"]
        rows.append({
            "corpus": c["name"], "windows": len(got_nll), "pred": n // len(got_nll),
            "nll": s["mean_nll"], "nll_ref": sum(want_nll) / n,
            "top1": s["top1"], "top1_ref": sum(want_c) / n,
            "worst_rel": max(rel), "mean_rel": sum(rel) / len(rel),
            "windows_top1_differ": sum(1 for d in dc if d), "worst_top1": max(abs(d) for d in dc),
            "top1_total_diff": sum(dc), "seconds": s["seconds"],
        })
    return rows


def table(rows):
    out = ["| corpus | windows x predictions | mean NLL moetier | mean NLL PyTorch | relative "
           "difference | top-1 moetier | top-1 PyTorch | per-window NLL: worst / mean relative "
           "difference | windows whose top-1 count differs | worst top-1 count difference | "
           "moetier seconds |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append("| %s | %d x %d | %.6f | %.6f | %.1e | %.6f | %.6f | %.1e / %.1e | %d | %d (sum %+d) | "
                   "%.0f |" % (r["corpus"], r["windows"], r["pred"], r["nll"], r["nll_ref"],
                               abs(r["nll"] - r["nll_ref"]) / r["nll_ref"], r["top1"], r["top1_ref"],
                               r["worst_rel"], r["mean_rel"], r["windows_top1_differ"], r["worst_top1"],
                               r["top1_total_diff"], r["seconds"]))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", required=True, help="moetier eval -o report")
    ap.add_argument("--reference", default="models/moetier-tiny/reference_eval.json")
    ap.add_argument("--arm", default=None, help="arm name in the report (default: the baseline)")
    args = ap.parse_args()
    with open(args.eval) as f:
        ev = json.load(f)
    with open(args.reference) as f:
        ref = json.load(f)
    rows = compare(ev, ref, args.arm or ev["baseline"])
    print(table(rows))
    for r in rows:
        if not math.isfinite(r["worst_rel"]):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
