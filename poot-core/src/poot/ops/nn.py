"""The compositions the spec names, recorded as the primitive chains it shows.

compile finds these chains again (RMSNorm and softmax as FusedRow regions,
rotate-half as Rope, the masked softmax between two matmuls as Attention).
"""
from __future__ import annotations

import math

from poot.dtypes import DType
from poot.ops.core import (
    add,
    cast,
    concat,
    div,
    exp,
    gather,
    ge,
    iota,
    matmul,
    mul,
    neg,
    reduce_max,
    reduce_sum,
    reshape,
    select,
    slice_axis,
    sqrt,
    sub,
    swap_last,
    transpose,
)
from poot.tracer import Tensor

NEG_INF = float("-inf")


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The seven eqns: Mul, Reduce Sum, Mul 1/D, Add eps, Sqrt, Div, Mul weight."""
    d = x.shape[-1]
    ss = reduce_sum(mul(x, x), -1, keepdim=True)
    den = sqrt(add(mul(ss, 1.0 / d), eps))
    return mul(div(x, den), weight)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """The five eqns of the two-pass safe softmax."""
    m = reduce_max(x, axis, keepdim=True)
    ex = exp(sub(x, m))
    return div(ex, reduce_sum(ex, axis, keepdim=True))


def silu(x: Tensor) -> Tensor:
    return div(x, add(exp(neg(x)), 1.0))


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return mul(silu(gate), up)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    from poot.ops.core import tanh

    inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), math.sqrt(2.0 / math.pi))
    return mul(mul(x, 0.5), add(tanh(inner), 1.0))


def geglu_tanh(gate: Tensor, up: Tensor) -> Tensor:
    return mul(gelu_tanh(gate), up)


def gelu_erf(x: Tensor) -> Tensor:
    from poot.ops.core import erf

    return mul(mul(x, 0.5), add(erf(mul(x, 1.0 / math.sqrt(2.0))), 1.0))


def embedding(table, ids: Tensor) -> Tensor:
    """Rows `ids` of a table: a Tensor (widened to F32 if stored narrower) or a PackedTensor."""
    from poot.ops.quant import PackedTensor

    if isinstance(table, PackedTensor):
        return gather(table.dequant(), ids, 0)
    rows = gather(table, ids, 0)
    return rows if rows.dtype is DType.F32 else cast(rows, DType.F32)


def linear(x: Tensor, weight, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ W^T for a checkpoint weight in [N, K] order.

    `weight` is a Tensor (f32, or bf16/f16 widened by a Cast) or a PackedTensor
    (PackedDequant feeding the MatMul); compile turns either into one contraction.
    """
    from poot.ops.quant import PackedTensor

    if isinstance(weight, PackedTensor):
        w = weight.dequant()
    else:
        w = cast(weight, DType.F32) if weight.dtype is not x.dtype else weight
    lead = x.shape[:-1]
    x2 = reshape(x, (-1, x.shape[-1])) if x.ndim != 2 else x
    y = matmul(x2, transpose(w, (1, 0)))
    y = reshape(y, lead + (y.shape[-1],)) if x.ndim != 2 else y
    return add(y, bias) if bias is not None else y


