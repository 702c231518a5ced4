#!/usr/bin/env python3
"""Train, export and evaluate moetier-tiny: a qwen3_moe model with MXFP4 experts.

Runs on one CUDA GPU with PyTorch and transformers 5.17 (written for torch 2.11).
Inputs come from scripts/train_tokenizer.py (uint16 ids, eval windows). Steps:

 1. Build transformers' Qwen3MoeConfig / Qwen3MoeForCausalLM from a preset (seeded init).
 2. Train with bf16 autocast, AdamW, warmup + cosine, 50/50 code/prose batches of random
    512-token windows, router aux loss on, for a wall-clock budget. The expert forward is
    a grouped GEMM (torch._grouped_mm) when it matches the dense reference on a probe,
    else transformers' own experts implementation. The last --qat-frac of the steps see
    MXFP4 expert weights (straight-through), so the exported model is the trained one.
 3. Export OUT/{config.json, model.safetensors}: experts per expert in MXFP4, the rest bf16.
 4. Reload the file, dequantize, and evaluate in float32 with transformers' eager paths
    (no TF32): held-out NLL / top-1 / bits per byte on fixed windows, per-layer routing
    counts and the share of routed calls covered by the 25% most used experts, greedy
    samples. Writes OUT/reference_eval.json, what moetier's tests compare against.
"""

import argparse
import copy
import hashlib
import json
import math
import os
import sys
import time
import types

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mxfp4_export as mx  # noqa: E402

import transformers  # noqa: E402
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

SIZE_LIMIT = 24_000_000  # bytes, checkpoint + tokenizer in models/

PRESETS = {
    # 8 MoE layers x 64 experts (top-8), hidden 256: see docs/embedded-model.md for why.
    "tiny": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=64,
                 intermediate_size=512),
    # Same code paths, tiny sizes: checks the whole pipeline in a minute.
    "smoke": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=32, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=32,
                  intermediate_size=128),
}

PROMPTS = [
    ("go", "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n"),
    ("c", "#include <linux/module.h>\n#include <linux/slab.h>\n\nstatic int\n"),
    ("prose-doc", "The purpose of this document is to"),
    ("prose-novel", "It was a fine morning, and Elizabeth"),
]

T0 = time.time()


def log(msg):
    print("[train %7.1fs] %s" % (time.time() - T0, msg), flush=True)


def autocast(device, enabled=True):
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=enabled)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def device_name(device):
    return torch.cuda.get_device_name() if torch.device(device).type == "cuda" else str(device)


# ---------------------------------------------------------------------------------------
# Config and model

def make_config(args, vocab_size, eos_id, pad_id):
    p = dict(PRESETS[args.preset])
    return Qwen3MoeConfig(
        vocab_size=vocab_size, max_position_embeddings=args.seq_len, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        router_aux_loss_coef=args.aux_coef, output_router_logits=False,
        initializer_range=0.02, hidden_act="silu", use_cache=False,
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id, **p)


def set_impl(config, attn=None, experts=None):
    """Select attention / experts implementations on a config (before or after building)."""
    for attr, value in (("_attn_implementation", attn), ("_experts_implementation", experts)):
        if value is None:
            continue
        try:
            setattr(config, attr, value)
        except Exception as e:  # noqa: BLE001
            log("setting %s=%s failed: %s" % (attr, value, e))


def experts_modules(model):
    return [layer.mlp.experts for layer in model.model.layers if hasattr(layer.mlp, "experts")]


def impl_names(model):
    return (getattr(model.config, "_attn_implementation", "?"),
            getattr(model.config, "_experts_implementation", "?"))


def check_tied(model):
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight
    if emb.data_ptr() != head.data_ptr():
        model.lm_head.weight = emb
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# ---------------------------------------------------------------------------------------
# Experts forward for training: one grouped GEMM per projection (bf16), optional MXFP4 QAT

