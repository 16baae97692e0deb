"""Int8 quantization of activations in blocks, GGUF's q8_0 rule, as IR.

`QuantizeI8` is the one primitive: the int8 codes of `x` for given scales. The scales and
the dequantization are ordinary ops, emitted by `q8_quantize` and `q8_dequantize`, so every
backend runs them with the lowerings it already has and the oracle defines them:

    xb = Reshape(x)                     [..., K/B, B]       blocks of B along the last axis
    d  = Div(Reduce(Max, Max(xb, Neg(xb)), -1, keepdim), 127)   [..., K/B, 1]  f32 scales
    q  = QuantizeI8(xb, d)              i8 [..., K/B, B]
    x' = Reshape(Mul(Cast(f32, q), d))  [..., K]             what a contraction then reads

`Q8PackedContraction` is the composite compile forms where a packed contraction reads such
rows (poot.compiler.passes.precision), so a kernel may multiply the codes with the weight's
integers; its meaning is that chain, then `PackedContraction`. `Q8KVAttention` is the one
the attention pass forms where attention reads a q8_0 KV cache: the dequantization of its
keys and values, then `Attention`, so a kernel reads the codes and scales in place;
`Q8KVSinkAttention` is its `SinkAttention` (gpt-oss).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from poot.dtypes import DType
from poot.ir.ops.base import OpKind, broadcast_shapes
from poot.ir.ops.composite import (
    Composite,
    PackedContraction,
    _attention_type,
    _reshape,
    attention_chain,
)
from poot.ir.ops.data import Gather
from poot.ir.ops.elementwise import Binary, BinaryOp, Cast, Unary, UnaryOp
from poot.ir.ops.reduce import Reduce, ReduceOp
from poot.ir.ops.shape import Transpose
from poot.ir.types import TensorType

if TYPE_CHECKING:  # pragma: no cover
    from poot.ir.packed import PackedWeight

F32, I8 = DType.F32, DType.I8
#: values per scale: GGUF's q8_0 block
Q8_BLOCK = 32
#: the largest code; -127 is the smallest (symmetric: -128 is never produced)
Q8_MAX = 127


@dataclass(frozen=True, repr=False)
class QuantizeI8(OpKind):
    """x F32, d F32 broadcasting to x's shape -> I8 codes of x's shape:
    q = clamp(round_half_even(x * inv), -127, 127) with inv = (d == 0 ? 0 : 1 / d), each an
    F32 operation; a NaN product gives 0."""

    arity: ClassVar[int] = 2
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "arith"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        x, d = ins
        self.need_dtype(x, (F32,), "x")
        self.need_dtype(d, (F32,), "scale")
        if broadcast_shapes(self, x, d) != x.shape:
            self.fail(f"the scales {d.shape} must broadcast to x's shape {x.shape}", ins)
        return x.with_dtype(I8)


def _blocks(op_name: str, shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    from poot.errors import ShapeError

    if not shape or shape[-1] % block:
        raise ShapeError(f"{op_name}: the last axis of {shape} is not a multiple of the "
                         f"quantization block {block}")
    return shape[:-1] + (shape[-1] // block, block)


def q8_quantize(b, x, block: int = Q8_BLOCK):
    """(codes i8 [..., K/B, B], scales f32 [..., K/B, 1]) of x [..., K] F32, emitted into
    `b` (a Builder, or anything with its `eqn` and `lit`)."""
    xb = _reshape(b, x, _blocks("q8_quantize", tuple(x.type.shape), block))
    mag = b.eqn(Binary(BinaryOp.Max), xb, b.eqn(Unary(UnaryOp.Neg), xb))
    amax = b.eqn(Reduce(ReduceOp.Max, -1, True), mag)
    d = b.eqn(Binary(BinaryOp.Div), amax, b.lit(float(Q8_MAX), F32))
    return b.eqn(QuantizeI8(), xb, d), d


def q8_dequantize(b, q, d):
    """f32(q) * d of codes [..., G, B] and scales [..., G, 1], as [..., G*B]."""
    x = b.eqn(Binary(BinaryOp.Mul), b.eqn(Cast(F32), q), d)
    shape = tuple(q.type.shape)
    return _reshape(b, x, shape[:-2] + (shape[-2] * shape[-1],))


def q8_round(b, x, block: int = Q8_BLOCK):
    """x [..., K] as a contraction reads it once quantized: q8_dequantize(q8_quantize(x))."""
    return q8_dequantize(b, *q8_quantize(b, x, block))


@dataclass(frozen=True, repr=False)
class Q8PackedContraction(Composite):
    """A packed contraction of activations quantized to int8 rows: a [..., M, K] F32 and
    the weight's sources (PackedContraction's operands) -> [..., M, N] F32, defined as
    PackedContraction(q8_round(a), sources). K is a multiple of 32; a kernel quantizes each
    block of 32 of a row as q8_quantize does and may then multiply the codes with the
    weight's integer codes, accumulating in integers (summation order is not meaning)."""

    weight: PackedWeight
    deciding: ClassVar[str] = "format"

    def infer(self, ins):
        if not ins:
            self.fail("takes an activation and the weight's sources", ins)
        _blocks(self.name, tuple(ins[0].shape), Q8_BLOCK)
        return PackedContraction(self.weight).infer(ins)

    def define(self, b, ins):
        a, *src = ins
        return b.eqn(PackedContraction(self.weight), q8_round(b, a), *src)


