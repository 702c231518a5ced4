#!/usr/bin/env python3
"""Summary of `llama.cpp.sh validate OUT_DIR` (one JSON object on stdout).

    summarize_validate.py OUT_DIR PROMPT...
"""
import json
import sys
from pathlib import Path


def main() -> int:
    out, prompts = Path(sys.argv[1]), sys.argv[2:]
    rows = []
    for i, prompt in enumerate(prompts):
        c = json.loads((out / f"p{i}.compare.json").read_text())
        c32 = json.loads((out / f"p{i}.compare-f32.json").read_text())
        mrun = (out / f"p{i}.moetier-run.txt").read_text(errors="replace").rstrip("\n")
        lsim = (out / f"p{i}.llama-simple.txt").read_text(errors="replace")
        # llama-simple echoes the prompt, then the continuation
        lcont = (lsim[len(prompt):] if lsim.startswith(prompt) else lsim).rstrip("\n")
        rows.append({
            "prompt": prompt, "n_prompt": c["n_prompt"],
            "prompt_ids_equal": c["prompt_ids_equal"],
            "greedy_ids_equal": c["generated_equal"], "n_generated": c["n_generated"],
            "first_divergence": c["first_divergence"],
            "max_abs_logit_last_prompt": c["last_prompt_max_abs"],
            "logit_range_last_prompt": c["last_prompt_top"]["range"],
            "top5_last_prompt": c["last_prompt_top"]["top_a"],
            "top5_equal_last_prompt": c["last_prompt_top"]["top_equal"],
            "max_abs_logit_all_steps": c["max_abs_all_steps"],
            "mean_abs_logit_all_steps": c["mean_abs_all_steps"],
            "top5_equal_all_steps": c["top_equal_all_steps"],
            "steps_compared": c["steps_compared"],
            "all_f32": {"greedy_ids_equal": c32["generated_equal"],
                          "max_abs_logit_last_prompt": c32["last_prompt_max_abs"],
                          "max_abs_logit_all_steps": c32["max_abs_all_steps"],
                          "mean_abs_logit_all_steps": c32["mean_abs_all_steps"],
                        "per_step_max_abs": c32["per_step_max_abs"]},
            "route_margin": c["route_margin"],
            "tools_text_equal": mrun == lcont,
            "moetier_run": mrun, "llama_simple": lcont})
    conv = json.loads((out / "convert.json").read_text())
    values = json.loads((out / "values.json").read_text())
    values32 = json.loads((out / "values-all-f32.json").read_text())
    summary = {
        "all_greedy_equal": all(r["greedy_ids_equal"] for r in rows),
        "all_tools_text_equal": all(r["tools_text_equal"] for r in rows),
        "max_abs_logit_last_prompt": max(r["max_abs_logit_last_prompt"] for r in rows),
        "max_abs_logit_all_steps": max(r["max_abs_logit_all_steps"] for r in rows),
        "all_f32_greedy_equal": all(r["all_f32"]["greedy_ids_equal"] for r in rows),
        "all_f32_max_abs_logit_last_prompt": max(r["all_f32"]["max_abs_logit_last_prompt"]
                                                 for r in rows),
        "all_f32_max_abs_logit_all_steps": max(r["all_f32"]["max_abs_logit_all_steps"]
                                               for r in rows),
    }
    print(json.dumps({"summary": summary, "values": values, "values_all_f32": values32,
                      "convert": {k: conv[k] for k in ("bytes", "tensors", "experts", "dense",
                                                       "seconds")},
                      "vocab": conv["vocab"], "prompts": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
