"""An independent gpt-oss forward pass in float64 numpy over HF-named tensors (the expert
stacks as transformers stores them dense: gate_up_proj [E, H, 2I] with gate and up in
alternate columns, down_proj [E, I, H]) and a config.json dict in either transformers
spelling, written from the model's published definition. Shares no code with poot.

- attention: q/k/v/o biases, RoPE (rotate-half) with YaRN, GQA; each head's learned sink
  logit joins its softmax's denominator and weights no value; layers per layer_types
  attend within sliding_window or to every earlier position;
- experts: router = linear with bias, top-k, softmax over the k chosen logits; each
  expert computes gate/up (+ bias), clamps gate above and up on both sides at the limit,
  (up + 1) * gate * sigmoid(alpha * gate), then down (+ bias).
"""
from __future__ import annotations

import math

import numpy as np
from reference_decoder import rms_norm


def rope_settings(cfg: dict) -> dict:
    rs = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    if "rope_theta" in cfg:
        rs.setdefault("rope_theta", cfg["rope_theta"])
    return rs


def yarn(cfg: dict, dim: int):
    """(inverse frequencies [dim/2], cos/sin factor) of YaRN as the config sets it."""
    rs = rope_settings(cfg)
    base = rs["rope_theta"]
    inv = np.array([base ** (-2 * i / dim) for i in range(dim // 2)])
    if rs.get("rope_type", rs.get("type", "default")) == "default":
        return inv, 1.0
    factor, old = rs["factor"], rs["original_max_position_embeddings"]

    def dim_for(rotations):     # the dim index whose wavelength turns `rotations` times
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_for(rs.get("beta_fast", 32.0)), dim_for(rs.get("beta_slow", 1.0))
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i, f in enumerate(inv):
        interpolated = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(f / factor * interpolated + f * (1 - interpolated))
    att = rs.get("attention_factor") or 0.1 * math.log(factor) + 1.0
    return np.array(out), att


def rotate(x, inv, att):
    """Rotate-half RoPE of x [T, H, d] at positions 0..T-1."""
    d = x.shape[-1]
    ang = np.arange(len(x))[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :] * att, np.sin(ang)[:, None, :] * att
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def sink_attention(q, k, v, sinks, window):
    """q [T, Hq, d], k/v [T, Hkv, d], sinks [Hq] -> [T, Hq, d]; `window`: a query at i sees
    keys j with i - window < j <= i (None: all j <= i)."""
    t, hq, d = q.shape
    group = hq // k.shape[1]
    out = np.zeros_like(q)
    for h in range(hq):
        kh, vh = k[:, h // group], v[:, h // group]
        for i in range(t):
            first = 0 if window is None else max(0, i - window + 1)
            s = kh[first: i + 1] @ q[i, h] / math.sqrt(d)
            m = max(s.max(), sinks[h])
            e = np.exp(s - m)
            out[i, h] = e @ vh[first: i + 1] / (e.sum() + math.exp(sinks[h] - m))
    return out


def experts(h, w: dict, p: str, k: int, alpha: float, limit: float):
    logits = h @ w[p + "router.weight"].T + w[p + "router.bias"]
    out = np.zeros_like(h)
    for row, x in enumerate(h):
        chosen = np.argsort(-logits[row], kind="stable")[:k]
        weights = np.exp(logits[row, chosen] - logits[row, chosen].max())
        weights /= weights.sum()
        for e, weight in zip(chosen, weights):
            gu = x @ w[p + "experts.gate_up_proj"][e] + w[p + "experts.gate_up_proj_bias"][e]
            gate, up = np.minimum(gu[0::2], limit), np.clip(gu[1::2], -limit, limit)
            act = (up + 1) * gate / (1 + np.exp(-alpha * gate))
            y = act @ w[p + "experts.down_proj"][e] + w[p + "experts.down_proj_bias"][e]
            out[row] += weight * y
    return out


def layer_types(cfg: dict) -> list[str]:
    return cfg.get("layer_types") or [
        "sliding_attention" if i % 2 == 0 else "full_attention"
        for i in range(cfg["num_hidden_layers"])]


def forward(w: dict[str, np.ndarray], cfg: dict, ids, limit: float | None = None,
            sinks: bool = True) -> np.ndarray:
    """Logits [T, vocab] (float64) of `ids` from position 0; `limit` overrides the clamp and
    `sinks=False` drops them (for tests that show both matter)."""
    w = {n: np.asarray(a, np.float64) for n, a in w.items()}
    t, eps = len(ids), cfg["rms_norm_eps"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inv, att = yarn(cfg, hd)
    alpha = cfg.get("swiglu_alpha", 1.702)
    limit = cfg.get("swiglu_limit", 7.0) if limit is None else limit
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i, kind in enumerate(layer_types(cfg)):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name, n):
            a = p + f"self_attn.{name}_proj."
            return (h @ w[a + "weight"].T + w[a + "bias"]).reshape(t, n, hd)

        q, k, v = proj("q", heads), proj("k", kv), proj("v", kv)
        q, k = rotate(q, inv, att), rotate(k, inv, att)
        window = cfg["sliding_window"] if kind == "sliding_attention" else None
        sink = w[p + "self_attn.sinks"] if sinks else np.full(heads, -np.inf)
        o = sink_attention(q, k, v, sink, window).reshape(t, heads * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T + w[p + "self_attn.o_proj.bias"]
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + experts(h, w, p + "mlp.", cfg["num_experts_per_tok"], alpha, limit)
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T
