"""MXFP4 quantization and the moetier-tiny checkpoint layout (torch only, no transformers).

Experts are stored per expert, as src/model/qwen3_moe.h documents for "per-expert MXFP4":
  model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight  U8      [out, in/2]
      e2m1 codes, two per byte, the low nibble holds the even element
  model.layers.L.mlp.experts.E.{gate,up,down}_proj.scale   F8_E8M0 [out, in/32]
      one power-of-two scale 2^(s-127) per 32 consecutive input elements
Everything else is bf16. lm_head is tied to model.embed_tokens and not stored.

Quantization of one block of 32 weights w (along the input dimension):
  scale = 2^ceil(log2(amax / 6)), amax = max|w| (so |w|/scale <= 6, nothing clips)
  code  = e2m1(w / scale), rounded to nearest, ties to the even code
e2m1 magnitudes by code 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
"""

import json
import re
import struct

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
BLOCK = 32
SCALE_BIAS = 127


def _blocks(w):
    if w.shape[-1] % BLOCK:
        raise ValueError("MXFP4: last dimension %d is not a multiple of %d" % (w.shape[-1], BLOCK))
    return w.float().reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)  # [..., K/32, 32]


def _pow2(k):
    """2^k as float32, exactly, for integer k in [-126, 127] (built from the exponent bits)."""
    return torch.bitwise_left_shift((k + SCALE_BIAS).to(torch.int32), 23).view(torch.float32)


def _scale_exponent(blocks):
    """k = ceil(log2(amax/6)) per block, exactly (frexp), clamped to [-126, 127]."""
    amax = blocks.abs().amax(dim=-1)  # [..., K/32]
    mant, expo = torch.frexp(amax / 6.0)  # amax/6 = mant * 2^expo, mant in [0.5, 1)
    k = torch.where(mant == 0.5, expo - 1, expo)
    k = torch.where(amax > 0, k, torch.zeros_like(k))
    return k.clamp(-126, 127)  # e8m0 byte = k + 127 in [1, 254]


def _magnitude_codes(v):
    """e2m1 magnitude code 0..7 of v >= 0 (v <= 6 up to rounding), nearest, ties to even."""
    c = (v > 0.25).to(torch.uint8)
    c += (v >= 0.75).to(torch.uint8)
    c += (v > 1.25).to(torch.uint8)
    c += (v >= 1.75).to(torch.uint8)
    c += (v > 2.5).to(torch.uint8)
    c += (v >= 3.5).to(torch.uint8)
    c += (v > 5.0).to(torch.uint8)
    return c


def _codes_and_scale(w):
    blocks = _blocks(w)  # [..., K/32, 32]
    k = _scale_exponent(blocks)  # [..., K/32]
    v = blocks / _pow2(k).unsqueeze(-1)
    mag = _magnitude_codes(v.abs())
    sign = ((v < 0) & (mag > 0)).to(torch.uint8) << 3
    return (mag | sign), k


def quantize(w):
    """w [..., K] -> (packed U8 [..., K/2], scale U8 [..., K/32])."""
    codes, k = _codes_and_scale(w)
    codes = codes.reshape(*w.shape)  # [..., K]
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)  # [..., K/2]
    return packed.contiguous(), (k + SCALE_BIAS).to(torch.uint8).contiguous()


def dequantize(packed, scale):
    """(packed U8 [..., K/2], scale U8 [..., K/32]) -> float32 [..., K]."""
    lo, hi = packed & 0x0F, packed >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)  # [..., K]
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    mag = table[(codes & 7).long()]
    val = torch.where((codes & 8) != 0, -mag, mag)
    e = scale.to(torch.int32)
    s = _pow2(e.clamp(1, 254) - SCALE_BIAS)  # [..., K/32]
    s = torch.where(e == 0, torch.full_like(s, 2.0 ** -127), s)
    s = torch.where(e == 255, torch.full_like(s, float("nan")), s)
    return (val.reshape(*scale.shape, BLOCK) * s.unsqueeze(-1)).reshape(val.shape)


def fake_quantize(w):
    """Straight-through MXFP4: forward uses the dequantized values, gradient passes to w."""
    codes, k = _codes_and_scale(w.detach())
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=w.device)
    mag = table[(codes & 7).long()]
    val = torch.where((codes & 8) != 0, -mag, mag)
    deq = (val * _pow2(k).unsqueeze(-1)).reshape(w.shape)
    return w + (deq.to(w.dtype) - w).detach()


# ---------------------------------------------------------------------------------------
# State dict <-> checkpoint tensors

