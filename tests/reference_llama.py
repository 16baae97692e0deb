"""An independent Llama forward pass in plain numpy, straight from a GGUF file's tensors.

It shares no code with poot's ops, compile or quant packages: weights are dequantized with
`gguf.quants.dequantize` and every layer is written out below, in float64. Tests compare
poot's model against `prefill_logits`.

RoPE and the GGUF Q/K layout. An HF Llama checkpoint rotates the pair (x[i], x[i + d/2]) of
each head (rotate_half). llama.cpp's converter permutes the rows of attn_q / attn_k within every
head: GGUF row 2i is HF row i and GGUF row 2i+1 is HF row i + d/2 (`reshape(heads, 2, d/2, ...)
.swapaxes(1, 2)`). So on GGUF weights, RoPE ("normal" mode, LLAMA_ROPE_TYPE_NORM) rotates
ADJACENT pairs (x[2i], x[2i+1]) of each head by the angle pos * base^(-2i/d):
    out[2i]   = x[2i] * cos - x[2i+1] * sin
    out[2i+1] = x[2i] * sin + x[2i+1] * cos
q and k are permuted the same way, so q.k (and the whole output) equals the HF model's. V and
attn_output are not permuted. `rope_adjacent_pairs` below is that rule;
test_reference_llama checks it against rotate_half on the un-permuted rows.

Checked once against llama.cpp (llama-cpp-python 0.3.36) on SmolLM2: run on a copy of the GGUF
with every tensor dequantized to F32 and an F32 KV cache, llama.cpp's logits match these to
4e-5 (max |logit| 27-40). With llama.cpp's default F16 KV cache the gap is ~1e-3 of max |logit|,
and on the Q4_1 file itself ~5% (llama.cpp quantizes activations to 8 bits for its dot products).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from gguf_file import PlainGGUFReader


@dataclass(frozen=True)
class LlamaConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_base: float
    norm_eps: float
    vocab: int


def read_config(reader: GGUFReader) -> LlamaConfig:
    def value(key: str):
        return reader.fields[key].contents()

    arch = value("general.architecture")
    if arch != "llama":
        raise ValueError(f"reference_llama reads architecture 'llama', not {arch!r}")
    hidden, heads = value("llama.embedding_length"), value("llama.attention.head_count")
    head_dim = hidden // heads
    # This reference rotates whole heads at the base frequency; refuse what it does not model.
    if "llama.rope.dimension_count" in reader.fields \
            and value("llama.rope.dimension_count") != head_dim:
        raise ValueError("reference_llama rotates the whole head; this file uses partial RoPE")
    if "llama.rope.scaling.type" in reader.fields \
            and value("llama.rope.scaling.type") not in ("none", ""):
        raise ValueError("reference_llama does not implement RoPE scaling")
    vocab = reader.get_tensor(_tensor_index(reader, "token_embd.weight")).shape[-1]
    return LlamaConfig(
        layers=value("llama.block_count"), hidden=hidden, heads=heads,
        kv_heads=value("llama.attention.head_count_kv"), head_dim=head_dim,
        rope_base=float(value("llama.rope.freq_base")) if "llama.rope.freq_base" in reader.fields
        else 10000.0,
        norm_eps=float(value("llama.attention.layer_norm_rms_epsilon")), vocab=int(vocab))


def _tensor_index(reader: GGUFReader, name: str) -> int:
    for i, tensor in enumerate(reader.tensors):
        if tensor.name == name:
            return i
    raise KeyError(name)


@functools.lru_cache(maxsize=1)
def load_weights(gguf_path: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Config and every tensor dequantized to float64, numpy shape [out, in] for matrices."""
    reader = PlainGGUFReader(gguf_path, "r")
    weights = {
        t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors
    }
    return read_config(reader), weights


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_adjacent_pairs(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """RoPE on GGUF-layout heads: x [T, heads, d], pairs (2i, 2i+1) rotate by pos*base^(-2i/d)."""
    d = x.shape[-1]
    inv_freq = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    angle = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [T, d/2]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def causal_gqa_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q [T, H, d], k/v [T, KV, d] -> [T, H, d]; query head h reads kv head h // (H / KV)."""
    t, heads, d = q.shape
    group = heads // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    future = np.triu(np.ones((t, t), dtype=bool), k=1)
    scores = np.where(future[None], -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", probs, v)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def prefill_logits(gguf_path: str | Path, token_ids) -> np.ndarray:
    """Logits [T, vocab] (float32) for every position of `token_ids`, from position 0."""
    cfg, w = load_weights(str(gguf_path))
    ids = np.asarray(token_ids, dtype=np.int64)
    positions = np.arange(len(ids))
    x = w["token_embd.weight"][ids]  # [T, hidden]
    for layer in range(cfg.layers):
        p = f"blk.{layer}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.norm_eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(len(ids), cfg.heads, cfg.head_dim)
        k = (h @ w[p + "attn_k.weight"].T).reshape(len(ids), cfg.kv_heads, cfg.head_dim)
        v = (h @ w[p + "attn_v.weight"].T).reshape(len(ids), cfg.kv_heads, cfg.head_dim)
        q = rope_adjacent_pairs(q, positions, cfg.rope_base)
        k = rope_adjacent_pairs(k, positions, cfg.rope_base)
        attn = causal_gqa_attention(q, k, v).reshape(len(ids), cfg.hidden)
        x = x + attn @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg.norm_eps)
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (silu(gate) * up) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], cfg.norm_eps)
    output = w.get("output.weight", w["token_embd.weight"])  # tied embeddings when absent
    return (x @ output.T).astype(np.float32)


def greedy_tokens(gguf_path: str | Path, token_ids, steps: int) -> list[int]:
    """`steps` greedy next tokens after `token_ids`, each from a full prefill (no KV cache)."""
    ids = list(token_ids)
    for _ in range(steps):
        ids.append(int(np.argmax(prefill_logits(gguf_path, ids)[-1])))
    return ids[len(token_ids):]
