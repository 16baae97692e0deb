"""Scalar expressions: the arithmetic of kernel programs and of packed-weight decode.

An expression is a small immutable tree over the IR's own scalar vocabulary
(Unary, Binary, Select, Cast) plus what a kernel needs around it: constants,
named index variables, loads from named buffers, and Bitcast (reinterpreting a
32-bit word, which every shading language has). Each backend prints these
nodes in its language; `evaluate` gives their meaning with numpy, vectorised
over arrays of index values, through the oracle's own scalar rules.

Decode programs of packed formats (poot_quant) are written with these nodes,
so a new format needs no backend code, and a new backend decodes every format.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from poot.dtypes import DType
from poot.ir.ops.elementwise import BinaryOp, UnaryOp

I32, U32, F32 = DType.I32, DType.U32, DType.F32


class Expr:
    """Base of every scalar expression. `dtype` is the type of the result."""

    dtype: DType

    # operator sugar; both operands must already share a dtype (no implicit promotion)
    def _bin(self, op, other, swap=False):
        other = lit(other, self.dtype) if not isinstance(other, Expr) else other
        a, b = (other, self) if swap else (self, other)
        return Bin(op, a, b)

    def __add__(self, o): return self._bin(BinaryOp.Add, o)
    def __radd__(self, o): return self._bin(BinaryOp.Add, o, True)
    def __sub__(self, o): return self._bin(BinaryOp.Sub, o)
    def __rsub__(self, o): return self._bin(BinaryOp.Sub, o, True)
    def __mul__(self, o): return self._bin(BinaryOp.Mul, o)
    def __rmul__(self, o): return self._bin(BinaryOp.Mul, o, True)
    def __floordiv__(self, o): return self._bin(BinaryOp.Div, o)   # integer division
    def __truediv__(self, o): return self._bin(BinaryOp.Div, o)
    def __and__(self, o): return self._bin(BinaryOp.And, o)
    def __or__(self, o): return self._bin(BinaryOp.Or, o)
    def __xor__(self, o): return self._bin(BinaryOp.Xor, o)
    def __lshift__(self, o): return self._bin(BinaryOp.Shl, o)
    def __rshift__(self, o): return self._bin(BinaryOp.Shr, o)
    def __neg__(self): return Un(UnaryOp.Neg, self)

    def cast(self, to: DType) -> Expr:
        return self if to is self.dtype else Cast(to, self)

    def bitcast(self, to: DType) -> Expr:
        return self if to is self.dtype else Bitcast(to, self)


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: float | int
    dtype: DType


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """An index variable the kernel binds (a thread index, a loop counter, a row)."""

    name: str
    dtype: DType = I32


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """Element `index` (I32) of the named buffer, read as `dtype`."""

    buffer: str
    index: Expr
    dtype: DType


@dataclass(frozen=True, eq=False)
class Un(Expr):
    op: UnaryOp
    x: Expr

    @property
    def dtype(self) -> DType:
        return self.x.dtype


@dataclass(frozen=True, eq=False)
class Bin(Expr):
    op: BinaryOp
    a: Expr
    b: Expr

    def __post_init__(self):
        a = self.a.dtype
        if a is not self.b.dtype:
            raise TypeError(f"{self.op.name}: operand dtypes differ ({a} vs "
                            f"{self.b.dtype}); cast explicitly")
        # kept, not recomputed: a chain of n Bins would otherwise ask n deep at every node
        object.__setattr__(self, "_dtype", I32 if self.op.compare else a)

    @property
    def dtype(self) -> DType:
        return self._dtype


@dataclass(frozen=True, eq=False)
class Sel(Expr):
    cond: Expr
    t: Expr
    f: Expr

    @property
    def dtype(self) -> DType:
        return self.t.dtype


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    dtype: DType
    x: Expr


@dataclass(frozen=True, eq=False)
class Bitcast(Expr):
    """Reinterpret the bits of a 32-bit value (I32 <-> U32 <-> F32)."""

    dtype: DType
    x: Expr


@dataclass(frozen=True, eq=False)
class Dot2(Expr):
    """An integer dot product of two pairs: c + a.lo * b[2h] + a.hi * b[2h + 1], where a (I32)
    holds two signed 16-bit halves, b (U32) four unsigned bytes (b[0] the lowest), h = 1 if
    `high` else 0, c I32; exact in I32 for the magnitudes quantized activations have. A
    target that has the instruction (target.DOT2: PTX dp2a) prints it as one; every other
    printer, and the interpreter, print `lower_dot2`'s plain integer multiply-adds."""

    a: Expr
    b: Expr
    c: Expr
    high: bool = False
    dtype: DType = I32

    def __post_init__(self):
        if (self.a.dtype, self.b.dtype, self.c.dtype) != (I32, U32, I32):
            raise TypeError(f"Dot2 takes (I32, U32, I32), not ({self.a.dtype}, "
                            f"{self.b.dtype}, {self.c.dtype})")


