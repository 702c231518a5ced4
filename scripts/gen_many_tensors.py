#!/usr/bin/python3
"""Writes a valid qwen3_moe checkpoint with a very large number of tiny tensors.

Used to measure header parsing and load time as a function of the tensor count
(docs/loading.md). The model is tiny (hidden 16, 256 experts of width 8 per
layer) and has as many layers as it takes to reach --tensors tensors, all in one
model.safetensors, so its one header holds them all. Weights are seeded small
bf16 values (never zeros, never NaN); with --tokenizer DIR the tokenizer files
of DIR are copied in (its vocabulary must fit --vocab).

  scripts/gen_many_tensors.py OUT [--tensors 100000] [--experts 256]
                              [--tokenizer models/moetier-tiny]

OUT must not exist; the checkpoint is written under a temporary name and
renamed at the end. Standard library only.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import sys

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MOE_INTER = 16, 2, 1, 8, 8


def bf16_pool(n, seed):
    rnd = random.Random(seed)
    out = bytearray()
    for _ in range(n):
        v = rnd.gauss(0.0, 0.05)
        if v == 0.0:
            v = 0.01
        out += struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:4]
    return bytes(out)


def tensor_list(layers, experts, vocab):
    """(name, shape, is_norm) in file order."""
    q, kv, h = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, HIDDEN
    ts = [("model.embed_tokens.weight", [vocab, h], False)]
    for l in range(layers):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        ts += [(p + "input_layernorm.weight", [h], True),
               (p + "post_attention_layernorm.weight", [h], True),
               (a + "q_proj.weight", [q, h], False), (a + "k_proj.weight", [kv, h], False),
               (a + "v_proj.weight", [kv, h], False), (a + "o_proj.weight", [h, q], False),
               (a + "q_norm.weight", [HEAD_DIM], True), (a + "k_norm.weight", [HEAD_DIM], True),
               (p + "mlp.gate.weight", [experts, h], False)]
        for e in range(experts):
            x = f"{p}mlp.experts.{e}."
            ts += [(x + "gate_proj.weight", [MOE_INTER, h], False),
                   (x + "up_proj.weight", [MOE_INTER, h], False),
                   (x + "down_proj.weight", [h, MOE_INTER], False)]
    ts.append(("model.norm.weight", [h], True))
    return ts


def config(layers, experts, vocab, top_k):
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": vocab, "hidden_size": HIDDEN, "intermediate_size": 2 * MOE_INTER,
        "moe_intermediate_size": MOE_INTER, "num_hidden_layers": layers,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "num_local_experts": experts, "num_experts_per_tok": top_k, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512, "tie_word_embeddings": True, "attention_bias": False,
        "hidden_act": "silu", "use_sliding_window": False, "sliding_window": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "eos_token_id": 0, "dtype": "bfloat16"}


def write_safetensors(path, ts, pool):
    header, off = {}, 0
    for name, shape, _ in ts:
        n = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    one = struct.pack("<H", 0x3F80)  # bf16 1.0 for norms
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        pos = 0
        for _, shape, norm in ts:
            n = 2 * math.prod(shape)
            if norm:
                f.write(one * (n // 2))
                continue
            start = (pos * 2) % (len(pool) - n) if len(pool) > n else 0
            start -= start % 2
            chunk = pool[start:start + n]
            while len(chunk) < n:
                chunk += pool[:n - len(chunk)]
            f.write(chunk)
            pos += 7919
    return len(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tensors", type=int, default=100000)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--tokenizer", help="directory whose tokenizer*.json are copied")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit(f"{a.out}: already exists")
    per_layer = 9 + 3 * a.experts
    layers = max(1, math.ceil((a.tensors - 2) / per_layer))
    ts = tensor_list(layers, a.experts, a.vocab)
    tmp = a.out.rstrip("/") + ".tmp-gen"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config(layers, a.experts, a.vocab, a.top_k), f, indent=1)
    hdr = write_safetensors(os.path.join(tmp, "model.safetensors"), ts, bf16_pool(1 << 16, a.seed))
    if a.tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(a.tokenizer, name)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(tmp, name))
    os.rename(tmp, a.out)
    print(f"{a.out}: {len(ts)} tensors in {layers} layers, header {hdr} bytes")


if __name__ == "__main__":
    main()
