#!/usr/bin/env python3
"""Writes docs/embedded-model.md (or a short summary) from models/NAME/reference_eval.json.

  write_model_doc.py --eval models/moetier-tiny/reference_eval.json \
      --manifest data/corpus/manifest.json --out docs/embedded-model.md
  write_model_doc.py --summary --eval ... [--exit-code N --seconds S --tar-sha256 H]

Standard library only. Every figure comes from the JSON files; the prose around them says
why the model is built the way it is.
"""

import argparse
import json
import os
import sys

WHY = """\
## Why this configuration

The budget is 24 MB for the whole checkpoint, tokenizer included. An MXFP4 expert weight
costs 4.25 bits (a 4-bit e2m1 code plus one 8-bit power-of-two scale per 32 weights); a
bf16 weight costs 16. Expert parameters are therefore almost four times cheaper than
dense ones, and the configuration spends the budget accordingly:

- **64 experts per layer, top-8, normalized top-k weights** (Qwen3-30B-A3B routes 8 of
  128 the same way). The issue asks for at least 64 experts and k <= 8; k = 8 gives each
  token the most expert capacity allowed. With a few minutes of training the model sees
  each training token several times, so extra compute per token costs little data and
  buys quality.
- **Small, fine-grained experts** (moe_intermediate_size 64): many small experts in many
  layers (8 x 64 = 512 experts) rather than fewer large ones. This is the regime of
  DeepSeek-V4 (256 experts, top-6) and Qwen3 that moetier is built for, and it gives the
  locality measurements below something to find. MXFP4 blocks run along each
  projection's input dimension, so hidden and intermediate sizes are multiples of 32.
- **hidden 256, 8 layers, 4 query heads and 2 KV heads of 64 (GQA 2:1), q/k RMSNorm**:
  depth rather than width at this size; GQA and q/k norm exercise the same attention path
  as the real qwen3_moe checkpoints.
- **Tied input/output embeddings and an 8192-id byte-level BPE**: the embedding is the
  largest bf16 tensor; tying it and keeping the vocabulary small leave the budget to the
  experts.
- **Router auxiliary loss 0.001**: Qwen3's default, with transformers' load-balancing loss.
  That loss counts all k choices of a token, so 0.001 at k = 8 is about the strength of
  Switch Transformer's 0.01 at k = 1. Each batch is half code, half prose, and the loss
  only sees the expert histogram pooled over the batch and the layers, so experts stay
  free to specialize by domain. The locality table counts unused experts, the sign of a
  loss too weak; a much stronger one would flatten the routing skew that locality is about.
- **Quantization-aware tail**: the last part of training runs the expert projections on
  their MXFP4 values (straight-through gradient), so the exported experts are the ones the
  model was trained with. The table shows held-out NLL before and after MXFP4.
- **Sequence length 512, RoPE theta 10000**: max_position_embeddings is the trained
  length; longer contexts were never seen.
"""


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt_bytes(n):
    return "{:,}".format(int(n))


def config_table(r):
    c = r["config"]
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "norm_topk_prob", "tie_word_embeddings", "max_position_embeddings", "rope_parameters",
            "router_aux_loss_coef", "rms_norm_eps", "eos_token_id", "pad_token_id"]
    lines = ["| field | value |", "|---|---|"]
    for k in keys:
        if k in c:
            lines.append("| %s | %s |" % (k, json.dumps(c[k])))
    t = r["training"]
    size = r["size"]
    lines += ["", "Parameters: %s in all, %s in experts (MXFP4), %s elsewhere (bf16)." % (
        fmt_bytes(t["parameters"]), fmt_bytes(t["expert_parameters"]),
        fmt_bytes(t["parameters"] - t["expert_parameters"]))]
    lines += ["", "| file | bytes | sha256 |", "|---|---|---|"]
    for name, f in sorted(size["files"].items()):
        lines.append("| %s | %s | `%s` |" % (name, fmt_bytes(f["bytes"]), f["sha256"][:16]))
    lines.append("| **total** | **%s** | limit %s |" % (fmt_bytes(size["total_bytes"]), fmt_bytes(size["limit_bytes"])))
    return "\n".join(lines)


def quality_table(r):
    lines = ["| held-out | windows x tokens | mean NLL (nats) | perplexity | top-1 | bits/byte | NLL before MXFP4 |",
             "|---|---|---|---|---|---|---|"]
    for d in ("code", "prose"):
        h, b = r["heldout"][d], r["heldout_before_mxfp4"][d]
        lines.append("| %s | %d x %d | %.4f | %.2f | %.4f | %.4f | %.4f |" % (
            d, h["windows"], r["eval_windows"]["seq_len"], h["mean_nll"], h["perplexity"], h["top1"],
            h["bits_per_byte"], b["mean_nll"]))
    return "\n".join(lines)


