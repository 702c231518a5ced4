#!/usr/bin/env python3
"""Convert a qwen3_moe checkpoint (moetier's or a publisher's) to a GGUF that
llama.cpp's `qwen3moe` architecture loads. Measurement only (docs/peers.md).

    moetier_to_gguf.py MODEL_DIR OUT.gguf [--pre NAME] [--dense-f32] [--name NAME]

Uses llama.cpp's own gguf-py (found through $LLAMA_GGUF_PY, default
/work/peers/llama.cpp/gguf-py) and numpy; no torch, no transformers.

Expert layouts (src/model/qwen3_moe.h):
  stacked bf16/f32      mlp.experts.gate_up_proj [E, 2I, H] (gate rows first),
                        mlp.experts.down_proj [E, H, I]
  per-expert bf16/f32   mlp.experts.{e}.{gate,up,down}_proj.weight [out, in]
  per-expert MXFP4      mlp.experts.{e}.{gate,up,down}_proj.weight U8/I8 [out, in/2]
                        (e2m1 pairs, low nibble = even element) +
                        .scale F8_E8M0/U8 [out, in/32]
The MXFP4 experts become ggml MXFP4 (type 39) with the same values: a ggml
block_mxfp4 is {uint8 e; uint8 qs[16]} where qs[j] holds element j (low nibble)
and element j+16 (high nibble), and decodes as kvalues[q] * 2^(e-128) with
kvalues = 2 * e2m1, i.e. e2m1[q] * 2^(e-127): the e8m0 byte is copied as is and
only the nibbles move. Per-expert CB3 has no ggml type and is refused.

Dense matrices keep their type (bf16 stays bf16, f32 stays f32, f16 stays f16).
Norm weights, biases and the router (ffn_gate_inp) are written as f32, as
llama.cpp's own converter does: a lossless widening of bf16 (llama.cpp's
kernels expect f32 there). --dense-f32 widens every dense matrix to f32 too
(for value checks: llama.cpp's CPU bf16 matmul rounds activations to bf16);
--all-f32 also decodes the experts to f32 (exact; llama.cpp's CPU MXFP4 matmul
quantizes activations to q8_0), so that only the arithmetic order differs.

Memory: tensors are numpy memmaps of the safetensors payloads; one output
tensor (at most one layer's stacked experts) is materialised at a time. The
output is written to OUT.gguf.tmp.PID and renamed at the end.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import struct
import sys
import time
from pathlib import Path

_here = Path(__file__).resolve().parent
for _c in (os.environ.get("LLAMA_GGUF_PY"), "/work/peers/llama.cpp/gguf-py", str(_here / "gguf-py")):
    if _c and (Path(_c) / "gguf" / "__init__.py").is_file():
        sys.path.insert(0, _c)
        break

try:
    import numpy as np
except ImportError:
    sys.exit("moetier_to_gguf.py: numpy missing (Debian: apt-get install python3-numpy; "
             "run with /usr/bin/python3)")
try:
    import gguf  # llama.cpp's gguf-py
except ImportError as e:
    sys.exit(f"moetier_to_gguf.py: cannot import llama.cpp's gguf-py ({e}); set LLAMA_GGUF_PY "
             "to <llama.cpp>/gguf-py (scripts/peers/llama.cpp.sh fetch)")

log = logging.getLogger("moetier_to_gguf")
GT = gguf.GGMLQuantizationType


class ConvertError(Exception):
    pass


# ---------------------------------------------------------------- safetensors

ST_DTYPES = {
    "F32": (np.float32, GT.F32), "F16": (np.float16, GT.F16), "BF16": (np.uint16, GT.BF16),
    "U8": (np.uint8, None), "I8": (np.uint8, None), "F8_E8M0": (np.uint8, None),
}


class STensor:
    __slots__ = ("name", "dtype", "shape", "path", "offset", "nbytes", "_mm")

    def __init__(self, name, dtype, shape, path, offset, nbytes):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.path, self.offset, self.nbytes = path, offset, nbytes
        self._mm = None

    def release(self) -> None:
        self._mm = None  # unmaps once the last view is gone

    def array(self) -> np.ndarray:
        """Memmap of the payload, in the numpy dtype carrying its bits."""
        if self._mm is None:
            npdt = ST_DTYPES[self.dtype][0]
            n = int(np.prod(self.shape)) if self.shape else 1
            if n * np.dtype(npdt).itemsize != self.nbytes:
                raise ConvertError(f"{self.path.name}: {self.name}: {self.nbytes} bytes for "
                                   f"shape {list(self.shape)} {self.dtype}")
            if n == 0:
                self._mm = np.zeros(self.shape, npdt)
            else:
                self._mm = np.memmap(self.path, dtype=npdt, mode="r", offset=self.offset,
                                     shape=self.shape)
        return self._mm


def read_checkpoint(d: Path) -> dict[str, STensor]:
    idx = d / "model.safetensors.index.json"
    if idx.is_file():
        files = sorted(set(json.loads(idx.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in d.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"{d}: no *.safetensors")
    out: dict[str, STensor] = {}
    for fn in files:
        p = d / fn
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        base = 8 + n
        size = p.stat().st_size
        for name, v in hdr.items():
            # padding tensors (docs/formats.md) align the next tensor; not weights
            if name == "__metadata__" or name.startswith("__pad_"):
                continue
            if v["dtype"] not in ST_DTYPES:
                raise ConvertError(f"{fn}: {name}: dtype {v['dtype']} not supported")
            a, b = v["data_offsets"]
            if base + b > size:
                raise ConvertError(f"{fn}: {name}: payload past the end of the file")
            if name in out:
                raise ConvertError(f"{fn}: {name}: also in {out[name].path.name}")
            out[name] = STensor(name, v["dtype"], v["shape"], p, base + a, b - a)
    return out


# ---------------------------------------------------------------- config

def parse_config(d: Path) -> dict:
    cfg = json.loads((d / "config.json").read_text())
    f = cfg.get("text_config", cfg) if cfg.get("model_type") != "qwen3_moe" else cfg
    if f.get("model_type") != "qwen3_moe":
        raise ConvertError(f"config.json: model_type {f.get('model_type')!r}, expected 'qwen3_moe'")

    def need(k):
        if f.get(k) is None:
            raise ConvertError(f"config.json: field {k!r} missing")
        return f[k]

    c = {k: int(need(k)) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                   "num_attention_heads", "moe_intermediate_size",
                                   "num_experts_per_tok")}
    c["num_key_value_heads"] = int(f.get("num_key_value_heads") or c["num_attention_heads"])
    c["head_dim"] = int(f.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    e, l = f.get("num_experts"), f.get("num_local_experts")
    if e is not None and l is not None and int(e) != int(l):
        raise ConvertError(f"config.json: num_local_experts {l} disagrees with num_experts {e}")
    if e is None and l is None:
        raise ConvertError("config.json: field 'num_experts' missing (or num_local_experts)")
    c["num_experts"] = int(e if e is not None else l)
    c["intermediate_size"] = int(f.get("intermediate_size") or 0)
    c["rms_norm_eps"] = float(f.get("rms_norm_eps", 1e-6))
    c["max_position_embeddings"] = int(f.get("max_position_embeddings") or 0)
    c["tie_word_embeddings"] = bool(f.get("tie_word_embeddings", False))
    c["attention_bias"] = bool(f.get("attention_bias", False))
    c["norm_topk_prob"] = bool(f.get("norm_topk_prob", False))
    theta = f.get("rope_theta")
    rp = f.get("rope_parameters")
    if isinstance(rp, dict):
        if rp.get("rope_type", rp.get("type", "default")) != "default":
            raise ConvertError(f"config.json: rope_parameters.rope_type {rp.get('rope_type')!r} "
                               "not supported (only 'default')")
        t2 = rp.get("rope_theta")
        if theta is not None and t2 is not None and float(t2) != float(theta):
            raise ConvertError("config.json: rope_parameters.rope_theta disagrees with rope_theta")
        theta = theta if theta is not None else t2
    rs = f.get("rope_scaling")
    if isinstance(rs, dict) and rs.get("rope_type", rs.get("type", "default")) != "default":
        raise ConvertError(f"config.json: rope_scaling {rs} not supported")
    c["rope_theta"] = float(theta if theta is not None else 10000.0)
    # What llama.cpp's qwen3moe graph cannot express: refuse rather than mis-convert.
    if f.get("hidden_act", "silu") != "silu":
        raise ConvertError(f"config.json: hidden_act {f.get('hidden_act')!r} (only silu)")
    if f.get("use_sliding_window") and f.get("sliding_window"):
        raise ConvertError("config.json: sliding window attention is not supported")
    if f.get("mlp_only_layers") or int(f.get("decoder_sparse_step", 1) or 1) != 1:
        raise ConvertError("config.json: dense (mlp_only_layers / decoder_sparse_step) layers: "
                           "llama.cpp's qwen3moe has MoE in every layer")
    if not c["norm_topk_prob"]:
        raise ConvertError("config.json: norm_topk_prob false: llama.cpp's qwen3moe always "
                           "renormalises the top-k weights")
    return c


# ---------------------------------------------------------------- tokenizer

QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
             r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# pre-tokenizer regex (tokenizer.json Split) -> llama.cpp's tokenizer.ggml.pre
# (src/llama-vocab.cpp: "qwen2" -> LLAMA_VOCAB_PRE_TYPE_QWEN2, same regex).
KNOWN_PRE = {QWEN2_RE: "qwen2", QWEN35_RE: "qwen35", LLAMA3_RE: "llama-bpe"}


def detect_pre(tok: dict) -> str:
    pt = tok.get("pre_tokenizer") or {}
    seq = pt.get("pretokenizers", [pt]) if pt.get("type") == "Sequence" else [pt]
    splits = [p for p in seq if p.get("type") == "Split"]
    bl = [p for p in seq if p.get("type") == "ByteLevel"]
    if len(splits) == 1 and len(bl) == 1 and not bl[0].get("use_regex", True):
        rx = splits[0].get("pattern", {}).get("Regex")
        if splits[0].get("behavior") == "Isolated" and not splits[0].get("invert") and rx in KNOWN_PRE:
            return KNOWN_PRE[rx]
        raise ConvertError(f"tokenizer.json: pre-tokenizer regex {rx!r} is not one this converter "
                           "maps to a llama.cpp pre-tokenizer; pass --pre NAME")
    if not splits and len(bl) == 1 and bl[0].get("use_regex", True) and len(seq) == 1:
        return "gpt-2"
    raise ConvertError(f"tokenizer.json: pre-tokenizer {pt} not recognised; pass --pre NAME")


def add_vocab(w: "gguf.GGUFWriter", d: Path, n_vocab: int, pre: str | None) -> dict:
    tok = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        raise ConvertError(f"tokenizer.json: model type {model.get('type')!r} (only BPE)")
    if model.get("byte_fallback"):
        raise ConvertError("tokenizer.json: byte_fallback BPE (sentencepiece style) not supported")
    vocab: dict[str, int] = dict(model["vocab"])
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for a in added.values():
        vocab[a["content"]] = a["id"]
    ids = {}
    for t, i in vocab.items():
        ids[i] = t
    top = max(ids) + 1
    if top > n_vocab:
        raise ConvertError(f"tokenizer has id {top - 1}, config vocab_size is {n_vocab}")
    tokens, types = [], []
    n_unused = 0
    for i in range(n_vocab):
        if i not in ids:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            n_unused += 1
            continue
        t = ids[i]
        tokens.append(t)
        if i in added:
            a = added[i]
            looks = (t.startswith("<|") and t.endswith("|>")) or t in ("<pad>", "<mask>")
            types.append(gguf.TokenType.CONTROL if a.get("special") or looks
                         else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    pre = pre or detect_pre(tok)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    sv = gguf.SpecialVocab(d, load_merges=True, n_vocab=n_vocab)
    if "eos" in sv.special_token_ids and "bos" not in sv.special_token_ids:
        # llama.cpp defaults a gpt2 vocab's bos to id 11; with add_bos false it is never
        # inserted, but give it a real token (Qwen's GGUFs use <|endoftext|>).
        sv.special_token_ids["bos"] = sv.special_token_ids["eos"]
    if "bos" not in sv.add_special_token:
        sv.add_special_token["bos"] = False
    sv.add_to_gguf(w, quiet=True)
    norm = (tok.get("normalizer") or {}).get("type")
    return {"pre": pre, "n_tokens": len(ids), "n_unused": n_unused, "merges": len(sv.merges),
            "special": dict(sv.special_token_ids), "add": dict(sv.add_special_token),
            "normalizer": norm,
            "control": [tokens[i] for i in range(n_vocab) if types[i] == gguf.TokenType.CONTROL][:8]}


# ---------------------------------------------------------------- tensors

def mxfp4_to_ggml(w: np.ndarray, s: np.ndarray, out: np.ndarray) -> None:
    """moetier MXFP4 rows -> ggml block_mxfp4 rows.
    w: [R, in/2] uint8, byte b = element 2b (low nibble) | element 2b+1 (high nibble)
    s: [R, in/32] uint8 e8m0
    out: [R, in/32, 17] uint8: out[..., 0] = e, out[..., 1 + j] = el[j] | el[j+16] << 4.
    With a = block bytes 0..7, b = block bytes 8..15 (moetier order):
      qs[2i]   = el[2i]   | el[2i+16]   << 4 = (a[i] & 15) | (b[i] << 4)
      qs[2i+1] = el[2i+1] | el[2i+17]   << 4 = (a[i] >> 4) | (b[i] & 0xF0)"""
    R, nb = s.shape
    wb = np.asarray(w).reshape(R, nb, 16)
    a, b = wb[..., :8], wb[..., 8:]
    out[..., 0] = s
    ev = out[..., 1:17:2]
    od = out[..., 2:17:2]
    np.bitwise_and(a, 15, out=ev)
    ev |= np.left_shift(b, 4)
    np.right_shift(a, 4, out=od)
    od |= np.bitwise_and(b, 0xF0)


class Plan:
    """One output tensor: name, numpy-order shape (elements), ggml type, producer."""

    def __init__(self, name, shape, gtype, make, sources=()):
        self.name, self.shape, self.gtype, self.make = name, tuple(shape), gtype, make
        self.sources = list(sources)  # STensors to unmap once written
        bs, ts = gguf.GGML_QUANT_SIZES[gtype]
        n = int(np.prod(self.shape))
        if self.shape[-1] % bs:
            raise ConvertError(f"{name}: row of {self.shape[-1]} not a multiple of {bs}")
        self.nbytes = n // bs * ts


def np_dtype_of(gt):
    return {GT.F32: np.float32, GT.F16: np.float16, GT.BF16: np.uint16}[gt]


def bf16_to_f32(a: np.ndarray) -> np.ndarray:
    return (np.asarray(a, dtype=np.uint32) << 16).view(np.float32)


def as_type(a: np.ndarray, src: str, gt) -> np.ndarray:
    """Payload (memmap) of safetensors dtype `src` as ggml type gt (exact widening only)."""
    if ST_DTYPES[src][1] == gt:
        return a
    if gt == GT.F32:
        if src == "BF16":
            return bf16_to_f32(a)
        if src == "F16":
            return np.asarray(a, dtype=np.float32)
    raise ConvertError(f"no exact conversion {src} -> {gt.name}")


E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def mxfp4_to_f32(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """moetier MXFP4 rows -> f32 (exact): e2m1[code] * 2^(scale-127)."""
    w = np.asarray(w)
    codes = np.empty((w.shape[0], w.shape[1] * 2), np.uint8)
    codes[:, 0::2] = w & 15
    codes[:, 1::2] = w >> 4
    scale = np.ldexp(np.float32(1), np.asarray(s).astype(np.int32) - 127).astype(np.float32)
    return E2M1[codes] * np.repeat(scale, 32, axis=1)


def build_plan(ck: dict[str, STensor], c: dict, dense_f32: bool,
               experts_f32: bool = False) -> tuple[list[Plan], dict]:
    used: set[str] = set()
    plans: list[Plan] = []
    H, L, E = c["hidden_size"], c["num_hidden_layers"], c["num_experts"]
    I, D = c["moe_intermediate_size"], c["head_dim"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    stats = {"experts": None, "dense_types": set()}

    def get(name, shape=None):
        t = ck.get(name)
        if t is None:
            raise ConvertError(f"checkpoint: tensor {name} missing")
        if shape is not None and list(t.shape) != list(shape):
            raise ConvertError(f"checkpoint: {name} has shape {list(t.shape)}, expected {list(shape)}")
        used.add(name)
        return t

    def dense(gname, hname, shape, force_f32=False):
        t = get(hname, shape)
        if t.dtype not in ("F32", "F16", "BF16"):
            raise ConvertError(f"{hname}: dtype {t.dtype} for a dense tensor")
        gt = GT.F32 if (force_f32 or dense_f32) else ST_DTYPES[t.dtype][1]
        if not force_f32:
            stats["dense_types"].add(gt.name)
        plans.append(Plan(gname, shape, gt, lambda t=t, gt=gt: as_type(t.array(), t.dtype, gt), [t]))

    V = c["vocab_size"]
    dense("token_embd.weight", "model.embed_tokens.weight", [V, H])
    dense("output_norm.weight", "model.norm.weight", [H], True)
    if "lm_head.weight" in ck and not c["tie_word_embeddings"]:
        dense("output.weight", "lm_head.weight", [V, H])
    elif "lm_head.weight" in ck:
        used.add("lm_head.weight")  # tied: llama.cpp reuses token_embd
    elif not c["tie_word_embeddings"]:
        raise ConvertError("checkpoint: lm_head.weight missing and tie_word_embeddings is false")

    for l in range(L):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        dense(g + "attn_norm.weight", p + "input_layernorm.weight", [H], True)
        dense(g + "attn_q.weight", p + "self_attn.q_proj.weight", [nq * D, H])
        dense(g + "attn_k.weight", p + "self_attn.k_proj.weight", [nkv * D, H])
        dense(g + "attn_v.weight", p + "self_attn.v_proj.weight", [nkv * D, H])
        if c["attention_bias"]:
            dense(g + "attn_q.bias", p + "self_attn.q_proj.bias", [nq * D], True)
            dense(g + "attn_k.bias", p + "self_attn.k_proj.bias", [nkv * D], True)
            dense(g + "attn_v.bias", p + "self_attn.v_proj.bias", [nkv * D], True)
        dense(g + "attn_output.weight", p + "self_attn.o_proj.weight", [H, nq * D])
        dense(g + "attn_q_norm.weight", p + "self_attn.q_norm.weight", [D], True)
        dense(g + "attn_k_norm.weight", p + "self_attn.k_norm.weight", [D], True)
        dense(g + "ffn_norm.weight", p + "post_attention_layernorm.weight", [H], True)
        dense(g + "ffn_gate_inp.weight", p + "mlp.gate.weight", [E, H], True)

        x = p + "mlp.experts."
        shapes = {"gate": [I, H], "up": [I, H], "down": [H, I]}
        if x + "gate_up_proj" in ck:
            layout = "stacked"
            gu = get(x + "gate_up_proj", [E, 2 * I, H])
            dn = get(x + "down_proj", [E, H, I])
            if gu.dtype not in ("F32", "F16", "BF16") or dn.dtype != gu.dtype:
                raise ConvertError(f"{x}gate_up_proj/down_proj: dtypes {gu.dtype}/{dn.dtype}")
            gt = GT.F32 if experts_f32 else ST_DTYPES[gu.dtype][1]
            plans.append(Plan(g + "ffn_gate_exps.weight", [E, I, H], gt,
                              lambda gu=gu, gt=gt: as_type(
                                  np.ascontiguousarray(gu.array()[:, :I, :]), gu.dtype, gt)))
            plans.append(Plan(g + "ffn_up_exps.weight", [E, I, H], gt,
                              lambda gu=gu, gt=gt: as_type(
                                  np.ascontiguousarray(gu.array()[:, I:, :]), gu.dtype, gt), [gu]))
            plans.append(Plan(g + "ffn_down_exps.weight", [E, H, I], gt,
                              lambda dn=dn, gt=gt: as_type(dn.array(), dn.dtype, gt), [dn]))
        elif x + "0.gate_proj.weight" in ck:
            w0 = ck[x + "0.gate_proj.weight"]
            if x + "0.gate_proj.codebook" in ck:
                raise ConvertError(f"{x}*: CB3 experts have no ggml type (convert the MXFP4 or "
                                   "bf16 checkpoint instead)")
            mx = x + "0.gate_proj.scale" in ck
            layout = "per-expert MXFP4" if mx else f"per-expert {w0.dtype}"
            for proj in ("gate", "up", "down"):
                R, K = shapes[proj]
                if mx:
                    if K % 32:
                        raise ConvertError(f"{x}*.{proj}_proj: in={K} not a multiple of 32")
                    ws = [get(f"{x}{e}.{proj}_proj.weight", [R, K // 2]) for e in range(E)]
                    ss = [get(f"{x}{e}.{proj}_proj.scale", [R, K // 32]) for e in range(E)]
                    for t in ws:
                        if t.dtype not in ("U8", "I8"):
                            raise ConvertError(f"{t.name}: dtype {t.dtype}, expected U8/I8 codes")
                    for t in ss:
                        if t.dtype not in ("U8", "F8_E8M0"):
                            raise ConvertError(f"{t.name}: dtype {t.dtype}, expected F8_E8M0/U8")

                    if experts_f32:
                        def make(ws=ws, ss=ss, R=R, K=K):
                            out = np.empty((E, R, K), np.float32)
                            for e in range(E):
                                out[e] = mxfp4_to_f32(ws[e].array(), ss[e].array())
                            return out
                        plans.append(Plan(f"{g}ffn_{proj}_exps.weight", [E, R, K], GT.F32, make,
                                          ws + ss))
                        continue

                    def make(ws=ws, ss=ss, R=R, K=K, name=f"{x}*.{proj}_proj"):
                        out = np.empty((E, R, K // 32, 17), np.uint8)
                        for e in range(E):
                            s = ss[e].array()
                            if (s == 0xFF).any():
                                raise ConvertError(f"{ss[e].name}: e8m0 0xff (NaN in moetier, "
                                                   "finite in ggml)")
                            mxfp4_to_ggml(ws[e].array(), s, out[e])
                        return out.reshape(E, R, -1)
                    plans.append(Plan(f"{g}ffn_{proj}_exps.weight", [E, R, K], GT.MXFP4, make,
                                      ws + ss))
                else:
                    ws = [get(f"{x}{e}.{proj}_proj.weight", [R, K]) for e in range(E)]
                    dt = ws[0].dtype
                    if dt not in ("F32", "F16", "BF16") or any(t.dtype != dt for t in ws):
                        raise ConvertError(f"{x}*.{proj}_proj.weight: mixed or bad dtypes")
                    gt = GT.F32 if experts_f32 else ST_DTYPES[dt][1]

                    def make(ws=ws, R=R, K=K, dt=dt, gt=gt):
                        out = np.empty((E, R, K), np_dtype_of(gt))
                        for e in range(E):
                            out[e] = as_type(ws[e].array(), dt, gt)
                        return out
                    plans.append(Plan(f"{g}ffn_{proj}_exps.weight", [E, R, K], gt, make, ws))
        else:
            raise ConvertError(f"checkpoint: layer {l}: no experts ({x}gate_up_proj or "
                               f"{x}0.gate_proj.weight)")
        if stats["experts"] not in (None, layout):
            raise ConvertError(f"layer {l}: experts are {layout}, earlier layers {stats['experts']}")
        stats["experts"] = layout
    left = sorted(set(ck) - used)
    if left:
        raise ConvertError(f"checkpoint: {len(left)} tensors not converted, e.g. {left[:4]}")
    # the three projections are written gate, up, down; llama.cpp looks them up by name
    return plans, stats


# ---------------------------------------------------------------- main

def convert(model_dir: Path, out: Path, pre: str | None, dense_f32: bool, name: str | None,
            experts_f32: bool = False) -> dict:
    t0 = time.time()
    c = parse_config(model_dir)
    ck = read_checkpoint(model_dir)
    plans, stats = build_plan(ck, c, dense_f32 or experts_f32, experts_f32)
    tmp = out.with_name(out.name + f".tmp.{os.getpid()}")
    w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3MOE])
    try:
        w.add_name(name or model_dir.resolve().name)
        w.add_type(gguf.GGUFType.MODEL)
        w.add_string("general.source.producer", "moetier scripts/peers/moetier_to_gguf.py")
        mx = stats["experts"] == "per-expert MXFP4" and not experts_f32
        dts = stats["dense_types"]
        ft = (gguf.LlamaFileType.MOSTLY_MXFP4_MOE if mx else
              gguf.LlamaFileType.ALL_F32 if dts == {"F32"} else
              gguf.LlamaFileType.MOSTLY_F16 if dts == {"F16"} else gguf.LlamaFileType.MOSTLY_BF16)
        w.add_file_type(ft)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_block_count(c["num_hidden_layers"])
        if c["intermediate_size"]:
            w.add_feed_forward_length(c["intermediate_size"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_rope_dimension_count(c["head_dim"])
        w.add_rope_freq_base(c["rope_theta"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
        voc = add_vocab(w, model_dir, c["vocab_size"], pre)

        for pl in plans:
            raw = None if pl.gtype in (GT.F32, GT.F16) else pl.gtype
            npdt = np.uint8 if pl.gtype == GT.MXFP4 else np_dtype_of(pl.gtype)
            shape = list(pl.shape)
            if pl.gtype == GT.MXFP4:  # gguf-py takes quantized shapes in bytes
                shape[-1] = shape[-1] // 32 * 17
            w.add_tensor_info(pl.name, shape, np.dtype(npdt), pl.nbytes, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total = 0
        for i, pl in enumerate(plans):
            a = pl.make()
            if a.nbytes != pl.nbytes:
                raise ConvertError(f"{pl.name}: produced {a.nbytes} bytes, planned {pl.nbytes}")
            w.write_tensor_data(np.ascontiguousarray(a))
            total += a.nbytes
            del a
            for t in pl.sources:
                t.release()
            if i % 64 == 63:
                log.info("%d/%d tensors, %.2f GB, %.1fs", i + 1, len(plans), total / 1e9,
                         time.time() - t0)
        w.close()
        os.replace(tmp, out)
    except BaseException:
        try:
            w.close()
        except Exception:
            pass
        tmp.unlink(missing_ok=True)
        raise
    return {"out": str(out), "bytes": out.stat().st_size, "tensors": len(plans),
            "experts": stats["experts"], "dense": sorted(stats["dense_types"]),
            "seconds": round(time.time() - t0, 2), "vocab": voc, "config": c}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--pre", help="tokenizer.ggml.pre (default: from the pre-tokenizer regex)")
    ap.add_argument("--dense-f32", action="store_true",
                    help="widen every dense matrix to f32 (exact; for value checks)")
    ap.add_argument("--all-f32", action="store_true",
                    help="every matrix in f32, experts decoded exactly (value checks only)")
    ap.add_argument("--name", help="general.name (default: the model directory's name)")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        r = convert(a.model_dir, a.out, a.pre, a.dense_f32, a.name, a.all_f32)
    except (ConvertError, OSError, KeyError, ValueError) as e:
        print(f"moetier_to_gguf.py: {e}", file=sys.stderr)
        return 1
    r.pop("config")
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
