"""Rope: rotate-half RoPE on the first `rot` features, one thread per output element;
RopeScatter: the same elements written to the KV pool rows a ScatterUpdate would;
RopeUpdateSlice: written to the dense cache block a DynamicUpdateSlice would."""
from __future__ import annotations

from poot.codegen import index as ix
from poot.codegen.expr import Load, Sel, i32
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.lower.data import in_order, scatter_rows, update_block
from poot.codegen.lower.pointwise import pointwise_kernel
from poot.codegen.program import KernelProgram
from poot.ir.ops import Rope, RopeScatter, RopeUpdateSlice


def rotated(kb, sig: Sig, rot: int, first: int, c, tables: tuple[int, int] | None = None):
    """Element `c` of Rope{rot}(x, cos, sin), operands first, first + 1, first + 2 of sig
    (cos and sin the operands `tables` where given)."""
    where = (first, *(tables or (first + 1, first + 2)))
    x, cos, sin = (sig.type(j) for j in where)
    xs, cs, ss = (f"in{j}" for j in where)
    h = rot // 2

    def table(name, t, coords):
        return Load(name, ix.ravel(ix.broadcast_coords(coords, t.shape), t.shape), t.dtype)

    d, lead = c[-1], list(c[:-1])
    # j: the pair index (clamped so lanes past `rot` still read inside the tables)
    j = kb.let("j", ix.clamp(Sel(ix.lt(d, i32(h)), d, ix.sub(d, h)), 0, h - 1))
    x1 = kb.let("x1", Load(xs, ix.ravel(lead + [j], x.shape), x.dtype))
    x2 = kb.let("x2", Load(xs, ix.ravel(lead + [ix.add(j, h)], x.shape), x.dtype))
    cj = kb.let("cj", table(cs, cos, lead + [j]))
    sj = kb.let("sj", table(ss, sin, lead + [j]))
    lo = x1 * cj - x2 * sj
    hi = x1 * sj + x2 * cj
    keep = Load(xs, ix.ravel(c, x.shape), x.dtype)
    return Sel(ix.lt(d, i32(h)), lo, Sel(ix.lt(d, i32(rot)), hi, keep))


@lowers(Rope)
def lower_rope(sig: Sig) -> KernelProgram:
    return pointwise_kernel(sig, lambda c, kb: rotated(kb, sig, sig.op.rot, 0, c))


@lowers(RopeScatter)
def lower_rope_scatter(sig: Sig) -> KernelProgram:
    x = sig.type(1)
    return scatter_rows(sig, 4, lambda kb, i: rotated(kb, sig, sig.op.rot, 1,
                                                      ix.unravel(i, x.shape)))


@lowers(RopeUpdateSlice)
def lower_rope_update_slice(sig: Sig) -> KernelProgram:
    """Each block element rotated from x's element at the same place in x's order of the
    block's axes (`RopeUpdateSlice.token_order`)."""
    base, x = sig.type(0), sig.type(1)
    upd = sig.op.update_type(base, x)
    order = sig.op.token_order(upd.shape)

    def value(kb, i):
        y = rotated(kb, sig, sig.op.rot, 1, ix.unravel(in_order(kb, i, upd, order), x.shape))
        return y if x.dtype == base.dtype else y.cast(base.dtype)
    return update_block(sig, upd, 4, value)