@dataclass(frozen=True, eq=False)
class Dot4(Expr):
    """An integer dot product of two quads: c + sum_i a[i] * b[i] over i = 0..3, where a
    (I32) holds four signed bytes and b (U32) four unsigned bytes (byte 0 the lowest), c
    I32; exact in I32. Printed as one instruction where the target has it (target.DOT4),
    else, and in the interpreter, as `lower_dot2`'s plain integer multiply-adds.
    `b_bits`: b's bytes are below 2^b_bits (a target whose instruction takes signed bytes
    only, WGSL's dot4I8Packed, needs no second product for b_bits <= 7)."""

    a: Expr
    b: Expr
    c: Expr
    dtype: DType = I32
    b_bits: int = 8

    def __post_init__(self):
        if (self.a.dtype, self.b.dtype, self.c.dtype) != (I32, U32, I32):
            raise TypeError(f"Dot4 takes (I32, U32, I32), not ({self.a.dtype}, "
                            f"{self.b.dtype}, {self.c.dtype})")


def lower_dot2(e: Dot2 | Dot4) -> Expr:
    """Dot2 (Dot4) as shifts, masks and two (four) multiply-adds (I32 >> is arithmetic)."""
    if isinstance(e, Dot4):
        out = e.c
        for i in range(4):
            a = (e.a << i32(24 - 8 * i)) >> i32(24)
            out = out + a * ((e.b >> u32(8 * i)) & u32(0xFF)).bitcast(I32)
        return out
    lo, hi = (e.a << i32(16)) >> i32(16), e.a >> i32(16)
    shift = 16 if e.high else 0
    b0 = ((e.b >> u32(shift)) & u32(0xFF)).bitcast(I32)
    b1 = ((e.b >> u32(shift + 8)) & u32(0xFF)).bitcast(I32)
    return e.c + lo * b0 + hi * b1


# -- constructors ----------------------------------------------------------------
def lit(value, dtype: DType) -> Const:
    return Const(value, dtype)


def i32(v) -> Expr:
    return v if isinstance(v, Expr) else Const(int(v), I32)


def u32(v) -> Expr:
    return v if isinstance(v, Expr) else Const(int(v), U32)


def f32(v) -> Expr:
    return v if isinstance(v, Expr) else Const(float(v), F32)


def select(cond: Expr, t: Expr, f: Expr) -> Sel:
    return Sel(cond, t, f)


def ge(a: Expr, b: Expr) -> Bin:
    return Bin(BinaryOp.Ge, a, b)


def maximum(a: Expr, b: Expr) -> Bin:
    return Bin(BinaryOp.Max, a, b)


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Un, Cast, Bitcast)):
        return (e.x,)
    if isinstance(e, Bin):
        return (e.a, e.b)
    if isinstance(e, Sel):
        return (e.cond, e.t, e.f)
    if isinstance(e, Load):
        return (e.index,)
    if isinstance(e, (Dot2, Dot4)):
        return (e.a, e.b, e.c)
    return ()


def walk(e: Expr):
    """Every node of the tree, children before parents (shared nodes once)."""
    seen: set[int] = set()
    out: list[Expr] = []

    def go(n):
        if id(n) in seen:
            return
        seen.add(id(n))
        for c in children(n):
            go(c)
        out.append(n)

    go(e)
    return out


