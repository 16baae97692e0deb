"""QuantizeI8: one thread per code, in the scalar vocabulary every printer has.

The rule (docs/ir.md section 10.8) rounds half to even; no target's own rounding
instruction is asked for. The product is clamped to [-127, 127] first (a NaN product
becomes 0), so the truncation to I32 is defined everywhere, and the truncated part `f` is
exact (|y| < 2^23): the code moves one step away from zero where |f| > 1/2, or where
|f| = 1/2 and the truncated value is odd.
"""
from __future__ import annotations

from poot.codegen.expr import Expr, Sel, f32, ge, i32
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.lower.pointwise import pointwise_kernel
from poot.codegen.program import KernelProgram
from poot.dtypes import DType
from poot.ir.ops import Q8_MAX, QuantizeI8

F32, I32, I8 = DType.F32, DType.I32, DType.I8


def quantize_i8(x: Expr, d: Expr, let=None) -> Expr:
    """The I8 code of F32 `x` for the F32 scale `d` (QuantizeI8's rule); `let(name,
    expr)` binds the values read several times (a KernelBuilder's `let`; without it the
    expression repeats them)."""
    let = let or (lambda _, e: e)
    zero, one = f32(0.0), i32(1)
    is_zero = ge(d, zero) * ge(zero, d)
    inv = Sel(is_zero, zero, f32(1.0) / d)
    y = let("qy", x * inv)
    y = let("qy", Sel(ge(y, y), y, zero))                    # NaN: 0
    y = let("qy", Sel(ge(y, f32(Q8_MAX)), f32(Q8_MAX), y))
    y = let("qy", Sel(ge(f32(-Q8_MAX), y), f32(-Q8_MAX), y))
    t = let("qt", y.cast(I32))                               # toward zero
    f = let("qf", y - t.cast(F32))                           # exact, in (-1, 1)
    odd = t & one
    half = f32(0.5)
    up = (one - ge(half, f)) + ge(f, half) * ge(half, f) * odd       # f > 1/2, or = 1/2
    down = (one - ge(f, -half)) + ge(f, -half) * ge(-half, f) * odd  # f < -1/2, or = -1/2
    return (t + up - down).cast(I8)


@lowers(QuantizeI8)
def lower_quantize_i8(sig: Sig) -> KernelProgram:
    return pointwise_kernel(sig, lambda c, kb: quantize_i8(sig.operand_at(0, c),
                                                           sig.operand_at(1, c)))


__all__ = ["quantize_i8", "lower_quantize_i8"]
