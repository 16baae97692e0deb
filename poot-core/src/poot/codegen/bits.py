"""Widening 16-bit floats held in 32-bit words, with integer ops and Bitcast only.

Weights stay in their checkpoint bytes; kernels read them as U32 words and widen
each half in registers, which every backend can print (no bf16/f16 type needed).
"""
from __future__ import annotations

from poot.codegen.expr import Expr, Sel, f32, ge, u32
from poot.dtypes import DType

F32, U32 = DType.F32, DType.U32


def bf16_bits_to_f32(h: Expr) -> Expr:
    """bf16 bits (U32, low half) to f32: exact, the bits move to the high half."""
    return (h << u32(16)).bitcast(F32)


def f16_bits_to_f32(h: Expr) -> Expr:
    """IEEE binary16 bits (U32, low half) to f32: normals, subnormals, Inf and NaN."""
    sign = (h & u32(0x8000)) << u32(16)
    exp = (h >> u32(10)) & u32(0x1F)
    magnitude = (h & u32(0x7FFF)) << u32(13)
    normal = magnitude + u32((127 - 15) << 23)
    inf_nan = magnitude + u32((255 - 31) << 23)
    subnormal = ((h & u32(0x3FF)).cast(F32) * f32(2.0 ** -24)).bitcast(U32)
    bits = Sel(ge(exp, u32(31)), inf_nan, Sel(ge(exp, u32(1)), normal, subnormal))
    return (bits | sign).bitcast(F32)


def half_of(word: Expr, upper: Expr) -> Expr:
    """The low (upper == 0) or high (upper == 1) 16 bits of a U32 word, as U32.
    `upper` is an I32 0/1."""
    return (word >> (upper.cast(U32) * u32(16))) & u32(0xFFFF)


def widen16(bits: Expr, dtype: DType) -> Expr:
    """Widen a 16-bit float's bits (U32) of `dtype` (BF16 or F16) to F32."""
    if dtype is DType.BF16:
        return bf16_bits_to_f32(bits)
    if dtype is DType.F16:
        return f16_bits_to_f32(bits)
    raise ValueError(f"widen16 takes bf16 or f16, not {dtype}")