# -- meaning -------------------------------------------------------------------------
def evaluate(e: Expr, env: Mapping[str, np.ndarray | int],
             buffers: Mapping[str, np.ndarray],
             load: Callable[[Load, np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Evaluate with numpy. `env` binds Vars (scalars or broadcastable arrays);
    `buffers` maps names to 1-D arrays read by Load (out-of-range loads raise).
    `load(node, index)`, when given, performs every Load instead (the kernel
    interpreter uses it for shared and per-thread arrays and race checks)."""
    from poot.oracle import scalar as S

    memo: dict[int, np.ndarray] = {}
    lowered: list[Expr] = []     # Dot2's plain trees live on: their ids key `memo`

    def ev(n: Expr) -> np.ndarray:
        key = id(n)
        if key in memo:
            return memo[key]
        if isinstance(n, Const):
            r = np.asarray(n.value).astype(n.dtype.numpy) if not n.dtype.is_int else \
                np.asarray(np.int64(n.value)).astype(n.dtype.numpy)
        elif isinstance(n, Var):
            r = np.asarray(env[n.name]).astype(n.dtype.numpy)
        elif isinstance(n, Load) and load is not None:
            r = load(n, ev(n.index).astype(np.int64))
        elif isinstance(n, Load):
            buf = np.asarray(buffers[n.buffer])
            idx = ev(n.index).astype(np.int64)
            if idx.size and (idx.min() < 0 or idx.max() >= buf.size):
                raise IndexError(f"load from {n.buffer!r} out of range "
                                 f"[{idx.min()}, {idx.max()}] of {buf.size}")
            flat = buf.reshape(-1)
            if flat.dtype != n.dtype.numpy:
                flat = flat.view(n.dtype.numpy) if flat.dtype.itemsize == \
                    n.dtype.numpy.itemsize else flat.astype(n.dtype.numpy)
            r = flat[idx]
        elif isinstance(n, Un):
            r = S.unary(n.op, ev(n.x), n.x.dtype)
        elif isinstance(n, Bin):
            a, b = np.broadcast_arrays(ev(n.a), ev(n.b))
            r = S.binary(n.op, a, b, n.a.dtype)
        elif isinstance(n, Sel):
            r = S.select(ev(n.cond), ev(n.t), ev(n.f))
        elif isinstance(n, Cast):
            r = S.cast(ev(n.x), n.x.dtype, n.dtype)
        elif isinstance(n, Bitcast):
            r = S.bitcast(np.asarray(ev(n.x)), n.dtype)
        elif isinstance(n, (Dot2, Dot4)):
            lowered.append(lower_dot2(n))
            r = ev(lowered[-1])
        else:  # pragma: no cover
            raise TypeError(f"unknown expression {n!r}")
        memo[key] = r
        return r

    return ev(e)


Printer = Callable[[Expr], str]


# -- shared decode pieces (used by packed formats and dense f16 words) -----------------------
def half_bits_to_f32(h: Expr) -> Expr:
    """The F32 value of IEEE binary16 bits held in the low 16 bits of a U32 (or I32; the
    high bits are ignored): exact, with subnormals, infinities and NaN (mantissa kept),
    in integer ops and Bitcast. The magnitude moves under the f32 exponent and one add
    rebiases it (a second one makes Inf/NaN); subnormals are (2^23 + m) - 2^23 scaled by
    2^-24, exact and with no f32 subnormal on the way; the sign is ORed in last."""
    h = h.bitcast(U32) if h.dtype is I32 else h
    magnitude = h & u32(0x7FFF)
    normal = (magnitude << u32(13)) + u32(0x38000000)
    bits = select(ge(magnitude, u32(0x7C00)), normal + u32(0x38000000), normal)
    tiny = ((magnitude | u32(0x4B000000)).bitcast(F32) - f32(8388608.0)) * f32(2.0 ** -24)
    value = select(ge(magnitude, u32(0x400)), bits.bitcast(F32), tiny)
    return (value.bitcast(U32) | ((h & u32(0x8000)) << u32(16))).bitcast(F32)


def byte_at(load, role: str, offset: Expr) -> Expr:
    """Byte `offset` (I32) of source `role`, as a U32 in [0, 255]."""
    word = load(role, offset >> i32(2))
    return (word >> ((offset & i32(3)) * i32(8)).bitcast(U32)) & u32(0xFF)


def half_at(load, role: str, index: Expr) -> Expr:
    """Little-endian 16-bit element `index` (I32) of source `role`, as a U32."""
    word = load(role, index >> i32(1))
    return (word >> ((index & i32(1)) * i32(16)).bitcast(U32)) & u32(0xFFFF)
