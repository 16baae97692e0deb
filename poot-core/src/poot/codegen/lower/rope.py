"""Rope: rotate-half RoPE on the first `rot` features, one thread per output element."""
from __future__ import annotations

from poot.codegen import index as ix
from poot.codegen.expr import Load, Sel, i32
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.lower.pointwise import pointwise_kernel
from poot.codegen.program import KernelProgram
from poot.ir.ops import Rope


@lowers(Rope)
def lower_rope(sig: Sig) -> KernelProgram:
    x, cos, sin = sig.type(0), sig.type(1), sig.type(2)
    rot, h = sig.op.rot, sig.op.rot // 2

    def table(name, t, coords):
        return Load(name, ix.ravel(ix.broadcast_coords(coords, t.shape), t.shape), t.dtype)

    def value(c, kb):
        d, lead = c[-1], list(c[:-1])
        # j: the pair index (clamped so lanes past `rot` still read inside the tables)
        j = kb.let("j", ix.clamp(Sel(ix.lt(d, i32(h)), d, ix.sub(d, h)), 0, h - 1))
        x1 = kb.let("x1", Load("in0", ix.ravel(lead + [j], x.shape), x.dtype))
        x2 = kb.let("x2", Load("in0", ix.ravel(lead + [ix.add(j, h)], x.shape), x.dtype))
        cj = kb.let("cj", table("in1", cos, lead + [j]))
        sj = kb.let("sj", table("in2", sin, lead + [j]))
        lo = x1 * cj - x2 * sj
        hi = x1 * sj + x2 * cj
        keep = Load("in0", ix.ravel(c, x.shape), x.dtype)
        return Sel(ix.lt(d, i32(h)), lo, Sel(ix.lt(d, i32(rot)), hi, keep))
    return pointwise_kernel(sig, value)
