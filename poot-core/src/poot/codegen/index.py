"""Index arithmetic for lowerings: folded I32 helpers, comparisons, shapes and launches.

The helpers fold constants (`i * 1`, `0 + i`, `6 // 2`) so printed kernels stay
readable; they never change meaning. Comparisons return I32 indicators (the IR
has Ge only, so the others are written with it).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from poot.codegen.expr import Bin, Bitcast, Cast, Const, Expr, Sel, Var, ge, i32
from poot.codegen.program import global_id, group_id, local_id
from poot.dtypes import DType
from poot.ir.ops.elementwise import BinaryOp

I32, F32 = DType.I32, DType.F32
MAX_GRID_X = 65535  # the smallest per-dimension grid limit among the backends (WebGPU)


def _c(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Const) and e.dtype is I32 else None


def add(a, b) -> Expr:
    a, b = i32(a), i32(b)
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return i32(ca + cb)
    if ca == 0:
        return b
    if cb == 0:
        return a
    return a + b


def sub(a, b) -> Expr:
    a, b = i32(a), i32(b)
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return i32(ca - cb)
    return a if cb == 0 else a - b


def mul(a, b) -> Expr:
    a, b = i32(a), i32(b)
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return i32(ca * cb)
    if ca == 0 or cb == 0:
        return i32(0)
    if ca == 1:
        return b
    if cb == 1:
        return a
    return a * b


def _pow2(c: int | None) -> int | None:
    return c.bit_length() - 1 if c is not None and c > 0 and c & (c - 1) == 0 else None


def div(a, b) -> Expr:
    """Integer division of non-negative indices (by a power of two: a shift)."""
    a, b = i32(a), i32(b)
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return i32(ca // cb)
    if cb == 1:
        return a
    if _pow2(cb) is not None:
        return Bin(BinaryOp.Shr, a, i32(_pow2(cb)))
    return Bin(BinaryOp.Div, a, b)


def mod(a, b) -> Expr:
    """Remainder of non-negative indices (the IR has no Rem: a - (a / b) * b; by a power
    of two: a mask)."""
    a, b = i32(a), i32(b)
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return i32(ca % cb)
    if cb == 1:
        return i32(0)
    if _pow2(cb) is not None:
        return Bin(BinaryOp.And, a, i32(cb - 1))
    return sub(a, mul(div(a, b), b))


def lt(a: Expr, b: Expr) -> Expr:
    """1 where a < b, else 0 (I32)."""
    return Bin(BinaryOp.Xor, ge(a, b), i32(1))


def eq(a: Expr, b: Expr) -> Expr:
    return Bin(BinaryOp.And, ge(a, b), ge(b, a))


def both(a: Expr, b: Expr) -> Expr:
    """Logical and of two I32 indicators (0/1)."""
    return Bin(BinaryOp.And, a, b)


def minimum(a: Expr, b: Expr) -> Expr:
    return Sel(ge(a, b), b, a)


def clamp(x: Expr, lo: int, hi: int) -> Expr:
    """x limited to [lo, hi] (I32)."""
    return Sel(ge(x, i32(lo)), minimum(x, i32(hi)), i32(lo))


# -- shapes ----------------------------------------------------------------------
def strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def unravel(flat: Expr, shape: Sequence[int]) -> list[Expr]:
    """Row-major coordinates of a flat index (the last axis varies fastest)."""
    coords, rest = [], flat
    for d, s in zip(shape, strides(shape), strict=True):
        coords.append(i32(0) if d == 1 else (div(rest, s) if s > 1 else rest))
        rest = mod(rest, s) if s > 1 else rest
    return coords


def ravel(coords: Sequence[Expr], shape: Sequence[int]) -> Expr:
    out: Expr = i32(0)
    for c, d, s in zip(coords, shape, strides(shape), strict=True):
        if d != 1:
            out = add(out, mul(c, s))
    return out


def broadcast_coords(coords: Sequence[Expr], shape: Sequence[int]) -> list[Expr]:
    """Coordinates into an operand of `shape` that numpy-broadcasts to len(coords) axes."""
    lead = len(coords) - len(shape)
    return [i32(0) if d == 1 else coords[lead + i] for i, d in enumerate(shape)]


# -- launches ---------------------------------------------------------------------
def launch_1d(count: int, workgroup: int) -> tuple[tuple[int, ...], Expr]:
    """A grid of `count` items in workgroups of `workgroup` threads, and the item each
    thread takes (threads past `count` must be guarded). Uses a second grid axis when
    the first would exceed the per-axis limit."""
    groups = max(1, math.ceil(count / workgroup))
    if groups <= MAX_GRID_X:
        return (groups,), global_id(0)
    gy = math.ceil(groups / MAX_GRID_X)
    return (MAX_GRID_X, gy), add(mul(add(mul(group_id(1), MAX_GRID_X), group_id(0)),
                                     workgroup), local_id(0))


def launch_groups(count: int) -> tuple[tuple[int, ...], Expr]:
    """A grid of `count` workgroups (one per row) and the row each workgroup takes."""
    if count <= MAX_GRID_X:
        return (max(1, count),), group_id(0)
    gy = math.ceil(count / MAX_GRID_X)
    return (MAX_GRID_X, gy), add(mul(group_id(1), MAX_GRID_X), group_id(0))


def pow2_at_least(n: int, lo: int = 32, hi: int = 256) -> int:
    """The smallest power of two >= n, kept within [lo, hi]."""
    p = lo
    while p < n and p < hi:
        p *= 2
    return p


__all__ = ["add", "sub", "mul", "div", "mod", "lt", "eq", "both", "minimum", "clamp",
           "strides", "unravel", "ravel", "broadcast_coords", "launch_1d", "launch_groups",
           "pow2_at_least", "Var"]


def low_zeros(e: Expr) -> int:
    """Low bits known to be zero in integer `e` (32 for a literal 0; 0 where unknown: a
    variable, a load), from how its literals, products and shifts build it."""
    if isinstance(e, Const):
        v = int(e.value) & 0xFFFFFFFF
        return 32 if v == 0 else (v & -v).bit_length() - 1
    if isinstance(e, Cast | Bitcast) and e.dtype in (DType.I32, DType.U32):
        return low_zeros(e.x)
    if isinstance(e, Sel):
        return min(low_zeros(e.t), low_zeros(e.f))
    if not isinstance(e, Bin) or e.dtype not in (DType.I32, DType.U32):
        return 0
    a = low_zeros(e.a)
    shift = int(e.b.value) if isinstance(e.b, Const) else None
    if e.op in (BinaryOp.Add, BinaryOp.Sub, BinaryOp.Or, BinaryOp.Xor):
        return min(a, low_zeros(e.b))
    if e.op is BinaryOp.Mul:
        return min(32, a + low_zeros(e.b))
    if e.op is BinaryOp.And:
        return max(a, low_zeros(e.b))
    if e.op is BinaryOp.Shl and shift is not None and 0 <= shift < 32:
        return min(32, a + shift)
    if e.op is BinaryOp.Shr and shift is not None and 0 <= shift < 32:
        return max(0, a - shift) if a < 32 else 32
    return 0


def split_offset(e: Expr) -> tuple[Expr | None, int]:
    """`e` as (rest, c) with e = rest + c, c the sum of the literals its additions hold
    (rest None where e is a literal), looking through I32/U32 casts."""
    if isinstance(e, Cast | Bitcast) and e.dtype in (DType.I32, DType.U32):
        rest, c = split_offset(e.x)
        return (None if rest is None else type(e)(e.dtype, rest)), c
    if isinstance(e, Const):
        return None, int(e.value)
    if isinstance(e, Bin) and e.op is BinaryOp.Add:
        ra, ca = split_offset(e.a)
        rb, cb = split_offset(e.b)
        rest = ra if rb is None else rb if ra is None else Bin(BinaryOp.Add, ra, rb)
        return rest, ca + cb
    return e, 0
