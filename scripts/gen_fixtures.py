#!/usr/bin/env python3
"""Golden fixtures for qwen3_moe: tiny seeded random checkpoints + reference logits.

Runs where transformers 5.17, tokenizers and torch are installed (the GPU machine):
    python3 scripts/gen_fixtures.py --out tests/data/fixtures

Each fixture directory holds config.json, tokenizer.json, the weights, and
  reference.json         {"prompts": [...], "n_generate": N, "margins": {...}}
  reference.safetensors  p{i}.input_ids I64 [T], p{i}.logits F32 [T, V],
                         p{i}.greedy I64 [N]
The reference runs transformers' own Qwen3MoeForCausalLM in float32 on the CPU
(eager attention) with the bf16-rounded (or MXFP4-dequantized) weights that the
checkpoint stores, so an f32 engine reading the checkpoint computes the same
function up to summation order. Seeds are searched until the smallest router
top-k gap and greedy top-1 gap are clear of f32 rounding, so an exact token
comparison is meaningful.
"""
import argparse
import glob
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "The quick brown fox jumps over the lazy dog, and",
    "你好，世界! 🌍 naïve café — x = [1, 2, 3]",
]
N_GENERATE = 12
PROSE = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. The quick brown fox jumps over the lazy dog. "
)

FIXTURES = {
    # transformers' own stacked expert layout, transformers-form config.
    "qwen3moe-bf16": dict(
        config=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, num_experts=16, num_experts_per_tok=4,
                    moe_intermediate_size=32, intermediate_size=96, mlp_only_layers=[1],
                    norm_topk_prob=True, tie_word_embeddings=False),
        layout="stacked", seed=1000),
    # per-expert MXFP4 experts, bf16 elsewhere, tied embeddings.
    "qwen3moe-mxfp4": dict(
        config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=16, num_experts=32, num_experts_per_tok=8,
                    moe_intermediate_size=64, intermediate_size=128, norm_topk_prob=False,
                    tie_word_embeddings=True),
        layout="mxfp4", seed=2000),
    # per-expert bf16 in 3 shards with an index, publisher-form config, q/k/v/o biases.
    "qwen3moe-sharded": dict(
        config=dict(hidden_size=96, num_hidden_layers=2, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=32, intermediate_size=64, norm_topk_prob=True,
                    tie_word_embeddings=False, attention_bias=True, decoder_sparse_step=1),
        layout="per_expert", seed=3000, publisher_config=True, shards=3),
}


def train_tokenizer(vocab_size=384):
    """A small Qwen2-style byte-level BPE, trained on fixed local text."""
    files = sorted(glob.glob("/usr/lib/python3*/json/*.py"))[:6]
    text = [PROSE] * 20 + [open(f, encoding="utf-8").read() for f in files]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(QWEN2_PATTERN),
                             behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(text, trainer)
    return tok