def locality_table(r):
    loc = r["locality"]
    lines = ["Share of routed (token, expert) calls that go to the %d most used experts of %d "
             "(the top %d%%; uniform routing would give %.2f):" % (
                 loc["top_experts"], round(loc["top_experts"] / loc["uniform_share"]),
                 round(100 * loc["top_fraction"]), loc["uniform_share"]), "",
             "| layer | code | prose | code+prose | top-set overlap | code on prose's top | prose on code's top "
             "| unused experts (code/prose) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in loc["layers"]:
        lines.append("| %d | %.3f | %.3f | %.3f | %.2f | %.3f | %.3f | %d / %d |" % (
            row["layer"], row["code"]["top_share"], row["prose"]["top_share"], row["all"]["top_share"],
            row["top_set_overlap"], row["code_calls_on_prose_top"], row["prose_calls_on_code_top"],
            row["code"]["unused_experts"], row["prose"]["unused_experts"]))
    lines += ["", "Top-set overlap is the share of code's top experts that are also among prose's. "
              "\"code on prose's top\" is the share of code's calls that a cache holding prose's hot set would "
              "serve (and the other way round)."]
    return "\n".join(lines)


def training_section(r):
    t = r["training"]
    h = t.get("hyper", {})
    lines = ["- %s steps (%s planned) of %s sequences x %s tokens, %s tokens in %s s: %s tokens/s on %s." % (
        t["steps"], t["planned_steps"], h.get("batch"), h.get("seq_len"), fmt_bytes(t["tokens"]), t["seconds"],
        fmt_bytes(t["tokens_per_second"]), r["versions"].get("device", "?")),
             "- AdamW (0.9, 0.95), peak lr %s, %s warmup steps, cosine to %s x peak, weight decay %s, "
             "gradient clip 1.0, bf16 autocast, seed %s." % (
                 h.get("lr"), h.get("warmup"), h.get("min_lr_ratio"), h.get("weight_decay"), t.get("seed")),
             "- Router aux loss coefficient %s; MXFP4 (quantization-aware) from step %s." % (
                 h.get("aux_coef"), t.get("qat_from_step")),
             "- Experts forward during training: `%s` (relative error against a dense float32 reference on "
             "a probe: %s)." % (t.get("experts_impl"), ", ".join("%.1e" % e for e in t.get("experts_probe_rel_err", []))),
             "- Versions: %s." % ", ".join("%s %s" % kv for kv in r["versions"].items() if kv[0] != "device")]
    vals = [x for x in t.get("history", []) if "val" in x]
    if vals:
        lines += ["", "Held-out NLL during training (first windows, bf16, before MXFP4 export):", "",
                  "| step | code | prose |", "|---|---|---|"]
        for x in vals:
            lines.append("| %d | %.4f | %.4f |" % (x["step"], x["val"]["code"], x["val"]["prose"]))
    return "\n".join(lines)


def corpus_section(manifest):
    if not manifest:
        return "(data/corpus/manifest.json was not available when this page was written.)"
    lines = ["| corpus | package | version | license | train docs | train bytes | held-out docs |",
             "|---|---|---|---|---|---|---|"]
    for name, s in sorted(manifest["sources"].items(), key=lambda kv: (kv[1]["domain"], kv[0])):
        lines.append("| %s (%s) | %s | %s | %s | %s | %s | %s |" % (
            name, s["domain"], s["package"], s["version"], s["license"], s.get("train_docs", 0),
            fmt_bytes(s.get("train_bytes", 0)), s.get("heldout_docs", 0)))
    return "\n".join(lines)


def samples_section(r):
    out = []
    for s in r["samples"]:
        text = (s["prompt"] + s["text"]).replace("```", "'''")
        out += ["**%s** (prompt, then %d greedy tokens):" % (s["name"], len(s["greedy_ids"])), "", "```",
                text, "```", ""]
    return "\n".join(out)


# A hand-written section of the existing page that a rewrite keeps (its figures come from
# running `moetier eval`, not from reference_eval.json): from its heading to the next "## ".
# It is kept only while it names the sha256 of the current model.safetensors; for a new
# model it is dropped (rerun the command it shows and paste the new table).
MOETIER_VS_REF = "## moetier versus the PyTorch reference"


def kept_section(path, heading, model_sha256):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    start = text.find("\n" + heading + "\n")
    if start < 0:
        return []
    end = text.find("\n## ", start + 1 + len(heading))
    section = text[start + 1:end + 1 if end >= 0 else len(text)].rstrip() + "\n"
    if model_sha256 not in section:
        print("dropped the section %r: measured on another model.safetensors" % heading)
        return []
    return [section]


def write_doc(r, manifest, path):
    w = r["eval_windows"]
    parts = [
        "# moetier-tiny: the embedded default model", "",
        "A small qwen3_moe model that ships in `models/moetier-tiny/` so that moetier runs out of the "
        "box, and so that its tests and tools have a real trained MoE (with real routing skew) to work "
        "on. Trained from scratch on code and English prose from Debian packages by "
        "`scripts/device_train.sh` on one GPU; this page is written by `scripts/write_model_doc.py` "
        "from `models/moetier-tiny/reference_eval.json`.", "",
        "## Files", "",
        "- `config.json` (transformers 5.17 form), `tokenizer.json`, `tokenizer_config.json`",
        "- `model.safetensors`: experts per expert in MXFP4 "
        "(`model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight` U8 [out, in/2] and `.scale` F8_E8M0 "
        "[out, in/32]), everything else bf16, `lm_head` tied to `model.embed_tokens`",
        "- `reference_eval.json`: the float32 reference figures below, per window, plus routing counts",
        "- `tests/data/moetier-tiny/eval_{code,prose}.txt` and `eval_ids.json`: the held-out text the "
        "figures are measured on and its token ids", "",
        "## Configuration", "", config_table(r), "", WHY,
        "## Data", "",
        "Built by `scripts/build_corpus.sh` (see `data/README.md`). Each document is one file (a chapter "
        "for the novels); train and held-out are split by a seeded hash of the document name.", "",
        corpus_section(manifest), "",
        "## Training", "", training_section(r), "",
        "## Held-out quality", "",
        "Reference: %s." % r["reference"], "",
        "Windows: %s. %d windows per domain." % (w["rule"], w["windows"]), "",
        quality_table(r), "",
        *kept_section(path, MOETIER_VS_REF, r["size"]["files"]["model.safetensors"]["sha256"]),
        "## Expert locality", "", locality_table(r), "",
        "## Greedy samples (float32 reference)", "", samples_section(r),
    ]
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(parts).rstrip() + "\n")
    os.replace(path + ".tmp", path)