QAT = {"on": False}
GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Same math as Qwen3MoeExperts.forward. hidden_states [T, H], top_k_* [T, K]."""
    n_tok, k = top_k_index.shape
    n_exp = self.gate_up_proj.shape[0]
    w_gu, w_down = self.gate_up_proj, self.down_proj  # [E, 2I, H], [E, H, I]
    if QAT["on"]:
        w_gu, w_down = mx.fake_quantize(w_gu), mx.fake_quantize(w_down)
    w_gu, w_down = w_gu.to(torch.bfloat16), w_down.to(torch.bfloat16)
    flat = top_k_index.reshape(-1)  # [T*K]
    order = torch.argsort(flat, stable=True)  # slots grouped by expert
    token_of = torch.div(order, k, rounding_mode="floor")  # [T*K]
    x = hidden_states.to(torch.bfloat16)[token_of]  # [T*K, H]
    offs = torch.cumsum(torch.bincount(flat, minlength=n_exp), dim=0).to(torch.int32)  # [E]
    gate_up = GROUPED_MM(x, w_gu.transpose(-2, -1), offs=offs)  # [T*K, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate) * up  # [T*K, I]
    y = GROUPED_MM(act, w_down.transpose(-2, -1), offs=offs)  # [T*K, H]
    y = y * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
    y = y[torch.argsort(order)].reshape(n_tok, k, -1).sum(dim=1)  # [T, H], deterministic
    return y.to(hidden_states.dtype)


def dense_reference(ex, x, idx, w):
    """Plain float32 experts math for the probe. x [T, H], idx/w [T, K] -> [T, H]."""
    gu = torch.einsum("th,tkoh->tko", x, ex.gate_up_proj.float()[idx])  # [T, K, 2I]
    gate, up = gu.chunk(2, dim=-1)
    act = F.silu(gate) * up  # [T, K, I]
    y = torch.einsum("tki,tkhi->tkh", act, ex.down_proj.float()[idx])  # [T, K, H]
    return (y * w.unsqueeze(-1)).sum(dim=1)


def probe_experts(model, fn, device):
    """Relative errors (out, d/dx, d/dW) of an experts forward against dense_reference."""
    ex = model.model.layers[0].mlp.experts
    cfg = model.config
    g = torch.Generator(device="cpu").manual_seed(1234)
    x = torch.randn(333, cfg.hidden_size, generator=g).to(device)
    idx = torch.rand(333, cfg.num_experts, generator=g).topk(cfg.num_experts_per_tok, dim=-1).indices.to(device)
    w = torch.rand(333, cfg.num_experts_per_tok, generator=g).to(device)
    probe = torch.randn(333, cfg.hidden_size, generator=g).to(device)
    errs = []
    results = []
    for f in (dense_reference, fn):
        xx = x.clone().requires_grad_(True)
        ex.zero_grad(set_to_none=True)
        with autocast(device, enabled=(f is not dense_reference)):
            out = f(ex, xx, idx, w)
        (out.float() * probe).sum().backward()
        results.append((out.detach().float(), xx.grad.detach().float(), ex.gate_up_proj.grad.detach().float()))
    ex.zero_grad(set_to_none=True)
    for ref, got in zip(results[0], results[1]):
        errs.append(((got - ref).norm() / ref.norm().clamp_min(1e-12)).item())
    return errs


def choose_experts_impl(model, device, wanted):
    """Patch each experts module with the fastest forward that matches the reference."""
    def transformers_impl(name):
        def fwd(ex, x, idx, w):
            old = getattr(ex.config, "_experts_implementation", None)
            set_impl(ex.config, experts=name)
            try:
                return type(ex).forward(ex, x, idx, w)
            finally:
                set_impl(ex.config, experts=old)
        return fwd
    candidates = [("moetier_grouped_mm", grouped_experts_forward),
                  ("transformers_grouped_mm", transformers_impl("grouped_mm")),
                  ("transformers_eager", transformers_impl("eager"))]
    if wanted != "auto":
        candidates = [c for c in candidates if c[0] == wanted]
    for name, fn in candidates:
        try:
            errs = probe_experts(model, fn, device)
        except Exception as e:  # noqa: BLE001
            log("experts impl %s: failed on the probe: %s" % (name, str(e).splitlines()[0][:200]))
            continue
        ok = errs[0] < 2e-2 and errs[1] < 3e-2 and errs[2] < 3e-2
        log("experts impl %s: rel err out %.2e dx %.2e dW %.2e -> %s" % (name, *errs, "ok" if ok else "REJECTED"))
        if not ok:
            continue
        if name == "moetier_grouped_mm":
            for ex in experts_modules(model):
                ex.forward = types.MethodType(grouped_experts_forward, ex)
        else:
            impl = name.split("_", 1)[1]
            set_impl(model.config, experts=impl)
            for ex in experts_modules(model):
                set_impl(ex.config, experts=impl)
        return name, errs
    sys.exit("no experts implementation passed the probe")


# ---------------------------------------------------------------------------------------
# Data

def load_tokens(tokens_dir, device):
    out = {}
    for name in ("train_code", "train_prose"):
        arr = np.load(os.path.join(tokens_dir, name + ".npy"))
        out[name] = torch.from_numpy(arr.astype(np.int32)).to(device)
    return out


def load_eval_windows(fixtures, device):
    with open(os.path.join(fixtures, "eval_ids.json")) as f:
        spec = json.load(f)
    seq, nwin = spec["seq_len"], spec["windows"]
    windows = {}
    for domain, fx in spec["corpora"].items():
        ids = torch.tensor(fx["ids"][:seq * nwin], dtype=torch.long)
        windows[domain] = ids.reshape(nwin, seq).to(device)  # [W, T]
    return spec, windows


def sample_batch(data, batch, seq, gen, device):
    """Half code, half prose: random windows of seq+1 ids -> (inputs, targets) [B, T]."""
    parts = []
    for name in ("train_code", "train_prose"):
        d = data[name]
        starts = torch.randint(0, d.numel() - seq - 1, (batch // 2,), generator=gen).to(device)
        parts.append(d[starts.unsqueeze(1) + torch.arange(seq + 1, device=device)])
    w = torch.cat(parts).long()  # [B, T+1]
    return w[:, :-1], w[:, 1:]


# ---------------------------------------------------------------------------------------
# Training

def lr_at(step, total, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    if total is None:
        return args.lr
    p = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def make_optimizer(model, args):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": other, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except Exception:  # noqa: BLE001
        return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def aux_loss_of(out, cfg):
    aux = getattr(out, "aux_loss", None)
    if torch.is_tensor(aux):
        return aux
    # Same formula as transformers' load_balancing_loss_func, over all layers' logits.
    logits = torch.cat([t.float() for t in out.router_logits], dim=0)  # [L*T, E]
    probs = logits.softmax(dim=-1)
    sel = probs.topk(cfg.num_experts_per_tok, dim=-1).indices
    frac = torch.bincount(sel.reshape(-1), minlength=cfg.num_experts).float() / logits.shape[0]
    return (frac * probs.mean(dim=0)).sum() * cfg.num_experts


@torch.no_grad()
def quick_val(model, windows, n):
    """Mean held-out NLL of the first n windows per domain (bf16 autocast, training path)."""
    model.eval()
    res = {}
    for domain, w in windows.items():
        x = w[:n]
        with autocast(x.device):
            logits = model(input_ids=x, use_cache=False).logits
        res[domain] = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                      x[:, 1:].reshape(-1)).item()
    model.train()
    return res


def train(model, data, windows, args, device):
    cfg = model.config
    opt = make_optimizer(model, args)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    budget = args.train_seconds
    total = args.steps if args.steps > 0 else None
    hist, t_start, step, tokens, skipped = [], time.time(), 0, 0, 0
    t_calib, qat_from = None, None
    model.train()
    while True:
        elapsed = time.time() - t_start
        if total is not None and step >= total:
            break
        if elapsed > budget:
            log("stopping on time at step %d of %s" % (step, total))
            break
        if step == 10:
            sync(device)
            t_calib = time.time()
        if total is None and step == 40:
            sync(device)
            per_step = (time.time() - t_calib) / 30
            total = 40 + int((budget - (time.time() - t_start)) / per_step * args.time_safety)
            log("calibrated: %.1f ms/step -> %d steps in %.0f s" % (per_step * 1e3, total, budget))
        if total is not None and qat_from is None and args.qat_frac > 0:
            qat_from = int(total * (1 - args.qat_frac))
        QAT["on"] = qat_from is not None and step >= qat_from
        lr = lr_at(step, total, args)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sample_batch(data, args.batch, args.seq_len, gen, device)
        with autocast(device):
            out = model(input_ids=x, output_router_logits=True, use_cache=False)
        lm = F.cross_entropy(out.logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1))
        aux = aux_loss_of(out, cfg)
        loss = lm + args.aux_coef * aux.float()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if torch.isfinite(gnorm):
            opt.step()
        else:
            skipped += 1
            if skipped > 20:
                sys.exit("training diverged: more than 20 steps with non-finite gradients")
        step += 1
        tokens += x.numel()
        if step % args.log_every == 0:
            el = time.time() - t_start
            rate = tokens / el
            log("step %5d/%s lr %.2e loss %.4f aux %.3f gnorm %.2f qat %d tok/s %.0f" % (
                step, total, lr, lm.item(), aux.item(), gnorm.item(), QAT["on"], rate))
            hist.append({"step": step, "time_s": round(el, 1), "loss": round(lm.item(), 4),
                         "aux": round(aux.item(), 4), "lr": lr, "tok_per_s": round(rate)})
        if step % args.val_every == 0:
            v = quick_val(model, windows, args.val_windows)
            log("step %5d held-out (first %d windows, bf16) code %.4f prose %.4f" % (
                step, args.val_windows, v["code"], v["prose"]))
            hist.append({"step": step, "val": {k: round(val, 4) for k, val in v.items()}})
    QAT["on"] = False
    sync(device)
    el = time.time() - t_start
    summary = {"steps": step, "planned_steps": total, "tokens": tokens, "seconds": round(el, 1),
               "tokens_per_second": round(tokens / el), "skipped_steps": skipped, "qat_from_step": qat_from,
               "history": hist}
    log("trained %d steps, %d tokens in %.0f s (%.0f tok/s)" % (step, tokens, el, tokens / el))
    return summary


# ---------------------------------------------------------------------------------------
# Export

def write_config(cfg, out_dir):
    c = copy.deepcopy(cfg)
    c.output_router_logits = False
    c.use_cache = True
    c.architectures = ["Qwen3MoeForCausalLM"]
    try:  # exactly what transformers writes (the golden fixtures use it too)
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            c.save_pretrained(tmp)
            with open(os.path.join(tmp, "config.json")) as f:
                d = json.load(f)
    except Exception as e:  # noqa: BLE001
        log("config.save_pretrained failed (%s); using to_dict()" % e)
        d = c.to_dict()
    d = {k: v for k, v in d.items() if not k.startswith("_") and "implementation" not in k}
    d["dtype"] = "bfloat16"
    d.pop("torch_dtype", None)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(d, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    return d


def check_with_safetensors(path):
    """Opens the file with the safetensors library too (a second reader), non-fatal."""
    try:
        from safetensors import safe_open
        with safe_open(path, framework="pt") as f:
            keys = list(f.keys())
            picks = [keys[0]] + [k for k in keys if k.endswith("0.gate_proj.weight")][:1] \
                + [k for k in keys if k.endswith("0.gate_proj.scale")][:1]
            got = {k: "%s%s" % (str(f.get_tensor(k).dtype).replace("torch.", ""), list(f.get_tensor(k).shape))
                   for k in picks}
        return "ok: %d tensors; %s" % (len(keys), got)
    except Exception as e:  # noqa: BLE001
        return "failed: %s" % str(e).splitlines()[0][:300]


def export_checkpoint(sd, cfg, out_dir):
    tensors = mx.export_tensors(sd, cfg.tie_word_embeddings)
    meta = {"format": "pt", "producer": "moetier scripts/train_model.py",
            "experts": "MXFP4: e2m1 codes (low nibble = even element) + e8m0 scale per 32 inputs"}
    path = os.path.join(out_dir, "model.safetensors")
    nbytes = mx.write_safetensors(path + ".tmp", tensors, meta)
    os.replace(path + ".tmp", path)
    write_config(cfg, out_dir)
    log("wrote %s: %d tensors, %d bytes; safetensors library: %s" % (
        path, len(tensors), nbytes, check_with_safetensors(path)))
    return path


def file_facts(out_dir):
    facts, total = {}, 0
    for name in sorted(os.listdir(out_dir)):
        p = os.path.join(out_dir, name)
        if not os.path.isfile(p) or name == "reference_eval.json":
            continue
        with open(p, "rb") as f:
            data = f.read()
        facts[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        total += len(data)
    return facts, total


# ---------------------------------------------------------------------------------------
# Float32 reference evaluation (transformers' eager attention and experts, no TF32)

def build_eval_model(cfg, sd, device):
    c = copy.deepcopy(cfg)
    c.output_router_logits = False
    set_impl(c, attn="eager", experts="eager")
    model = Qwen3MoeForCausalLM(c)
    set_impl(model.config, attn="eager", experts="eager")
    for ex in experts_modules(model):
        set_impl(ex.config, experts="eager")
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if set(missing) - {"lm_head.weight"} or unexpected:
        sys.exit("eval model: missing %s unexpected %s" % (missing, unexpected))
    check_tied(model)
    return model.to(device=device, dtype=torch.float32).eval()


def token_byte_lengths(tok):
    """Bytes of text per id (byte-level tokens: one char per byte); special tokens 0."""
    n = tok.get_vocab_size()
    lens = torch.zeros(n, dtype=torch.long)
    special = {t.content for t in tok.get_added_tokens_decoder().values()} \
        if hasattr(tok, "get_added_tokens_decoder") else {"<|endoftext|>", "<|pad|>"}
    for i in range(n):
        s = tok.id_to_token(i)
        lens[i] = 0 if (s is None or s in special) else len(s)
    return lens


@torch.no_grad()
def evaluate(model, windows, byte_len, batch=16):
    cfg = model.config
    n_layers, n_exp, k = cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok
    res = {}
    for domain, w in windows.items():  # w [W, T]
        n_win, seq = w.shape
        nll = torch.zeros(n_win, dtype=torch.float64)
        correct = torch.zeros(n_win, dtype=torch.long)
        counts = torch.zeros(n_layers, n_exp, dtype=torch.long)
        for i in range(0, n_win, batch):
            x = w[i:i + batch]  # [b, T]
            out = model(input_ids=x, output_router_logits=True, use_cache=False)
            logits = out.logits.float()[:, :-1]  # [b, T-1, V]
            tgt = x[:, 1:]
            lp = torch.log_softmax(logits, dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # [b, T-1]
            nll[i:i + len(x)] = (-lp.double()).sum(dim=1).cpu()
            correct[i:i + len(x)] = (logits.argmax(dim=-1) == tgt).sum(dim=1).cpu()
            for layer, rl in enumerate(out.router_logits):  # [b*T, E]
                sel = rl.float().softmax(dim=-1).topk(k, dim=-1).indices
                counts[layer] += torch.bincount(sel.reshape(-1).cpu(), minlength=n_exp)
        n = n_win * (seq - 1)
        nbytes = int(byte_len[w[:, 1:].cpu()].sum())
        res[domain] = {
            "windows": n_win, "predicted_tokens": n, "target_bytes": nbytes,
            "mean_nll": nll.sum().item() / n, "top1": correct.sum().item() / n,
            "perplexity": math.exp(nll.sum().item() / n),
            "bits_per_byte": nll.sum().item() / math.log(2) / max(1, nbytes),
            "per_window_nll_sum": [round(v, 6) for v in nll.tolist()],
            "per_window_top1_correct": correct.tolist(),
            "routing_counts": counts.tolist(),
        }
    return res


def locality(res, top_frac=0.25):
    """Per layer: share of routed calls on the top 25% experts, code vs prose."""
    code = torch.tensor(res["code"]["routing_counts"], dtype=torch.float64)  # [L, E]
    prose = torch.tensor(res["prose"]["routing_counts"], dtype=torch.float64)
    n_exp = code.shape[1]
    top = int(math.ceil(top_frac * n_exp))
    rows = []
    for layer in range(code.shape[0]):
        row = {"layer": layer}
        sets = {}
        for name, c in (("code", code[layer]), ("prose", prose[layer]), ("all", code[layer] + prose[layer])):
            order = torch.argsort(c, descending=True, stable=True)
            sets[name] = set(order[:top].tolist())
            p = c / c.sum()
            ent = -(p[p > 0] * p[p > 0].log()).sum().item() / math.log(n_exp)
            row[name] = {"top_share": round((c[order[:top]].sum() / c.sum()).item(), 4),
                         "normalized_entropy": round(ent, 4), "unused_experts": int((c == 0).sum())}
        row["top_set_overlap"] = round(len(sets["code"] & sets["prose"]) / top, 4)
        row["code_calls_on_prose_top"] = round((code[layer][list(sets["prose"])].sum() / code[layer].sum()).item(), 4)
        row["prose_calls_on_code_top"] = round((prose[layer][list(sets["code"])].sum() / prose[layer].sum()).item(), 4)
        rows.append(row)
    return {"top_fraction": top_frac, "top_experts": top, "uniform_share": top / n_exp, "layers": rows}


@torch.no_grad()
def greedy(model, tok, prompt, n_new, eod_id, device):
    prompt_ids = tok.encode(prompt, add_special_tokens=False).ids
    ids = list(prompt_ids)
    for _ in range(n_new):
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1]
        nxt = int(logits.float().argmax())
        ids.append(nxt)
        if nxt == eod_id:
            break
    new = ids[len(prompt_ids):]
    return {"prompt": prompt, "prompt_ids": prompt_ids, "greedy_ids": new,
            "text": tok.decode(new, skip_special_tokens=False)}


def strip_lists(res):
    return {d: {k: v for k, v in r.items() if not isinstance(v, list)} for d, r in res.items()}


# ---------------------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--tokens", required=True, help="directory written by train_tokenizer.py")
    ap.add_argument("--out", default="models/moetier-tiny")
    ap.add_argument("--fixtures", default="tests/data/moetier-tiny")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--minutes", type=float, default=7.0, help="training time if --end-by is not given")
    ap.add_argument("--end-by", type=float, default=0.0, help="unix time by which everything must end")
    ap.add_argument("--reserve", type=float, default=75.0, help="seconds kept for export and eval")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (default: from the time budget)")
    ap.add_argument("--batch", type=int, default=128, help="sequences per step (half code, half prose)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--aux-coef", type=float, default=0.001)
    ap.add_argument("--qat-frac", type=float, default=0.15, help="last share of steps trained on MXFP4 experts")
    ap.add_argument("--time-safety", type=float, default=0.95)
    ap.add_argument("--experts-impl", default="auto",
                    choices=["auto", "moetier_grouped_mm", "transformers_grouped_mm", "transformers_eager"])
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--val-every", type=int, default=500)
    ap.add_argument("--val-windows", type=int, default=8)
    ap.add_argument("--sample-tokens", type=int, default=96)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: local dry runs only
    return ap.parse_args()


def setup(args, device):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    eod, pad = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>")
    cfg = make_config(args, tok.get_vocab_size(), eod, pad)
    budget = mx.checkpoint_budget(dict(PRESETS[args.preset], vocab_size=tok.get_vocab_size(),
                                       tie_word_embeddings=True),
                                  os.path.getsize(os.path.join(args.out, "tokenizer.json")))
    log("size budget: %s" % json.dumps(budget))
    if budget["total"] > SIZE_LIMIT:
        sys.exit("preset %s does not fit: %d > %d bytes" % (args.preset, budget["total"], SIZE_LIMIT))
    set_impl(cfg, attn="sdpa")
    torch.manual_seed(args.seed)
    model = Qwen3MoeForCausalLM(cfg)
    check_tied(model)
    model.to(device)
    n_exp = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    n_all = sum(p.numel() for p in model.parameters())
    log("model: %d parameters (%d in experts, %d other); attn/experts impl %s" % (
        n_all, n_exp, n_all - n_exp, impl_names(model)))
    return tok, cfg, budget, model, {"parameters": n_all, "expert_parameters": n_exp}


def main():
    args = parse_args()
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("CUDA is required")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    np.random.seed(args.seed)
    log("torch %s, transformers %s, device %s" % (torch.__version__, transformers.__version__,
                                                   device_name(device)))
    tok, cfg, budget, model, counts = setup(args, device)
    impl, errs = choose_experts_impl(model, device, args.experts_impl)
    data = load_tokens(args.tokens, device)
    spec, windows = load_eval_windows(args.fixtures, device)
    log("train tokens: code %d, prose %d" % (data["train_code"].numel(), data["train_prose"].numel()))
    end_by = args.end_by if args.end_by > 0 else time.time() + args.minutes * 60 + args.reserve
    args.train_seconds = max(10.0, end_by - args.reserve - time.time())
    log("training for %.0f s" % args.train_seconds)
    summary = train(model, data, windows, args, device)
    summary.update(counts, experts_impl=impl, experts_probe_rel_err=errs, seed=args.seed,
                   hyper={k: getattr(args, k) for k in ("batch", "seq_len", "lr", "min_lr_ratio", "warmup",
                                                        "weight_decay", "aux_coef", "qat_frac")})
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    del model, data
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    finish(args, tok, cfg, budget, sd, spec, windows, summary, device)


def finish(args, tok, cfg, budget, sd, spec, windows, summary, device):
    os.makedirs(args.out, exist_ok=True)
    path = export_checkpoint(sd, cfg, args.out)
    tensors, _ = mx.read_safetensors(path)
    sd_q = mx.import_state_dict(tensors, cfg.num_hidden_layers, cfg.num_experts)
    # The same weights before MXFP4 (non-expert parts rounded to bf16 as stored): what QAT/PTQ cost.
    sd_pre = {k: (v if ".mlp.experts." in k else v.to(torch.bfloat16).float()) for k, v in sd.items()}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    byte_len = token_byte_lengths(tok)
    model = build_eval_model(cfg, sd_pre, device)
    log("eval model impl %s" % (impl_names(model),))
    before = evaluate(model, windows, byte_len)
    model = build_eval_model(cfg, sd_q, device)
    ref = evaluate(model, windows, byte_len)
    for d in ("code", "prose"):
        log("held-out %-5s NLL %.4f (before MXFP4 %.4f) top-1 %.4f bits/byte %.4f" % (
            d, ref[d]["mean_nll"], before[d]["mean_nll"], ref[d]["top1"], ref[d]["bits_per_byte"]))
    loc = locality(ref)
    for row in loc["layers"]:
        log("layer %d top-25%% share: code %.3f prose %.3f all %.3f; top-set overlap %.2f" % (
            row["layer"], row["code"]["top_share"], row["prose"]["top_share"], row["all"]["top_share"],
            row["top_set_overlap"]))
    eod = tok.token_to_id("<|endoftext|>")
    samples = []
    for name, prompt in PROMPTS:
        s = greedy(model, tok, prompt, args.sample_tokens, eod, device)
        s["name"] = name
        samples.append(s)
        log("sample %s:\n%s%s\n----" % (name, prompt, s["text"]))
    facts, total = file_facts(args.out)
    result = {
        "model": "moetier-tiny", "preset": args.preset,
        "reference": ("transformers %s Qwen3MoeForCausalLM, float32, attention eager, experts eager, "
                      "TF32 off; weights read back from model.safetensors (experts dequantized from MXFP4, "
                      "the rest bf16)" % transformers.__version__),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "device": device_name(device)},
        "config": json.load(open(os.path.join(args.out, "config.json"))),
        "size": {"limit_bytes": SIZE_LIMIT, "budget": budget, "files": facts, "total_bytes": total,
                 "ok": total <= SIZE_LIMIT},
        "eval_windows": {"fixture": os.path.join(args.fixtures, "eval_ids.json"), "seq_len": spec["seq_len"],
                         "windows": spec["windows"],
                         "rule": ("window w of a domain is ids[w*seq_len:(w+1)*seq_len] of eval_ids.json "
                                  "(= tokenizer(eval_<domain>.txt)); each window is run on its own from "
                                  "position 0 and scored on its seq_len-1 next-token predictions")},
        "heldout": ref,
        "heldout_before_mxfp4": strip_lists(before),
        "locality": loc,
        "samples": samples,
        "training": summary,
    }
    with open(os.path.join(args.out, "reference_eval.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    log("checkpoint files: %d bytes in all (limit %d)" % (total, SIZE_LIMIT))
    if total > SIZE_LIMIT:
        sys.exit("checkpoint is %d bytes, over the %d limit" % (total, SIZE_LIMIT))
    log("done")


if __name__ == "__main__":
    main()
