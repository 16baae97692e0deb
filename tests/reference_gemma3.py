"""An independent Gemma 3 forward pass in plain numpy, straight from a GGUF file's tensors.

Shares no code with poot: weights are dequantized with `gguf.quants.dequantize` and the block
is written out below in float64 (the tied 262144-row head multiplies in float32 to keep the
memory at one copy of the table). What it models, per the Gemma 3 architecture:

- embeddings scaled by sqrt(hidden);
- per layer: x += post_attention_norm(attn(attn_norm(x))), then
  x += post_ffw_norm(mlp(ffn_norm(x))); RMSNorm multiplies by the stored weight, which
  llama.cpp's converter stored as (1 + w) already;
- attention: q/k get a per-head RMSNorm (attn_q_norm / attn_k_norm), then rotate-half RoPE
  (GGUF keeps HF's row order for Gemma), 4 query heads on 1 KV head, scale 1/sqrt(head_dim);
  every sixth layer (5, 11, 17) is global with RoPE base `freq_base`, the others see only the
  last `window` positions (key j visible to query i iff i - window < j <= i) and use base 10000;
- mlp: GeGLU, gelu_tanh(gate) * up.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from gguf.quants import dequantize
from gguf_file import PlainGGUFReader

LOCAL_BASE = 10000.0  # RoPE base of the sliding layers (Gemma 3's rope_local_base_freq)
PATTERN = 6           # every sixth layer is global


@functools.lru_cache(maxsize=1)
def load(gguf_path: str) -> tuple[dict, dict[str, np.ndarray]]:
    reader = PlainGGUFReader(gguf_path, "r")

    def value(key):
        return reader.fields[key].contents()

    assert value("general.architecture") == "gemma3"
    cfg = {k: value(f"gemma3.{k}") for k in (
        "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
        "attention.key_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
        "attention.sliding_window")}
    weights = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type)
        weights[t.name] = w.astype(np.float32 if t.name == "token_embd.weight" else np.float64,
                                   copy=False)
    return cfg, weights


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_half(x, positions, base):
    """x [T, H, d]: pairs (i, i + d/2) rotate by pos * base^(-2i/d)."""
    d = x.shape[-1]
    ang = positions[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(ang)[:, None, :].astype(x.dtype), np.sin(ang)[:, None, :].astype(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def gelu_tanh(x):
    c = x.dtype.type(np.sqrt(2.0 / np.pi))
    return x.dtype.type(0.5) * x * (1 + np.tanh(c * (x + x.dtype.type(0.044715) * x ** 3)))


def attention(q, k, v, window):
    """q [T, H, d], k/v [T, 1, d]; causal, and within `window` positions when given."""
    t, _, d = q.shape
    scores = np.einsum("qhd,kd->hqk", q, k[:, 0]) * q.dtype.type(d ** -0.5)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    hidden = (j > i) | ((i - j >= window) if window else False)
    scores = np.where(hidden[None], -np.inf, scores)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,kd->qhd", p, v[:, 0])


def prefill_logits(gguf_path: str | Path, token_ids, dtype=np.float64) -> np.ndarray:
    """Logits [T, vocab] (float32) of `token_ids` from position 0, computed in `dtype`."""
    cfg, w64 = load(str(gguf_path))
    w = {k: v if k == "token_embd.weight" else v.astype(dtype, copy=False)
         for k, v in w64.items()}
    ids = np.asarray(token_ids, np.int64)
    t, dim = len(ids), cfg["embedding_length"]
    heads, kv, hd = (cfg["attention.head_count"], cfg["attention.head_count_kv"],
                     cfg["attention.key_length"])
    eps = cfg["attention.layer_norm_rms_epsilon"]
    pos = np.arange(t, dtype=np.float64)
    x = w["token_embd.weight"][ids].astype(dtype) * dtype(np.sqrt(dim))
    for layer in range(cfg["block_count"]):
        p = f"blk.{layer}."
        is_global = (layer + 1) % PATTERN == 0
        base = cfg["rope.freq_base"] if is_global else LOCAL_BASE
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(t, heads, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(t, kv, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(t, kv, hd)
        q = rope_half(rms_norm(q, w[p + "attn_q_norm.weight"], eps), pos, base)
        k = rope_half(rms_norm(k, w[p + "attn_k_norm.weight"], eps), pos, base)
        o = attention(q, k, v, None if is_global else cfg["attention.sliding_window"])
        o = o.reshape(t, heads * hd) @ w[p + "attn_output.weight"].T
        x = x + rms_norm(o, w[p + "post_attention_norm.weight"], eps)
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        m = gelu_tanh(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        m = m @ w[p + "ffn_down.weight"].T
        x = x + rms_norm(m, w[p + "post_ffw_norm.weight"], eps)
    x = rms_norm(x, w["output_norm.weight"], eps)
    return x.astype(np.float32) @ w["token_embd.weight"].T
