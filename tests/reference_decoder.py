"""An independent decoder forward pass in float64 numpy over HF-named tensors and an HF
config.json dict: Llama, Mistral, Qwen2, Qwen3 and Gemma 3 (text), with the RoPE scalings
written out from their published definitions (default, linear, llama3, yarn).

Shares no code with poot. Tests build random-weight HF folders of each family and compare
poot's logits with `forward`.
"""
from __future__ import annotations

import math

import numpy as np


def rms_norm(x, w, eps, offset=0.0):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_frequencies(cfg: dict, dim: int, base: float, scaled: bool = True):
    """(inverse frequencies [dim/2], attention factor) for rope_scaling of cfg."""
    rs = (cfg.get("rope_scaling") or {}) if scaled else {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    freqs = [1.0 / base ** (2 * i / dim) for i in range(dim // 2)]
    if kind == "default":
        return np.array(freqs), 1.0
    factor = rs["factor"]
    if kind == "linear":
        return np.array(freqs) / factor, 1.0
    if kind == "llama3":
        old = rs["original_max_position_embeddings"]
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        out = []
        for f in freqs:
            wavelength = 2 * math.pi / f
            if wavelength < old / hi:          # high frequency: kept
                out.append(f)
            elif wavelength > old / lo:        # low frequency: interpolated
                out.append(f / factor)
            else:                              # between: a smooth blend
                smooth = (old / wavelength - lo) / (hi - lo)
                out.append((1 - smooth) * f / factor + smooth * f)
        return np.array(out), 1.0
    if kind == "yarn":
        old = rs.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        fast, slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

        def correction_dim(rotations):
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(fast)), 0)
        high = min(math.ceil(correction_dim(slow)), dim - 1)
        out = []
        for i, f in enumerate(freqs):
            ramp = min(max((i - low) / max(high - low, 0.001), 0.0), 1.0)
            keep = 1.0 - ramp                  # share of the un-interpolated frequency
            out.append(f / factor * (1 - keep) + f * keep)
        attention = rs.get("attention_factor") or (0.1 * math.log(factor) + 1.0)
        return np.array(out), attention
    raise ValueError(kind)


def rope(x, positions, inv, att):
    """Rotate-half RoPE: x [T, H, d], pairs (i, i + d/2); cos/sin times `att`."""
    d = x.shape[-1]
    ang = positions[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :] * att, np.sin(ang)[:, None, :] * att
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def layer_windows(cfg: dict) -> list[int | None]:
    """Per layer: its sliding window, or None for global attention."""
    n, window = cfg["num_hidden_layers"], cfg.get("sliding_window")
    if not window or not cfg.get("use_sliding_window", True):
        return [None] * n
    if "layer_types" in cfg:
        return [window if t == "sliding_attention" else None for t in cfg["layer_types"]]
    if cfg["model_type"] == "gemma3_text":
        period = cfg.get("sliding_window_pattern", 6)
        return [None if (i + 1) % period == 0 else window for i in range(n)]
    return [window] * n


def attention(q, k, v, window, scale, spans=None):
    """q [T, H, d], k/v [T, KV, d]; causal, within `window` positions where given; and
    where `spans` [T] gives two positions one nonzero id, they see each other."""
    t, heads, _ = q.shape
    group = heads // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * scale
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    hidden = (j > i) | ((i - j >= window) if window else np.zeros_like(j > i))
    if spans is not None:
        hidden &= ~((spans[:, None] == spans[None, :]) & (spans[:, None] > 0))
    scores = np.where(hidden[None], -np.inf, scores)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v)


def moe(w, cfg, p, h):
    """Token by token: the router's softmax, the top-k experts (renormalized for Mixtral and
    where norm_topk_prob), each expert's SwiGLU MLP; Qwen2-MoE adds its shared expert times
    sigmoid(shared_expert_gate)."""
    mixtral = cfg["model_type"] == "mixtral"
    pre = p + ("block_sparse_moe." if mixtral else "mlp.")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    k = cfg["num_experts_per_tok"]
    out = np.zeros_like(h)
    for t, x in enumerate(h):
        logits = w[pre + "gate.weight"] @ x
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top = sorted(range(len(probs)), key=lambda e: -probs[e])[:k]
        weights = probs[top]
        if mixtral or cfg.get("norm_topk_prob"):
            weights = weights / weights.sum()
        for e, g in zip(top, weights):
            ex = f"{pre}experts.{e}."
            a = silu(w[ex + names[0] + ".weight"] @ x) * (w[ex + names[1] + ".weight"] @ x)
            out[t] += g * (w[ex + names[2] + ".weight"] @ a)
        if pre + "shared_expert.gate_proj.weight" in w:
            sh = pre + "shared_expert."
            a = silu(w[sh + "gate_proj.weight"] @ x) * (w[sh + "up_proj.weight"] @ x)
            gate = 1.0 / (1.0 + np.exp(-(w[pre + "shared_expert_gate.weight"] @ x)))
            out[t] += gate * (w[sh + "down_proj.weight"] @ a)
    return out


def forward(w: dict[str, np.ndarray], cfg: dict, ids, rows=None, spans=None) -> np.ndarray:
    """Logits [T, vocab] (float64) of `ids` from position 0; `rows` (position -> row)
    replace those positions' scaled embeddings (image features); positions of one span
    (position -> id) attend to each other both ways (an image's tokens in Gemma 3)."""
    w = {n: np.asarray(a, np.float64) for n, a in w.items()}
    kind = cfg["model_type"]
    gemma = kind == "gemma3_text"
    offset = 1.0 if gemma else 0.0
    t, eps = len(ids), cfg["rms_norm_eps"]
    dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or dim // heads
    scale = (cfg.get("query_pre_attn_scalar") or hd) ** -0.5
    base = cfg.get("rope_theta", 10000.0)
    global_freqs = rope_frequencies(cfg, hd, base)
    local_freqs = rope_frequencies(cfg, hd, cfg.get("rope_local_base_freq", base), scaled=False)
    positions = np.arange(t, dtype=np.float64)
    windows = layer_windows(cfg)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    if gemma:
        x = x * math.sqrt(dim)
    for pos, row in (rows or {}).items():
        x[pos] = row
    span_ids = np.zeros(t, np.int64)
    for pos, span in (spans or {}).items():
        span_ids[pos] = span
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps, offset)

        def proj(name, n, h=h, p=p):
            y = h @ w[f"{p}self_attn.{name}.weight"].T + w.get(f"{p}self_attn.{name}.bias", 0)
            return y.reshape(t, n, hd)

        q, k, v = proj("q_proj", heads), proj("k_proj", kv), proj("v_proj", kv)
        if p + "self_attn.q_norm.weight" in w:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps, offset)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps, offset)
        inv, att = local_freqs if (gemma and windows[i]) else global_freqs
        q, k = rope(q, positions, inv, att), rope(k, positions, inv, att)
        o = attention(q, k, v, windows[i], scale, span_ids).reshape(t, heads * hd)
        o = o @ w[p + "self_attn.o_proj.weight"].T
        if gemma:
            x = x + rms_norm(o, w[p + "post_attention_layernorm.weight"], eps, offset)
            h = rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps, offset)
        else:
            x = x + o
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps, offset)
        if kind in ("mixtral", "qwen2_moe", "qwen3_moe"):
            m = moe(w, cfg, p, h)
        else:
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            m = ((gelu_tanh(gate) if gemma else silu(gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        x = x + (rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps, offset)
                 if gemma else m)
    x = rms_norm(x, w["model.norm.weight"], eps, offset)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