@dataclass(frozen=True, repr=False)
class Q8KVAttention(Composite):
    """Attention over keys and values held as q8_0 rows (a q8_0 KV cache read in place):
    operands q [..., Hq, T, D] F32, k codes [..., Hkv, S, D] I8, k scales [..., Hkv, S,
    D/32] F32, v codes [..., Hkv, S, Dv] I8, v scales [..., Hkv, S, Dv/32] F32, mask (as
    Attention's); D and Dv multiples of 32. Defined as Attention(scale) over
    q8_dequantize of each codes and scales pair (f32(code) * scale, one rounding: the
    cache's read chain), so a kernel that dequantizes each element as it loads it gives
    the bits of the f32 attention over the dequantized copy."""

    scale: float
    arity: ClassVar[int] = 6
    deciding: ClassVar[str] = "kv"       # the codes' dtype, I8
    needs: ClassVar[str] = "convert"

    def infer(self, ins):
        self.check_arity(ins)
        q, kc, ks, vc, vs, mask = ins
        self.need_dtype(q, (F32,), "q")
        for codes, scales, what in ((kc, ks, "k"), (vc, vs, "v")):
            self.need_dtype(codes, (I8,), f"{what} codes")
            self.need_dtype(scales, (F32,), f"{what} scales")
            blocks = _blocks(self.name, tuple(codes.shape), Q8_BLOCK)[:-1]
            if tuple(scales.shape) != blocks:
                self.fail(f"{what}'s scales must be {blocks}: one per {Q8_BLOCK} codes", ins)
        return _attention_type(self, [q, kc.with_dtype(F32), vc.with_dtype(F32), mask])

    def define(self, b, ins):
        q, kc, ks, vc, vs, mask = ins
        return attention_chain(b, q, q8_rows(b, kc, ks), q8_rows(b, vc, vs), mask, self.scale)


@dataclass(frozen=True, repr=False)
class Q8KVSinkAttention(Composite):
    """SinkAttention over keys and values held as q8_0 rows (gpt-oss with a q8_0 KV cache):
    operands as Q8KVAttention's, then sinks [Hq] F32. Defined as SinkAttention(scale) over
    q8_dequantize of each codes and scales pair, so a kernel that dequantizes each element
    as it loads it gives the bits of the f32 sink attention over the dequantized copy."""

    scale: float
    arity: ClassVar[int] = 7
    deciding: ClassVar[str] = "kv"       # the codes' dtype, I8
    needs: ClassVar[str] = "convert"

    def infer(self, ins):
        self.check_arity(ins)
        out = Q8KVAttention(self.scale).infer(ins[:6])
        q, sinks = ins[0], ins[6]
        if sinks.shape != (q.shape[-3],) or sinks.dtype != q.dtype:
            self.fail(f"sinks must be [Hq={q.shape[-3]}] of q's dtype", ins)
        return out

    def define(self, b, ins):
        q, kc, ks, vc, vs, mask, sinks = ins
        return attention_chain(b, q, q8_rows(b, kc, ks), q8_rows(b, vc, vs), mask, self.scale,
                               sinks)


@dataclass(frozen=True, repr=False)
class PagedQ8KVAttention(Composite):
    """Q8KVAttention over q8_0 pools read through each sequence's slot map (a paged q8_0 KV
    cache read in place): operands q [B, Hq, T, D] F32, k codes [P, Hkv, D] I8, k scales
    [P, Hkv, D/32] F32, v codes [P, Hkv, Dv] I8, v scales [P, Hkv, Dv/32] F32, slot_map
    [B, S] I32, mask. Defined as Q8KVAttention over Transpose(Gather(x, slot_map), (0, 2,
    1, 3)) of each of the four pools, as PagedAttention reads its pools."""

    scale: float
    arity: ClassVar[int] = 7
    deciding: ClassVar[str] = "kv"       # the codes' dtype, I8
    needs: ClassVar[str] = "convert"

    def infer(self, ins):
        self.check_arity(ins)
        q, *pools, smap, mask = ins
        self.need_dtype(smap, (DType.I32,), "slot_map")
        if q.rank != 4 or smap.rank != 2 or smap.shape[0] != q.shape[0] or any(
                p.rank != 3 or p.shape[:2] != pools[0].shape[:2] for p in pools):
            self.fail("expected q [B, Hq, T, D], pools [P, Hkv, ...], slot_map [B, S]", ins)
        (bsz, s), hkv = smap.shape, pools[0].shape[1]
        rows = [TensorType((bsz, hkv, s, p.shape[2]), p.dtype) for p in pools]
        return Q8KVAttention(self.scale).infer([q, *rows, mask])

    def define(self, b, ins):
        q, *pools, smap, mask = ins
        kc, ks, vc, vs = (b.eqn(Transpose((0, 2, 1, 3)), b.eqn(Gather(0), p, smap))
                          for p in pools)
        return attention_chain(b, q, q8_rows(b, kc, ks), q8_rows(b, vc, vs), mask, self.scale)


def q8_rows(b, codes, scales):
    """The f32 rows [..., D] of q8_0 codes [..., D] and their scales [..., D/32]: what a
    q8_0 KV cache's read emits (poot.ops.kv_decode)."""
    lead, d = tuple(codes.type.shape[:-1]), codes.type.shape[-1]
    return q8_dequantize(b, _reshape(b, codes, lead + (d // Q8_BLOCK, Q8_BLOCK)),
                         _reshape(b, scales, lead + (d // Q8_BLOCK, 1)))


__all__ = ["PagedQ8KVAttention", "QuantizeI8", "Q8KVAttention", "Q8KVSinkAttention",
           "Q8PackedContraction", "Q8_BLOCK", "Q8_MAX",
           "q8_quantize", "q8_dequantize", "q8_round", "q8_rows"]
