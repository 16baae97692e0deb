"""The SigLIP vision tower traced through poot.ops.

One image [C, H, W] (F32, normalized) comes in through slot `vision.pixels`, a role this
module owns and declares through the `poot_slot_roles` hook. The patch embedding (a
convolution whose stride is its kernel) is a reshape of the pixels into patches and one
contraction with the kernel read as a [hidden, C*p*p] matrix; then the learned position
embeddings, and per layer: LayerNorm (with bias), non-causal multi-head attention (q, k, v
and output projections with biases), residual, LayerNorm, fc1, GELU (tanh), fc2, residual;
then the post LayerNorm. Tensor names are HF's under "vision." (poot.models.vision.weights).
"""
from __future__ import annotations

from poot import ops
from poot.dtypes import DType
from poot.ir.types import SlotKind
from poot.plugin import hookimpl, manager

OWNER = "poot.models.vision.siglip"
PIXELS = "vision.pixels"


def roles() -> list[SlotKind]:
    return [SlotKind(PIXELS, DType.F32, None, None, owner=OWNER)]


@hookimpl
def poot_slot_roles():
    return roles()


def pixels_slot(config):
    """The slot of one image [C, H, W]."""
    manager()  # loads the plugins, this one included, which declares the role
    s = config.image_size
    return ops.slot(SlotKind.get(PIXELS), (config.channels, s, s), PIXELS)


def declarer(weights):
    """`declare(name)`: the const of the WeightSource's tensor `name`, one per name in the
    graph being traced."""
    seen: dict = {}

    def declare(name):
        if name not in seen:
            s = weights.spec(name)
            seen[name] = ops.const(s.type.shape, s.type.dtype, s.ref)
        return seen[name]
    return declare


def f32(x):
    return x if x.dtype is DType.F32 else ops.cast(x, DType.F32)


def layer_norm(x, weight, bias, eps: float):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis."""
    inv = 1.0 / x.shape[-1]
    xc = ops.sub(x, ops.mul(ops.reduce_sum(x, -1, keepdim=True), inv))
    var = ops.mul(ops.reduce_sum(ops.mul(xc, xc), -1, keepdim=True), inv)
    return ops.add(ops.mul(ops.div(xc, ops.sqrt(ops.add(var, eps))), weight), bias)


def patches(pixels, channels: int, per_side: int, patch: int):
    """[C, H, W] -> [N, C*p*p]: patch (R, C') row-major, its values in (c, ky, kx) order,
    the order of a Conv2d kernel [hidden, C, p, p] read as a matrix."""
    c, n, p = channels, per_side, patch
    x = ops.reshape(pixels, (c * n, p, n, p))              # (c R), ky, C', kx
    x = ops.transpose(x, (0, 2, 1, 3))                     # (c R), C', ky, kx
    x = ops.reshape(x, (c, n * n, p * p))
    x = ops.transpose(x, (1, 0, 2))                        # N, c, (ky kx)
    return ops.reshape(x, (n * n, c * p * p))


def tower(config, declare, pixels):
    """The last hidden state [N, hidden] of one image; `declare(name)` binds a weight."""
    c = config
    n, d, hd = c.patches_per_side ** 2, c.hidden, c.head_dim

    def linear(x, name):
        return ops.linear(x, declare(name + ".weight"), f32(declare(name + ".bias")))

    def norm(x, name):
        return layer_norm(x, declare(name + ".weight"), declare(name + ".bias"), c.eps)

    kernel = ops.reshape(declare("vision.embeddings.patch_embedding.weight"),
                         (d, c.channels * c.patch * c.patch))
    x = ops.linear(patches(pixels, c.channels, c.patches_per_side, c.patch), kernel,
                   f32(declare("vision.embeddings.patch_embedding.bias")))
    x = ops.add(x, f32(declare("vision.embeddings.position_embedding.weight")))
    # every patch sees every patch: an all-visible additive mask
    mask = ops.select(ops.ge(ops.iota((1, n), 1), 0), 0.0, float("-inf"), dtype=DType.F32)

    def heads(y):
        return ops.transpose(ops.reshape(y, (n, c.heads, hd)), (1, 0, 2))   # [H, N, hd]

    for i in range(c.layers):
        p = f"vision.encoder.layers.{i}."
        h = norm(x, p + "layer_norm1")
        q, k, v = (heads(linear(h, f"{p}self_attn.{w}_proj")) for w in "qkv")
        o = ops.attention_masked(q, k, v, mask, hd ** -0.5)                 # [H, N, hd]
        o = ops.reshape(ops.transpose(o, (1, 0, 2)), (n, d))
        x = ops.add(x, linear(o, p + "self_attn.out_proj"))
        h = norm(x, p + "layer_norm2")
        x = ops.add(x, linear(ops.gelu_tanh(linear(h, p + "mlp.fc1")), p + "mlp.fc2"))
    return norm(x, "vision.post_layernorm")
