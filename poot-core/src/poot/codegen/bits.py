"""Widening 16-bit floats held in 32-bit words, with integer ops and Bitcast only.

Weights stay in their checkpoint bytes; kernels read them as U32 words and widen
each half in registers, which every backend can print (no bf16/f16 type needed).
"""
from __future__ import annotations

from poot.codegen.expr import Expr, half_bits_to_f32, u32
from poot.dtypes import DType

F32, U32 = DType.F32, DType.U32


def bf16_bits_to_f32(h: Expr) -> Expr:
    """bf16 bits (U32, low half) to f32: exact, the bits move to the high half."""
    return (h << u32(16)).bitcast(F32)


def half_of(word: Expr, upper: Expr) -> Expr:
    """The low (upper == 0) or high (upper == 1) 16 bits of a U32 word, as U32.
    `upper` is an I32 0/1."""
    return (word >> (upper.cast(U32) * u32(16))) & u32(0xFFFF)


def widen16(bits: Expr, dtype: DType) -> Expr:
    """Widen a 16-bit float's bits (U32) of `dtype` (BF16 or F16) to F32."""
    if dtype is DType.BF16:
        return bf16_bits_to_f32(bits)
    if dtype is DType.F16:
        return half_bits_to_f32(bits)
    raise ValueError(f"widen16 takes bf16 or f16, not {dtype}")