def summary(args):
    print("exit code %s, %s s in all, tar sha256 %s" % (args.exit_code, args.seconds, args.tar_sha256))
    if not os.path.exists(args.eval):
        print("no %s: the run did not finish; see the log" % args.eval)
        return
    r = load(args.eval)
    t = r["training"]
    print("preset %s: %s params (%s in experts); checkpoint %s bytes (limit %s, ok=%s)" % (
        r["preset"], t["parameters"], t["expert_parameters"], r["size"]["total_bytes"],
        r["size"]["limit_bytes"], r["size"]["ok"]))
    print("trained %s steps, %s tokens, %s s, %s tok/s, experts impl %s" % (
        t["steps"], t["tokens"], t["seconds"], t["tokens_per_second"], t["experts_impl"]))
    for d in ("code", "prose"):
        h, b = r["heldout"][d], r["heldout_before_mxfp4"][d]
        print("held-out %-5s NLL %.4f (before MXFP4 %.4f) top-1 %.4f bits/byte %.4f" % (
            d, h["mean_nll"], b["mean_nll"], h["top1"], h["bits_per_byte"]))
    for row in r["locality"]["layers"]:
        print("layer %d top-25%% share code %.3f prose %.3f all %.3f overlap %.2f" % (
            row["layer"], row["code"]["top_share"], row["prose"]["top_share"], row["all"]["top_share"],
            row["top_set_overlap"]))
    for s in r["samples"]:
        print("--- %s\n%s%s" % (s["name"], s["prompt"], s["text"][:400]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--manifest", default="data/corpus/manifest.json")
    ap.add_argument("--out", default="docs/embedded-model.md")
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--exit-code", default="?")
    ap.add_argument("--seconds", default="?")
    ap.add_argument("--tar-sha256", default="?")
    args = ap.parse_args()
    if args.summary:
        summary(args)
        return 0
    r = load(args.eval)
    manifest = load(args.manifest) if os.path.exists(args.manifest) else None
    write_doc(r, manifest, args.out)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
