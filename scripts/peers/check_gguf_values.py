#!/usr/bin/env python3
"""Check that a GGUF written by moetier_to_gguf.py holds exactly the checkpoint's values.

    check_gguf_values.py MODEL_DIR MODEL.gguf [--layers 0,1,...] [--experts N]

Every dense tensor is compared bit for bit (after the exact bf16->f32 widening
where the converter widens). Every MXFP4 expert is decoded twice and compared:
the checkpoint's codes by moetier's rule (element 2b = low nibble of byte b,
value e2m1[code] * 2^(scale-127)), the GGUF's block_mxfp4 by gguf-py's port of
ggml's dequantize_row_mxfp4 (gguf.quants.dequantize) and, with --ggml-dequant
BIN (ggml_dequant, built with the peer), by ggml's own C to_float as well.
Prints one JSON line; exit 1 on any difference.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_here = Path(__file__).resolve().parent
sys.path.insert(0, str(_here))
import moetier_to_gguf as m2g  # noqa: E402  (sets up gguf-py on sys.path)
import numpy as np  # noqa: E402
import gguf  # noqa: E402

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def moetier_mxfp4(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    R = w.shape[0]
    codes = np.empty((R, w.shape[1] * 2), np.uint8)
    codes[:, 0::2] = w & 15
    codes[:, 1::2] = w >> 4
    scale = np.ldexp(np.float32(1), s.astype(np.int32) - 127).astype(np.float32)
    return E2M1[codes] * np.repeat(scale, 32, axis=1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--layers", help="comma list (default: all)")
    ap.add_argument("--experts", type=int, default=0, help="check only the first N experts")
    ap.add_argument("--ggml-dequant", help="ggml_dequant binary: also decode experts with ggml's C code")
    a = ap.parse_args()
    cfg = m2g.parse_config(a.model_dir)
    ck = m2g.read_checkpoint(a.model_dir)
    rd = gguf.GGUFReader(a.gguf)
    gt = {t.name: t for t in rd.tensors}
    L = cfg["num_hidden_layers"]
    layers = [int(x) for x in a.layers.split(",")] if a.layers else list(range(L))
    E = cfg["num_experts"] if a.experts <= 0 else min(a.experts, cfg["num_experts"])
    bad, n_dense, n_exp, n_vals = [], 0, 0, 0

    def ck_f32(name):
        t = ck[name]
        arr = np.asarray(t.array())
        if t.dtype == "BF16":
            return m2g.bf16_to_f32(arr), arr
        return arr.astype(np.float32), arr

    def gg(name):
        t = gt[name]
        data = np.asarray(t.data)
        shape = [int(x) for x in reversed(t.shape)]  # numpy order
        return t, data, shape

    def cmp_dense(gname, hname):
        nonlocal n_dense
        t, data, shape = gg(gname)
        ref32, raw = ck_f32(hname)
        if list(ref32.shape) != shape:
            bad.append(f"{gname}: shape {shape} vs {list(ref32.shape)}")
            return
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            ok = np.array_equal(data.view(np.uint16).reshape(raw.shape), raw)
        else:
            got = gguf.quants.dequantize(data, t.tensor_type).reshape(shape)
            ok = np.array_equal(got.view(np.uint32), ref32.view(np.uint32))
        n_dense += 1
        if not ok:
            bad.append(f"{gname} differs from {hname}")

    cmp_dense("token_embd.weight", "model.embed_tokens.weight")
    cmp_dense("output_norm.weight", "model.norm.weight")
    if "output.weight" in gt:
        cmp_dense("output.weight", "lm_head.weight")
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
             "ffn_gate_inp": "mlp.gate"}
    max_abs = 0.0
    n_c = 0
    tmp = tempfile.TemporaryDirectory() if a.ggml_dequant else None
    for l in layers:
        cdec = {}
        if tmp:
            enames = [f"blk.{l}.ffn_{p}_exps.weight" for p in ("gate", "up", "down")]
            subprocess.run([a.ggml_dequant, str(a.gguf), tmp.name, *enames], check=True)
            for nm in enames:
                cdec[nm] = np.fromfile(os.path.join(tmp.name, nm + ".f32"), np.float32)
        for g, h in names.items():
            cmp_dense(f"blk.{l}.{g}.weight", f"model.layers.{l}.{h}.weight")
        for proj in ("gate", "up", "down"):
            t, data, shape = gg(f"blk.{l}.ffn_{proj}_exps.weight")
            x = f"model.layers.{l}.mlp.experts."
            per_exp = data.reshape(shape[0], -1)
            for e in range(E):
                if f"{x}{e}.{proj}_proj.scale" in ck:  # MXFP4 checkpoint
                    ref = moetier_mxfp4(np.asarray(ck[f"{x}{e}.{proj}_proj.weight"].array()),
                                        np.asarray(ck[f"{x}{e}.{proj}_proj.scale"].array()))
                elif f"{x}gate_up_proj" in ck:
                    I = cfg["moe_intermediate_size"]
                    src = ck[f"{x}gate_up_proj"] if proj != "down" else ck[f"{x}down_proj"]
                    arr = np.asarray(src.array()[e])
                    arr = arr[:I] if proj == "gate" else arr[I:] if proj == "up" else arr
                    ref = m2g.bf16_to_f32(arr) if src.dtype == "BF16" else arr.astype(np.float32)
                else:
                    ref, _ = ck_f32(f"{x}{e}.{proj}_proj.weight")
                got = gguf.quants.dequantize(per_exp[e], t.tensor_type).reshape(ref.shape)
                nm = f"blk.{l}.ffn_{proj}_exps.weight"
                if nm in cdec:
                    gc = cdec[nm].reshape(shape[0], *ref.shape)[e]
                    n_c += 1
                    if not np.array_equal(gc, ref):
                        bad.append(f"{nm}[{e}]: ggml's C to_float differs")
                d = np.abs(got - ref)
                max_abs = max(max_abs, float(d.max()))
                # MXFP4: equal as numbers (ggml has no -0: code 8 decodes to +0)
                if not np.array_equal(got, ref):
                    bad.append(f"blk.{l}.ffn_{proj}_exps[{e}] differs (max {d.max()})")
                n_exp += 1
                n_vals += ref.size
    r = {"ok": not bad, "dense_tensors": n_dense, "expert_matrices": n_exp,
         "expert_values": n_vals, "max_abs_diff": max_abs,
         "expert_matrices_ggml_c": n_c, "problems": bad[:10]}
    print(json.dumps(r))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
