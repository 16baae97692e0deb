"""The connectors from the tower's patches to the language model's rows, traced through
poot.ops.

Gemma 3's multimodal projector: the tower's patches [N, hidden] average-pooled in square
blocks to `mm_tokens` rows, RMSNorm'd (its weight stored as w of a (1 + w) norm, added once
in poot.models.vision.weights), and projected to the language model's width by
`mm_input_projection_weight` [hidden, text_dim] (x @ W, not W^T).

Idefics3's connector: a pixel shuffle (space to depth: each s x s block of patches becomes
one row of s*s*hidden values) and `modality_projection.proj` [text_dim, s*s*hidden] without
bias (x @ W^T)."""
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


def pixel_shuffle(x, per_side: int, scale: int):
    """[N, D] patches in row-major (R, C) order -> [N/s^2, s*s*D]: block (i, j) row-major,
    its values in (r, c, d) order, patch (i*s + r, j*s + c)'s channel d."""
    d, b = x.shape[-1], per_side // scale
    y = ops.reshape(x, (b, scale, b, scale * d))          # i, r, j, (c d)
    y = ops.transpose(y, (0, 2, 1, 3))                    # i, j, r, (c d)
    return ops.reshape(y, (b * b, scale * scale * d))


def idefics3_connector(config, declare, x):
    """[N, hidden] -> [N/s^2, text_dim]."""
    c = config
    y = pixel_shuffle(x, c.patches_per_side, c.scale)
    return ops.linear(y, declare("connector.modality_projection.proj.weight"))


#: each VisionConfig.connector's graph
CONNECTORS = {"gemma3": gemma3_projector, "idefics3": idefics3_connector}
