"""An independent SigLIP vision tower, Gemma 3 multimodal projector and Idefics3 connector
in float64 numpy, straight from HF-named tensors (the "vision_tower.vision_model." /
"model.vision_model.", "multi_modal_projector." and "model.connector." prefixes dropped)
and the vision config.json dict.

Shares no code with poot. Written from the architecture: the patch embedding is the
convolution itself (an einsum over each patch's window), position embeddings added per patch,
pre-norm encoder layers with LayerNorm(bias), softmax(q k^T / sqrt(d)) v over all patches,
GELU (tanh) MLP, then the post LayerNorm; the projector averages k x k blocks of the patch
grid, applies RMSNorm with (1 + w) and multiplies by mm_input_projection_weight. Idefics3's
connector gathers each s x s block of the patch grid into one vector (its patches row by
row, each patch's channels whole) and multiplies by modality_projection.proj.weight^T.
"""
from __future__ import annotations

import math

import numpy as np


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def tower(w: dict, cfg: dict, pixels: np.ndarray) -> np.ndarray:
    """The last hidden state [patches, hidden] of pixels [C, H, W]."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    p, eps, heads = cfg["patch_size"], cfg.get("layer_norm_eps", 1e-6), cfg["num_attention_heads"]
    c, h, wd = pixels.shape
    grid = np.asarray(pixels, np.float64).reshape(c, h // p, p, wd // p, p)
    kernel = w["embeddings.patch_embedding.weight"]                     # [D, C, p, p]
    x = np.einsum("crysx,ocyx->rso", grid, kernel).reshape((h // p) * (wd // p), -1)
    x = x + w["embeddings.patch_embedding.bias"] + w["embeddings.position_embedding.weight"]
    n, d = x.shape
    hd = d // heads
    for i in range(cfg["num_hidden_layers"]):
        pre = f"encoder.layers.{i}."

        def lin(y, name, pre=pre):
            return y @ w[f"{pre}{name}.weight"].T + w[f"{pre}{name}.bias"]

        y = layer_norm(x, w[pre + "layer_norm1.weight"], w[pre + "layer_norm1.bias"], eps)
        q, k, v = (lin(y, f"self_attn.{s}_proj").reshape(n, heads, hd) for s in "qkv")
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, v).reshape(n, d)
        x = x + lin(o, "self_attn.out_proj")
        y = layer_norm(x, w[pre + "layer_norm2.weight"], w[pre + "layer_norm2.bias"], eps)
        x = x + lin(gelu_tanh(lin(y, "mlp.fc1")), "mlp.fc2")
    return layer_norm(x, w["post_layernorm.weight"], w["post_layernorm.bias"], eps)


def projector(w: dict, cfg: dict, mm_tokens: int, x: np.ndarray) -> np.ndarray:
    """Gemma 3's projector: [patches, hidden] -> [mm_tokens, text hidden]."""
    per_side = cfg["image_size"] // cfg["patch_size"]
    side = math.isqrt(mm_tokens)
    k = per_side // side
    d = x.shape[-1]
    pooled = x.reshape(side, k, side, k, d).mean(axis=(1, 3)).reshape(side * side, d)
    normed = pooled / np.sqrt((pooled ** 2).mean(-1, keepdims=True) + cfg.get(
        "layer_norm_eps", 1e-6)) * (1.0 + np.asarray(w["mm_soft_emb_norm.weight"], np.float64))
    return normed @ np.asarray(w["mm_input_projection_weight"], np.float64)


def idefics3_connector(w: dict, cfg: dict, scale: int, x: np.ndarray) -> np.ndarray:
    """Idefics3's connector: [patches, hidden] -> [patches / scale^2, text hidden]."""
    n = cfg["image_size"] // cfg["patch_size"]
    grid = np.asarray(x, np.float64).reshape(n, n, -1)
    blocks = [np.concatenate([grid[i * scale + r, j * scale + c]
                              for r in range(scale) for c in range(scale)])
              for i in range(n // scale) for j in range(n // scale)]
    return np.stack(blocks) @ np.asarray(w["modality_projection.proj.weight"], np.float64).T
