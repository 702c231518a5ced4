#!/usr/bin/env python3
"""A random MXFP4 qwen3_moe checkpoint with Qwen3-30B-A3B's shapes (hidden 2048,
128 experts of 768, 32/4 heads of 128, vocab 151936) and LAYERS layers, for
timing moetier_to_gguf.py at scale (docs/peers.md). Values are random bytes
(scales kept in 118..126); the tokenizer files are copied from TOKENIZER_DIR.

    make_synthetic_checkpoint.py OUT_DIR LAYERS TOKENIZER_DIR [--shard-layers K]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

H, I, E, K, NQ, NKV, D, V = 2048, 768, 128, 8, 32, 4, 128, 151936


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("layers", type=int)
    ap.add_argument("tokenizer_dir", type=Path)
    ap.add_argument("--shard-layers", type=int, default=4)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def bf16(shape, scale=0.02):
        x = (rng.standard_normal(size=shape, dtype=np.float32) * scale)
        return (x.view(np.uint32) >> 16).astype(np.uint16)

    def ones(shape):
        return np.full(shape, 0x3F80, np.uint16)  # bf16 1.0

    shards: list[dict[str, tuple[str, np.ndarray | tuple]]] = []
    cur: dict = {"model.embed_tokens.weight": ("BF16", bf16((V, H))),
                 "model.norm.weight": ("BF16", ones((H,))),
                 "lm_head.weight": ("BF16", bf16((V, H)))}
    for l in range(a.layers):
        p = f"model.layers.{l}."
        cur[p + "input_layernorm.weight"] = ("BF16", ones((H,)))
        cur[p + "post_attention_layernorm.weight"] = ("BF16", ones((H,)))
        cur[p + "self_attn.q_proj.weight"] = ("BF16", bf16((NQ * D, H)))
        cur[p + "self_attn.k_proj.weight"] = ("BF16", bf16((NKV * D, H)))
        cur[p + "self_attn.v_proj.weight"] = ("BF16", bf16((NKV * D, H)))
        cur[p + "self_attn.o_proj.weight"] = ("BF16", bf16((H, NQ * D)))
        cur[p + "self_attn.q_norm.weight"] = ("BF16", ones((D,)))
        cur[p + "self_attn.k_norm.weight"] = ("BF16", ones((D,)))
        cur[p + "mlp.gate.weight"] = ("BF16", bf16((E, H)))
        for e in range(E):
            for proj, (r, k) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                n = f"{p}mlp.experts.{e}.{proj}_proj."
                cur[n + "weight"] = ("U8", ("rand", (r, k // 2)))
                cur[n + "scale"] = ("F8_E8M0", ("scale", (r, k // 32)))
        if (l + 1) % a.shard_layers == 0 or l + 1 == a.layers:
            shards.append(cur)
            cur = {}
    if cur:
        shards.append(cur)
    wmap = {}
    for si, t in enumerate(shards):
        fn = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        hdr, off = {}, 0
        for name in sorted(t):
            dt, x = t[name]
            shape = x.shape if isinstance(x, np.ndarray) else x[1]
            nb = int(np.prod(shape)) * (2 if dt == "BF16" else 1)
            hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
            wmap[name] = fn
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(a.out / fn, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for name in sorted(t):
                dt, x = t[name]
                if isinstance(x, np.ndarray):
                    f.write(x.tobytes())
                elif x[0] == "rand":
                    f.write(os.urandom(int(np.prod(x[1]))))
                else:
                    f.write(rng.integers(118, 127, size=x[1], dtype=np.uint8).tobytes())
        print(fn, flush=True)
    (a.out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
           "hidden_size": H, "intermediate_size": 6144, "moe_intermediate_size": I,
           "num_hidden_layers": a.layers, "num_attention_heads": NQ, "num_key_value_heads": NKV,
           "head_dim": D, "num_experts": E, "num_experts_per_tok": K, "norm_topk_prob": True,
           "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "max_position_embeddings": 40960,
           "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
           "vocab_size": V, "eos_token_id": 0, "torch_dtype": "bfloat16"}
    (a.out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(a.tokenizer_dir / f, a.out / f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
