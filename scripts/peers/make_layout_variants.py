#!/usr/bin/env python3
"""Rewrite an MXFP4 qwen3_moe checkpoint with its experts in the two other
layouts, exactly (e2m1 * 2^k is a bf16 value while k stays in bf16's range):

    make_layout_variants.py MODEL_DIR OUT_DIR

OUT_DIR/per-expert-bf16/  mlp.experts.{e}.{gate,up,down}_proj.weight BF16 [out, in]
OUT_DIR/stacked-bf16/     mlp.experts.gate_up_proj BF16 [E, 2I, H], mlp.experts.down_proj [E, H, I]

Non-expert tensors, config and tokenizer files are copied unchanged. Used to
exercise moetier_to_gguf.py's three expert paths (docs/peers.md).
"""
from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moetier_to_gguf as m2g  # noqa: E402
import numpy as np  # noqa: E402

from check_gguf_values import moetier_mxfp4  # noqa: E402


def f32_to_bf16_exact(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    if (u & 0xFFFF).any():
        raise SystemExit("value not representable in bf16")
    return (u >> 16).astype(np.uint16)


def write_st(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    hdr, off, order = {}, 0, []
    for name in sorted(tensors):
        dt, a = tensors[name]
        n = a.nbytes
        hdr[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + n]}
        off += n
        order.append(a)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for a in order:
            f.write(np.ascontiguousarray(a).tobytes())


def main() -> int:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    c = m2g.parse_config(src)
    ck = m2g.read_checkpoint(src)
    E, L = c["num_experts"], c["num_hidden_layers"]
    base = {n: (t.dtype, np.asarray(t.array())) for n, t in ck.items() if ".mlp.experts." not in n}
    per, stk = dict(base), dict(base)
    for l in range(L):
        x = f"model.layers.{l}.mlp.experts."
        mats = {}
        for p in ("gate", "up", "down"):
            mats[p] = [f32_to_bf16_exact(moetier_mxfp4(np.asarray(ck[f"{x}{e}.{p}_proj.weight"].array()),
                                                        np.asarray(ck[f"{x}{e}.{p}_proj.scale"].array())))
                       for e in range(E)]
            for e in range(E):
                per[f"{x}{e}.{p}_proj.weight"] = ("BF16", mats[p][e])
        stk[x + "gate_up_proj"] = ("BF16", np.stack([np.concatenate([mats["gate"][e], mats["up"][e]])
                                                     for e in range(E)]))
        stk[x + "down_proj"] = ("BF16", np.stack(mats["down"]))
    for name, t in (("per-expert-bf16", per), ("stacked-bf16", stk)):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.suffix == ".json" and not f.name.startswith("model.safetensors"):
                shutil.copy(f, d / f.name)
        write_st(d / "model.safetensors", t)
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