def rope_tables(positions: int, rot: int, base: float = 10000.0, scale: float = 1.0):
    """Host-side cos/sin tables [positions, rot/2] (numpy, f32) for const binders."""
    import numpy as np

    inv = base ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = np.outer(np.arange(positions, dtype=np.float64) / scale, inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope_partial(x: Tensor, cos_table: Tensor, sin_table: Tensor, positions: Tensor,
                 rot: int | None = None, tokens_first: bool = False) -> Tensor:
    """Rotate-half RoPE on the first `rot` features of x.

    cos/sin rows are gathered from const tables [P, rot/2] by `positions`. With
    x [..., H, T, D] (heads first) positions is [T]; with x [..., T, H, D]
    (`tokens_first`) positions is [..., T] and the rows broadcast over heads.
    """
    d = x.shape[-1]
    rot = d if rot is None else rot
    h = rot // 2
    cos = gather(cos_table, positions, 0)
    sin = gather(sin_table, positions, 0)
    if tokens_first:
        cos = reshape(cos, positions.shape + (1, h))
        sin = reshape(sin, positions.shape + (1, h))
    x1 = slice_axis(x, -1, 0, h)
    x2 = slice_axis(x, -1, h, rot)
    parts = [sub(mul(x1, cos), mul(x2, sin)), add(mul(x1, sin), mul(x2, cos))]
    if rot < d:
        parts.append(slice_axis(x, -1, rot, d))
    return concat(parts, -1)


def positions(pos: Tensor, t: int) -> Tensor:
    """Query positions pos + [0, t): I32 [t] for a Pos slot [1], [B, t] for pos [B, 1]."""
    if pos.ndim == 2:
        return add(iota((1, t), 1), pos)
    return add(iota((t,), 0), reshape(pos, (1,)) if pos.shape != (1,) else pos)


def causal_mask(pos: Tensor, t: int, s: int, window: int | None = None,
                dtype: DType = DType.F32) -> Tensor:
    """Additive mask built in-graph from Pos and Iota: key j is visible to query i
    iff j <= pos + i (and j > pos + i - window for a sliding window).
    [T, S] for a Pos slot [1]; [B, T, S] for per-sequence positions [B, 1]."""
    lead = pos.shape[:1] if pos.ndim == 2 else ()
    qpos = reshape(positions(pos, t), lead + (t, 1))
    kpos = iota(tuple(1 for _ in lead) + (1, s), len(lead) + 1)
    visible = ge(qpos, kpos)
    if window is not None:
        visible = mul(visible, ge(kpos, sub(qpos, window - 1)))
    return select(visible, 0.0, NEG_INF, dtype=dtype)


def ring_positions(pos: Tensor, ring: int) -> Tensor:
    """The position each slot of a ring cache holds before a step at `pos` (Pos [1]): the
    latest p < pos with p = slot (mod ring), negative where the slot was never written.
    I32 [ring]: p = s + ring * ((pos + ring - 1 - s) / ring) - ring."""
    s = iota((ring,), 0)
    laps = div(sub(add(pos, ring - 1), s), ring)     # non-negative operands: floor division
    return sub(add(s, mul(laps, ring)), ring)


def ring_mask(pos: Tensor, t: int, ring: int, window: int, dtype: DType = DType.F32) -> Tensor:
    """Additive mask [T, ring + T] of a sliding-window step over a ring cache as it was
    (ring slots) followed by the step's own T keys: key at position j is visible to query
    i iff 0 <= j <= pos + i and j > pos + i - window."""
    kpos = reshape(concat([ring_positions(pos, ring), positions(pos, t)], 0), (1, ring + t))
    qpos = reshape(positions(pos, t), (t, 1))
    visible = mul(mul(ge(qpos, kpos), ge(kpos, sub(qpos, window - 1))), ge(kpos, 0))
    return select(visible, 0.0, NEG_INF, dtype=dtype)


def ring_slots(pos: Tensor, t: int, ring: int, end: Tensor) -> Tensor:
    """Ring slot of each of a step's T new keys, (pos + i) mod ring, or -1 (no write) for
    padding (positions from `end`, a Pos [1]: one past the step's last real token) and for
    keys a later key of the same step overwrites (T > ring). I32 [T]."""
    p = positions(pos, t)
    keep = ge(sub(end, 1), p)
    if t > ring:
        keep = mul(keep, ge(iota((t,), 0), t - ring))
    return select(keep, sub(p, mul(div(p, ring), ring)), -1)


def attention_masked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor,
                     scale: float | None = None, sinks: Tensor | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v with GQA: q [..., Hq, T, D], k/v [..., Hkv, S, D];
    `sinks` [Hq]: a logit per head in each softmax's denominator (gpt-oss).

    Records the primitive chain of `poot.ir.ops.attention_chain` (the Attention
    composite's own definition), so compile can find it and the two agree.
    """
    from poot.ir.ops import attention_chain
    from poot.tracer import builder

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return Tensor(attention_chain(builder(), q.ref, k.ref, v.ref, mask.ref, scale,
                                  None if sinks is None else sinks.ref))


def moe_route(logits: Tensor, k: int):
    """Top-k experts per row and their softmax weights: (ids [T, k] I32, weights [T, k])."""
    from poot.ops.core import argtopk

    t, e = logits.shape
    ids = argtopk(logits, k)
    flat = reshape(logits, (t * e,))
    rows = mul(iota((t, 1), 0), e)
    picked = gather(flat, add(ids, rows), 0)          # per-row gather via the flat index
    return ids, softmax(picked, -1)


__all__ = ["rms_norm", "softmax", "silu", "swiglu", "gelu_erf", "embedding", "linear",
           "gelu_tanh", "geglu_tanh", "ring_positions", "ring_mask", "ring_slots",
           "rope_tables", "rope_partial", "positions", "causal_mask", "attention_masked",
           "moe_route", "swap_last", "matmul"]
