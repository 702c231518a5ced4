#!/usr/bin/env python3
"""Compare moetier_logits and llama_logits runs (docs/peers.md).

    compare_logits.py A.json A.f32 B.json B.f32 [--top 5]

A/B: the JSON each harness printed and its --dump file ([N+1, vocab] f32).
Reports whether the prompt ids and the greedy ids agree, and, for every step
while the two token streams are still equal (the inputs are then identical),
the max |logit difference| over the whole vocabulary, the same relative to the
logits' range, and whether the top-K ids agree; row 0 is the last prompt
position. Prints one JSON object; route_margin (moetier_logits' smallest gap
between the k-th and (k+1)-th router probabilities per step) is passed through.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a_json")
    ap.add_argument("a_f32")
    ap.add_argument("b_json")
    ap.add_argument("b_f32")
    ap.add_argument("--top", type=int, default=5)
    a = ap.parse_args()
    ja, jb = json.load(open(a.a_json)), json.load(open(a.b_json))
    V = ja["n_vocab"]
    if jb["n_vocab"] != V:
        print(json.dumps({"error": f"n_vocab {V} vs {jb['n_vocab']}"}))
        return 1
    la = np.fromfile(a.a_f32, np.float32).reshape(-1, V)
    lb = np.fromfile(a.b_f32, np.float32).reshape(-1, V)
    ga, gb = ja["generated_ids"], jb["generated_ids"]
    same_prefix = 0
    while same_prefix < min(len(ga), len(gb)) and ga[same_prefix] == gb[same_prefix]:
        same_prefix += 1
    steps = []
    # row s is comparable when the first s generated tokens agree
    for s in range(min(len(la), len(lb), same_prefix + 1)):
        x, y = la[s].astype(np.float64), lb[s].astype(np.float64)
        d = np.abs(x - y)
        ta = np.argsort(-x, kind="stable")[: a.top].tolist()
        tb = np.argsort(-y, kind="stable")[: a.top].tolist()
        steps.append({"step": s, "max_abs": float(d.max()), "mean_abs": float(d.mean()),
                      "range": float(x.max() - x.min()), "top_equal": ta == tb,
                      "top_a": ta, "top_b": tb,
                      "top_a_logits": [round(float(x[i]), 4) for i in ta],
                      "top_b_logits": [round(float(y[i]), 4) for i in ta]})
    r = {
        "prompt_ids_equal": ja["prompt_ids"] == jb["prompt_ids"],
        "n_prompt": len(ja["prompt_ids"]),
        "generated_equal": ga == gb,
        "n_generated": len(ga),
        "first_divergence": None if ga == gb else same_prefix,
        "text_a": ja.get("text"), "text_b": jb.get("text"),
        "last_prompt_max_abs": steps[0]["max_abs"] if steps else None,
        "last_prompt_top": steps[0] if steps else None,
        "max_abs_all_steps": max(s["max_abs"] for s in steps) if steps else None,
        "mean_abs_all_steps": float(np.mean([s["mean_abs"] for s in steps])) if steps else None,
        "top_equal_all_steps": all(s["top_equal"] for s in steps),
        "steps_compared": len(steps),
        "per_step_max_abs": [round(s["max_abs"], 5) for s in steps],
        "route_margin": ja.get("route_margin", jb.get("route_margin")),
    }
    print(json.dumps(r, indent=1))
    return 0 if r["prompt_ids_equal"] and r["generated_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
