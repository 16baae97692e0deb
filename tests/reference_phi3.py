"""An independent Phi-3 / Phi-4-mini forward pass in float64 numpy over HF-named tensors (the
fused self_attn.qkv_proj and mlp.gate_up_proj as stored) and a config.json dict in either
transformers spelling, with LongRoPE and partial rotary written out from their published
definitions. Shares no code with poot.

LongRoPE picks its factor set by the context the model serves (`context`): the short factors
within original_max_position_embeddings, the long ones beyond; cos/sin are scaled by
sqrt(1 + ln(s) / ln(original)) for s = max_position_embeddings / original (> 1).
"""
from __future__ import annotations

import math

import numpy as np
from reference_decoder import attention, rms_norm, silu


def rope_settings(cfg: dict) -> dict:
    """The RoPE keys wherever the config spelled them (4.x top level and rope_scaling, 5.x
    rope_parameters)."""
    rs = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    for key in ("rope_theta", "partial_rotary_factor", "original_max_position_embeddings"):
        if key in cfg:
            rs.setdefault(key, cfg[key])
    return rs


def longrope(cfg: dict, rot: int, context: int):
    """(inverse frequencies [rot/2], cos/sin factor)."""
    rs = rope_settings(cfg)
    base = rs.get("rope_theta", 10000.0)
    freqs = np.array([1.0 / base ** (2 * i / rot) for i in range(rot // 2)])
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return freqs, 1.0
    original = rs.get("original_max_position_embeddings", 4096)
    scale = cfg["max_position_embeddings"] / original
    factors = rs["long_factor"] if context > original else rs["short_factor"]
    att = rs.get("attention_factor") or (
        math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
    return freqs / np.array(factors, np.float64), att


def rotate(x, positions, inv, att, rot):
    """Rotate-half RoPE on the first `rot` dims of each head of x [T, H, d]."""
    ang = positions[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :] * att, np.sin(ang)[:, None, :] * att
    a, b, rest = x[..., : rot // 2], x[..., rot // 2: rot], x[..., rot:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, rest], axis=-1)


def forward(w: dict[str, np.ndarray], cfg: dict, ids, context: int) -> np.ndarray:
    """Logits [T, vocab] (float64) of `ids` from position 0, for a model serving `context`
    positions."""
    w = {n: np.asarray(a, np.float64) for n, a in w.items()}
    t, eps = len(ids), cfg["rms_norm_eps"]
    dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = dim // heads
    rot = int(hd * rope_settings(cfg).get("partial_rotary_factor", 1.0))
    inv, att = longrope(cfg, rot, context)
    positions = np.arange(t, dtype=np.float64)
    window = cfg.get("sliding_window")
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        qkv = h @ w[p + "self_attn.qkv_proj.weight"].T
        q = qkv[:, : heads * hd].reshape(t, heads, hd)
        k = qkv[:, heads * hd: (heads + kv) * hd].reshape(t, kv, hd)
        v = qkv[:, (heads + kv) * hd:].reshape(t, kv, hd)
        q, k = rotate(q, positions, inv, att, rot), rotate(k, positions, inv, att, rot)
        o = attention(q, k, v, window, hd ** -0.5).reshape(t, heads * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = np.split(h @ w[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
        x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