EXPERT_RE = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def export_tensors(state_dict, tie_word_embeddings):
    """{name: (dtype, shape, bytes)} for the checkpoint, from a transformers state dict."""
    out = {}
    for name, t in state_dict.items():
        t = t.detach().float().cpu()
        if name == "lm_head.weight" and tie_word_embeddings:
            continue
        m = EXPERT_RE.match(name)
        if not m:
            bf = t.to(torch.bfloat16).contiguous()
            out[name] = ("BF16", list(bf.shape), bf.view(torch.int16).numpy().tobytes())
            continue
        prefix, kind = m.groups()
        for e in range(t.shape[0]):
            if kind == "gate_up_proj":  # [E, 2I, H]: gate rows first
                inter = t.shape[1] // 2
                parts = {"gate_proj": t[e, :inter], "up_proj": t[e, inter:]}
            else:  # [E, H, I]
                parts = {"down_proj": t[e]}
            for proj, w in parts.items():
                packed, scale = quantize(w)
                base = "%s.%d.%s" % (prefix, e, proj)
                out[base + ".weight"] = ("U8", list(packed.shape), packed.numpy().tobytes())
                out[base + ".scale"] = ("F8_E8M0", list(scale.shape), scale.numpy().tobytes())
    return out


def _natural_key(name):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def write_safetensors(path, tensors, metadata):
    """Plain safetensors writer: 8-byte header length, JSON header, tensors back to back."""
    header, offset, order = {"__metadata__": metadata}, 0, sorted(tensors, key=_natural_key)
    for name in order:
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name in order:
            f.write(tensors[name][2])
    return 8 + len(hjson) + offset


def read_safetensors(path):
    """{name: torch tensor} (BF16 -> bfloat16, U8/F8_E8M0 -> uint8, F32 -> float32)."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + hlen])
    base = 8 + hlen
    dtypes = {"BF16": torch.bfloat16, "U8": torch.uint8, "F8_E8M0": torch.uint8, "F32": torch.float32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = bytearray(blob[base + a:base + b])
        t = torch.frombuffer(raw, dtype=dtypes[info["dtype"]]) if raw else torch.zeros(0, dtype=dtypes[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out, header.get("__metadata__", {})


def import_state_dict(tensors, num_layers, num_experts):
    """float32 transformers state dict (stacked experts) from checkpoint tensors."""
    sd = {}
    for name, t in tensors.items():
        if ".mlp.experts." not in name:
            sd[name] = t.float()
    for layer in range(num_layers):
        prefix = "model.layers.%d.mlp.experts" % layer
        if "%s.0.gate_proj.weight" % prefix not in tensors:
            continue
        gate_up, down = [], []
        for e in range(num_experts):
            deq = {}
            for proj in ("gate_proj", "up_proj", "down_proj"):
                base = "%s.%d.%s" % (prefix, e, proj)
                deq[proj] = dequantize(tensors[base + ".weight"], tensors[base + ".scale"])
            gate_up.append(torch.cat([deq["gate_proj"], deq["up_proj"]], dim=0))  # [2I, H]
            down.append(deq["down_proj"])  # [H, I]
        sd[prefix + ".gate_up_proj"] = torch.stack(gate_up)  # [E, 2I, H]
        sd[prefix + ".down_proj"] = torch.stack(down)  # [E, H, I]
    return sd


def checkpoint_budget(cfg, tokenizer_bytes):
    """Bytes of model.safetensors (+ tokenizer.json) for a config dict, before writing it."""
    h, n_layers, n_exp = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_experts"]
    inter, v, hd = cfg["moe_intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    expert_w = n_layers * n_exp * 3 * h * inter
    mxfp4 = expert_w // 2 + expert_w // BLOCK
    attn = n_layers * (h * nq * hd * 2 + h * nkv * hd * 2 + 2 * hd + 2 * h)  # q,o,k,v, q/k norm, 2 norms
    router = n_layers * n_exp * h
    embed = v * h * (1 if cfg["tie_word_embeddings"] else 2) + h  # + final norm
    bf16 = 2 * (attn + router + embed)
    n_tensors = n_layers * (n_exp * 6 + 10) + 3
    header = 110 * n_tensors  # measured: about 100 bytes of JSON per tensor entry
    return {"experts_mxfp4": mxfp4, "bf16": bf16, "header_estimate": header,
            "tokenizer": tokenizer_bytes, "total": mxfp4 + bf16 + header + tokenizer_bytes,
            "expert_params": expert_w, "other_params": attn + router + embed}