def mxfp4_quantize(w):
    """w [out, in] -> (packed U8 [out, in/2], e8m0 U8 [out, in/32], dequantized f32)."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    out, inn = w.shape
    b = w.float().reshape(out, inn // 32, 32)
    amax = b.abs().amax(-1)
    exp = torch.ceil(torch.log2(torch.clamp(amax, min=1e-30) / 6.0)).clamp(-127, 127)
    scale = torch.pow(2.0, exp)
    q = b / scale[..., None]
    idx = (q.abs()[..., None] - grid).abs().argmin(-1)  # nearest grid point
    sign = (q < 0).to(torch.int64)
    codes = (idx | (sign << 3)).reshape(out, inn)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    deq = (grid[idx] * (1 - 2 * sign) * scale[..., None]).reshape(out, inn)
    return packed, (exp + 127).to(torch.uint8), deq


def build_model(cfg_kwargs, vocab, seed):
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=vocab, max_position_embeddings=256,
                         initializer_range=0.08, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         **cfg_kwargs)
    cfg._attn_implementation = "eager"
    model = Qwen3MoeForCausalLM(cfg).float().eval()
    attn = model.model.layers[0].self_attn
    assert attn.head_dim == cfg_kwargs["head_dim"], (attn.head_dim, cfg_kwargs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norms init to ones: perturb so misuse shows
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):  # sharper routing: clear top-k gaps
                p.mul_(4.0)
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            p.copy_(p.to(torch.bfloat16).float())  # the checkpoint stores bf16
    return cfg, model


def quantize_experts(model, cfg):
    """Replaces expert weights by MXFP4-dequantized values; returns packed tensors."""
    out = {}
    I = cfg.moe_intermediate_size
    with torch.no_grad():
        for li, layer in enumerate(model.model.layers):
            ex = getattr(layer.mlp, "experts", None)
            if ex is None:
                continue
            for e in range(cfg.num_experts):
                gu, dn = ex.gate_up_proj[e], ex.down_proj[e]
                pre = f"model.layers.{li}.mlp.experts.{e}."
                for nm, w in (("gate_proj", gu[:I]), ("up_proj", gu[I:]), ("down_proj", dn)):
                    packed, scales, deq = mxfp4_quantize(w)
                    w.copy_(deq)
                    out[pre + nm + ".weight"] = packed
                    out[pre + nm + ".scale"] = scales.view(torch.float8_e8m0fnu)
    return out


def per_expert_state(model, cfg, sd):
    """Stacked experts -> per-expert gate/up/down tensors (publisher layout)."""
    I = cfg.moe_intermediate_size
    res = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            for e in range(v.shape[0]):
                res[f"{pre}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                res[f"{pre}{e}.up_proj.weight"] = v[e, I:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                res[f"{pre}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            res[k] = v
    return res


@torch.no_grad()
def references(model, cfg, tok):
    """Logits at every prompt position, greedy continuations and the margins."""
    tensors, margins_greedy, margins_router = {}, [], []
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([tok.encode(p).ids])
        out = model(ids, output_router_logits=True)
        tensors[f"p{i}.input_ids"] = ids[0].to(torch.int64)
        tensors[f"p{i}.logits"] = out.logits[0].float().contiguous()
        for rl in out.router_logits or []:
            probs = torch.softmax(rl.float(), -1).sort(-1, descending=True).values
            k = cfg.num_experts_per_tok
            margins_router.append(float((probs[:, k - 1] - probs[:, k]).min()))
        seq = ids
        for _ in range(N_GENERATE):
            logits = model(seq).logits[0, -1]
            top = logits.topk(2).values
            margins_greedy.append(float(top[0] - top[1]))
            seq = torch.cat([seq, logits.argmax().view(1, 1)], dim=1)
        tensors[f"p{i}.greedy"] = seq[0, ids.shape[1]:].to(torch.int64).contiguous()
    return tensors, min(margins_greedy), min(margins_router)


def publisher_config(cfg, vocab):
    c = {k: getattr(cfg, k) for k in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "num_experts_per_tok", "moe_intermediate_size", "intermediate_size",
        "norm_topk_prob", "tie_word_embeddings", "attention_bias", "decoder_sparse_step",
        "rms_norm_eps", "max_position_embeddings")}
    c.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=vocab,
             num_experts=cfg.num_experts, rope_theta=10000.0, rope_scaling=None,
             torch_dtype="bfloat16", hidden_act="silu", mlp_only_layers=[],
             use_sliding_window=False, sliding_window=None, max_window_layers=cfg.num_hidden_layers,
             attention_dropout=0.0, initializer_range=0.08, output_router_logits=False,
             router_aux_loss_coef=0.001, use_cache=True, bos_token_id=None, eos_token_id=0,
             transformers_version="4.51.0")
    return c


def save_sharded(sd, d, n):
    names = sorted(sd)
    chunks = [names[i::n] for i in range(n)]
    weight_map, total = {}, 0
    for i, chunk in enumerate(chunks):
        fn = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: sd[k] for k in chunk}, os.path.join(d, fn), metadata={"format": "pt"})
        for k in chunk:
            weight_map[k] = fn
            total += sd[k].numel() * sd[k].element_size()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def make_fixture(name, spec, tok, outdir):
    vocab = tok.get_vocab_size()
    for attempt in range(50):
        cfg, model = build_model(spec["config"], vocab, spec["seed"] + attempt)
        mx = quantize_experts(model, cfg) if spec["layout"] == "mxfp4" else None
        refs, mg, mr = references(model, cfg, tok)
        if mg > 2e-3 and mr > 2e-5:
            break
        print(f"{name}: seed {spec['seed'] + attempt} margins greedy {mg:.2e} router {mr:.2e}: retry")
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    if spec["layout"] == "mxfp4":
        sd = {k: v for k, v in sd.items() if ".mlp.experts." not in k}
        sd.update(mx)
    elif spec["layout"] == "per_expert":
        sd = per_expert_state(model, cfg, sd)
    if spec.get("publisher_config"):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(publisher_config(cfg, vocab), f, indent=2)
    else:
        cfg.save_pretrained(d)
    if spec.get("shards"):
        save_sharded(sd, d, spec["shards"])
    else:
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    tok.save(os.path.join(d, "tokenizer.json"))
    save_file(refs, os.path.join(d, "reference.safetensors"))
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"prompts": PROMPTS, "n_generate": N_GENERATE, "seed": spec["seed"] + attempt,
                   "margins": {"greedy_top1_gap": mg, "router_topk_gap": mr},
                   "reference": "transformers Qwen3MoeForCausalLM, float32, eager, CPU"},
                  f, indent=2, ensure_ascii=False)
    print(f"{name}: seed {spec['seed'] + attempt}, greedy gap {mg:.3e}, router gap {mr:.3e}, "
          f"{sum(v.numel() * v.element_size() for v in sd.values())} weight bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/fixtures")
    args = ap.parse_args()
    torch.set_num_threads(8)
    import transformers
    print("transformers", transformers.__version__, "torch", torch.__version__)
    tok = train_tokenizer()
    for name, spec in FIXTURES.items():
        make_fixture(name, spec, tok, args.out)
    # What does save_pretrained itself write for experts? Recorded for docs/formats.md.
    cfg, model = build_model(FIXTURES["qwen3moe-bf16"]["config"], tok.get_vocab_size(), 1)
    tmp = "/tmp/moetier_sp"
    model.save_pretrained(tmp)
    from safetensors import safe_open
    with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
        keys = [k for k in f.keys() if "layers.0.mlp" in k]
    print("save_pretrained writes layer-0 mlp keys:", keys[:6])


if __name__ == "__main__":
    main()
