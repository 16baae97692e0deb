"""Gemma 3's multimodal projector, traced through poot.ops: the tower's patches [N, hidden]
average-pooled in square blocks to `mm_tokens` rows, RMSNorm'd (its weight stored as w of a
(1 + w) norm, added once in poot.models.vision.weights), and projected to the language
model's width by `mm_input_projection_weight` [hidden, text_dim] (x @ W, not W^T)."""
from __future__ import annotations

from poot import ops
from poot.models.vision.siglip import f32


def average_pool(x, per_side: int, kernel: int):
    """[N, D] patches in row-major (R, C) order -> [(N/k^2), D] block means, row-major.
    Two sums over reshapes: first the k columns of each block, then its k rows."""
    d, s = x.shape[-1], per_side // kernel
    y = ops.reduce_sum(ops.reshape(x, (per_side * s, kernel, d)), 1)      # [(r C), D]
    y = ops.reduce_sum(ops.reshape(y, (s, kernel, s, d)), 1)              # [R, C, D]
    return ops.mul(ops.reshape(y, (s * s, d)), 1.0 / (kernel * kernel))


def gemma3_projector(config, declare, x):
    """[N, hidden] -> [mm_tokens, text_dim]."""
    c = config
    y = average_pool(x, c.patches_per_side, c.pool)
    y = ops.rms_norm(y, declare("projector.mm_soft_emb_norm.weight"), c.eps)
    return ops.matmul(y, f32(declare("projector.mm_input_projection_weight")))
