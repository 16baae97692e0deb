"""An independent DeepSeek-V2/V3 forward pass in float64 numpy over HF-named tensors (per
expert, as the checkpoints store them) and a config.json dict in either transformers
spelling, written from the model's published definition. Shares no code with poot.

Attention is computed the plain way, per head, with each head's keys and values
up-projected from the latent (no absorption: poot's absorbed form must agree with it):

- q = q_b(rmsnorm(q_a(h))) (or q_proj(h) when q_lora_rank is null), per head [nope | rope];
- kv_a(h) = [c | k_pe]; k_nope, v per head from kv_b(rmsnorm(c)); k_pe one for all heads;
- RoPE on q_pe and k_pe only, each (x[2i], x[2i+1]) pair rotated as a complex number
  (DeepSeek's interleaved layout), YaRN frequencies, cos/sin times mscale(mscale) /
  mscale(mscale_all_dim); the softmax scale 1/sqrt(nope + rope) times (V3)
  mscale(mscale_all_dim)^2;
- FFN: a SwiGLU MLP in the first first_k_dense_replace layers, then MoE: the shared experts'
  MLP plus the routed experts. V3 routes by sigmoid scores, choosing with
  e_score_correction_bias added, within the topk_group groups of the best top-2 sums;
  V2 by softmax, groups ranked by their best score (group_limited_greedy) or not (greedy);
  weights: the chosen scores (renormalized in V3 when norm_topk_prob) times
  routed_scaling_factor.
"""
from __future__ import annotations

import math

import numpy as np
from reference_decoder import rms_norm, silu
from reference_gpt_oss import rope_settings, yarn


def mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def rope_parts(cfg: dict):
    """(inverse frequencies, cos/sin factor, softmax scale)."""
    rs = rope_settings(cfg)
    dr = cfg["qk_rope_head_dim"]
    inv, _ = yarn(cfg, dr)
    scale = (cfg["qk_nope_head_dim"] + dr) ** -0.5
    if rs.get("rope_type", rs.get("type", "default")) == "default":
        return inv, 1.0, scale
    f = rs["factor"]
    att = mscale(f, rs.get("mscale", 1.0)) / mscale(f, rs.get("mscale_all_dim", 1.0)) \
        if rs.get("mscale") and rs.get("mscale_all_dim") else mscale(f, 1.0)
    if cfg["model_type"] == "deepseek_v3" and rs.get("mscale_all_dim"):
        scale *= mscale(f, rs["mscale_all_dim"]) ** 2
    return inv, att, scale


def rotate_pairs(x, inv, att):
    """x [T, n, d]: pair (2i, 2i+1) at position p turned by p * inv[i], times att."""
    z = x[..., 0::2] + 1j * x[..., 1::2]
    turn = np.exp(1j * np.arange(len(x))[:, None, None] * inv[None, None, :]) * att
    z = z * turn
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def attention(w, p, h, cfg, inv, att, scale):
    t, heads, eps = len(h), cfg["num_attention_heads"], cfg["rms_norm_eps"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    r = cfg["kv_lora_rank"]
    a = p + "self_attn."
    if cfg.get("q_lora_rank"):
        q = rms_norm(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], eps) \
            @ w[a + "q_b_proj.weight"].T
    else:
        q = h @ w[a + "q_proj.weight"].T
    q = q.reshape(t, heads, dn + dr)
    kv = h @ w[a + "kv_a_proj_with_mqa.weight"].T
    up = rms_norm(kv[:, :r], w[a + "kv_a_layernorm.weight"], eps) @ w[a + "kv_b_proj.weight"].T
    up = up.reshape(t, heads, dn + dv)
    k_pe = rotate_pairs(kv[:, None, r:], inv, att)                    # [T, 1, dr]
    q_pe = rotate_pairs(q[..., dn:], inv, att)
    out = np.zeros((t, heads, dv))
    for hd in range(heads):
        keys = np.concatenate([up[:, hd, :dn], k_pe[:, 0]], -1)
        query = np.concatenate([q[:, hd, :dn], q_pe[:, hd]], -1)
        s = query @ keys.T * scale + np.triu(np.full((t, t), -np.inf), 1)
        e = np.exp(s - s.max(-1, keepdims=True))
        out[:, hd] = (e / e.sum(-1, keepdims=True)) @ up[:, hd, dn:]
    return out.reshape(t, heads * dv) @ w[a + "o_proj.weight"].T


def mlp(w, p, x):
    return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) \
        @ w[p + "down_proj.weight"].T


def route(w, p, x, cfg):
    """(chosen experts, weights) of one token x."""
    e, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    logits = w[p + "gate.weight"] @ x
    v3 = cfg["model_type"] == "deepseek_v3"
    if v3:
        scores = 1 / (1 + np.exp(-logits))
        choice = scores + w[p + "gate.e_score_correction_bias"]
    else:
        scores = np.exp(logits - logits.max())
        scores /= scores.sum()
        choice = scores.copy()
    method = cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
    if method != "greedy":
        groups = choice.reshape(cfg["n_group"], -1)
        rank = np.sort(groups, -1)[:, -2:].sum(-1) if v3 else groups.max(-1)
        kept = np.argsort(-rank, kind="stable")[:cfg["topk_group"]]
        mask = np.zeros_like(groups)
        mask[kept] = 1
        choice = np.where(mask.reshape(e) > 0, choice, 0.0)
    chosen = np.argsort(-choice, kind="stable")[:k]
    weights = scores[chosen]
    if v3 and cfg.get("norm_topk_prob", True):
        weights = weights / (weights.sum() + 1e-20)
    return chosen, weights * cfg.get("routed_scaling_factor", 1.0)


def moe(w, p, h, cfg):
    out = mlp(w, p + "shared_experts.", h)
    for row, x in enumerate(h):
        for j, weight in zip(*route(w, p, x, cfg)):
            out[row] += weight * mlp(w, f"{p}experts.{j}.", x[None])[0]
    return out


def forward(w: dict[str, np.ndarray], cfg: dict, ids) -> np.ndarray:
    """Logits [T, vocab] (float64) of `ids` from position 0."""
    w = {n: np.asarray(a, np.float64) for n, a in w.items()}
    eps = cfg["rms_norm_eps"]
    inv, att, scale = rope_parts(cfg)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        x = x + attention(w, p, h, cfg, inv, att, scale)
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        dense = i < cfg.get("first_k_dense_replace", 0)
        x = x + (mlp(w, p + "mlp.", h) if dense else moe(w, p + "mlp.", h, cfg))
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return x @ head.T
